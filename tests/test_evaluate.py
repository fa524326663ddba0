"""Retrieval metrics against the official evaluation, batched scoring, and the evaluate CLI."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from prvr.data.official import OfficialSource, prepare_split
from prvr.data.synthetic import SyntheticConfig, generate
from prvr.evaluate.__main__ import main
from prvr.evaluate.retrieval import chance_sumr, retrieval_metrics, score_split
from prvr.models.checkpoint import save_checkpoint
from prvr.models.mssl import MSSL, MSSLConfig

SHARED = Path(__file__).resolve().parents[2] / "shared"
TINY = SyntheticConfig(n_videos=(12, 10, 14), captions_per_video=2, distractors_per_video=1, visual_dim=24,
                       query_dim=16, min_frames=3, max_frames=150, seed=3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny synthetic set (some videos shorter than 32 rows, some longer than 128) + a random model."""
    root = tmp_path_factory.mktemp("eval")
    generate(TINY, root)
    torch.manual_seed(0)
    model = MSSL(MSSLConfig(visual_dim=TINY.visual_dim, query_dim=TINY.query_dim, hidden_size=32)).eval()
    save_checkpoint(model, root / "ckpt")
    return root, model


def test_metrics_match_official_evaluation():
    path = SHARED / "reference" / "mssl" / "metrics.pt"
    if not path.is_file():
        pytest.skip(f"reference numbers not found at {path}")
    ref = torch.load(path, weights_only=True)
    got = retrieval_metrics(ref["scores"], ref["gt_video"])
    assert set(got) == set(ref["expected"])
    for key, value in ref["expected"].items():
        assert got[key] == pytest.approx(value, abs=1e-9), key


def test_metrics_by_hand():
    scores = np.array([[0.9, 0.1, 0.5], [0.2, 0.3, 0.1], [0.0, 0.4, 0.8]], np.float32)
    got = retrieval_metrics(scores, np.array([2, 0, 2]))  # ranks 2, 2, 1
    assert got["r1"] == pytest.approx(100 / 3) and got["r5"] == 100.0 and got["r100"] == 100.0
    assert got["sumr"] == pytest.approx(100 / 3 + 300)
    assert (got["medr"], got["meanr"]) == (2.0, pytest.approx(5 / 3))
    assert got["map"] == pytest.approx((0.5 + 0.5 + 1) / 3)


def test_metrics_ties_break_like_numpy_argsort():
    scores = np.zeros((4, 6), np.float32)  # all tied: the rank is the position np.argsort gives
    gt = np.array([0, 3, 5, 2])
    expected = [int(np.where(np.argsort(-row) == g)[0][0]) + 1 for row, g in zip(scores, gt, strict=True)]
    assert retrieval_metrics(scores, gt)["meanr"] == pytest.approx(np.mean(expected))


def test_metrics_reject_bad_input():
    with pytest.raises(ValueError, match="do not match"):
        retrieval_metrics(np.zeros((3, 4)), np.zeros(2, int))
    with pytest.raises(ValueError, match="outside"):
        retrieval_metrics(np.zeros((2, 4)), np.array([0, 4]))


def test_chance_sumr_is_the_random_expectation():
    rng = np.random.default_rng(0)
    gt = rng.integers(0, 150, 20000)
    measured = retrieval_metrics(rng.random((20000, 150)), gt)["sumr"]
    assert measured == pytest.approx(chance_sumr(150), rel=0.03)


def test_batched_scoring_equals_the_model_inference_path(tiny):
    root, model = tiny
    source = OfficialSource(root, TINY.collection, TINY.feature)
    split = prepare_split(source, "test")
    scores = score_split(model, split, query_bsz=7, video_bsz=5)  # odd batch sizes: batching must not matter
    videos = model.encode_videos([source.video_rows(v) for v in split.video_ids])
    queries = model.encode_queries([source.caption_tokens(c.cap_id) for c in split.captions])
    ref = model.score(queries, videos)
    for name in ("total", "clip", "frame"):
        np.testing.assert_allclose(scores[name], getattr(ref, name).numpy(), atol=1e-5, err_msg=name)


def test_cli_json(tiny, capsys):
    root, _ = tiny
    main(["--checkpoint", str(root / "ckpt"), "--data", str(root), "--collection", TINY.collection,
          "--feature", TINY.feature, "--split", "test", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert (out["videos"], out["queries"]) == (14, 28)
    for name in ("total", "clip", "frame"):
        m = out["metrics"][name]
        assert 0 <= m["r1"] <= m["r5"] <= m["r10"] <= m["r100"] == 100.0  # 14 videos: R@100 is certain
        assert m["sumr"] == pytest.approx(m["r1"] + m["r5"] + m["r10"] + m["r100"])
        assert 1 <= m["medr"] <= 14 and 1 <= m["meanr"] <= 14 and 0 < m["map"] <= 1


def test_cli_table_and_dims_error(tiny, capsys, tmp_path):
    root, _ = tiny
    args = ["--data", str(root), "--collection", TINY.collection, "--feature", TINY.feature]
    main(["--checkpoint", str(root / "ckpt"), *args])
    table = capsys.readouterr().out
    assert "SumR" in table and all(name in table for name in ("total", "clip", "frame"))
    other = MSSL(MSSLConfig(visual_dim=TINY.visual_dim + 1, query_dim=TINY.query_dim))
    save_checkpoint(other, tmp_path / "other")
    with pytest.raises(ValueError, match=f"visual {TINY.visual_dim + 1}.*visual {TINY.visual_dim}"):
        main(["--checkpoint", str(tmp_path / "other"), *args])


def test_moments_files_are_read_with_equal_texts_merged_and_bad_entries_named(tmp_path):
    from prvr.evaluate.annotated import load_moments_file

    for name in ("a.mp4", "b.avi", "notes.txt"):
        (tmp_path / name).write_bytes(b"")  # only names matter here: nothing is decoded
    spec = {"videos": [{"file": "a.mp4", "queries": [{"text": "a dog", "start": 1, "end": 4},
                                                     {"text": "a cat", "start": 5, "end": 9}]},
                       {"file": "b.avi", "queries": [{"text": "a dog", "start": 0, "end": 2}]}]}
    path = tmp_path / "moments.json"
    path.write_text(json.dumps(spec))
    aset = load_moments_file(tmp_path, path)
    assert [vid for vid, _ in aset.videos] == ["a.mp4", "b.avi"]  # every video file, sorted; not notes.txt
    assert {q.text: q.moments for q in aset.queries} == {
        "a dog": {"a.mp4": ((1.0, 4.0),), "b.avi": ((0.0, 2.0),)}, "a cat": {"a.mp4": ((5.0, 9.0),)}}
    for bad, message in [({"videos": [{"file": "a.mp4", "queries": [{"text": "x", "start": 1}]}]}, "query 0"),
                         ({"videos": [{"file": "c.mp4", "queries": []}]}, "c.mp4"),
                         ({"videos": [{"file": "a.mp4", "queries": [{"text": " ", "start": 0, "end": 1}]}]},
                          "needs text"),
                         ([1, 2], "expected")]:
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            load_moments_file(tmp_path, path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="JSON"):
        load_moments_file(tmp_path, path)


def test_moments_files_keep_each_querys_clip_and_kind(tmp_path):
    from prvr.evaluate.annotated import load_moments_file

    (tmp_path / "a.mp4").write_bytes(b"")
    spec = {"videos": [{"file": "a.mp4", "queries": [
        {"text": "a dog", "start": 1, "end": 4, "clip": "dogs", "kind": "clip"},
        {"text": "a cat", "start": 5, "end": 9}]}]}
    path = tmp_path / "moments.json"
    path.write_text(json.dumps(spec))
    got = {q.text: (q.clip, q.kind) for q in load_moments_file(tmp_path, path).queries}
    assert got == {"a dog": ("dogs", "clip"), "a cat": (None, None)}


def test_every_number_gets_a_bootstrap_interval_around_its_unchanged_value():
    from prvr.evaluate.annotated import Query, confidence_intervals, format_report
    from prvr.evaluate.bootstrap import intervals

    ranks = np.array([1, 1, 1, 7, 2, 3])  # clips c0, c1, c2: R@1 100, 50, 0
    values = {"two_branch": {"R@1": 100.0 * (ranks <= 1),
                             "SumR": 100.0 * (ranks <= 1) + 100.0 * (ranks <= 5)}}
    local = {"key_moment": {"mean_iou": np.array([0.1, 0.5, 0.9, 0.0, 0.3, 0.6])}}
    queries = [Query(f"q{i}", f"t{i}", {}, clip=f"c{i // 2}") for i in range(6)]
    ci = confidence_intervals(queries, values, local)
    assert ci["unit"] == "clip" and ci["resamples"] == 2000
    r1 = ci["metrics"]["two_branch"]["R@1"]
    assert r1["value"] == pytest.approx(50.0) and r1["low"] <= 50.0 <= r1["high"] and r1["high"] > r1["low"]
    assert ci["localisation"]["key_moment"]["mean_iou"]["value"] == pytest.approx(0.4)
    assert confidence_intervals(queries, values, local) == ci  # seeded: the same intervals every run
    ungrouped = confidence_intervals([Query(q.id, q.text, {}) for q in queries], values, local)
    assert ungrouped["unit"] == "query"
    assert intervals({"x": np.ones(4)})["x"] == {"value": 1.0, "low": 1.0, "high": 1.0}
    report = {"videos": 3, "queries": 6, "metrics": {"two_branch": {"R@1": 50.0, "SumR": 100.0}},
              "localisation": {"key_moment": {"mean_iou": 0.4}}, "ci": ci}
    table = format_report(report)
    assert f"[{r1['low']:.1f}, {r1['high']:.1f}]" in table and "bootstrap" in table
