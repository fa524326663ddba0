"""A long H.264 clip made of real footage, generated at run time (never committed): real clips decoded,
resized to one size and frame rate, and written one after the other, looping, until the length asked for.

    python -m benchmarks.long_clip OUT.mp4 --seconds 600 [--sources DIR ...]

Default sources: the demo's shipped clips (``assets/demo_clips``, in every checkout) and, where present, the
project's shared test clips (``../shared/videos``).
"""

from __future__ import annotations

import argparse
from fractions import Fraction
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCES = (REPO / "assets" / "demo_clips", REPO.parent / "shared" / "videos")


def real_clips(folders: tuple[Path, ...] = DEFAULT_SOURCES) -> list[Path]:
    """The mp4 clips of the folders that exist, sorted by name within each folder."""
    return [p for folder in folders if folder.is_dir() for p in sorted(folder.glob("*.mp4"))]


def make_long_clip(out: Path, seconds: float, sources: list[Path], size: tuple[int, int] = (640, 360),
                   fps: int = 25) -> Path:
    """Write ``seconds`` of ``sources`` (looped in order) as one H.264 mp4 at ``size`` and ``fps``."""
    import av

    if not sources:
        raise FileNotFoundError("no source clips: pass --sources DIR with mp4 files")
    width, height = size
    total, written = int(round(seconds * fps)), 0
    with av.open(str(out), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast"}
        stream.codec_context.time_base = Fraction(1, fps)
        while written < total:
            for source in sources:
                for image in _frames(source, size, fps):
                    frame = av.VideoFrame.from_ndarray(image, format="rgb24")
                    frame.pts = written
                    container.mux(stream.encode(frame))
                    written += 1
                    if written == total:
                        break
                if written == total:
                    break
        container.mux(stream.encode())
    return out


def _frames(path: Path, size: tuple[int, int], fps: int):
    """RGB frames of one clip resized to ``size`` at ``fps``: each output time shows the source frame on
    screen then (frames repeated or dropped)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        period = 1.0 / float(stream.average_rate or fps)
        step, next_t, shown, last_t = 1.0 / fps, 0.0, None, 0.0
        for frame in container.decode(stream):
            if frame.time is None:
                continue
            while shown is not None and next_t < frame.time:
                yield shown
                next_t += step
            shown = frame.reformat(width=size[0], height=size[1], format="rgb24").to_ndarray()
            last_t = float(frame.time)
        while shown is not None and next_t < last_t + period:
            yield shown
            next_t += step


def main() -> None:
    """Write the clip named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--sources", type=Path, nargs="*", default=list(DEFAULT_SOURCES))
    args = parser.parse_args()
    make_long_clip(args.out, args.seconds, real_clips(tuple(args.sources)))
    print(args.out)


if __name__ == "__main__":
    main()
