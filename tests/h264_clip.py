"""A small H.264 clip whose frames change over time, written with PyAV (tests/test_spaces.py and the
ZeroGPU stand-in it runs in a fresh process)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np


def encode(path: Path, seconds: float = 6.0, fps: int = 10, size: tuple[int, int] = (64, 48)) -> Path:
    """An H.264 clip at ``path``: red rising and blue falling in its top-left quarter, frame by frame."""
    import av

    width, height = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "g": str(fps)}
        stream.codec_context.time_base = Fraction(1, 1000)
        for i in range(int(seconds * fps)):
            rgb = np.zeros((height, width, 3), np.uint8)
            rgb[..., 0] = min(255, 4 * i)
            rgb[: height // 2, : width // 2, 2] = 255 - min(255, 4 * i)
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts, frame.time_base = round(1000 * i / fps), Fraction(1, 1000)
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path
