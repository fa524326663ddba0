"""MS-SL core: preprocessing, forward, losses and checkpoints against the official reference numbers."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import prvr  # noqa: F401  - applies the torchvision CPU fix first
from prvr.models import branches, losses
from prvr.models.branches import clip_scale, clip_scale_with_raw, key_clip_attention, window_proposals
from prvr.models.checkpoint import load_checkpoint, save_checkpoint
from prvr.models.mssl import MSSL, MSSLConfig
from prvr.models.preprocess import (
    clip_input,
    clip_unit_rows,
    frame_input,
    pad,
    proposal_index,
    proposal_units,
    query_input,
)

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "mssl"
TOL = 1e-4


def _reference(name: str) -> dict:
    """Load one official reference file, or skip when the shared data is absent."""
    path = REFERENCE / f"{name}.pt"
    if not path.is_file():
        pytest.skip(f"official reference numbers not found at {path}")
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module", params=["forward_small_dims", "forward_tvr_dims"])
def forward_ref(request) -> dict:
    """A reference gallery, its official model and our outputs on it (computed once per file)."""
    ref = _reference(request.param)
    model = MSSL.from_official(ref["state_dict"], ref["config"]).eval()
    videos = model.encode_videos(ref["videos"])
    queries = model.encode_queries(ref["queries"])
    scores = model.score(queries, videos)
    return {"ref": ref, "model": model, "videos": videos, "queries": queries, "scores": scores}


def _tiny_config(**overrides) -> MSSLConfig:
    """A small random-weight configuration that runs in milliseconds."""
    tiny = {"visual_dim": 12, "query_dim": 10, "hidden_size": 32, "max_ctx_l": 16, "max_desc_l": 6,
            "map_size": 8}
    return MSSLConfig(**{**tiny, **overrides})


def _tiny_model(seed: int = 0, **overrides) -> MSSL:
    torch.manual_seed(seed)
    return MSSL(_tiny_config(**overrides)).eval()


def _gallery(seed: int = 0, lengths=(1, 3, 8, 9, 20, 40), n_queries: int = 4, dims=(12, 10)):
    """Random raw video rows and query tokens for the tiny model."""
    g = torch.Generator().manual_seed(seed)
    videos = [torch.randn(n, dims[0], generator=g) for n in lengths]
    queries = [torch.randn(n, dims[1], generator=g) for n in (2, 6, 9, 3)[:n_queries]]
    return videos, queries


# ----------------------------------------------------------------------------- preprocessing
def test_preprocessing_matches_official(forward_ref):
    ref = forward_ref["ref"]
    clips = torch.stack([clip_input(v) for v in ref["videos"]])
    torch.testing.assert_close(clips, ref["clip_inputs"], atol=TOL, rtol=0)
    for raw, expected in zip(ref["videos"], ref["frame_inputs"], strict=True):
        torch.testing.assert_close(frame_input(raw), expected, atol=TOL, rtol=0)
    for raw, expected in zip(ref["queries"], ref["query_inputs"], strict=True):
        torch.testing.assert_close(query_input(raw.numpy()), expected, atol=TOL, rtol=0)


def test_clip_unit_rows_keep_official_quirks():
    rows = clip_unit_rows(64)  # edges 0, 2, ..., 62, then 64 clamped to 63: the last row is never used
    assert rows[:31].tolist() == [[2 * i, 2 * i + 2] for i in range(31)]
    assert rows[31].tolist() == [62, 63]
    assert clip_unit_rows(1).tolist() == [[0, 1]] * 32  # one row is duplicated into every unit
    assert clip_unit_rows(33)[-1].tolist() == [32, 33]  # empty bin at the clamp: its start row alone
    # 16 rows: edges i / 2 rounded half to even (0.5 -> 0, 1.5 -> 2); empty bins take their start row
    assert clip_unit_rows(16)[:4].tolist() == [[0, 1], [0, 1], [1, 2], [2, 3]]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (np.zeros((0, 4), np.float32), "empty"),
        (np.zeros(4, np.float32), "2-D"),
        (np.array([[1.0, np.nan], [0.0, 1.0]], np.float32), "NaN or inf values in rows \\[0\\]"),
        (np.array([[1.0, 2.0], [np.inf, 1.0]], np.float32), "NaN or inf values in rows \\[1\\]"),
        (np.ones((3, 4), np.int64), "floating point"),
    ],
)
def test_preprocessing_rejects_bad_input(bad, message):
    for fn in (clip_input, frame_input, query_input):
        with pytest.raises(ValueError, match=message):
            fn(bad)


def test_pad_masks_valid_rows():
    padded, mask = pad([torch.ones(2, 3), torch.ones(4, 3)])
    assert padded.shape == (2, 4, 3) and mask.dtype == torch.float32
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert padded[0, 2:].abs().sum() == 0
    with pytest.raises(ValueError, match="different feature shapes"):
        pad([torch.ones(2, 3), torch.ones(2, 4)])


def test_proposal_index_round_trip():
    windows = [(k, s) for k in range(1, 33) for s in range(33 - k)]
    indices = [proposal_index(k, s) for k, s in windows]
    assert indices == list(range(528))  # ordered by length then start
    starts, ends = proposal_units(torch.arange(528))
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == [(s, s + k) for k, s in windows]
    assert proposal_units(527) == (0, 32)
    with pytest.raises(ValueError, match="outside"):
        proposal_units(528)


def test_window_proposals_are_window_means():
    units = torch.randn(2, 8, 5)
    proposals = window_proposals(units)
    assert proposals.shape == (2, 36, 5)
    for idx in (0, 7, 8, 20, 35):
        s, e = proposal_units(idx, map_size=8)
        torch.testing.assert_close(proposals[:, idx], units[:, s:e].mean(dim=1))


# ----------------------------------------------------------------------------- forward
def test_state_dict_names_are_official(forward_ref):
    ours = forward_ref["model"].state_dict()
    official = forward_ref["ref"]["state_dict"]
    assert len(ours) == 54
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in official.items()}


def test_forward_matches_official(forward_ref):
    ref, videos, scores = forward_ref["ref"], forward_ref["videos"], forward_ref["scores"]
    torch.testing.assert_close(forward_ref["queries"], ref["query_vectors"], atol=TOL, rtol=0)
    torch.testing.assert_close(videos.proposals, ref["proposals"], atol=TOL, rtol=0)
    for i, expected in enumerate(ref["frame_features"]):
        n = len(expected)
        torch.testing.assert_close(videos.frames[i, :n], expected, atol=TOL, rtol=0)
        assert videos.frame_mask[i].sum() == n and videos.frames[i, n:].abs().sum() == 0
    torch.testing.assert_close(scores.clip, ref["clip_scores"], atol=TOL, rtol=0)
    torch.testing.assert_close(scores.frame, ref["frame_scores"], atol=TOL, rtol=0)
    torch.testing.assert_close(scores.total, ref["scores"], atol=TOL, rtol=0)
    assert torch.equal(scores.key_clip, ref["key_clip_index"])


def test_attend_matches_score(forward_ref):
    """z for each video's key clip reproduces the frame score; alpha is a distribution, 0 on padding."""
    model, videos, queries, scores = (forward_ref[k] for k in ("model", "videos", "queries", "scores"))
    z, alpha = model.attend(videos, scores.key_clip.t())  # (Nv, Nq, H), (Nv, Nq, L)
    frame = torch.einsum("qh,vqh->qv", F.normalize(queries, dim=-1), F.normalize(z, dim=-1))
    torch.testing.assert_close(frame, scores.frame, atol=1e-6, rtol=0)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(alpha.shape[:2]))
    assert (alpha * (1 - videos.frame_mask[:, None, :])).abs().max() == 0


def test_encoding_is_independent_of_the_batch():
    model = _tiny_model()
    videos, queries = _gallery()
    alone = model.encode_videos(videos[:1])
    together = model.encode_videos(videos, batch_size=4)  # longer videos pad the first chunk
    torch.testing.assert_close(together.proposals[:1], alone.proposals, atol=1e-6, rtol=0)
    torch.testing.assert_close(together.frames[:1, :1], alone.frames, atol=1e-6, rtol=0)
    assert together.frames.shape[1] == 16  # max_ctx_l: the 20/40-row videos are re-binned
    q_alone = model.encode_queries(queries[:1])
    torch.testing.assert_close(model.encode_queries(queries)[:1], q_alone, atol=1e-6, rtol=0)


def test_score_chunking_does_not_change_results(monkeypatch):
    model = _tiny_model()
    videos, queries = _gallery()
    encoded, q = model.encode_videos(videos), model.encode_queries(queries)
    whole = model.score(q, encoded)
    monkeypatch.setattr(branches, "_CHUNK_ELEMENTS", 1)  # one video per chunk
    chunked = model.score(q, encoded)
    for name in ("total", "clip", "frame"):
        torch.testing.assert_close(getattr(chunked, name), getattr(whole, name), atol=1e-6, rtol=0)
    assert torch.equal(chunked.key_clip, whole.key_clip)


def test_raw_inputs_with_wrong_dims_are_rejected():
    model = _tiny_model()
    with pytest.raises(ValueError, match=r"video 1: features of shape \(5, 7\), expected \(n, 12\)"):
        model.encode_videos([torch.randn(3, 12), torch.randn(5, 7)])
    with pytest.raises(ValueError, match=r"query 0: features of shape \(3, 12\), expected \(n, 10"):
        model.encode_queries([torch.randn(3, 12)])
    with pytest.raises(ValueError, match=r"video 0: NaN or inf values in rows \[2\]"):
        model.encode_videos([torch.eye(12)[:3] / torch.tensor([1.0, 1.0, 0.0])[:, None]])
    with pytest.raises(TypeError, match="query 0: expected a numpy array or torch tensor, got list"):
        model.encode_queries([[[0.0] * 10]])


def test_clip_scale_max_and_argmax():
    q, p = torch.randn(3, 6), torch.randn(4, 10, 6)
    cos, arg = clip_scale(q, p)
    full = F.normalize(q, dim=-1) @ F.normalize(p, dim=-1).transpose(1, 2)  # (Nv, Nq, P)
    torch.testing.assert_close(cos, full.max(dim=-1).values.t())
    assert torch.equal(arg, full.argmax(dim=-1).t())


def test_key_clip_attention_ignores_padding_and_scales_with_temperature():
    keys, values = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.float32)
    key_clips = torch.randn(2, 3, 4)
    z, alpha = key_clip_attention(keys, values, mask, key_clips)
    z_cut, _ = key_clip_attention(keys[:1, :3], values[:1, :3], mask[:1, :3], key_clips[:1])
    torch.testing.assert_close(z[:1], z_cut)
    assert alpha[0, :, 3:].abs().max() == 0
    _, sharp = key_clip_attention(keys, values, mask, key_clips, temperature=0.01)
    assert sharp.max(dim=-1).values.min() > alpha.max(dim=-1).values.min()


# ----------------------------------------------------------------------------- losses
def test_loss_matches_official():
    ref = _reference("loss_small_dims")
    model = MSSL.from_official(ref["state_dict"], ref["config"]).eval()
    out = model.loss(ref["clip_inputs"], ref["frame_inputs"], ref["frame_mask"], ref["query_inputs"],
                     ref["query_mask"], ref["query_labels"], hard_negative_pool=1)
    names = {"clip_nce": "clip_nce_loss", "clip_trip": "clip_trip_loss", "frame_nce": "frame_nce_loss",
             "frame_trip": "frame_trip_loss", "total": "loss_overall"}
    for ours, theirs in names.items():
        assert abs(out[ours].item() - ref["loss"][theirs]) < TOL, (ours, out[ours].item())
    out["total"].backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_clip_scale_with_raw_values_and_gradients_match_the_full_product():
    """The argmax-then-recompute maxima give the full (Nq, Nv, P) product's values and gradients."""
    g = torch.Generator().manual_seed(0)
    q0, p0 = torch.randn(5, 16, generator=g), torch.randn(7, 21, 16, generator=g)
    w1, w2 = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    results = []
    for full in (False, True):
        q, p = q0.clone().requires_grad_(), p0.clone().requires_grad_()
        if full:
            dots = torch.einsum("qh,vph->qvp", q, p)
            cos = dots / (q.norm(dim=-1)[:, None, None] * p.norm(dim=-1)[None])
            best, arg, raw = cos.max(-1).values, cos.max(-1).indices, dots.max(-1).values
        else:
            best, arg, raw = clip_scale_with_raw(q, p)
        ((w1 * best).sum() + (w2 * raw).sum()).backward()
        results.append((best.detach(), arg, raw.detach(), q.grad, p.grad))
    for ours, full in zip(*results, strict=True):
        torch.testing.assert_close(ours, full, rtol=1e-5, atol=1e-6)


def _clip_nce_loop(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A direct per-query / per-video transcription of the clip NCE, to check the vectorised one."""
    t2v = torch.stack([torch.logsumexp(scores[i], 0) - scores[i, labels[i]] for i in range(len(scores))])
    v2t = []
    for v in range(scores.shape[1]):
        own = scores[labels == v, v]
        no_query = scores.new_zeros(())
        v2t.append(torch.logsumexp(scores[:, v], 0) - torch.logsumexp(own, 0) if len(own) else no_query)
    return t2v.mean() + torch.stack(v2t).mean()


def test_clip_nce_matches_direct_loop():
    scores, labels = torch.randn(7, 4), torch.tensor([0, 0, 1, 1, 1, 3, 3])  # video 2 has no query
    torch.testing.assert_close(losses.clip_nce(scores, labels), _clip_nce_loop(scores, labels))


def test_random_negatives_follow_the_pools():
    """Random negatives are never the positive and, with a pool, come from the n hardest only."""
    labels = torch.tensor([0, 1, 2, 3])
    scores = torch.tensor([[0.9, 0.5, 0.1, 0.0],
                           [0.5, 0.9, 0.1, 0.0],
                           [0.5, 0.1, 0.9, 0.0],
                           [0.5, 0.1, 0.0, 0.9]])
    torch.manual_seed(0)
    # margin 0: a hinge is positive only if a negative beats its positive, which never happens here
    assert losses.clip_triplet(scores, labels, margin=0.0) == 0
    assert losses.frame_triplet(scores, margin=0.0) == 0
    # pool 1 draws the hardest: every row's is 0.5 (t2v hinge 0.1 each); columns' hardest queries are
    # 0.5, 0.5, 0.1, 0.0 (v2t hinges 0.1, 0.1, 0, 0)
    hard = losses.clip_triplet(scores, labels, margin=0.5, hard_pool=1)
    assert math.isclose(hard.item(), 0.1 + 0.05, rel_tol=1e-5)
    random_draws = torch.stack([losses.clip_triplet(scores, labels, margin=0.5) for _ in range(200)])
    assert random_draws.max() <= hard + 1e-6 and random_draws.min() < hard  # easier negatives get drawn


# ----------------------------------------------------------------------------- MS-SL++
def test_msslpp_model_uses_medoid_proposals():
    model = _tiny_model(clusters=5)
    videos, queries = _gallery()
    encoded = model.encode_videos(videos)
    assert encoded.proposals.shape == (6, 5, 32) and encoded.proposal_index.shape == (6, 5)
    assert (encoded.proposal_index.diff(dim=1) > 0).all()  # sorted ascending, distinct
    full = window_proposals(encoded.clip_units)
    gathered = full.gather(1, encoded.proposal_index[..., None].expand(-1, -1, 32))
    torch.testing.assert_close(encoded.proposals, gathered)
    scores = model.score(model.encode_queries(queries), encoded)
    assert all(scores.key_clip[:, v].tolist()[i] in encoded.proposal_index[v].tolist()
               for v in range(6) for i in range(4))
    # training: clustering runs without gradient, the gathered medoid proposals carry it
    model.train()
    frames, frame_mask = pad([frame_input(v, 16) for v in videos])
    tokens, token_mask = pad([query_input(q, 6) for q in queries])
    clips = torch.stack([clip_input(v, 8) for v in videos])
    out = model.loss(clips, frames, frame_mask, tokens, token_mask, torch.tensor([0, 1, 2, 5]))
    out["total"].backward()
    assert model.clip_encoder.output["dense"].weight.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- config and checkpoints
def test_config_round_trip_and_official_mapping():
    cfg = _tiny_config(margin=0.1, clusters=4)
    assert MSSLConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match=r"unknown MSSLConfig fields \['bogus'\]"):
        MSSLConfig.from_dict({**cfg.to_dict(), "bogus": 1})
    official = {"visual_input_size": 3072, "query_input_size": 768, "margin": 0.1, "use_hard_negative": False,
                "device": "cuda", "clip_scale_w": 0.5, "frame_scale_w": 0.5}
    mapped = MSSLConfig.from_official(official)
    assert (mapped.visual_dim, mapped.query_dim, mapped.margin, mapped.clip_scale_w) == (3072, 768, 0.1, 0.5)
    assert mapped.hidden_size == 384 and mapped.clusters == 0
    with pytest.raises(ValueError, match="visual_input_size"):
        MSSLConfig.from_official({"query_input_size": 768})
    with pytest.raises(ValueError, match="map_size 32 exceeds max_ctx_l 16"):
        _tiny_config(map_size=32)
    with pytest.raises(ValueError, match="hidden_size 32 is not divisible by n_heads 5"):
        _tiny_config(n_heads=5)


def test_checkpoint_round_trip_is_bit_exact(tmp_path):
    model = _tiny_model(seed=3)
    videos, queries = _gallery(seed=1)
    before = model.score(model.encode_queries(queries), model.encode_videos(videos))
    profile = {"name": "lite", "version": 1}
    save_checkpoint(model, tmp_path / "ckpt", train={"lr": 2.5e-4}, profile=profile, metrics={"sumr": 1.5},
                    epoch=7)
    assert not list((tmp_path / "ckpt").glob("*.pt"))  # nothing pickled
    loaded = load_checkpoint(tmp_path / "ckpt").eval()
    after = loaded.score(loaded.encode_queries(queries), loaded.encode_videos(videos))
    for name in ("total", "clip", "frame", "key_clip"):
        assert torch.equal(getattr(before, name), getattr(after, name)), name
    assert loaded.fingerprint() == model.fingerprint()
    assert loaded.profile == profile
    assert loaded.checkpoint_meta == {"train": {"lr": 2.5e-4}, "profile": profile, "metrics": {"sumr": 1.5},
                                      "epoch": 7}
    assert _tiny_model(seed=4).fingerprint() != model.fingerprint()


def test_checkpoint_errors_are_specific(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="lacks config.json"):
        load_checkpoint(tmp_path / "empty")
    torch.save({"state_dict": {}}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match="not an official MS-SL checkpoint"):
        load_checkpoint(tmp_path / "other.pth")


class EasyDict(dict):
    """Pickles like easydict.EasyDict (a dict whose items are mirrored as attributes) once renamed below."""

    def __init__(self, d=None):
        super().__init__()
        for k, v in (d or {}).items():
            setattr(self, k, v)

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        super().__setitem__(name, value)


def test_official_checkpoint_loads_without_easydict_and_from_gpu(tmp_path, monkeypatch):
    source = _tiny_model(seed=5)
    cfg = source.cfg
    official_cfg = {"visual_input_size": cfg.visual_dim, "query_input_size": cfg.query_dim,
                    "hidden_size": cfg.hidden_size, "max_ctx_l": cfg.max_ctx_l, "max_desc_l": cfg.max_desc_l,
                    "map_size": cfg.map_size, "n_heads": cfg.n_heads, "margin": 0.1,
                    "use_hard_negative": False}
    fake = types.ModuleType("easydict")  # present only while saving, as on the machine that trained
    fake.EasyDict = EasyDict
    monkeypatch.setattr(EasyDict, "__module__", "easydict")
    monkeypatch.setitem(sys.modules, "easydict", fake)
    # tag every storage as CUDA, as a checkpoint saved on a GPU machine is
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
    state = {f"module.{k}": v for k, v in source.state_dict().items()}  # DataParallel prefix
    checkpoint = {"model": state, "model_cfg": EasyDict(official_cfg), "epoch": 12}
    torch.save(checkpoint, tmp_path / "model.ckpt")
    monkeypatch.undo()
    assert sys.modules.get("easydict") is not fake
    if not torch.cuda.is_available():  # the file really is tagged for CUDA
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(tmp_path / "model.ckpt", weights_only=False)
    loaded = load_checkpoint(tmp_path / "model.ckpt", map_location="cpu")
    assert loaded.device.type == "cpu" and loaded.cfg.margin == 0.1
    assert loaded.checkpoint_meta["epoch"] == 12
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_check_dims_names_both_sides():
    model = _tiny_model()
    model.check_dims(12, 10, "features.h5")
    with pytest.raises(ValueError, match=r"features\.h5 has visual dim 3072 and query dim 768, but the model "
                                         r"expects visual dim 12 and query dim 10"):
        model.check_dims(3072, 768, "features.h5")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    """The two-branch model scores on CUDA what it scores on the CPU, at torch's defaults (on an H200 the
    scores moved by 7e-8; with TF32 matrix products allowed, by 1.7e-4). MS-SL++'s medoids are not
    compared: float32 rounding breaks the exact ties between mirrored windows differently on each device
    (prvr/models/clustering.py), so its key clips can differ, as the official code's do."""
    model = _tiny_model()
    videos, queries = _gallery()
    cpu = model.score(model.encode_queries(queries), model.encode_videos(videos))
    model.cuda()
    gpu = model.score(model.encode_queries(queries), model.encode_videos(videos))
    assert gpu.total.device.type == "cuda"
    torch.testing.assert_close(gpu.total.cpu(), cpu.total, atol=1e-5, rtol=0)
    assert torch.equal(gpu.key_clip.cpu(), cpu.key_clip)
