"""Retrieval metrics against the official evaluation, batched scoring, and the evaluate CLI."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from prvr.data import OfficialSource, prepare_split
from prvr.evaluate import chance_sumr, main, retrieval_metrics, score_split
from prvr.model import MSSL, MSSLConfig
from prvr.synthetic import SyntheticConfig, generate

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
    model.save(root / "ckpt")
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
    MSSL(MSSLConfig(visual_dim=TINY.visual_dim + 1, query_dim=TINY.query_dim)).save(tmp_path / "other")
    with pytest.raises(ValueError, match=f"visual {TINY.visual_dim + 1}.*visual {TINY.visual_dim}"):
        main(["--checkpoint", str(tmp_path / "other"), *args])


def test_moments_files_are_read_with_equal_texts_merged_and_bad_entries_named(tmp_path):
    from prvr.annotated import load_moments_file

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
