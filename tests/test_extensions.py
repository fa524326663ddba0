"""RAL (CSA, MSRA) and ICE / IRM / TCP: shapes, masking, reference formulas, gradients, config switches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Normal, kl_divergence

import prvr  # noqa: F401  - applies the torchvision CPU fix first
from prvr.models import ral, regularizers
from prvr.models.branches import EncodedQueries
from prvr.models.checkpoint import load_checkpoint, save_checkpoint
from prvr.models.mssl import MSSL, MSSLConfig
from prvr.models.preprocess import pad
from prvr.results.query import QueryError

H = 16


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    """(B, width) float mask with the given valid lengths."""
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()


def _garbage_pad(x: torch.Tensor, mask: torch.Tensor, extra: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Widen (B, L, H) by ``extra`` rows and fill every padded row with random values (must be ignored)."""
    x = torch.cat([x, torch.zeros(x.shape[0], extra, x.shape[2])], dim=1)
    mask = torch.cat([mask, torch.zeros(mask.shape[0], extra)], dim=1)
    return torch.where(mask[..., None] == 1, x, torch.randn_like(x) * 5), mask


# ----------------------------------------------------------------------------- CSA
def _csa_reference(head, tokens, tmask, frames, fmask, pad_to):
    """The released formula, literally: pad frames with zeros to pad_to, multiply padded sims by 0."""
    tokens, frames = F.normalize(tokens, dim=-1), F.normalize(frames, dim=-1)
    out = torch.zeros(len(tokens), len(frames))
    for i in range(len(tokens)):
        logits = head(tokens[i]).squeeze(-1).masked_fill(tmask[i] == 0, float("-inf"))
        w = logits.softmax(-1)
        for j in range(len(frames)):
            f = torch.zeros(pad_to, frames.shape[-1])
            m = torch.zeros(pad_to)
            f[: frames.shape[1]], m[: frames.shape[1]] = frames[j], fmask[j]
            sim = (tokens[i] @ f.t()) * tmask[i][:, None] * m[None, :]
            out[i, j] = (sim.max(dim=1).values * w).sum()
    return out


@pytest.fixture
def csa_batch():
    torch.manual_seed(0)
    tmask, fmask = _mask([5, 3, 1], 5), _mask([7, 2, 12, 4], 12)
    tokens, frames = torch.randn(3, 5, H) * tmask[..., None], torch.randn(4, 12, H) * fmask[..., None]
    return ral.word_confidence_head(H), tokens, tmask, frames, fmask


def test_csa_matches_released_formula(csa_batch):
    head, tokens, tmask, frames, fmask = csa_batch
    scores = ral.csa_scores(head, tokens, tmask, frames, fmask, pad_to=12)
    assert scores.shape == (3, 4)
    expected = _csa_reference(head, tokens, tmask, frames, fmask, 12)
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)


def test_csa_zero_padding_quirk_only_for_short_videos():
    head = ral.word_confidence_head(H)
    token = torch.randn(1, 1, H)
    frames = -token.expand(1, 4, H).clone()  # every frame anti-parallel to the word: cosine -1
    full = ral.csa_scores(head, token, torch.ones(1, 1), frames, torch.ones(1, 4), pad_to=4)
    short = ral.csa_scores(head, token, torch.ones(1, 1), frames, torch.ones(1, 4), pad_to=128)
    torch.testing.assert_close(full, torch.full((1, 1), -1.0))  # no padding: the true max
    torch.testing.assert_close(short, torch.zeros(1, 1))  # padded to 128 as released: a 0 joins the max


def test_csa_padding_and_chunking_do_not_change_scores(csa_batch, monkeypatch):
    head, tokens, tmask, frames, fmask = csa_batch
    expected = ral.csa_scores(head, tokens, tmask, frames, fmask)
    wide_tokens, wide_tmask = _garbage_pad(tokens, tmask, 3)
    wide_frames, wide_fmask = _garbage_pad(frames, fmask, 9)
    wide = ral.csa_scores(head, wide_tokens, wide_tmask, wide_frames, wide_fmask)
    torch.testing.assert_close(wide, expected)
    monkeypatch.setattr(ral, "CHUNK_ELEMENTS", 50)  # forces one query and one video per block
    torch.testing.assert_close(ral.csa_scores(head, tokens, tmask, frames, fmask), expected)


def test_csa_raw_scores_and_gradients(csa_batch):
    head, tokens, tmask, frames, fmask = csa_batch
    tokens, frames = tokens.requires_grad_(), frames.requires_grad_()
    raw = ral.csa_scores(head, tokens * 3, tmask, frames, fmask, normalize=False)
    cos = ral.csa_scores(head, tokens * 3, tmask, frames, fmask)
    assert not torch.allclose(raw, cos)  # dot products of unnormalised features are not cosines
    assert cos.abs().max() <= 1 + 1e-6
    (raw.sum() + cos.sum()).backward()
    for p in [*head.parameters(), tokens, frames]:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_csa_rejects_mismatched_widths(csa_batch):
    head, tokens, tmask, frames, fmask = csa_batch
    with pytest.raises(ValueError, match="token width 16 != frame width 8"):
        ral.csa_scores(head, tokens, tmask, frames[..., :8], fmask)


# ----------------------------------------------------------------------------- MSRA
def test_support_sets_concatenate_each_videos_valid_tokens():
    tmask = _mask([2, 3, 1, 2], 3)
    tokens = torch.arange(4 * 3 * 2, dtype=torch.float).view(4, 3, 2)
    labels = torch.tensor([1, 0, 1, 1])
    support, smask = ral.support_sets(tokens, tmask, labels, 2)
    assert support.shape == (2, 5, 2) and smask.tolist() == [[1, 1, 1, 0, 0], [1] * 5]
    torch.testing.assert_close(support[0, :3], tokens[1, :3])
    torch.testing.assert_close(support[1], torch.cat([tokens[0, :2], tokens[2, :1], tokens[3, :2]]))
    with pytest.raises(ValueError, match=r"videos \[2\] have no query"):
        ral.support_sets(tokens, tmask, labels, 3)


def test_mil_nce_matches_loop_and_rewards_alignment():
    torch.manual_seed(1)
    v, t = torch.randn(3, 2, H), torch.randn(3, 2, H)
    sim = v.reshape(6, H) @ t.reshape(6, H).t()
    owner = torch.arange(3).repeat_interleave(2)
    ref = 0.0
    for m in (sim, sim.t()):
        logp = m.log_softmax(dim=1)
        ref += torch.stack([-logp[i, owner == owner[i]].mean() for i in range(6)]).mean() / 2
    torch.testing.assert_close(ral.mil_nce(v, t), ref)
    aligned = 5 * torch.eye(H)[:3].unsqueeze(1).expand(3, 2, H)
    assert ral.mil_nce(aligned, aligned) < ral.mil_nce(aligned, aligned.roll(1, dims=0))


def test_gaussian_kl_terms_match_closed_forms():
    torch.manual_seed(2)
    vs, ts = torch.randn(4, 6, H), torch.randn(4, 6, H)
    vls, tls = torch.randn(4, H) * 0.3, torch.randn(4, H) * 0.3
    mv, mt = vs.mean(1), ts.mean(1)
    prior = Normal(0.0, 1.0)
    # prior terms read log-sigma as a log-variance, the cross-modal term reads exp(log-sigma) as a std
    expected = (kl_divergence(Normal(mv, (0.5 * vls).exp()), prior).sum(1).mean()
                + kl_divergence(Normal(mt, (0.5 * tls).exp()), prior).sum(1).mean()
                + kl_divergence(Normal(mt, tls.exp()), Normal(mv, vls.exp())).sum(1).mean())
    torch.testing.assert_close(ral.gaussian_kl(vs, vls, ts, tls), expected)
    zero = torch.zeros(2, 6, H)
    torch.testing.assert_close(ral.gaussian_kl(zero, zero[:, 0], zero, zero[:, 0]), torch.tensor(0.0))


def _msra_batch():
    torch.manual_seed(3)
    tmask, fmask = _mask([4, 2, 3, 5, 1], 5), _mask([6, 3], 6)
    labels = torch.tensor([0, 0, 1, 1, 1])
    return torch.randn(5, 5, H) * tmask[..., None], tmask, labels, torch.randn(2, 6, H), fmask


def test_msra_losses_ignore_padding_and_train_every_parameter():
    msra = ral.MSRA(H, n_samples=6)
    tokens, tmask, labels, frames, fmask = _msra_batch()
    torch.manual_seed(10)
    mil, kl = msra(tokens, tmask, labels, frames, fmask)
    wide = (*_garbage_pad(tokens, tmask, 4), labels, *_garbage_pad(frames, fmask, 7))
    torch.manual_seed(10)  # same Gaussian samples
    torch.testing.assert_close(torch.stack(msra(*wide)), torch.stack([mil, kl]))
    assert mil > 0 and kl > 0
    (mil + kl).backward()
    for name, p in msra.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


# ----------------------------------------------------------------------------- ICE
def test_mutual_nearest_pairs_selects_only_cross_video_mutual_matches():
    e = torch.eye(H)
    units = torch.zeros(3, 2, H)
    units[0, 0], units[0, 1] = e[0], e[5]  # video 0: unit 0 matches query 0 (cross-video)
    units[1, 0], units[1, 1] = e[1], e[2]  # video 1: unit 0 matches query 1 but they share the video
    units[2, 0], units[2, 1] = e[3] + 0.1 * e[4], e[6] + e[7]
    # query 3 (e6) is nearest to unit (2,1) (cos 0.71), but that unit's nearest query is query 5: not mutual
    queries = torch.stack([e[0], e[1], e[3] + e[4], e[6], e[2] + 3 * e[8], e[6] + e[7]])
    labels = torch.tensor([1, 1, 0, 0, 0, 0])
    video, unit, query = regularizers.mutual_nearest_pairs(units, queries, labels, threshold=0.4)
    # query 0 <-> (0,0) cos 1; query 2 <-> (2,0) cos 0.77; query 5 <-> (2,1) cos 1;
    # query 4 <-> (1,1) cos 0.32 < 0.4; query 1 shares video 1 with its nearest unit
    pairs = list(zip(video.tolist(), unit.tolist(), query.tolist(), strict=True))
    assert pairs == [(0, 0, 0), (2, 0, 2), (2, 1, 5)]


def test_ice_loss_trains_the_pairs_and_is_zero_without_pairs():
    torch.manual_seed(4)
    units = torch.randn(4, 8, H, requires_grad=True)
    queries = units.detach()[[1, 2, 3, 0], [3, 1, 5, 7]] + 0.01 * torch.randn(4, H)
    queries.requires_grad_()
    labels = torch.tensor([0, 1, 2, 3])
    loss, n = regularizers.ice_loss(units, queries, labels, 0.4, 0.2, 0.02, None)
    assert n == 4 and loss > 0
    loss.backward()
    assert units.grad[1, 3].abs().sum() > 0 and units.grad[1, 0].abs().sum() == 0  # only selected units
    assert torch.isfinite(queries.grad).all() and queries.grad.abs().sum() > 0
    none, n = regularizers.ice_loss(units, -queries, labels, 0.99, 0.2, 0.02, None)
    assert n == 0 and none.item() == 0.0


# ----------------------------------------------------------------------------- IRM
def test_irm_redundancy_features_and_loss():
    torch.manual_seed(5)
    miner = regularizers.RedundancyMiner(H)
    frames, fmask = torch.randn(3, 6, H), _mask([6, 2, 4], 6)
    queries, labels = torch.randn(7, H, requires_grad=True), torch.tensor([0, 0, 1, 1, 2, 2, 2])
    key_moments = torch.randn(7, H)
    r_v, r_q = miner(frames, fmask, key_moments, queries, labels)
    v = miner.pool(frames, fmask)
    torch.testing.assert_close(r_v, miner.fc(v[labels] - key_moments))
    torch.testing.assert_close(r_q, miner.fc(v[labels] - queries))
    torch.testing.assert_close(miner.pool(*_garbage_pad(frames, fmask, 5)), v)  # padding is ignored
    clip_cos = torch.rand(7, 3) * 2 - 1
    loss = regularizers.irm_loss(miner, frames, fmask, queries, labels, key_moments, clip_cos, 3 * clip_cos,
                                 0.2, 0.02, None)
    assert loss > 0
    loss.backward()
    for name, p in [*miner.named_parameters(), ("queries", queries)]:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


# ----------------------------------------------------------------------------- TCP
def test_group_labels_and_partial_shuffle():
    mask = _mask([16, 5, 3], 16)
    labels = regularizers.group_labels(mask, 8)
    assert labels[0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    assert labels[1, :5].tolist() == [0, 1, 3, 4, 6] and (labels[1, 5:] == -100).all()
    perm = regularizers.partial_shuffle(mask, 0.25, torch.Generator().manual_seed(0))
    assert (perm.sort(dim=1).values == torch.arange(16)).all()  # a permutation per row
    moved = perm != torch.arange(16)
    assert moved.sum(dim=1).tolist() == [4, 0, 0]  # round(0.25 * n) rows move; 1 chosen row cannot move
    assert not moved[mask == 0].any()  # padding stays in place


def test_tcp_loss_uses_shuffled_labels_and_trains_head_and_encoder():
    torch.manual_seed(6)
    heads = regularizers.CoherenceHeads(H, groups=8)
    encoder = nn.Linear(H, H)
    inputs, mask = torch.randn(3, 16, H), _mask([16, 12, 9], 16)
    loss = regularizers.tcp_loss(heads.frame, encoder, inputs, mask, encoder(inputs), 8, 0.25)
    assert torch.isfinite(loss) and loss > 2 * 1.5  # two cross-entropies near log(8) = 2.08 at random init
    loss.backward()
    for p in [*heads.frame.parameters(), *encoder.parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    assert heads.clip.weight.grad is None
    # a classifier that reads the group from the features scores the shuffled rows right only via their labels
    onehot = F.one_hot(regularizers.group_labels(mask, 8).clamp(min=0), 8).float() * 50

    def identity(x):
        return x

    perfect = regularizers.tcp_loss(nn.Identity(), identity, onehot, mask, onehot, 8, 0.25)
    assert perfect < 1e-6
    with pytest.raises(ValueError, match="at least 2 groups"):
        regularizers.CoherenceHeads(H, groups=1)


# ----------------------------------------------------------------------------- the options inside MSSL
DV, DQ = 24, 20
SMALL = {"hidden_size": 32}  # the official 384 only slows these tests down
OPTIONS = {  # each option's config switch -> the parameter prefixes it adds and the loss terms it adds
    "csa": (("frame_branch_query_proj.", "frame_branch_query_encoder.", "text_weight_fc."), ()),
    "msra": (("msra.",), ("msra_mil", "msra_kl")),
    "ice": ((), ("ice",)),
    "irm": (("irm.",), ("irm",)),
    "tcp": (("tcp.",), ("tcp",)),
}
BASE_LOSSES = {"clip_nce", "clip_trip", "frame_nce", "frame_trip", "total"}


def _batch(n_videos: int = 5):
    """A collated training batch: 2 captions per video, varied lengths (some padded)."""
    torch.manual_seed(7)
    lengths = [40, 33, 20, 7, 3][:n_videos]
    frames, fmask = pad([torch.randn(n, DV) for n in lengths])
    queries, qmask = pad([torch.randn(n, DQ) for n in [9, 4, 12, 6, 3, 8, 5, 10, 7, 2][: 2 * n_videos]])
    labels = torch.arange(n_videos).repeat_interleave(2)
    return torch.randn(n_videos, 32, DV), frames, fmask, queries, qmask, labels


@pytest.mark.parametrize("option", list(OPTIONS))
def test_each_option_is_one_config_field(option):
    prefixes, terms = OPTIONS[option]
    base = MSSL(MSSLConfig(visual_dim=DV, query_dim=DQ, **SMALL))
    model = MSSL(MSSLConfig(visual_dim=DV, query_dim=DQ, ice_threshold=-1.0, **SMALL, **{option: True}))
    assert len(base.state_dict()) == 54  # the official tensors, untouched by the defaults
    added = set(model.state_dict()) - set(base.state_dict())
    assert set(base.state_dict()) <= set(model.state_dict())
    assert all(k.startswith(prefixes) for k in added)
    assert all(any(k.startswith(p) for k in added) for p in prefixes)
    out = model.loss(*_batch())
    assert set(out) == BASE_LOSSES | set(terms)
    assert all(torch.isfinite(v) for v in out.values())
    torch.testing.assert_close(out["total"], sum(v for k, v in out.items() if k != "total"))
    out["total"].backward()
    for name, p in model.named_parameters():
        if any(name.startswith(pre) for pre in prefixes):
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_all_options_together_train_and_round_trip(tmp_path):
    cfg = MSSLConfig(visual_dim=DV, query_dim=DQ, **SMALL, **{o: True for o in OPTIONS})
    model = MSSL(cfg)
    out = model.loss(*_batch(), hard_negative_pool=2)
    out["total"].backward()
    assert torch.isfinite(out["total"])
    save_checkpoint(model, tmp_path / "ckpt")
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert loaded.cfg == cfg and loaded.fingerprint() == model.fingerprint()


def test_csa_changes_the_frame_score_at_inference():
    model = MSSL(MSSLConfig(visual_dim=DV, query_dim=DQ, csa=True, **SMALL)).eval()
    torch.manual_seed(8)
    videos = model.encode_videos([torch.randn(n, DV).numpy() for n in (50, 140, 5)])
    queries = model.encode_queries([torch.randn(n, DQ).numpy() for n in (4, 31, 9)])
    assert isinstance(queries, EncodedQueries) and queries.tokens.shape == (3, 30, 32)
    scores = model.score(queries, videos)
    expected = ral.csa_scores(model.text_weight_fc, queries.tokens, queries.token_mask, videos.frames,
                              videos.frame_mask, pad_to=128)
    torch.testing.assert_close(scores.frame, expected)
    torch.testing.assert_close(scores.total, 0.7 * scores.clip + 0.3 * scores.frame)
    torch.testing.assert_close(model.score(queries[1:], videos).total, scores.total[1:])  # per-query result
    with pytest.raises(TypeError, match="frame-branch tokens"):
        model.score(queries.vectors, videos)


def test_index_scores_a_csa_model_exactly(tmp_path):
    from prvr.index import GalleryVideo, VideoIndex
    from prvr.results.search import encode_query, search

    torch.manual_seed(9)
    model = MSSL(MSSLConfig(visual_dim=DV, query_dim=DQ, csa=True, **SMALL)).eval()
    rng = np.random.default_rng(0)
    videos = []
    for i, rows in enumerate((3, 40, 17, 150, 60, 8)):
        t = np.arange(rows, dtype=np.float32)
        features = rng.standard_normal((rows, DV)).astype(np.float32)
        videos.append(GalleryVideo(f"v{i}", features, t, t + 1, rows))
    tokens = [rng.standard_normal((n, DQ)).astype(np.float32) for n in (5, 12, 33)]
    index = VideoIndex.create(tmp_path / "ix", model)
    index.add(videos)
    expected = model.score(model.encode_queries(tokens), model.encode_videos([v.features for v in videos]))
    for j, t in enumerate(tokens):
        evidence = index.rank(encode_query(model, t), k=4)
        positions, totals = np.array([index.position[h.id] for h in evidence.hits]), evidence.totals
        best = np.lexsort((np.arange(len(videos)), -expected.total[j].numpy()))[:4]
        assert positions.tolist() == best.tolist()
        np.testing.assert_allclose(totals, expected.total[j].numpy()[best], atol=1e-5)
        hits = search([index], t, k=2).results
        np.testing.assert_allclose([h["frame_score"] for h in hits], expected.frame[j].numpy()[best[:2]],
                                   atol=1e-5)
    with pytest.raises(QueryError, match="needs the query's tokens"):
        index.rank(np.ones(SMALL["hidden_size"], np.float32), k=2)


def test_train_cli_flags_are_recorded_in_the_checkpoint(tmp_path):
    from prvr.data.synthetic import SyntheticConfig, generate
    from prvr.train.loop import main

    data = SyntheticConfig(n_videos=(8, 4, 4), captions_per_video=2, distractors_per_video=1, visual_dim=DV,
                           query_dim=DQ, min_frames=20, max_frames=30, seed=3)
    generate(data, tmp_path)
    args = ["--data", str(tmp_path), "--collection", data.collection, "--feature", data.feature,
            "--out", str(tmp_path / "run"), "--hidden_size=16", "--map_size=16", "--batch_size=4",
            "--n_epoch=1", "--csa", "--msra", "--ice", "--irm", "--tcp", "--tcp_w=0.5"]
    result = main(args)
    assert set(result["test"]) == {"total", "clip", "frame"}
    model = load_checkpoint(tmp_path / "run" / "best")
    assert all(getattr(model.cfg, o) for o in OPTIONS) and model.cfg.tcp_w == 0.5
    added = {"text_weight_fc.0.weight", "msra.pie_net_text.fc.weight", "irm.fc.weight", "tcp.frame.weight"}
    assert added <= set(model.state_dict())
