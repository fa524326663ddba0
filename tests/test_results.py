"""What users get from search(): key moments that cover what happened, and confidence labels that depend on
the (query, video) pair, the weights and the reference bank only, for shared and session hits alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import prvr  # noqa: F401  - applies the compatibility fix first
from prvr.index import GalleryVideo, IndexConfig, VideoIndex
from prvr.index.encoding import ReferenceQueries
from prvr.models.bridge import BridgeConfig, BridgeModel
from prvr.results.confidence import CalibratedConfidence, Calibrator, ConfidenceConfig, cuts, labels
from prvr.results.search import search

CLASSES = 24  # the toy bridge: class c's rows are one-hot-ish on feature c, its text is unit vector c
WEIGHTS = [(0.7, 0.3), (1.0, 0.0), (0.0, 1.0), (0.4, 0.6)]


def toy_bridge() -> BridgeModel:
    """A bridge whose classifier reads class c from feature c and whose class texts are orthonormal, so a
    query of class c's text matches exactly the rows of class c."""
    head = torch.nn.Linear(CLASSES, CLASSES)
    with torch.no_grad():
        head.weight.copy_(torch.eye(CLASSES) * 4)
        head.bias.zero_()
    return BridgeModel(head, torch.eye(CLASSES), BridgeConfig(top_k=3), profile={"name": "toy"})


def video(scenes: list[tuple[int, int]], seed: int, vid: str) -> GalleryVideo:
    """1 s rows: (class, seconds) per scene, each row its class's one-hot plus noise."""
    rng = np.random.default_rng(seed)
    cls = np.concatenate([np.full(n, c) for c, n in scenes])
    rows = np.eye(CLASSES, dtype=np.float32)[cls] * 3 + 0.3 * rng.standard_normal((len(cls), CLASSES))
    t = np.arange(len(cls), dtype=np.float32)
    return GalleryVideo(vid, rows.astype(np.float32), t, t + 1, float(len(cls)), title=vid)


def query(c: int, seed: int = 0) -> np.ndarray:
    """Token features of a query about class c (its text vector, a little noisy)."""
    rng = np.random.default_rng(seed)
    return (np.eye(CLASSES)[c] + 0.05 * rng.standard_normal(CLASSES)).astype(np.float32)[None]


def bank(model: BridgeModel, n: int = 120) -> ReferenceQueries:
    """A reference bank of everyday-like queries: mixes of the background classes 0..11 (never 12..23)."""
    rng = np.random.default_rng(7)
    tokens = [np.eye(CLASSES, dtype=np.float32)[rng.choice(12, size=3)] + 0.1 * rng.standard_normal(
        (3, CLASSES)).astype(np.float32) for _ in range(n)]
    return ReferenceQueries(model.encode_queries(tokens), "toy-bank")


def scenes(seed: int, n: int = 8) -> list[tuple[int, int]]:
    """Background scenes of classes 0..11, 20-90 s each."""
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(12)), int(rng.integers(20, 90))) for _ in range(n)]


@pytest.fixture(scope="module")
def model() -> BridgeModel:
    return toy_bridge()


def test_a_searchs_key_moment_covers_a_planted_event(model: BridgeModel, tmp_path: Path) -> None:
    """A 20-minute video with a 45 s event of class 20 at 600 s: the top result's key moment is the event
    (within 2 s of its edges), in seconds, whatever the video's length; MS-SL's key clip stays beside it."""
    before, after = scenes(1, 6), scenes(2, 12)  # 6 scenes: at most 540 s
    pad = 600 - sum(n for _, n in before)
    long = video([*before, (3, pad), (20, 45), *after], seed=3, vid="long")
    assert long.features.shape[0] >= 1200
    others = [video(scenes(10 + i), seed=10 + i, vid=f"other{i}") for i in range(3)]
    index = VideoIndex.create(tmp_path / "ix", model, IndexConfig(), bank(model))
    index.add([*others, long])
    top = search([index], query(20), k=2).results[0]
    assert top["video_id"] == "long"
    key = top["key_moment"]
    assert abs(key["start"] - 600) <= 2 and abs(key["end"] - 645) <= 2, key
    assert top["moments"][0] == key and len(top["heatmap"]["score"]) == 128  # 1,200 rows: 128 cells
    assert set(top["key_clip"]) == {"start", "end", "proposal", "score"}
    assert top["key_clip"]["score"] == pytest.approx(top["clip_score"], abs=1e-5)


# The label machinery with the pre-session-13 cuts (strong: beats every reference caption; possible:
# beats 80 %): the default's margin of 0.1 is calibrated on the real model's cosines, not this toy model's.
QUANTILE_CUTS = CalibratedConfidence(ConfidenceConfig(medium_quantile=0.8, high_margin=0.0,
                                                      medium_margin=0.0))


def labelled(index: VideoIndex, tokens: np.ndarray, w: tuple[float, float]) -> dict[str, str]:
    """Every video's label for one query at weights w, through search (k = the whole gallery)."""
    return {r["video_id"]: r["confidence"]
            for r in search([index], tokens, k=len(index), weights=w, confidence=QUANTILE_CUTS)}


def test_labels_unchanged_when_ten_unrelated_videos_join(model: BridgeModel, tmp_path: Path) -> None:
    gallery = [video([*scenes(20 + i, 3), (12 + i, 30)], seed=20 + i, vid=f"g{i}") for i in range(6)]
    index = VideoIndex.create(tmp_path / "ix", model, IndexConfig(), bank(model))
    index.add(gallery)
    asked = [query(c, seed=c) for c in (*range(12, 18), 0, 5, 22)]  # on-topic, background, off-topic
    before = [labelled(index, q, w) for q in asked for w in WEIGHTS]
    index.add([video(scenes(40 + i, 4), seed=40 + i, vid=f"new{i}") for i in range(10)])
    after = [labelled(index, q, w) for q in asked for w in WEIGHTS]
    assert [{v: lab[v] for v in b} for b, lab in zip(before, after, strict=True)] == before
    seen = {lab for b in before for lab in b.values()}
    assert {"high", "low"} <= seen  # the test can tell labels apart
    assert before[0]["g0"] == "high"  # a query about g0's own event, at the default weights


def test_a_label_compares_the_total_at_the_weights_in_use_with_the_bank_at_those_weights(
        model: BridgeModel, tmp_path: Path) -> None:
    """Consistency across weights: at any weights a label equals the rule applied to the model's own
    scores at those weights (the query's total vs the reference captions' totals on that video), and no
    reference caption is ever high on any video at any weights, through search."""
    refs = bank(model)
    gallery = [video([*scenes(60 + i, 3), (12 + i, 25)], seed=60 + i, vid=f"g{i}") for i in range(5)]
    index = VideoIndex.create(tmp_path / "ix", model, IndexConfig(), refs)
    index.add(gallery)
    enc = model.encode_videos([v.features for v in gallery])
    ref_scores = model.score(refs.queries, enc)  # (R, V)
    asked = [query(c, seed=c) for c in (12, 13, 14, 3, 20)]
    for w in WEIGHTS:
        totals = w[0] * ref_scores.clip.double().numpy() + w[1] * ref_scores.frame.double().numpy()
        for tokens in asked:
            got = labelled(index, tokens, w)
            s = model.score(model.encode_queries([tokens]), enc)
            mine = (w[0] * s.clip + w[1] * s.frame).double().numpy()[0]
            for j, v in enumerate(gallery):
                high, medium = totals[:, j].max(), np.quantile(totals[:, j], 0.8, method="higher")
                if min(abs(mine[j] - high), abs(mine[j] - medium)) < 2e-3:
                    continue  # within float16 storage of a cut
                expected = "high" if mine[j] > high else "medium" if mine[j] > medium else "low"
                assert got[v.id] == expected, (w, v.id, mine[j], medium, high)
        ref_tokens = [t for t in np.random.default_rng(7).choice(12, size=(5, 3))]
        for cs in ref_tokens:  # queries drawn like the bank's own
            assert "high" not in labelled(index, np.eye(CLASSES, dtype=np.float32)[cs], w).values()


def test_reference_scores_are_stored_rounded_up_and_cut_per_weights(model: BridgeModel,
                                                                    tmp_path: Path) -> None:
    refs = bank(model)
    index = VideoIndex.create(tmp_path / "ix", model, IndexConfig(), refs)
    gallery = [video(scenes(80 + i, 3), seed=80 + i, vid=f"g{i}") for i in range(3)]
    index.add(gallery)
    hit = index.rank(model.encode_queries([query(0)])[0].numpy(), k=3).hits
    exact = model.score(refs.queries, model.encode_videos([v.features for v in gallery]))
    for h in hit:
        j = [v.id for v in gallery].index(h.id)
        assert h.ref_clip.dtype == np.float16 and h.ref_clip.shape == (len(refs),)
        assert (h.ref_clip.astype(np.float64) >= exact.clip[:, j].double().numpy()).all()
        assert (h.ref_frame.astype(np.float64) >= exact.frame[:, j].double().numpy()).all()
        assert np.abs(h.ref_clip.astype(np.float64) - exact.clip[:, j].double().numpy()).max() < 2e-3
    null = cuts(hit[0].ref_clip, hit[0].ref_frame, (1.0, 0.0))
    margin = ConfidenceConfig().high_margin  # strong: beats the best stored reference caption by this
    assert null.high == pytest.approx(float(hit[0].ref_clip.astype(np.float64).max()) + margin)
    assert cuts(np.zeros(0), np.zeros(0), (0.7, 0.3)) is None
    assert labels([0.9], [None]) == ["low"]  # no stored scores: never strong
    with pytest.raises(ValueError, match="2 scores but 1"):
        labels([0.1, 0.2], [null])


def test_session_hits_are_judged_by_the_same_rule(model: BridgeModel, tmp_path: Path) -> None:
    """A video's label does not depend on which gallery (shared or a session's) holds it."""
    refs = bank(model)
    gallery = [video([*scenes(90 + i, 3), (12 + i, 30)], seed=90 + i, vid=f"g{i}") for i in range(4)]
    alone = VideoIndex.create(tmp_path / "all", model, IndexConfig(), refs)
    alone.add(gallery)
    shared = VideoIndex.create(tmp_path / "shared", model, IndexConfig(), refs)
    session = VideoIndex.create(tmp_path / "session", model, IndexConfig(), refs)
    shared.add(gallery[:3])
    session.add(gallery[3:])
    for c in (12, 15, 2):
        one = {r["video_id"]: r["confidence"]
               for r in search([alone], query(c), k=4, confidence=QUANTILE_CUTS)}
        two = {r["video_id"]: r["confidence"]
               for r in search([shared, session], query(c), k=4, confidence=QUANTILE_CUTS)}
        assert one == two
    top = search([shared, session], query(15), k=1, confidence=QUANTILE_CUTS).results[0]
    assert top["confidence"] == "high"


def test_calibrator_hands_the_index_its_bank(model: BridgeModel, tmp_path: Path) -> None:
    """The predictor's wiring: a Calibrator's reference_queries are what the index stores scores of; an index
    built with another bank is refused, one opened without a bank cannot add videos."""
    from prvr.index import GalleryError, IndexMismatchError

    class Encoder:
        backbone = None

        def encode(self, texts: list[str]) -> list[np.ndarray]:
            return [query(len(t) % CLASSES, seed=i)[0][None].repeat(2, 0) for i, t in enumerate(texts)]

    cal = Calibrator.for_model(model, Encoder())
    index = VideoIndex.create(tmp_path / "ix", model, IndexConfig(), cal.reference_queries)
    index.add([video(scenes(1, 2), seed=1, vid="a")])
    assert index.rank(model.encode_queries([query(0)])[0].numpy(), k=1).hits[0].ref_clip.shape == (261,)
    with pytest.raises(IndexMismatchError, match="reference bank"):
        VideoIndex.open(tmp_path / "ix", model, references=bank(model))
    reader = VideoIndex.open(tmp_path / "ix", model)
    with pytest.raises(GalleryError, match="reference scores"):
        reader.add([video(scenes(2, 2), seed=2, vid="b")])
    assert cal.confidence() == CalibratedConfidence(cal.cfg)


def test_the_index_stores_each_rows_bank_statistics_and_moments_read_them(model: BridgeModel,
                                                                           tmp_path: Path) -> None:
    """With a reference bank the index stores, per fine row and per context row, the mean and std of its
    cosine with the bank's vectors; the result's key moment is find_moments' over them. Without a bank they
    are empty and the moments read raw cosines."""
    from prvr.results.moments import find_moments
    from prvr.temporal.hubness import bank_stats

    refs = bank(model)
    vectors = refs.queries.numpy()
    videos = [video([(3, 30), (20, 25), (5, 40)], seed=1, vid="a"), video(scenes(4, 3), seed=4, vid="b")]
    with_bank = VideoIndex.create(tmp_path / "bank", model, IndexConfig(), refs)
    without = VideoIndex.create(tmp_path / "none", model, IndexConfig())
    for index in (with_bank, without):
        index.add(videos)
    q = model.encode_queries([query(20)])[0].numpy()
    for hit in with_bank.rank(q, k=2).hits:
        np.testing.assert_allclose(hit.fine_bank, bank_stats(hit.fine.astype(np.float32), vectors), atol=1e-6)
        np.testing.assert_allclose(hit.context_bank, bank_stats(hit.context, vectors), atol=1e-6)
        assert hit.fine_bank.shape == (len(hit.fine), 2) and hit.context_bank.shape == (len(hit.context), 2)
    assert all(h.fine_bank.shape == h.context_bank.shape == (0, 2) for h in without.rank(q, k=2).hits)
    hit = with_bank.rank(q, k=1).hits[0]
    top = search([with_bank], query(20), k=1).results[0]
    expected = find_moments(q, hit.fine, hit.fine_start, hit.fine_end, hit.segments, context=hit.context,
                            row_bank=hit.fine_bank, context_bank=hit.context_bank)
    raw = find_moments(q, hit.fine, hit.fine_start, hit.fine_end, hit.segments, context=hit.context)
    key = {**expected["key_moment"], "from": "pictures"}  # (no words: the pictures')
    assert top["key_moment"] == key and top["moments"] == [key, *expected["moments"][1:]]
    assert expected["key_moment"]["contrast"] != raw["key_moment"]["contrast"]  # the statistics were read
    assert top["video_id"] == "a" and 30 <= top["key_moment"]["start"] < top["key_moment"]["end"] <= 55
