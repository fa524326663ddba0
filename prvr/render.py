"""Rendering the generated demo videos: photographs under a moving camera, cross-faded, into H.264 mp4.

A video is a list of ``Scene`` s placed on the time axis (``prvr.demo.timeline``). Each frame is drawn
straight in the encoder's pixel format (yuv420p planes) by small numba kernels: a bilinear magnification of
the photo's moving crop, and a linear blend during cross-fades; filler scenes are a plain grey card whose
shading drifts slowly. Integer arithmetic and one encoder thread per video: the same bytes on every machine.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np
from PIL import Image

log = logging.getLogger(__name__)

GENERATOR_VERSION = 3  # bump whenever rendering changes: cached videos are then rebuilt
MOTIONS = ("zoom_in", "zoom_out", "pan_left", "pan_right", "pan_up", "pan_down")


@dataclass(frozen=True)
class RenderConfig:
    width: int = 480  # 16:9 and small: rendering and feature extraction take seconds on 2 cores
    height: int = 270
    fps: int = 10  # the lite profile samples about one row per second; 10 fps plays smoothly enough
    transition_s: float = 1.0  # cross-fade length; belongs to no moment
    zoom: float = 1.3  # a zoom travels from 1x to this; a pan runs at this zoom to have room to move
    crf: int = 23  # x264's default quality
    # x264's superfast plus the macroblock tree (and fixed B-frames): about 2/3 of veryfast's encoding time
    # for a similar size at the same quality on these slow pans and fades. More than x264's default 3
    # B-frames encodes faster still, but libx264 then gives different bytes from run to run (measured)
    preset: str = "superfast"
    x264_params: str = "mbtree=1:rc-lookahead=10:b-adapt=0"


@dataclass(frozen=True)
class Scene:
    photo: str | None  # None for a filler card
    start: float  # full visibility from start to end (seconds)
    end: float
    motion: str = "zoom_in"
    focus: tuple[float, float] = (0.5, 0.5)  # relative (x, y) the camera centres on


Planes = tuple[np.ndarray, np.ndarray, np.ndarray]  # one yuv420p picture: Y (h, w), Cb and Cr (h/2, w/2)


def load_photo(source: str, index: int | None = None) -> Image.Image:
    """One of the photographs shipped inside scikit-image's wheel, as an RGB image."""
    import skimage.data

    loader = getattr(skimage.data, source, None)
    if loader is None:
        raise ValueError(f"skimage.data has no image {source!r}")
    image = loader()
    if index is not None:
        image = image[index]
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(f"skimage.data.{source} is {image.dtype}, expected an 8-bit photograph")
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=2)
    return Image.fromarray(np.ascontiguousarray(image[..., :3]))


def crop_box(size: tuple[int, int], scene: Scene, u: float, cfg: RenderConfig) -> tuple[float, ...]:
    """The photo region (x0, y0, x1, y1) shown at progress ``u`` in [0, 1] of the scene's motion."""
    width, height = size
    aspect = cfg.width / cfg.height
    full_w = min(width, height * aspect)  # largest crop of the output's aspect ratio
    u = u * u * (3 - 2 * u)  # ease in and out
    if scene.motion.startswith("zoom"):
        z = 1 + (cfg.zoom - 1) * (u if scene.motion == "zoom_in" else 1 - u)
        cx, cy = scene.focus
    else:
        z = cfg.zoom
        along = u if scene.motion in ("pan_right", "pan_down") else 1 - u
        horizontal = scene.motion in ("pan_left", "pan_right")
        cx, cy = (along, scene.focus[1]) if horizontal else (scene.focus[0], along)
    w, h = full_w / z, full_w / z / aspect
    x = min(max(cx * width, w / 2), width - w / 2)  # keep the crop inside the photo
    y = min(max(cy * height, h / 2), height - h / 2)
    return (x - w / 2, y - h / 2, x + w / 2, y + h / 2)


def filler_card(t: float, cfg: RenderConfig, out: Planes) -> None:
    """Draw a plain grey card whose faint diagonal shading drifts slowly (so the video visibly plays)."""
    diagonal = np.arange(cfg.width + cfg.height - 1) / (cfg.width + cfg.height) + 0.05 * t
    grey = 118 + 10 * np.sin(2 * math.pi * diagonal)
    luma = np.rint(16 + grey * (219 / 255)).astype(np.uint8)
    out[0][:] = np.lib.stride_tricks.sliding_window_view(luma, cfg.width)  # pixel (i, j) shows luma[i + j]
    out[1].fill(128)  # grey has no chroma
    out[2].fill(128)


# RGB -> BT.601 limited-range Y, Cb, Cr: libswscale's default, and what players assume for untagged SD video
YUV_FROM_RGB = np.array([[65.481, 128.553, 24.966],
                         [-37.797, -74.203, 112.0],
                         [112.0, -93.786, -18.214]]) / 255
YUV_OFFSET = np.array([16.0, 128.0, 128.0])


def yuv_planes(photo: Image.Image) -> Planes:
    """A photo as full-size Y and half-size Cb, Cr planes (uint8 arrays), converted once per photo."""
    yuv = np.clip(np.rint(np.asarray(photo, dtype=np.float64) @ YUV_FROM_RGB.T + YUV_OFFSET), 0, 255)
    y, cb, cr = (np.ascontiguousarray(yuv[..., c], dtype=np.uint8) for c in range(3))
    half = ((photo.width + 1) // 2, (photo.height + 1) // 2)  # chroma: PIL's box filter halves the planes
    return y, *(np.array(Image.fromarray(c).resize(half, Image.BOX)) for c in (cb, cr))


def photo_planes(photo: Image.Image, cfg: RenderConfig) -> Planes:
    """A photo shrunk once so that the camera's widest view is the output's size, as Y, Cb, Cr planes.

    Every frame then only magnifies its crop (1x to ``cfg.zoom``), where plain bilinear interpolation needs
    no antialiasing filter: that is what makes ``_magnify`` cheap."""
    full_w = min(photo.width, photo.height * cfg.width / cfg.height)
    scale = cfg.width / full_w
    if scale < 1:
        photo = photo.resize((round(photo.width * scale), round(photo.height * scale)), Image.LANCZOS)
    return yuv_planes(photo)


@numba.njit(inline="always")
def _tap(x: float, n: int) -> tuple[int, int]:
    """Bilinear taps at position x in a row of n pixels: the left pixel, the right one's weight (of 256)."""
    x = min(max(x, 0.0), n - 1.0)
    i = min(int(x), n - 2)
    return i, int((x - i) * 256 + 0.5)


@numba.njit(inline="always")
def _resample_row(src_row: np.ndarray, cols: np.ndarray, right: np.ndarray, line: np.ndarray) -> None:
    """line[j] = src_row interpolated between pixels cols[j] and cols[j] + 1 (weight right[j] of 256)."""
    for j in range(line.shape[0]):
        c = cols[j]  # unsigned: numba then skips the negative-index wraparound test
        line[j] = np.int32(src_row[c]) * (256 - right[j]) + np.int32(src_row[c + np.uintp(1)]) * right[j]


@numba.njit(nogil=True, cache=True)
def _magnify(src: np.ndarray, x0: float, y0: float, x1: float, y1: float, out: np.ndarray) -> None:
    """Bilinearly resample the region (x0, y0)-(x1, y1) of src (pixel edges, like PIL's box) onto out.

    Separable: each source row is resampled horizontally once (magnifying, consecutive output rows share
    them), then output rows blend two such lines. Integer weights: the same bytes on every machine. The GIL
    is released, so videos render in parallel threads.
    """
    h, w = out.shape
    sx, sy = (x1 - x0) / w, (y1 - y0) / h
    cols, right = np.empty(w, np.uintp), np.empty(w, np.int32)
    for j in range(w):
        cols[j], right[j] = _tap(x0 + (j + 0.5) * sx - 0.5, src.shape[1])
    lines = np.empty((2, w), np.int32)  # source row q resampled horizontally, in lines[q % 2]
    ready = -2  # the lines hold source rows ready and ready + 1
    for i in range(h):
        r, wy = _tap(y0 + (i + 0.5) * sy - 0.5, src.shape[0])
        if r != ready:
            if r != ready + 1:
                _resample_row(src[r], cols, right, lines[r % 2])
            _resample_row(src[r + 1], cols, right, lines[(r + 1) % 2])
            ready = r
        above, below = lines[r % 2], lines[(r + 1) % 2]
        for j in range(w):
            out[i, j] = (above[j] * (256 - wy) + below[j] * wy + 32768) >> 16


@numba.njit(nogil=True, cache=True)
def _blend(a: np.ndarray, b: np.ndarray, alpha: int) -> None:
    """Move plane a alpha/256 of the way to plane b, in place (a cross-fade is linear: YUV blends as RGB)."""
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            a[i, j] = (a[i, j] * (256 - alpha) + b[i, j] * alpha + 128) >> 8


def plane_views(frame: np.ndarray, cfg: RenderConfig) -> Planes:
    """The Y, Cb, Cr planes of a (height * 3/2, width) yuv420p array (PyAV's layout), as views."""
    n, half = cfg.width * cfg.height, (cfg.height // 2, cfg.width // 2)
    y, cb, cr = np.split(frame.reshape(-1), [n, n * 5 // 4])
    return y.reshape(cfg.height, cfg.width), cb.reshape(half), cr.reshape(half)


def new_frame(cfg: RenderConfig) -> np.ndarray:
    """An uninitialised (height * 3/2, width) yuv420p array."""
    return np.empty((cfg.height * 3 // 2, cfg.width), np.uint8)


class Renderer:
    """Draws the yuv420p frame of a video at any time: moving crops of photographs, cross-faded.

    Frames are drawn straight in the encoder's pixel format (a Y plane and quarter-size chroma planes), into
    the encoder's own frame buffers. ``photos`` maps names to ``photo_planes``.
    """

    def __init__(self, scenes: list[Scene], photos: dict[str, Planes], cfg: RenderConfig) -> None:
        if cfg.width % 2 or cfg.height % 2:
            raise ValueError(f"yuv420p needs even dimensions, got {cfg.width}x{cfg.height}")
        self.scenes, self.photos, self.cfg = scenes, photos, cfg
        self.duration = scenes[-1].end
        self.incoming = plane_views(new_frame(cfg), cfg)  # the next scene during a cross-fade

    def draw_scene(self, scene: Scene, t: float, out: Planes) -> None:
        """Draw one scene's picture at time t into out (its motion spans the fades on both sides)."""
        cfg = self.cfg
        if scene.photo is None:
            filler_card(t, cfg, out)
            return
        pad = cfg.transition_s
        u = min(max((t - scene.start + pad) / (scene.end - scene.start + 2 * pad), 0.0), 1.0)
        planes = self.photos[scene.photo]
        height, width = planes[0].shape
        box = crop_box((width, height), scene, u, cfg)
        for src, target in zip(planes, out, strict=True):
            sx, sy = src.shape[1] / width, src.shape[0] / height  # the same region in chroma pixels
            _magnify(src, box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy, target)

    def draw(self, t: float, out: Planes) -> None:
        """Draw the frame at time t into out: the scene shown then, or a cross-fade between two."""
        for i, scene in enumerate(self.scenes):
            if t <= scene.end or i == len(self.scenes) - 1:
                if t >= scene.start or i == 0:
                    self.draw_scene(scene, t, out)
                    return
                previous = self.scenes[i - 1]  # inside the cross-fade previous -> scene
                alpha = round(256 * (t - previous.end) / (scene.start - previous.end))
                self.draw_scene(previous, t, out)
                self.draw_scene(scene, t, self.incoming)
                for a, b in zip(out, self.incoming, strict=True):
                    _blend(a, b, alpha)
                return
        raise AssertionError("unreachable: the last scene catches every t")

    def scene_frame(self, scene: Scene, t: float) -> np.ndarray:
        """One scene's picture at time t as a (height * 3/2, width) yuv420p array."""
        frame = new_frame(self.cfg)
        self.draw_scene(scene, t, plane_views(frame, self.cfg))
        return frame

    def frame(self, t: float) -> np.ndarray:
        """The frame at time t as a (height * 3/2, width) yuv420p array: rows of Y, Cb, Cr (PyAV's layout)."""
        frame = new_frame(self.cfg)
        self.draw(t, plane_views(frame, self.cfg))
        return frame


def encode_mp4(path: Path, renderer: Renderer, cfg: RenderConfig) -> None:
    """Write the rendered video as H.264/yuv420p mp4 (plays in browsers), atomically."""
    import av

    tmp = path.with_suffix(".tmp.mp4")
    n_frames = round(renderer.duration * cfg.fps)
    # faststart puts the index first so a browser can start playing before the download ends
    with av.open(str(tmp), "w", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream("libx264", rate=cfg.fps)
        stream.width, stream.height, stream.pix_fmt = cfg.width, cfg.height, "yuv420p"
        # one encoder thread: the bytes then do not depend on the machine (videos run in parallel instead)
        stream.options = {"crf": str(cfg.crf), "preset": cfg.preset, "x264-params": cfg.x264_params,
                          "threads": "1"}
        for k in range(n_frames):
            # a new frame each time (the encoder may still hold the last ones), drawn straight into its
            # planes: no copy (rows may be padded, hence the views)
            frame = av.VideoFrame(cfg.width, cfg.height, "yuv420p")
            renderer.draw(k / cfg.fps, tuple(np.frombuffer(p, np.uint8).reshape(p.height, p.line_size)
                                             [:, :p.width] for p in frame.planes))
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    os.replace(tmp, path)


def render_videos(jobs: dict[str, tuple[Path, list[Scene]]], photos: dict, cfg: RenderConfig
                  ) -> Iterator[str]:
    """Render video id -> (mp4 path, scenes) jobs, a video per CPU at a time (``photos``: the recipe's)."""
    if not jobs:
        return
    names = sorted({s.photo for _, scenes in jobs.values() for s in scenes if s.photo is not None})

    def prepare(name: str) -> Planes:
        return photo_planes(load_photo(photos[name]["source"], photos[name].get("index")), cfg)

    def render(video_id: str) -> str:
        path, scenes = jobs[video_id]
        log.info("rendering demo video %s (%.0f s) into %s", video_id, scenes[-1].end, path)
        used = {s.photo: planes[s.photo].result() for s in scenes if s.photo is not None}
        encode_mp4(path, Renderer(scenes, used, cfg), cfg)
        return video_id

    # threads suffice: drawing (numba), x264 and PIL release the GIL; longest videos first balances them
    order = sorted(jobs, key=lambda vid: -jobs[vid][1][-1].end)
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        # each photo prepared once for all videos; queued first, so a video never waits on an unstarted one
        planes = {name: pool.submit(prepare, name) for name in names}
        yield from pool.map(render, order)
