"""MS-SL's two branches as plain functions, shared by ``MSSL`` and the training-free models.

The clip scale: every window of the M clip units mean-pooled into a proposal (``window_proposals``), the
query's max cosine over them (``clip_scale``). The frame scale: the best proposal (the key clip) attends
over the video's frames (``key_clip_attention`` through a model's ``AttendFn``) and the query's cosine
with the attended feature is the score (``frame_scale``). ``two_branch_scores`` is MS-SL's inference score.
What a model's encoders produce (``EncodedVideos``, ``EncodedQueries``) and what scoring returns
(``Scores``) are defined here too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from prvr.models.preprocess import window_table

_CHUNK_ELEMENTS = 1 << 24  # bound on the largest intermediate tensor in chunked scoring (64 MB float32)


# ----------------------------------------------------------------------------- what models encode and score
@dataclass
class EncodedVideos:
    clip_units: Tensor  # (Nv, M, H) encoded clip units C
    proposals: Tensor  # (Nv, P, H): all M(M+1)/2 windows (by length then start), or the k medoids
    proposal_index: Tensor  # (Nv, P) long: index 0..527 of each proposal among all windows
    frames: Tensor  # (Nv, L, H) encoded frames, zero-padded
    frame_mask: Tensor  # (Nv, L) float, 1 = valid


@dataclass
class EncodedQueries:
    """What a CSA model scores queries with: the pooled vectors plus the frame-branch tokens."""

    vectors: Tensor  # (Nq, H) attention-pooled query vectors (clip branch)
    tokens: Tensor  # (Nq, Lq, H) frame-branch token features, zero-padded
    token_mask: Tensor  # (Nq, Lq) float, 1 = valid

    def __len__(self) -> int:
        return len(self.vectors)

    def __getitem__(self, idx: slice | Tensor) -> EncodedQueries:
        return EncodedQueries(self.vectors[idx], self.tokens[idx], self.token_mask[idx])

    def to(self, device: torch.device | str) -> EncodedQueries:
        """Move every tensor to ``device``."""
        return EncodedQueries(self.vectors.to(device), self.tokens.to(device), self.token_mask.to(device))


def cat_queries(parts: Sequence[Tensor | EncodedQueries]) -> Tensor | EncodedQueries:
    """Concatenate batches of encoded queries (token batches are zero-padded to a common length)."""
    if not isinstance(parts[0], EncodedQueries):
        return torch.cat(list(parts))
    L = max(p.tokens.shape[1] for p in parts)
    return EncodedQueries(torch.cat([p.vectors for p in parts]),
                          torch.cat([F.pad(p.tokens, (0, 0, 0, L - p.tokens.shape[1])) for p in parts]),
                          torch.cat([F.pad(p.token_mask, (0, L - p.token_mask.shape[1])) for p in parts]))


@dataclass
class Scores:  # every field is (Nq, Nv)
    total: Tensor  # clip_scale_w * clip + frame_scale_w * frame
    clip: Tensor  # max cosine over proposals
    frame: Tensor  # cosine between the query and its key-clip-guided frame feature
    key_clip: Tensor  # long: index (0..527, among all windows) of the key clip


# ----------------------------------------------------------------------------- the branches
@functools.lru_cache(maxsize=8)
def _window_matrix(map_size: int, device: torch.device) -> Tensor:
    """(M(M+1)/2, M) averaging matrix: row j holds 1/k over the k units of window j (by length then start)."""
    table = window_table(map_size)
    units = torch.arange(map_size)
    inside = (units >= table[:, :1]) & (units < table[:, 1:])  # (P, M)
    return (inside / (table[:, 1:] - table[:, :1])).float().to(device)


def window_proposals(units: Tensor) -> Tensor:
    """(B, M, H) clip units -> (B, M(M+1)/2, H): mean of every contiguous window, by length then start."""
    # one small matmul: within ~3e-7 of the official average pooling (as close as that pooling is to the
    # exact means) and ~10x faster than prefix sums + gathers, forward and backward
    weights = _window_matrix(units.shape[1], units.device).to(units.dtype)
    return torch.matmul(weights, units)


def chunks(n: int, size: int) -> Iterator[slice]:
    """Consecutive slices of at most ``size`` covering range(n)."""
    size = max(1, size)
    return (slice(i, min(i + size, n)) for i in range(0, n, size))


def clip_scale(queries: Tensor, proposals: Tensor) -> tuple[Tensor, Tensor]:
    """Max over proposals of cos(q, p) and its argmax: (Nq, H) x (Nv, P, H) -> (Nq, Nv) twice."""
    queries, proposals = F.normalize(queries, dim=-1), F.normalize(proposals, dim=-1)
    per_chunk = _CHUNK_ELEMENTS // max(1, queries.shape[0] * proposals.shape[1])
    best = [torch.einsum("qh,vph->qvp", queries, proposals[c]).max(dim=-1)  # (Nq, c) each
            for c in chunks(len(proposals), per_chunk)]
    return torch.cat([b.values for b in best], dim=1), torch.cat([b.indices for b in best], dim=1)


def clip_scale_with_raw(queries: Tensor, proposals: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Training's two maxima: (max cos, its argmax, max raw q.p), each (Nq, Nv), differentiable."""
    # a max passes gradient to its argmax only, so the (Nq, Nv, P) products run once without autograd to
    # find both argmaxes (raw and cosine, from ONE product), and only the winning (q, proposal) pairs are
    # recomputed with gradient: the backward of the largest matmul of a training step disappears
    Nq, (Nv, P, H) = len(queries), proposals.shape
    p_norm = proposals.norm(dim=-1).clamp_min(1e-12)  # (Nv, P), F.normalize's eps
    with torch.no_grad():
        inv_norm = 1.0 / p_norm  # |q| does not move the argmax
        per_chunk = _CHUNK_ELEMENTS // max(1, Nq * P)
        cos_arg, raw_arg = [], []
        for c in chunks(Nv, per_chunk):
            dots = torch.einsum("qh,vph->qvp", queries, proposals[c])  # (Nq, c, P)
            raw_arg.append(dots.argmax(dim=-1))
            cos_arg.append(dots.mul_(inv_norm[None, c]).argmax(dim=-1))
        cos_arg, raw_arg = torch.cat(cos_arg, dim=1), torch.cat(raw_arg, dim=1)
    base = torch.arange(Nv, device=proposals.device) * P  # row of proposal 0 of each video in (Nv * P, H)
    flat = proposals.reshape(Nv * P, H)

    def picked_dots(arg: Tensor) -> tuple[Tensor, Tensor]:
        """(Nq, Nv) q . proposals[v, arg[q, v]] and the flat proposal rows; backward is an index_add."""
        rows = (base + arg).flatten()
        return torch.einsum("qh,qvh->qv", queries, flat.index_select(0, rows).view(Nq, Nv, H)), rows

    raw, _ = picked_dots(raw_arg)
    cos_dots, rows = picked_dots(cos_arg)
    q_norm = queries.norm(dim=-1).clamp_min(1e-12)
    return cos_dots / (q_norm[:, None] * p_norm.flatten().index_select(0, rows).view(Nq, Nv)), cos_arg, raw


def key_clip_attention(
    keys: Tensor, values: Tensor, frame_mask: Tensor, key_clips: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Single-head attention of key clips over frames (no scaling, as official).

    keys, values (Nv, L, H), frame_mask (Nv, L) 1 = valid, key_clips (Nv, J, H)
    -> z (Nv, J, H) attended frame features, alpha (Nv, J, L) weights (exactly 0 on padding).
    """
    alpha = attention_weights(key_clips @ keys.transpose(-1, -2), frame_mask, temperature)
    return alpha @ values, alpha


def attention_weights(logits: Tensor, frame_mask: Tensor, temperature: float = 1.0) -> Tensor:
    """Softmax over frames of (Nv, J, L) key-clip logits / temperature; exactly 0 on padding (mask 0)."""
    return (logits / temperature).masked_fill(frame_mask[:, None, :] == 0, -1e9).softmax(dim=-1)


def frame_attention(frames: Sequence[np.ndarray], keys: np.ndarray) -> list[np.ndarray]:
    """``attention_weights`` of one key (H,) per video (keys (V, H)) over that video's own frames (L_i, H),
    unpadded, in numpy (float32): what results show for a handful of hits, where torch's per-op cost would
    exceed the work. einsum, not BLAS: BLAS's worker threads would spin on the cores the search needs."""
    out = []
    for f, key in zip(frames, keys, strict=True):
        logits = np.einsum("lh,h->l", f, key)
        e = np.exp(logits - logits.max())
        out.append(e / e.sum())
    return out


# how a model attends: (frames (Nv, L, H), frame_mask (Nv, L), key_clips (Nv, J, H)) -> z (Nv, J, H), alpha
AttendFn = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def attend_proposals(videos: EncodedVideos, proposal_idx: Tensor, attend: AttendFn) -> tuple[Tensor, Tensor]:
    """Key-clip-guided attention for proposals (Nv, J) (indices into videos.proposals) -> z, alpha."""
    idx = proposal_idx.to(videos.proposals.device)
    key_clips = videos.proposals.gather(1, idx[..., None].expand(-1, -1, videos.proposals.shape[-1]))
    return attend(videos.frames, videos.frame_mask, key_clips)


def frame_scale(queries: Tensor, videos: EncodedVideos, key_idx: Tensor, attend: AttendFn) -> Tensor:
    """cos(q, z) for every pair, z = ``attend`` of the pair's key clip (key_idx (Nq, Nv)) -> (Nq, Nv)."""
    (Nq, H), Nv, L = queries.shape, len(videos.proposals), videos.frames.shape[1]
    unit = F.normalize(queries, dim=-1)
    frame = queries.new_empty(Nq, Nv)
    for c in chunks(Nv, _CHUNK_ELEMENTS // max(1, Nq * max(L, H))):
        idx = key_idx[:, c].t()  # (c, Nq)
        key_clips = videos.proposals[c].gather(1, idx[..., None].expand(-1, -1, H))  # (c, Nq, H)
        z, _ = attend(videos.frames[c], videos.frame_mask[c], key_clips)  # (c, Nq, H)
        frame[:, c] = torch.einsum("qh,vqh->qv", unit, F.normalize(z, dim=-1))
    return frame


def branch_scores(clip: Tensor, key_idx: Tensor, frame: Tensor, videos: EncodedVideos,
                  weights: tuple[float, float]) -> Scores:
    """Scores from the two branches' (Nq, Nv) cosines, weighted (clip, frame); key clips among all windows."""
    key_clip = videos.proposal_index.gather(1, key_idx.t()).t()
    return Scores(total=weights[0] * clip + weights[1] * frame, clip=clip, frame=frame, key_clip=key_clip)


def two_branch_scores(queries: Tensor, videos: EncodedVideos, attend: AttendFn,
                      weights: tuple[float, float]) -> Scores:
    """MS-SL's inference score of every (query, video) pair: key clip, its attention, weighted sum."""
    clip, key_idx = clip_scale(queries, videos.proposals)
    return branch_scores(clip, key_idx, frame_scale(queries, videos, key_idx, attend), videos, weights)
