"""MS-SL training losses: InfoNCE on raw dot products and triplet ranking with sampled negatives.

All four are vectorised over queries and videos. Negative sampling follows the official schedule: with
``hard_pool`` None a negative is drawn uniformly from all negatives (before epoch 20), with an int n it is
drawn uniformly from the n hardest (from epoch 20 on; n = 1 is the hardest, deterministic).
"""

from __future__ import annotations

import torch
from torch import Tensor

_MASKED = 999.0  # the official positive-score mask: larger than any cosine, so it sorts first


def _positives(labels: Tensor, n_videos: int) -> Tensor:
    """(Nq, Nv) bool: query i belongs to video labels[i]."""
    return labels.unsqueeze(1) == torch.arange(n_videos, device=labels.device)


def clip_nce(scores: Tensor, labels: Tensor) -> Tensor:
    """InfoNCE on raw (Nq, Nv) scores: text->video + video->text with all of a video's queries positive."""
    positive = _positives(labels, scores.shape[1])
    rows = torch.arange(len(scores), device=scores.device)
    t2v = torch.logsumexp(scores, dim=1) - scores[rows, labels]
    # a video without queries in the batch contributes 0 to the mean, as in the official loop
    has_query = positive.any(dim=0)
    v2t_pos = torch.logsumexp(scores.masked_fill(~positive, float("-inf")), dim=0)
    v2t = torch.logsumexp(scores, dim=0) - v2t_pos
    return t2v.mean() + torch.where(has_query, v2t, torch.zeros_like(v2t)).mean()


def frame_nce(scores: Tensor) -> Tensor:
    """InfoNCE on raw (Nq, Nq) scores, diagonal positive: LSE(row i and column i, 2Nq terms) - s_ii."""
    both = torch.cat([scores, scores.t()], dim=1)  # row i holds row i and column i
    return (torch.logsumexp(both, dim=1) - scores.diagonal()).mean()


def _sample_sorted_negative(scores: Tensor, masked: Tensor, hard_pool: int | None) -> Tensor:
    """Per row, the score at a random sorted position in [1, n) (all) or [1, min(1 + pool, n)) (hard)."""
    n = scores.shape[1]
    if n < 2:
        raise ValueError(f"triplet loss needs at least 2 candidates per row to draw a negative, got {n}")
    order = masked.argsort(dim=1, descending=True)  # the masked positive comes first
    high = n if hard_pool is None else min(1 + hard_pool, n)
    pick = torch.randint(1, high, (len(scores),), device=scores.device)
    rows = torch.arange(len(scores), device=scores.device)
    return scores[rows, order[rows, pick]]


def _hinge(margin: float, negative: Tensor, positive: Tensor) -> Tensor:
    """Mean of max(0, margin + negative - positive)."""
    return (margin + negative - positive).clamp(min=0).mean()


def clip_triplet(scores: Tensor, labels: Tensor, margin: float, hard_pool: int | None = None) -> Tensor:
    """Triplet loss on cosine (Nq, Nv) clip scores, text->video plus video->text."""
    positive = _positives(labels, scores.shape[1])
    if positive.all(dim=0).any():
        raise ValueError("clip triplet loss: one video owns every query of the batch, so no negative query")
    rows = torch.arange(len(scores), device=scores.device)
    t2v_neg = _sample_sorted_negative(scores, scores.detach().masked_fill(positive, _MASKED), hard_pool)
    t2v = _hinge(margin, t2v_neg, scores[rows, labels])
    # video -> text: the positive is the mean over the video's queries; the negative is another video's query
    v2t_pos = (scores * positive).sum(dim=0) / positive.sum(dim=0).clamp(min=1)
    if hard_pool is None:  # a uniformly random negative query per video
        weights = (~positive).t().float()  # (Nv, Nq)
        neg_rows = torch.multinomial(weights, 1).squeeze(1)
        v2t_neg = scores[neg_rows, torch.arange(scores.shape[1], device=scores.device)]
    else:  # the official code takes the single hardest whatever the pool size
        v2t_neg = scores.masked_fill(positive, float("-inf")).max(dim=0).values
    return t2v + _hinge(margin, v2t_neg, v2t_pos)


def frame_triplet(scores: Tensor, margin: float, hard_pool: int | None = None) -> Tensor:
    """Triplet loss on cosine (Nq, Nq) frame scores (diagonal positive), over rows and over columns."""
    eye = torch.eye(len(scores), dtype=torch.bool, device=scores.device)
    masked = scores.detach().masked_fill(eye, _MASKED)
    positive = scores.diagonal()
    neg_video = _sample_sorted_negative(scores, masked, hard_pool)
    neg_query = _sample_sorted_negative(scores.t(), masked.t(), hard_pool)
    return _hinge(margin, neg_video, positive) + _hinge(margin, neg_query, positive)
