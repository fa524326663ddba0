"""Labels that know which model is speaking (issue 35, items 2-5): per-model calibrations, the "none" label,
one vocabulary, and the dev-set commands for any model (``benchmarks.calibrate``,
``prvr.evaluate --profile``), end to end with a full-size random CLIP ViT-B/32 (tests/full_size_clip.py)."""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

import prvr  # noqa: F401  - the compatibility fix first
from prvr.index import GalleryVideo, IndexConfig, VideoIndex
from prvr.models.bridge import BridgeConfig, BridgeModel
from prvr.results.confidence import (
    LABEL_WORDS,
    SHIPPED_CALIBRATIONS,
    Calibration,
    Calibrator,
    ConfidenceConfig,
    calibration_key,
    find_calibration,
    load_reference_captions,
    model_identity,
    summary_words,
)
from prvr.results.search import search
from tests.clips import write_clip

README = Path(__file__).resolve().parents[1] / "README.md"
DIM_V, DIM_T, CLASSES = 12, 16, 10


def toy_model(weights: str = "a") -> BridgeModel:
    """A bridge with a random classifier over random class embeddings; ``weights`` names its weights."""
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(DIM_V, CLASSES)
    with torch.no_grad():
        head.weight.copy_(torch.randn(CLASSES, DIM_V, generator=gen) * 3)
        head.bias.zero_()
    return BridgeModel(head, torch.randn(CLASSES, DIM_T, generator=gen), BridgeConfig(top_k=3),
                       profile={"name": "toy", "weights": {"toy": weights}})


class HashEncoder:
    """Token rows seeded by the text (no model)."""

    backbone = None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        gens = [np.random.default_rng(zlib.crc32(t.encode())) for t in texts]
        return [g.normal(size=(3, DIM_T)).astype(np.float32) for g in gens]


def toy_gallery(model: BridgeModel, calibrator: Calibrator, root: Path) -> VideoIndex:
    """Four random videos indexed with the calibrator's reference bank."""
    gen = np.random.default_rng(1)
    index = VideoIndex.create(root, model, IndexConfig(), calibrator.reference_queries)
    videos = []
    for i in range(4):
        rows = np.abs(gen.normal(size=(30, DIM_V))).astype(np.float32)
        t = np.arange(30.0)
        videos.append(GalleryVideo(f"v{i}", rows, t, t + 1, 30.0))
    index.add(videos)
    return index


# ----------------------------------------------------------------------------- item 2: per-model calibrations
def test_a_model_without_a_calibration_never_says_strong_and_says_why(tmp_path: Path) -> None:
    model = toy_model()
    cal = Calibrator.for_model(model, HashEncoder(), cache_dir=tmp_path / "confidence")
    about = cal.describe()
    assert about["calibrated"] is False and "python -m benchmarks.calibrate --profile toy" in about["reason"]
    index = toy_gallery(model, cal, tmp_path / "ix")
    hit = index.rank(np.ones(DIM_T, np.float32), k=4).hits[0]  # any hit: its own rows make a perfect query
    perfect = np.asarray(hit.fine, np.float32).mean(0)[None].repeat(2, 0)
    response = search([index], perfect, k=4, confidence=cal.confidence())
    assert not response.calibrated and response.no_strong_match
    assert {r["confidence"] for r in response} == {"low"}
    cfg = ConfidenceConfig(high_margin=0.0, medium_margin=0.0)
    given = Calibrator.for_model(model, HashEncoder(), cfg=cfg)
    assert search([index], perfect, k=4, confidence=given.confidence())[0]["confidence"] == "high"


def test_calibrations_are_stored_per_model_with_their_source_and_found(tmp_path: Path) -> None:
    model, other = toy_model("a"), toy_model("b")
    cfg = ConfidenceConfig(high_margin=0.05, medium_margin=0.05, none_quantile=0.5, none_margin=-0.1)
    source = {"command": "python -m benchmarks.calibrate --profile toy", "data": "a test"}
    path = Calibration(cfg, model_identity(model), source, {"check": {"n": 1}}).write(tmp_path)
    assert path.parent == tmp_path and json.loads(path.read_text())["cuts"]["none_quantile"] == 0.5
    found = Calibrator.for_model(model, HashEncoder(), cache_dir=tmp_path)
    assert found.cfg == cfg and found.describe()["calibrated"] is True
    assert found.describe()["source"] == source and found.describe()["file"] == path.name
    assert find_calibration(other, [tmp_path]) is None  # other weights: not this calibration
    renamed = tmp_path / "elsewhere" / f"toy-{calibration_key(model_identity(other))}.json"
    renamed.parent.mkdir()
    renamed.write_text(path.read_text())  # named for the other model, made for this one: not the other's
    assert find_calibration(other, [renamed.parent]) is None
    assert Calibrator.for_model(other, HashEncoder(), cache_dir=tmp_path).describe()["calibrated"] is False
    path.write_text("{not json")
    assert find_calibration(model, [tmp_path]) is None  # an unreadable file is skipped, not fatal


def test_the_offline_default_ships_its_calibration_from_the_calibrate_command() -> None:
    lite = BridgeModel.from_pretrained()
    found = find_calibration(lite)
    assert found is not None and Path(found.path).parent == SHIPPED_CALIBRATIONS
    assert found.source["command"] == "python -m benchmarks.calibrate --profile lite"
    assert "tune.json" in found.source["data"] and "check.json" in found.source["data"]
    check = found.measured["check"]
    for name in ("strong_precision", "strong_recall", "relevant_none", "off_topic_top_none"):
        assert set(check[name]) >= {"value", "low", "high", "n"}
    captions = "\n".join(load_reference_captions())
    assert found.source["reference_captions"] == hashlib.sha256(captions.encode()).hexdigest()[:16]


def test_a_recalibration_in_the_data_dir_wins_over_the_shipped_calibration(tmp_path: Path) -> None:
    """``python -m benchmarks.calibrate`` writes into the data dir's ``confidence/``: a model calibrated
    there again is labelled by that calibration, not by the one shipped for it."""
    lite = BridgeModel.from_pretrained()
    shipped = find_calibration(lite)
    assert shipped is not None and Path(shipped.path).parent == SHIPPED_CALIBRATIONS
    cfg = ConfidenceConfig(high_margin=shipped.cfg.high_margin + 0.05, medium_margin=0.01)
    mine = Calibration(cfg, model_identity(lite), {"command": "recalibrated"}).write(tmp_path / "confidence")
    found = find_calibration(lite, [tmp_path / "confidence"])
    assert found is not None and Path(found.path) == mine and found.cfg == cfg
    assert find_calibration(lite, [tmp_path / "nothing here"]).path == shipped.path


def test_info_says_whether_the_labels_are_calibrated(make_predictor, tmp_path: Path) -> None:
    """The predictor's /info description carries the calibration of the model it serves."""
    served = make_predictor(tmp_path / "lite").describe()["confidence"]  # the offline default: shipped
    assert served["calibrated"] is True and served["file"].startswith("lite-")
    assert served["source"]["command"] == "python -m benchmarks.calibrate --profile lite"
    assert {"tune", "check"} <= set(served["measured"])


# ------------------------------------------------------------------------ items 3 and 4: none, one vocabulary
def test_none_label_and_words_in_every_result(tmp_path: Path) -> None:
    model = toy_model()
    # none: not above the best reference caption on the video (strong: above it by 0.5)
    cfg = ConfidenceConfig(high_margin=0.5, medium_margin=0.5, none_quantile=1.0, none_margin=0.0)
    cal = Calibrator.for_model(model, HashEncoder(), cfg=cfg)
    index = toy_gallery(model, cal, tmp_path / "ix")
    response = search([index], HashEncoder().encode(["zzz"])[0], k=4, confidence=cal.confidence())
    assert response.no_match and all(r["confidence"] == "none" for r in response)
    for r in response:
        assert r["confidence_label"] == LABEL_WORDS[r["confidence"]] == "no match"
    assert response.to_dict()["no_match"] is True and response.to_dict()["calibrated"] is True
    kind, words = summary_words([r["confidence"] for r in response], response.calibrated)
    assert kind == "none" and "nothing like this" in words


def test_one_vocabulary_on_the_page_in_the_api_and_in_the_readme() -> None:
    import app

    result = {"rank": 1, "title": "t", "video_id": "v", "duration": 10.0, "confidence": "none",
              "confidence_label": LABEL_WORDS["none"], "score": 0.1, "clip_score": 0.1, "frame_score": 0.1,
              "key_moment": {"start": 0.0, "end": 1.0, "contrast": 1.0}, "moments": [],
              "heatmap": {"start": [0.0], "end": [1.0], "score": [0.1]},
              "attention": {"time": [], "weight": []}}
    assert '<span class="badge badge-none">no match</span>' in app.card_html(result, 0.7, (0.0, 1.0))
    assert summary_words(["low", "low"], calibrated=False)[0] == "uncalibrated"
    assert summary_words(["high", "low"], calibrated=True) == ("strong", "1 strong match")
    assert summary_words([], calibrated=True)[0] == "unconfirmed"  # no results: not "nothing like this"
    readme = README.read_text()
    for label, words in LABEL_WORDS.items():  # each machine value beside its words
        assert re.search(rf"`{label}`[^|\n]*\|[^|\n]*{words}", readme), (label, words)
    assert "`confidence_label`" in readme and '"calibrated": false' in readme


# ------------------------------------------------------------------------ items 2 and 5 end to end, full size
def coloured(colour: tuple[int, int, int]):
    """A picture of one colour with a moving white bar (for tests.clips.write_clip)."""
    def picture(i: int, w: int, h: int) -> np.ndarray:
        img = np.zeros((h, w, 3), np.uint8) + np.array(colour, np.uint8)
        img[:, (i * 9) % (w - 10) : (i * 9) % (w - 10) + 10] = 255
        return img

    return picture


@pytest.fixture(scope="module")
def tiny_dev_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three videos with tune.json and check.json moments files, as benchmarks.dev_set writes them."""
    root = tmp_path_factory.mktemp("dev_set")
    colours = {"red.mp4": (200, 30, 30), "green.mp4": (30, 200, 30), "blue.mp4": (30, 30, 200)}
    for name, colour in colours.items():
        write_clip(root / name, frames=15, fps=5, size=(160, 96), picture=coloured(colour))
    for half, texts in (("tune", ("a red screen", "a green screen")), ("check", ("a blue screen",))):
        videos = [{"file": f"{t.split()[1]}.mp4", "queries": [{"text": t, "start": 0.0, "end": 3.0,
                                                                 "clip": t.split()[1], "kind": "clip"}]}
                  for t in texts]
        (root / f"{half}.json").write_text(json.dumps({"videos": videos}))
    return root


def test_calibrate_and_evaluate_any_model_end_to_end(full_clip_b32: Path, tiny_dev_set: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    from benchmarks.calibrate import main as calibrate
    from extract.pipeline import TextEncoder
    from prvr.evaluate.__main__ import main as evaluate
    from prvr.models.zero_shot import ZeroShotModel

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the reference tokens' cache
    clip_b32 = full_clip_b32
    weights = f"clip={clip_b32}"
    report = evaluate(["--videos", str(tiny_dev_set), "--moments", str(tiny_dev_set / "tune.json"),
                       "--profile", "clip", "--weights", weights, "--json"])
    assert report["profile"] == "clip" and report["queries"] == 2 and report["videos"] == 3
    assert 0 <= report["metrics"]["two_branch"]["R@1"] <= 100 and "ci" in report
    assert list(tiny_dev_set.glob(".prvr-features-clip-*.h5"))  # its own cache beside lite's
    out = tmp_path / "data" / "confidence"
    off_topic = [tmp_path / "off_tune.txt", tmp_path / "off_check.txt"]
    off_topic[0].write_text("# tuning\na volcano erupts at night\nasdf qwer\n")
    off_topic[1].write_text("a giraffe eats leaves\nwibble wobble\n")
    got = calibrate(["--profile", "clip", "--weights", weights, "--dev-set", str(tiny_dev_set),
                     "--off-topic", *map(str, off_topic), "--out", str(out)])
    assert got["measured"]["check"]["off_topic_queries"] == 2
    assert Path(got["written"]).parent == out and set(got["measured"]) == {"tune", "check"}
    capsys.readouterr()
    model = ZeroShotModel.from_pretrained(str(clip_b32), device="cpu")
    found = Calibrator.for_model(model, TextEncoder("clip", {"clip": str(clip_b32)}, device="cpu"),
                                 cache_dir=out)  # where the app (data dir's confidence/) looks
    about = found.describe()
    assert about["calibrated"] is True and about["file"] == Path(got["written"]).name
    command = f"python -m benchmarks.calibrate --profile clip --weights {weights}"
    assert about["source"]["command"].startswith(command)
    assert found.cfg == ConfidenceConfig(**got["cuts"])
