"""The real clips the demo gallery is made of: trimmed, small re-encoded copies in ``assets/demo_clips``.

Maintainer tool, run once when the recipe's ``clips`` change (the app never runs it: it reads the shipped
files). Only footage published for reuse is shipped (MDN's CC0 media, Intel's CC-BY-4.0 sample videos, NASA
footage): ``/work/shared/videos_dev/manifest.json`` marks it ``may_ship``, and this tool refuses any other.

    python -m prvr.demo.clips [--source ../shared/videos_dev] [--out assets/demo_clips]

Each clip keeps the recipe's ``segments`` (seconds of the source, joined in order), sampled at the gallery's
frame rate (the newest source frame at each output instant), fitted into 480x270 with black bars (aspect
kept),
encoded as H.264/yuv420p without audio, and written with ``CREDITS.md`` beside them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

import numpy as np
from PIL import Image

from prvr.demo.compose import CLIPS_DIR, RenderConfig, clip_frame_count
from prvr.demo.gallery import SPEC_PATH, load_spec

DEFAULT_SOURCE = Path(__file__).resolve().parents[3] / "shared" / "videos_dev"
SHIP_CRF = 26  # re-encoded once more into each composite: a little more quality than the composites' own


def letterbox(image: Image.Image, cfg: RenderConfig) -> np.ndarray:
    """An RGB picture fitted inside the gallery's frame (aspect kept, black bars), as a uint8 array."""
    scale = min(cfg.width / image.width, cfg.height / image.height)
    size = (max(2, round(image.width * scale)), max(2, round(image.height * scale)))
    canvas = Image.new("RGB", (cfg.width, cfg.height))
    canvas.paste(image.convert("RGB").resize(size, Image.LANCZOS),
                 ((cfg.width - size[0]) // 2, (cfg.height - size[1]) // 2))
    return np.asarray(canvas)


def source_pictures(path: Path, segments: list, cfg: RenderConfig) -> list[np.ndarray]:
    """The kept seconds of a source video at the gallery's frame rate, letterboxed RGB arrays."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        decoded, origin = [], None
        for frame in container.decode(stream):  # keep only frames near the kept seconds (memory)
            t = float(frame.pts * frame.time_base)
            origin = t if origin is None else origin  # the first frame is 0 s
            if any(first - 1 <= t - origin <= last + 1 for first, last in segments):
                decoded.append((t - origin, frame.to_image()))
    decoded.sort(key=lambda x: x[0])
    times = np.array([t for t, _ in decoded])
    pictures = []
    for first, last in segments:
        for k in range(round((last - first) * cfg.fps)):
            t = first + k / cfg.fps
            i = max(int(np.searchsorted(times, t + 1e-6, side="right")) - 1, 0)  # newest frame shown at t
            if abs(times[i] - t) > 1:
                raise ValueError(f"{path}: no frame near {t:.2f} s")
            pictures.append(letterbox(decoded[i][1], cfg))
    return pictures


def encode_clip(path: Path, pictures: list[np.ndarray], cfg: RenderConfig) -> None:
    """H.264/yuv420p mp4, no audio, written atomically."""
    import av

    tmp = path.with_suffix(".tmp.mp4")
    with av.open(str(tmp), "w", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream("libx264", rate=cfg.fps)
        stream.width, stream.height, stream.pix_fmt = cfg.width, cfg.height, "yuv420p"
        stream.options = {"crf": str(SHIP_CRF), "preset": "slow", "threads": "1"}
        for picture in pictures:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
        container.mux(stream.encode())
    os.replace(tmp, path)


def credits(spec: dict, out: Path) -> str:
    """CREDITS.md for the shipped clips."""
    lines = ["# Credits for the demo clips", "",
             "Each file is a trimmed piece of a freely licensed video, scaled to 480x270 with black bars, "
             f"resampled to {RenderConfig().fps} fps and re-encoded (H.264, no audio) by `python -m "
             "prvr.demo.clips`. The demo gallery (`assets/demo_gallery.json`) strings them into longer "
             "videos on first start. Licences: CC0-1.0 (no conditions), CC-BY-4.0 (credit as below; changes: "
             "trimmed, "
             "scaled, re-encoded), NASA footage (public domain; NASA does not endorse this project).", "",
             "| file | source repository | path | commit | seconds kept | licence | author | sha256 |",
             "|---|---|---|---|---|---|---|---|"]
    for key, clip in spec["clips"].items():
        src = clip["source"]
        kept = ", ".join(f"{a:g}-{b:g}" for a, b in clip["segments"])
        sha = hashlib.sha256((out / f"{key}.mp4").read_bytes()).hexdigest()[:16]
        lines.append(f"| {key}.mp4 | https://github.com/{src['repo']} | {src['path']} | {src['commit']} | "
                     f"{kept} | {src['license']} | {src.get('author', 'unknown')} | {sha}... |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m prvr.demo.clips", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="folder of the source clips")
    parser.add_argument("--out", type=Path, default=CLIPS_DIR)
    parser.add_argument("--only", nargs="+", default=None, help="only these clip keys")
    args = parser.parse_args(argv)
    spec, cfg = load_spec(SPEC_PATH), RenderConfig()
    manifest = {c["file"]: c for c in json.loads((args.source / "manifest.json").read_text())}
    args.out.mkdir(parents=True, exist_ok=True)
    for key, clip in spec["clips"].items():
        if args.only and key not in args.only:
            continue
        entry = manifest.get(clip["source"]["file"])
        if entry is None or not entry.get("may_ship"):
            raise SystemExit(f"{clip['source']['file']} is not marked may_ship in the manifest: not shipped")
        pictures = source_pictures(args.source / clip["source"]["file"], clip["segments"], cfg)
        assert len(pictures) == clip_frame_count(clip, cfg), key
        encode_clip(args.out / f"{key}.mp4", pictures, cfg)
        print(f"{key}: {len(pictures)} frames, {(args.out / f'{key}.mp4').stat().st_size / 1e3:.0f} kB")
    (args.out / "CREDITS.md").write_text(credits(spec, args.out))


if __name__ == "__main__":
    main()
