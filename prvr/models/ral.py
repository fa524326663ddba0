"""RAL (EMNLP'25 Findings) ported to MS-SL: CSA word-confidence frame scoring and MSRA uncertainty alignment.

RAL was released only on a GMMFormer-v2 backbone; the port follows the reference notes: MS-SL's 528-proposal
clip branch stays, the frame score S_f becomes CSA over MS-SL's encoded frames, and MSRA adds two training
losses. Behaviour follows the released code, including its quirks, except where noted below.

* CSA: a second, frame-branch query encoder keeps its token outputs T_q (built by ``MSSL``, which owns the
  encoders). A word-confidence head gives w_t = softmax over valid words; S_f(q, v) = sum_t w_t max_f
  cos(T_q[t], F_v[f]). The released code zero-pads frames to ``max_ctx_l`` and *multiplies* padded entries by
  0, so a video shorter than ``max_ctx_l`` gets max(0, max over its frames) per word. We reproduce exactly
  that, independent of how far a batch happens to be padded.
* MSRA (training only): per video, the support set of all its queries' tokens and its frames each become a
  Gaussian (PIENet mean + uncertainty log-sigma); K samples per side feed a multi-instance InfoNCE and KL
  terms. Deviation: the attention pooling masks padding. The released code pads the text support set to
  ``max_desc_l * 26`` (a per-dataset constant in its source) without a mask, so padding tokens draw attention
  weight and the result depends on that constant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

CHUNK_ELEMENTS = 1 << 24  # bound on the (queries x videos x words x frames) block scored at once (64 MB fp32)


# ----------------------------------------------------------------------------- CSA
def word_confidence_head(hidden: int) -> nn.Sequential:
    """RAL's ``text_weight_fc``: Linear(H, H) -> ReLU -> Linear(H, 1), one logit per word."""
    return nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def word_weights(head: nn.Module, tokens: Tensor, token_mask: Tensor) -> Tensor:
    """(Nq, Lq, H) tokens + (Nq, Lq) mask -> (Nq, Lq) word confidences (softmax, exactly 0 on padding)."""
    logits = head(tokens).squeeze(-1).masked_fill(token_mask == 0, float("-inf"))
    return logits.softmax(dim=-1)


def csa_scores(
    head: nn.Module,
    tokens: Tensor,
    token_mask: Tensor,
    frames: Tensor,
    frame_mask: Tensor,
    normalize: bool = True,
    pad_to: int = 128,
) -> Tensor:
    """Confidence-weighted set-to-set score of every (query, video) pair -> (Nq, Nv).

    tokens (Nq, Lq, H), token_mask (Nq, Lq), frames (Nv, Lf, H), frame_mask (Nv, Lf); 1 = valid.
    ``normalize`` True gives the cosine score S_f, False the raw dot-product S_f' used by the NCE (the word
    weights then come from the raw tokens too, as released). Videos with fewer than ``pad_to`` valid frames
    see a 0 in the max over frames, because the released code zero-pads to ``pad_to`` (``max_ctx_l``).
    """
    if tokens.shape[-1] != frames.shape[-1]:
        raise ValueError(f"csa_scores: token width {tokens.shape[-1]} != frame width {frames.shape[-1]}")
    if tokens.shape[:2] != token_mask.shape or frames.shape[:2] != frame_mask.shape:
        raise ValueError(f"csa_scores: masks {tuple(token_mask.shape)}, {tuple(frame_mask.shape)} do not "
                         f"match tokens {tuple(tokens.shape)}, frames {tuple(frames.shape)}")
    if normalize:
        tokens, frames = F.normalize(tokens, dim=-1), F.normalize(frames, dim=-1)
    weights = word_weights(head, tokens, token_mask)  # (Nq, Lq)
    padded_video = frame_mask.sum(dim=1) < pad_to  # (Nv,) these see the released code's zero entries
    invalid_frame = frame_mask == 0
    (Nq, Lq, _), (Nv, Lf, _) = tokens.shape, frames.shape
    q_step = max(1, min(Nq, CHUNK_ELEMENTS // max(1, Lq * Lf)))
    v_step = max(1, CHUNK_ELEMENTS // max(1, q_step * Lq * Lf))
    rows = []
    for qs in range(0, Nq, q_step):
        q = slice(qs, qs + q_step)
        cols = []
        for vs in range(0, Nv, v_step):
            v = slice(vs, vs + v_step)
            sim = torch.einsum("qth,vfh->qvtf", tokens[q], frames[v])  # (q, v, Lq, Lf)
            sim = sim.masked_fill(invalid_frame[v][None, :, None, :], float("-inf"))
            best = sim.amax(dim=-1)  # (q, v, Lq) best frame per word
            best = torch.where(padded_video[v][None, :, None], best.clamp(min=0), best)
            # padded words have weight exactly 0 (and finite best), so they add nothing
            cols.append(torch.einsum("qvt,qt->qv", best, weights[q]))
        rows.append(torch.cat(cols, dim=1))
    return torch.cat(rows, dim=0)


# ----------------------------------------------------------------------------- MSRA
class AttentionPool(nn.Module):
    """Self-attentive pooling (Lin et al. 2017, PIENet's): softmax_t(W2 tanh(W1 x_t)) over valid tokens."""

    def __init__(self, hidden: int):
        super().__init__()
        self.w_1 = nn.Linear(hidden, hidden // 2, bias=False)
        self.w_2 = nn.Linear(hidden // 2, 1, bias=False)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, L, H), mask (B, L) 1 = valid -> (B, H)."""
        logits = self.w_2(torch.tanh(self.w_1(x))).squeeze(-1).masked_fill(mask == 0, float("-inf"))
        return torch.einsum("bl,blh->bh", logits.softmax(dim=-1), x)


class PIENet(nn.Module):
    """Gaussian mean: LayerNorm(pooled + sigmoid(fc(attention-pooled tokens))); the caller L2-normalises."""

    def __init__(self, hidden: int):
        super().__init__()
        self.attention = AttentionPool(hidden)
        self.fc = nn.Linear(hidden, hidden)
        self.layer_norm = nn.LayerNorm(hidden)

    def forward(self, pooled: Tensor, x: Tensor, mask: Tensor) -> Tensor:
        """pooled (B, H), x (B, L, H), mask (B, L) -> (B, H)."""
        return self.layer_norm(pooled + torch.sigmoid(self.fc(self.attention(x, mask))))


class UncertaintyHead(nn.Module):
    """Gaussian log-sigma: fc(attention-pooled tokens) + fc2(pooled) (PCME's ``UncertaintyModuleImage``)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.attention = AttentionPool(hidden)
        self.fc = nn.Linear(hidden, hidden)
        self.fc2 = nn.Linear(hidden, hidden)

    def forward(self, pooled: Tensor, x: Tensor, mask: Tensor) -> Tensor:
        """pooled (B, H), x (B, L, H), mask (B, L) -> log sigma (B, H)."""
        return self.fc(self.attention(x, mask)) + self.fc2(pooled)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x (B, L, H) over the valid positions of mask (B, L) -> (B, H)."""
    return torch.einsum("blh,bl->bh", x, mask) / mask.sum(dim=1, keepdim=True).clamp(min=1)


def support_sets(tokens: Tensor, token_mask: Tensor, labels: Tensor, n_videos: int) -> tuple[Tensor, Tensor]:
    """Concatenate the valid tokens of each video's queries: -> (Nv, S, H) zero-padded and (Nv, S) mask."""
    counts = torch.bincount(labels, minlength=n_videos)
    if (counts == 0).any():
        missing = (counts == 0).nonzero().flatten()[:10].tolist()
        raise ValueError(f"support_sets: videos {missing} have no query in the batch")
    valid = token_mask.bool()
    order = torch.argsort(labels, stable=True)  # queries grouped by video, batch order kept within a video
    flat = tokens[order][valid[order]]  # (T, H) valid tokens, grouped by video
    owner = labels[order].repeat_interleave(valid[order].sum(dim=1))  # (T,) video of each token
    per_video = torch.bincount(owner, minlength=n_videos)
    slot = torch.arange(len(owner), device=tokens.device) - (per_video.cumsum(0) - per_video)[owner]
    out = tokens.new_zeros(n_videos, int(per_video.max()), tokens.shape[-1])
    mask = token_mask.new_zeros(n_videos, out.shape[1])
    out[owner, slot] = flat
    mask[owner, slot] = 1.0
    return out, mask


def gaussian_samples(mean: Tensor, log_sigma: Tensor, k: int) -> Tensor:
    """k reparameterised samples mean + eps * exp(log_sigma), eps ~ N(0, I): (B, H) -> (B, k, H)."""
    eps = torch.randn(mean.shape[0], k, mean.shape[1], dtype=mean.dtype, device=mean.device)
    return mean.unsqueeze(1) + eps * log_sigma.exp().unsqueeze(1)


def mil_nce(video_samples: Tensor, text_samples: Tensor) -> Tensor:
    """Multi-instance InfoNCE over (B*K) x (B*K) raw dot products; a video's K x K block is positive."""
    B, K, H = video_samples.shape
    owner = torch.arange(B, device=video_samples.device).repeat_interleave(K)
    positive = (owner[:, None] == owner[None, :]).float()
    sim = video_samples.reshape(-1, H) @ text_samples.reshape(-1, H).t()  # (B*K, B*K), no temperature
    from_video = -(sim.log_softmax(dim=1) * positive).sum(dim=1) / positive.sum(dim=1)
    from_text = -(sim.t().log_softmax(dim=1) * positive).sum(dim=1) / positive.sum(dim=1)
    return (from_video.mean() + from_text.mean()) / 2


def gaussian_kl(video_samples: Tensor, video_log_sigma: Tensor, text_samples: Tensor,
                text_log_sigma: Tensor) -> Tensor:
    """The released KL terms: each side vs N(0, I) plus text-vs-video, summed over dims, batch-averaged.

    As released: means are the sample means; the prior terms read log_sigma as a log-variance while the
    cross-modal term reads exp(log_sigma) as a standard deviation (inconsistent, kept on purpose).
    """
    mu_v, mu_t = video_samples.mean(dim=1), text_samples.mean(dim=1)

    def to_prior(mu: Tensor, log_var: Tensor) -> Tensor:
        return (-0.5 * (1 + log_var - mu.pow(2) - log_var.exp())).sum(dim=1).mean()

    std_v, std_t = video_log_sigma.exp(), text_log_sigma.exp()
    var_ratio = (std_t.pow(2) + (mu_t - mu_v).pow(2)) / (2 * std_v.pow(2))
    cross = video_log_sigma - text_log_sigma + var_ratio - 0.5
    return to_prior(mu_v, video_log_sigma) + to_prior(mu_t, text_log_sigma) + cross.sum(dim=1).mean()


class MSRA(nn.Module):
    """Multi-granularity semantic uncertainty alignment: Gaussian text/video embeddings -> MIL-NCE and KL."""

    def __init__(self, hidden: int, n_samples: int = 6):
        super().__init__()
        if n_samples < 1:
            raise ValueError(f"MSRA needs at least one sample per modality, got n_samples={n_samples}")
        self.n_samples = n_samples
        self.pie_net_text, self.uncertain_net_text = PIENet(hidden), UncertaintyHead(hidden)
        self.pie_net_video, self.uncertain_net_video = PIENet(hidden), UncertaintyHead(hidden)

    def forward(self, tokens: Tensor, token_mask: Tensor, labels: Tensor, frames: Tensor,
                frame_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Query tokens (Nq, Lq, H) of videos ``labels``, frames (Nv, Lf, H) -> (MIL-NCE, KL), unweighted."""
        support, support_mask = support_sets(tokens, token_mask, labels, len(frames))
        text_pooled = masked_mean(support, support_mask)
        text_mean = F.normalize(self.pie_net_text(text_pooled, support, support_mask), dim=-1)
        text_log_sigma = self.uncertain_net_text(text_pooled, support, support_mask)
        video_pooled = F.normalize(masked_mean(F.normalize(frames, dim=-1), frame_mask), dim=-1)
        video_mean = F.normalize(self.pie_net_video(video_pooled, frames, frame_mask), dim=-1)
        video_log_sigma = self.uncertain_net_video(video_pooled, frames, frame_mask)
        text_samples = gaussian_samples(text_mean, text_log_sigma, self.n_samples)
        video_samples = gaussian_samples(video_mean, video_log_sigma, self.n_samples)
        mil = mil_nce(video_samples, text_samples)
        kl = gaussian_kl(video_samples, video_log_sigma, text_samples, text_log_sigma)
        return mil, kl
