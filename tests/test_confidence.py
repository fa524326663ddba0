"""Confidence labels depend on the pair, the video's stored reference scores, the weights, the model and the
reference bank only (through search: tests/test_results.py)."""

import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

import prvr  # noqa: F401  - applies the compatibility fix first
from prvr.models.bridge import BridgeConfig, BridgeModel
from prvr.results.confidence import (
    REFERENCE_CAPTIONS,
    Calibrator,
    ConfidenceConfig,
    VideoNull,
    cuts,
    labels,
    load_reference_captions,
)

DIM_V, DIM_T, CLASSES = 12, 16, 10


def random_model(seed: int = 0) -> BridgeModel:
    """A bridge with a random classifier over random 'class embeddings' (no downloads)."""
    gen = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(DIM_V, CLASSES)
    with torch.no_grad():
        head.weight.copy_(torch.randn(CLASSES, DIM_V, generator=gen) * 3)
        head.bias.zero_()
    return BridgeModel(head, torch.randn(CLASSES, DIM_T, generator=gen), BridgeConfig(top_k=3),
                       profile={"name": "toy"})


class HashEncoder:
    """A deterministic stand-in text encoder: token rows seeded by the text; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.backbone = type("B", (), {"name": "hash", "weights": type("W", (), {"identity": "hash-v1"})()})()

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        self.calls += 1
        gens = [np.random.default_rng(zlib.crc32(t.encode())) for t in texts]
        shapes = [(3 + len(t) % 4, DIM_T) for t in texts]
        return [g.normal(size=s).astype(np.float32) for g, s in zip(gens, shapes, strict=True)]


def videos(n: int, seed: int) -> list[np.ndarray]:
    """``n`` random raw videos of 10-40 rows."""
    gen = np.random.default_rng(seed)
    return [gen.normal(size=(int(gen.integers(10, 40)), DIM_V)).astype(np.float32) for _ in range(n)]


@pytest.fixture(scope="module")
def cal() -> Calibrator:
    return Calibrator.for_model(random_model(), HashEncoder())


def test_a_reference_caption_is_never_high_and_a_fifth_beat_the_medium_cut(cal: Calibrator) -> None:
    rows = videos(5, seed=4)
    s = cal.model.score(cal.references, cal.model.encode_videos(rows))  # (R, Nv): the bank itself
    quantiles = ConfidenceConfig(medium_quantile=0.8, high_margin=0.0, medium_margin=0.0)
    for w in ((0.7, 0.3), (1.0, 0.0), (0.0, 1.0)):
        totals = (w[0] * s.clip.double() + w[1] * s.frame.double()).numpy()  # as cuts computes them
        nulls = [cuts(s.clip[:, j].numpy(), s.frame[:, j].numpy(), w, quantiles) for j in range(len(rows))]
        default = [cuts(s.clip[:, j].numpy(), s.frame[:, j].numpy(), w) for j in range(len(rows))]
        for row in totals:
            assert "high" not in labels(row, nulls) and set(labels(row, default)) == {"low"}
        medium = [(totals[:, j] > null.medium).mean() for j, null in enumerate(nulls)]
        assert all(0.15 <= m <= 0.25 for m in medium)  # 80th percentile: about a fifth of the bank beats it
        for j, null in enumerate(default):  # the default: the margin over the best caption, no possible band
            assert null.high == null.medium == pytest.approx(totals[:, j].max() + 0.1)


def test_each_cut_adds_its_own_margin_to_its_own_quantile() -> None:
    """A calibration whose margins differ (the shipped ones happen to be equal): the high cut is the high
    quantile of the bank's totals plus ``high_margin``, the medium cut the medium quantile plus
    ``medium_margin``, the none cut the none quantile plus ``none_margin``; labels follow them."""
    gen = np.random.default_rng(7)
    clip, frame = gen.normal(size=200), gen.normal(size=200)
    w = (0.6, 0.4)
    totals = w[0] * clip + w[1] * frame
    cfg = ConfidenceConfig(medium_quantile=0.9, high_quantile=1.0, high_margin=0.3, medium_margin=0.05,
                           none_quantile=0.5, none_margin=-0.02)
    null = cuts(clip, frame, w, cfg)
    assert null.high == pytest.approx(totals.max() + 0.3)
    assert null.medium == pytest.approx(np.quantile(totals, 0.9, method="higher") + 0.05)
    assert null.none == pytest.approx(np.quantile(totals, 0.5, method="lower") - 0.02)
    best = totals.max()
    assert labels([best + 0.31, best + 0.29, best + 0.06, null.none - 0.01], [null] * 4) == \
        ["high", "medium", "medium", "none"]


def test_cuts_are_strict_and_abstain_means_no_high(cal: Calibrator) -> None:
    null = VideoNull(medium=0.3, high=0.5)
    got = [Calibrator.label(s, null) for s in (0.3, 0.30001, 0.5, 0.50001)]
    assert got == ["low", "medium", "medium", "high"]
    assert Calibrator.no_strong_match(["medium", "low"]) and not Calibrator.no_strong_match(["low", "high"])
    assert labels([0.9, 0.9], [null, None]) == ["high", "low"]  # no stored scores: never strong
    with_none = VideoNull(medium=0.3, high=0.5, none=0.1)
    assert [Calibrator.label(s, with_none) for s in (0.09999, 0.1, 0.10001)] == ["none", "none", "low"]
    with pytest.raises(ValueError, match="2 scores but 1 video nulls"):
        labels([0.1, 0.2], [null])
    with pytest.raises(ValueError, match="medium_quantile"):
        ConfidenceConfig(medium_quantile=0.9, high_quantile=0.8)
    with pytest.raises(ValueError, match="medium_margin"):
        ConfidenceConfig(medium_margin=0.2, high_margin=0.1)


def test_reference_tokens_are_cached_and_fingerprint_tracks_model_and_cuts(tmp_path: Path) -> None:
    enc = HashEncoder()
    a = Calibrator.for_model(random_model(), enc, cache_dir=tmp_path)
    b = Calibrator.for_model(random_model(), enc, cache_dir=tmp_path)
    assert enc.calls == 1 and len(list(tmp_path.glob("reference-tokens-*.npz"))) == 1
    torch.testing.assert_close(a.references, b.references)
    assert a.fingerprint() == b.fingerprint()
    assert Calibrator.for_model(random_model(seed=1), enc, tmp_path).fingerprint() != a.fingerprint()
    stricter = Calibrator.for_model(random_model(), enc, tmp_path, ConfidenceConfig(0.9, high_margin=0.2))
    assert stricter.fingerprint() != a.fingerprint()


def test_reference_bank_is_large_and_not_the_demo_captions() -> None:
    captions = load_reference_captions()
    assert len(captions) >= 200 and len(set(captions)) == len(captions)
    spec = json.loads((REFERENCE_CAPTIONS.parent / "demo_gallery.json").read_text())
    items = spec.get("photos") or spec.get("clips")  # the gallery's sources: photos, or (since) real clips
    demo = {c for item in items.values() for c in item["captions"]}
    assert demo
    assert not demo & set(captions)


def test_label_measures_follow_their_definitions() -> None:
    from benchmarks.confidence import label_measures

    labels = np.array([["high", "medium", "low"], ["high", "low", "medium"], ["low", "low", "high"]])
    ranks = np.array([[1, 2, 3], [2, 1, 3], [1, 2, 3]])
    relevant = np.array([[True, False, False], [True, False, False], [False, True, False]])
    got = label_measures(labels, ranks, relevant, top=2)
    assert got["strong_hits"] == 2 and got["strong_precision"] == 1.0  # (q0, v0), (q1, v0); not q2's v2
    assert got["strong_recall"] == 1.0  # only q0's rank-1 hit is relevant, and it is strong
    assert got["possible_hits"] == 1 and got["possible_precision"] == 0.0
    wider = label_measures(labels, ranks, relevant, top=3)
    assert wider["strong_precision"] == pytest.approx(2 / 3, abs=1e-3)


def test_demo_gallery_labels_stay_honest() -> None:
    """On the real default model and the demo gallery: no off-topic or nonsense query gets a strong match,
    the one-letter query "a" is never "possible", strong hits are right at least as often as the dev set's
    tuning half's target, labels survive 10 new videos (session 13's measures: benchmarks/confidence.py)."""
    from benchmarks.confidence import run

    report = run(clip_weights=())
    got = report["calibrated"]
    assert got["off_topic_high"] == 0 and got["nonsense_high"] == 0, got
    assert got["labels"]["a_label"] != "medium" and got["labels"]["off_topic_possible"] <= 0.1, got
    assert got["labels"]["strong_precision"] in (None, 1.0) or got["labels"]["strong_precision"] >= 0.9, got
    assert report["stable_when_gallery_grows"] == 1.0
    assert report["ms_per_search_10_hits"] < 1.0
