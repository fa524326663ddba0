"""Building the demo videos: real clips (``assets/demo_clips``) strung together, cross-faded, with cards.

A video is a list of ``Scene`` s placed on the time axis (``prvr.demo.gallery.timeline``): a clip scene plays
its shipped clip from its first frame to its last (``loops`` times in a row); a filler scene is a plain grey
or black card. Neighbouring scenes are joined by a cross-fade from the last picture of one to the first
picture of the next, so a clip plays exactly from its scene's start to its end and fades and cards belong to
no moment. The shipped clips already have the output's size and frame rate: frames are decoded, blended in
the encoder's pixel format (yuv420p) with integer arithmetic and encoded with one encoder thread per video,
so a video is the same bytes on every machine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

GENERATOR_VERSION = 4  # bump whenever building changes: cached videos are then rebuilt (4: real clips)
CLIPS_DIR = Path(__file__).resolve().parents[2] / "assets" / "demo_clips"
# plain cards as BT.601 limited-range luma (chroma 128): RGB (128, 128, 128) and (0, 0, 0)
CARD_LUMA = {"grey": 126, "black": 16}


@dataclass(frozen=True)
class RenderConfig:
    width: int = 480  # 16:9 and small: building and feature extraction take seconds on 2 cores
    height: int = 270
    fps: int = 15  # the shipped clips' rate; the lite profile samples about one row per second
    transition_s: float = 1.0  # cross-fade length; belongs to no moment
    crf: int = 23  # x264's default quality
    # x264's superfast with fixed B-frames and NO macroblock tree: x264's mbtree reads uninitialised memory
    # (measured: the same pictures gave different bytes under MALLOC_PERTURB_=1 and 2, and from run to run
    # when several videos were encoded one after another); without it the bytes are the same every time
    preset: str = "superfast"
    x264_params: str = "mbtree=0:b-adapt=0"


@dataclass(frozen=True)
class Scene:
    clip: str | None  # the recipe's clip key; None for a filler card
    start: float  # the clip plays (or the card shows) from start to end (seconds)
    end: float
    loops: int = 1
    colour: str = "grey"  # a filler card's colour

    @property
    def photo(self) -> str | None:
        """Deprecated alias of ``clip`` (the gallery was once made of photographs)."""
        return self.clip


def clip_frame_count(clip: dict, cfg: RenderConfig) -> int:
    """Frames of one play of a recipe clip (its kept segments at the gallery's frame rate)."""
    return sum(round((last - first) * cfg.fps) for first, last in clip["segments"])


def clip_path(key: str, clips_dir: Path = CLIPS_DIR) -> Path:
    """The shipped file of a clip."""
    return clips_dir / f"{key}.mp4"


Picture = np.ndarray  # one yuv420p picture as a (height * 3/2, width) uint8 array (PyAV's layout)


def card(colour: str, cfg: RenderConfig) -> Picture:
    """A plain card: flat luma, no chroma."""
    picture = np.full((cfg.height * 3 // 2, cfg.width), 128, np.uint8)
    picture[:cfg.height] = CARD_LUMA[colour]
    return picture


def clip_pictures(path: Path, n_frames: int, cfg: RenderConfig) -> Iterator[Picture]:
    """The first ``n_frames`` pictures of a shipped clip, decoded to yuv420p."""
    import av

    count = 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if (stream.codec_context.width, stream.codec_context.height) != (cfg.width, cfg.height):
            raise ValueError(f"{path} is {stream.codec_context.width}x{stream.codec_context.height}, "
                             f"expected {cfg.width}x{cfg.height}")
        for frame in container.decode(stream):
            if count == n_frames:
                break
            yield frame.to_ndarray(format="yuv420p")
            count += 1
    if count < n_frames:
        raise ValueError(f"{path} has {count} frames, the recipe needs {n_frames}: re-run prvr.demo.clips")


def blend(a: Picture, b: Picture, alpha: int) -> Picture:
    """a moved alpha/256 of the way to b (a cross-fade is linear: YUV blends as RGB)."""
    return ((a.astype(np.uint16) * (256 - alpha) + b.astype(np.uint16) * alpha + 128) >> 8).astype(np.uint8)


class Composer:
    """The pictures of one video, in order: scenes, and cross-fades between them."""

    def __init__(self, scenes: list[Scene], frames: dict[str, int], cfg: RenderConfig,
                 clips_dir: Path = CLIPS_DIR) -> None:
        if cfg.width % 2 or cfg.height % 2:
            raise ValueError(f"yuv420p needs even dimensions, got {cfg.width}x{cfg.height}")
        self.scenes, self.frames, self.cfg, self.clips_dir = scenes, frames, cfg, clips_dir

    def scene_pictures(self, scene: Scene) -> Iterator[Picture]:
        """Every picture of one scene: its clip, ``loops`` times, or its card."""
        if scene.clip is None:
            picture = card(scene.colour, self.cfg)
            for _ in range(round((scene.end - scene.start) * self.cfg.fps)):
                yield picture
            return
        for _ in range(scene.loops):
            yield from clip_pictures(clip_path(scene.clip, self.clips_dir), self.frames[scene.clip], self.cfg)

    def first_picture(self, scene: Scene) -> Picture:
        return next(iter(self.scene_pictures(scene)))

    def pictures(self) -> Iterator[Picture]:
        """The whole video, picture by picture."""
        n_fade = round(self.cfg.transition_s * self.cfg.fps)
        for i, scene in enumerate(self.scenes):
            last = None
            for last in self.scene_pictures(scene):
                yield last
            if i + 1 < len(self.scenes):
                following = self.first_picture(self.scenes[i + 1])
                for j in range(n_fade):
                    yield blend(last, following, round(256 * (j + 1) / (n_fade + 1)))


def encode_mp4(path: Path, pictures: Iterator[Picture], cfg: RenderConfig) -> int:
    """Write yuv420p pictures as H.264 mp4 (plays in browsers), atomically; return the frame count."""
    import av

    tmp = path.with_suffix(".tmp.mp4")
    n = 0
    # faststart puts the index first so a browser can start playing before the download ends
    with av.open(str(tmp), "w", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream("libx264", rate=cfg.fps)
        stream.width, stream.height, stream.pix_fmt = cfg.width, cfg.height, "yuv420p"
        # one encoder thread: the bytes then do not depend on the machine (videos run in parallel instead)
        stream.options = {"crf": str(cfg.crf), "preset": cfg.preset, "x264-params": cfg.x264_params,
                          "threads": "1"}
        for picture in pictures:
            frame = av.VideoFrame.from_ndarray(picture, format="yuv420p")
            frame.pts, frame.time_base = n, Fraction(1, cfg.fps)
            container.mux(stream.encode(frame))
            n += 1
        container.mux(stream.encode())
    os.replace(tmp, path)
    return n


def render_videos(jobs: dict[str, tuple[Path, list[Scene]]], frames: dict[str, int], cfg: RenderConfig,
                  clips_dir: Path = CLIPS_DIR) -> Iterator[str]:
    """Build video id -> (mp4 path, scenes) jobs, a video per CPU at a time; yield each id when written.
    ``frames``: clip key -> frames of one play."""
    if not jobs:
        return

    def render(video_id: str) -> str:
        path, scenes = jobs[video_id]
        log.info("building demo video %s (%.0f s) into %s", video_id, scenes[-1].end, path)
        n = encode_mp4(path, Composer(scenes, frames, cfg, clips_dir).pictures(), cfg)
        expected = round(scenes[-1].end * cfg.fps)
        if n != expected:
            raise AssertionError(f"{video_id}: wrote {n} frames, its timeline has {expected}")
        return video_id

    # threads suffice: decoding and x264 release the GIL; longest videos first balances them
    order = sorted(jobs, key=lambda vid: -jobs[vid][1][-1].end)
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        yield from pool.map(render, order)
