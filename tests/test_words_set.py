"""The words dev set (prvr.evaluate.words_set): its recipe, its rendering and sidecars, the split by video,
the cached build, and the bootstrap of its ratios; built here from clips made on the spot (fast), and the
real recipe checked against ../shared where it is."""

import json
from pathlib import Path

import numpy as np
import pytest

from extract.words.segment import SOURCES
from prvr.demo.compose import RenderConfig, encode_mp4
from prvr.evaluate.annotated import load_moments_file
from prvr.evaluate.bootstrap import ratio_interval
from prvr.evaluate.words_set import (
    HALVES,
    RECIPE_PATH,
    RENDER,
    build,
    composite_spans,
    load_recipe,
    missing_sources,
    render_overlay,
    render_slide,
    sidecar_text,
    split_videos,
)
from prvr.evaluate.words_set import SOURCES as SET_SOURCES

SHARED = Path(__file__).resolve().parents[2] / "shared"


def _clip(path: Path, seconds: float, colour: tuple[int, int, int]) -> None:
    """A flat-coloured 10 fps clip of ``seconds`` (a stand-in for shared footage)."""
    cfg = RenderConfig(fps=10)
    import av

    picture = av.VideoFrame.from_ndarray(np.full((cfg.height, cfg.width, 3), colour, np.uint8),
                                         format="rgb24").reformat(format="yuv420p").to_ndarray()
    encode_mp4(path, iter([picture] * round(seconds * cfg.fps)), cfg)


TINY = {
    "real": [{"id": "talk", "file": "videos/talk.mp4", "spans": {"all": [0.0, 2.0]},
              "queries": [{"text": "the whole talk", "kind": "exact", "source": "speech",
                           "targets": ["all"]}]}],
    "composites": [
        {"id": "c1", "sidecar": "srt", "items": [
            {"clip": "videos/red.mp4", "from": 0, "to": 2,
             "overlays": [{"key": "name", "kind": "lower_third", "from": 0.5, "to": 1.5,
                           "lines": ["Ada Byron"]}],
             "says": [{"key": "hello", "from": 0.2, "to": 1.8, "text": "Hello from line one."}]},
            {"slide": {"key": "slide", "seconds": 1.5, "title": "Budget 42", "lines": ["Second line"]}},
            {"clip": "videos/blue.mp4", "from": 0.5, "to": 2.5,
             "says": [{"key": "bye", "from": 0.0, "to": 1.0, "text": "Goodbye, line two."}]}],
         "queries": [{"text": "Ada Byron", "kind": "exact", "source": "screen", "targets": ["name"]},
                     {"text": "budget 42 and a goodbye", "kind": "paraphrase", "source": "screen",
                      "targets": ["slide", "bye"]},
                     {"text": "Budget 24", "kind": "near_miss", "source": "screen", "targets": ["slide"]}]},
        {"id": "c2", "sidecar": "vtt", "items": [
            {"clip": "videos/blue.mp4", "from": 0, "to": 1,
             "says": [{"key": "only", "from": 0.0, "to": 1.0, "text": "The only line."}]}],
         "queries": [{"text": "the only line", "kind": "exact", "source": "subtitles",
                      "targets": ["only"]}]}],
}


@pytest.fixture()
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    """A shared folder of made-up clips and the tiny recipe over it."""
    shared = tmp_path / "shared"
    (shared / "videos").mkdir(parents=True)
    _clip(shared / "videos" / "red.mp4", 2.0, (200, 30, 30))
    _clip(shared / "videos" / "blue.mp4", 3.0, (30, 30, 200))
    _clip(shared / "videos" / "talk.mp4", 2.0, (90, 90, 90))
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(TINY))
    return shared, recipe


def test_spans_are_laid_out_on_whole_frames_in_item_order() -> None:
    spans, duration = composite_spans(TINY["composites"][0])
    assert spans == {"name": (0.5, 1.5), "hello": (0.2, 1.8), "slide": (2.0, 3.5), "bye": (3.5, 4.5)}
    assert duration == 5.5
    bad = {"id": "x", "items": [{"clip": "c", "from": 0, "to": 1,
                                 "says": [{"key": "k", "from": 0.5, "to": 1.5, "text": "t"}]}]}
    with pytest.raises(ValueError, match="outside its item"):
        composite_spans(bad)


def test_sidecars_are_srt_and_webvtt_with_the_lines_times(tmp_path: Path) -> None:
    import pysubs2

    entry = TINY["composites"][0]
    srt = sidecar_text(entry, "srt")
    assert srt.startswith("1\n00:00:00,200 --> 00:00:01,800\nHello from line one.\n")
    vtt = sidecar_text(entry, "vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.200 --> 00:00:01.800\nHello from line one.\n")
    for fmt, text in (("srt", srt), ("vtt", vtt)):
        (tmp_path / f"s.{fmt}").write_text(text)
        lines = [(e.start, e.end, e.plaintext) for e in pysubs2.load(str(tmp_path / f"s.{fmt}"))]
        assert lines == [(200, 1800, "Hello from line one."), (3500, 4500, "Goodbye, line two.")], fmt
    with pytest.raises(ValueError, match="srt or vtt"):
        sidecar_text(entry, "ass")


def test_text_is_drawn_where_the_recipe_puts_it() -> None:
    slide = render_slide({"title": "Budget 42", "lines": ["Second line"]})
    assert slide.shape == (RENDER.height, RENDER.width, 3)
    assert (slide == render_slide({"title": "Budget 42", "lines": ["Second line"]})).all()  # deterministic
    assert not (slide == render_slide({"title": "Budget 24", "lines": ["Second line"]})).all()
    grey = np.full((RENDER.height, RENDER.width, 3), 90, np.uint8)
    third = render_overlay(grey, {"kind": "lower_third", "lines": ["Ada Byron", "Engineer"]})
    u = RENDER.width // 480  # the layout's grid
    changed = (third != grey).any(axis=2)
    assert changed[-60 * u:].mean() > 0.5 and not changed[:150 * u].any()  # a bar at the bottom only
    sign = render_overlay(grey, {"kind": "sign", "lines": ["Gate C"]})
    changed = (sign != grey).any(axis=2)
    assert changed[16 * u:60 * u, -110 * u:-16 * u].mean() > 0.5
    assert not changed[120 * u:].any() and not changed[:, :200 * u].any()  # a box at the top right only
    with pytest.raises(ValueError, match="lower_third or sign"):
        render_overlay(grey, {"kind": "banner", "lines": ["x"]})


def test_a_rendered_slide_is_read_back_by_ocr() -> None:
    rapidocr = pytest.importorskip("rapidocr_onnxruntime")
    engine = rapidocr.RapidOCR()
    found, _ = engine(render_slide({"title": "Riverside Bridge Repairs",
                                    "lines": ["Budget: 2.7 million euros"]}))
    text = " ".join(line[1] for line in found or [])
    assert "Riverside Bridge Repairs" in text and "2.7 million" in text, text


def test_the_split_is_by_video_seeded_and_deals_real_clips_to_both_halves() -> None:
    recipe = load_recipe()
    halves = split_videos(recipe, 0)
    ids = [e["id"] for e in [*recipe["real"], *recipe["composites"]]]
    assert sorted(halves["tune"] + halves["check"]) == sorted(ids)
    assert not set(halves["tune"]) & set(halves["check"])
    assert abs(len(halves["tune"]) - len(halves["check"])) <= 1
    real = {e["id"] for e in recipe["real"]}
    assert all(set(halves[h]) & real for h in HALVES)  # speech and subtitle tracks on both sides
    assert split_videos(recipe, 0) == halves and split_videos(recipe, 1) != halves


def test_the_recipe_is_consistent(tmp_path: Path) -> None:
    assert SET_SOURCES == SOURCES
    recipe = load_recipe()
    queries = [q for e in [*recipe["real"], *recipe["composites"]] for q in e["queries"]]
    kinds = {k: sum(q["kind"] == k for q in queries) for k in ("exact", "paraphrase", "near_miss")}
    assert kinds["exact"] >= 40 and kinds["paraphrase"] >= 25 and kinds["near_miss"] >= 25, kinds
    assert {q["source"] for q in queries} == set(SOURCES)
    assert {e.get("sidecar") for e in recipe["composites"]} == {"srt", "vtt", None}
    broken = json.loads(RECIPE_PATH.read_text())
    broken["composites"][0]["queries"][0]["targets"] = ["nowhere"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="nowhere"):
        load_recipe(path)


def test_build_writes_videos_sidecars_and_halves_and_reuses_them(tiny, tmp_path: Path) -> None:
    shared, recipe = tiny
    root = tmp_path / "set"
    built = build(shared, root, seed=0, recipe_path=recipe)
    assert sorted(p.name for p in root.iterdir() if p.suffix in (".mp4", ".srt", ".vtt")) == [
        "c1.mp4", "c1.srt", "c2.mp4", "c2.vtt", "talk.mp4"]
    assert (root / "talk.mp4").read_bytes() == (shared / "videos" / "talk.mp4").read_bytes()  # kept whole
    import av

    with av.open(str(root / "c1.mp4")) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 55 and frames[0].shape == (RENDER.height, RENDER.width, 3)  # 2 + 1.5 + 2 s, 10 fps
    assert frames[3].mean(axis=(0, 1))[0] > 150 and frames[50].mean(axis=(0, 1))[2] > 150  # red, then blue
    assert (frames[10][-60:] != frames[3][-60:]).any()  # the lower-third from 0.5 s
    assert (root / "c1.srt").read_text() == sidecar_text(TINY["composites"][0], "srt")
    every = {"tune": [], "check": []}
    for half in HALVES:
        spec = json.loads(built.moments[half].read_text())
        aset = load_moments_file(root, built.moments[half])
        assert {vid for vid, _ in aset.videos} == {"c1.mp4", "c2.mp4", "talk.mp4"}  # every video, both halves
        every[half] = [(q.text, q.clip, q.kind, q.source) for q in aset.queries]
        for q in aset.queries:
            assert set(q.moments) == {f"{q.clip}.mp4"}
        if any(q.clip == "c1" for q in aset.queries):
            got = {q.text: q.moments["c1.mp4"] for q in aset.queries if q.clip == "c1"}
            assert got == {"Ada Byron": ((0.5, 1.5),), "budget 42 and a goodbye": ((2.0, 3.5), (3.5, 4.5))}
            assert spec["near_miss"] == [{"text": "Budget 24", "near": "c1.mp4", "source": "screen",
                                          "spans": [[2.0, 3.5]]}]
    assert not {c for *_, c, _, _ in every["tune"]} & {c for *_, c, _, _ in every["check"]}
    assert ("the whole talk", "talk", "exact", "speech") in every["tune"] + every["check"]
    stamp = (root / "c1.mp4").stat().st_mtime_ns
    build(shared, root, seed=0, recipe_path=recipe)
    assert (root / "c1.mp4").stat().st_mtime_ns == stamp  # cached
    changed = json.loads(recipe.read_text())
    changed["composites"][0]["items"][1]["slide"]["title"] = "Budget 43"
    changed["composites"][1]["sidecar"] = None
    recipe.write_text(json.dumps(changed))
    build(shared, root, seed=0, recipe_path=recipe)
    assert (root / "c1.mp4").stat().st_mtime_ns != stamp and not (root / "c2.vtt").exists()


def test_build_names_the_missing_clips(tiny, tmp_path: Path) -> None:
    shared, recipe = tiny
    (shared / "videos" / "blue.mp4").unlink()
    with pytest.raises(FileNotFoundError, match="videos/blue.mp4"):
        build(shared, tmp_path / "set", recipe_path=recipe)
    assert not (tmp_path / "set").exists()  # nothing written


def test_the_real_recipe_finds_its_clips_in_shared() -> None:
    if not (SHARED / "videos_dev").is_dir():
        pytest.skip(f"../shared not found at {SHARED}")
    assert missing_sources(load_recipe(), SHARED) == []


def test_ratios_are_bootstrapped_as_ratios_of_sums() -> None:
    got = ratio_interval([1, 0, 2, 0], [1, 1, 2, 0])  # 3 right of 4
    assert got["value"] == 0.75 and (got["num"], got["den"]) == (3.0, 4.0)
    assert got["low"] <= 0.75 <= got["high"]
    assert ratio_interval([0, 0], [0, 0])["value"] is None
    assert ratio_interval([1, 1], [1, 1])["low"] == 1.0
    grouped = ratio_interval([1, 1, 0, 0], [1, 1, 1, 1], groups=["a", "a", "b", "b"])
    assert grouped["value"] == 0.5 and grouped["low"] == 0.0 and grouped["high"] == 1.0  # two groups only
