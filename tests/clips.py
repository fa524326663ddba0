"""The suite's one writer of synthetic media: small videos (any codec PyAV encodes) and an audio-only file.

Pictures (what frame ``i`` shows; both change every frame, so frames can be told apart):
- ``gradient``: a horizontal grey ramp sliding by ``10 * i`` levels (default);
- ``marked``: red = ``8 * i`` (capped at 255) and a green block in the top-left quarter, so a test can tell
  frames apart by their red level and the picture's orientation by the block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

Picture = Callable[[int, int, int], np.ndarray]  # (frame number, width, height) -> (H, W, 3) uint8


def gradient(i: int, width: int, height: int) -> np.ndarray:
    """A grey ramp across the frame, sliding by 10 levels a frame."""
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    return np.ascontiguousarray(np.broadcast_to((x + 10 * i) % 256, (height, width, 3)), np.uint8)


def marked(i: int, width: int, height: int) -> np.ndarray:
    """Red rising 8 levels a frame, and a green block in the top-left quarter."""
    rgb = np.zeros((height, width, 3), np.uint8)
    rgb[..., 0] = min(255, 8 * i)
    rgb[: height // 2, : width // 2, 1] = 255
    return rgb


def write_clip(path: Path, frames: int = 24, fps: int = 12, size: tuple[int, int] = (64, 48),
               codec: str = "libx264", picture: Picture = gradient, *, rotation: int | None = None,
               pts_ms: Sequence[int] | None = None, container_options: dict | None = None) -> Path:
    """Write ``frames`` frames of ``picture`` at ``fps`` into ``path`` (its folder made if missing).

    ``codec``: "libx264" (4:2:0 where the size is even, else 4:4:4, which browsers cannot play), "mpeg4", ...
    ``pts_ms``: each frame's time in ms (a variable frame rate), instead of ``frames`` at ``fps``.
    ``rotation``: display rotation metadata in degrees. ``container_options``: e.g. ``{"movflags": ...}``.
    """
    import av

    width, height = size
    # a frame's pts in ticks of time_base: 1/fps at a constant rate (AVI stores one frame a tick), else ms
    time_base = Fraction(1, fps) if pts_ms is None else Fraction(1, 1000)
    times = list(range(frames)) if pts_ms is None else list(pts_ms)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", options=container_options or {}) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = width, height
        even = width % 2 == 0 and height % 2 == 0
        stream.pix_fmt = "yuv420p" if even or codec != "libx264" else "yuv444p"
        if codec == "libx264":
            stream.options = {"preset": "ultrafast", "g": str(fps)}
        stream.codec_context.time_base = time_base
        if rotation is not None:
            stream.set_display_rotation(rotation)
        for i, pts in enumerate(times):
            frame = av.VideoFrame.from_ndarray(picture(i, width, height), format="rgb24")
            frame.pts, frame.time_base = pts, time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def write_audio(path: Path, seconds: float = 1.0) -> Path:
    """An audio-only AAC file (a soft tone): media with no video stream."""
    import av

    rate = 16000
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=rate)
        samples = int(rate * seconds)
        tone = (0.1 * np.sin(np.arange(samples) * 0.05)).astype(np.float32)[None]
        for lo in range(0, samples, 1024):  # the AAC encoder's frame size
            frame = av.AudioFrame.from_ndarray(tone[:, lo : lo + 1024], format="fltp", layout="mono")
            frame.sample_rate = rate
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path
