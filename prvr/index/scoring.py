"""Exact scores and evidence of chosen videos, for any gallery backend, from what it stores: the built-in
index reads them from its ``Snapshot``, the Qdrant backend from the points it fetched for its candidates.
Both implement ``VideoArrays``, the one interface this module reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from prvr.index.evidence import VideoEvidence
from prvr.index.query import QueryError
from prvr.index.rank import BOUND_EPS, ClipBounds, Exact, Stored, clip_bounds, exact_rows, frame_bounds
from prvr.index.schema import FINE
from prvr.index.sketch import BoundQuery
from prvr.models import ral
from prvr.models.branches import EncodedQueries
from prvr.models.preprocess import pad


@runtime_checkable
class VideoArrays(Protocol):
    """What exact scores and evidence read of a gallery's stored videos, by position (``schema.ARRAYS``)."""

    videos: Sequence[Mapping]  # every record by position
    table: np.ndarray  # (W, 2) the model's window table: [start, end) units of each window number
    seg_start: np.ndarray  # (S + 1,) where each segment's positions start (the kernels' runs)
    reads_ahead: bool  # True where ``prefetch`` starts disk reads (a gallery past memory), False in memory

    @property
    def stored(self) -> Stored:
        """The arrays as the kernels read them in place (``rank.Stored``)."""

    @property
    def windows(self) -> np.ndarray | None:
        """None when every video stores all windows in window_table order, else the table for ``pidx``."""

    def gather(self, key: str, positions: np.ndarray) -> np.ndarray:
        """Rows of the one-row-per-video array ``key`` for sorted positions."""

    def ragged(self, key: str, position: int) -> np.ndarray:
        """One video's rows of the ragged array ``key``."""

    def prefetch(self, keys: Sequence[str], positions: np.ndarray) -> None:
        """Start reading these arrays' rows of these videos, all at once (where reading costs a disk read)."""


def query_vector(q: np.ndarray | torch.Tensor | EncodedQueries) -> np.ndarray:
    """The (H,) float32 query vector of the model's encoding of one query."""
    if isinstance(q, EncodedQueries):
        q = q.vectors
    if isinstance(q, torch.Tensor):
        q = q.detach().float().cpu().numpy()
    x = np.asarray(q, dtype=np.float32).reshape(-1)
    if not np.isfinite(x).all():
        raise QueryError("the query vector contains NaN or inf")
    return np.ascontiguousarray(x)


def is_csa(model) -> bool:
    """True for a model whose frame score is RAL's CSA (from the query's tokens, not bounded by stored z)."""
    return bool(getattr(model.cfg, "csa", False))


def exact_of(model, snap: VideoArrays, positions: np.ndarray, q: np.ndarray | EncodedQueries,
             w: tuple[float, float], bq: BoundQuery | None = None) -> Exact:
    """``rank.Exact`` for sorted positions of a snapshot (the CSA frame score for a CSA model)."""
    bq = bq or BoundQuery.of(query_vector(q))
    threads = torch.get_num_threads() if len(positions) > 1 else 1
    ex = exact_rows(snap.stored, snap.seg_start, positions, bq, w, snap.windows, threads)
    if not is_csa(model):
        return ex
    frame = csa_frame(model, snap, positions, q)
    return dataclasses.replace(ex, frame=frame, total=w[0] * ex.clip + w[1] * frame)


def refined_bounds(model, snap: VideoArrays, positions: np.ndarray, bq: BoundQuery, w: tuple[float, float],
                   tau: float, threads: int, known: ClipBounds | None = None) -> np.ndarray:
    """Upper bounds of the totals of sorted positions from the sketch (``rank.top_k``'s ``refine``): the full
    8-bit codes' clip bound (from ``known`` where the first pass computed it), then, for those it leaves at or
    above tau, the frame balls' bound (not for a CSA model, whose frame score the stored features do not
    bound; not before a tau exists: it only helps to get below one)."""
    got = None if known is None else known.of(positions)
    clip, hi = got if got is not None else clip_bounds(snap.stored, snap.seg_start, positions, bq,
                                                       snap.windows, threads)
    total = w[0] * clip + w[1]
    if w[1] <= 0 or is_csa(model) or tau == -np.inf:
        return total
    eps = BOUND_EPS * (1 + w[0] + w[1])
    at = np.flatnonzero(total + eps >= tau)
    if len(at):
        enough = (tau - eps - w[0] * clip[at]) / w[1]
        # the last tier reads the factors of the videos the first two leave: where they come from disk, those
        # are asked for all at once between two passes; in memory, all three tiers in one pass (0.2 ms of a
        # 4 ms rank at 2,179 videos)
        frame = frame_bounds(snap.stored, snap.seg_start, positions[at], hi, at, bq, snap.windows, enough,
                             threads, tight=not snap.reads_ahead)
        more = frame >= enough
        if snap.reads_ahead and more.any():
            snap.prefetch(("zbasis", "zcoef"), positions[at[more]])
            frame[more] = frame_bounds(snap.stored, snap.seg_start, positions[at[more]], hi, at[more], bq,
                                       snap.windows, enough[more], threads)
        total[at] = w[0] * clip[at] + w[1] * frame
    return total


def csa_frame(model, snap: VideoArrays, positions: np.ndarray, q: np.ndarray | EncodedQueries) -> np.ndarray:
    """CSA frame scores (float64) of the videos at ``positions``, from their stored frames."""
    if not isinstance(q, EncodedQueries):
        raise QueryError("this index's model scores frames with CSA, which needs the query's tokens: "
                         "pass the model's EncodedQueries of the query (model.encode_queries) as q")
    device = model.device
    frames, mask = pad([torch.from_numpy(snap.ragged("frames", p).copy()) for p in positions])
    with torch.no_grad():
        scores = ral.csa_scores(model.text_weight_fc, q.tokens.to(device), q.token_mask.to(device),
                                frames.to(device), mask.to(device), pad_to=model.cfg.max_ctx_l)
    return scores[0].double().cpu().numpy()


def evidence_of(model, snap: VideoArrays, ranked: np.ndarray, q: np.ndarray | EncodedQueries,
                w: tuple[float, float], exact: Exact | None = None) -> tuple[VideoEvidence, ...]:
    """VideoEvidence of the ranked positions (read in storage order, returned in rank order); ``exact``:
    their exact scores, in rank order, where the ranking already computed them."""
    if not len(ranked):
        return ()
    order = np.argsort(ranked)
    positions = ranked[order]
    ex = exact_of(model, snap, positions, q, w) if exact is None else exact.take(order)
    units = snap.gather("units", positions).astype(np.float32)
    pidx = snap.gather("pidx", positions).astype(np.int64)
    windows = snap.table[pidx]  # (V, P, 2)
    V = np.arange(len(positions))
    key_window = windows[V, ex.key]  # (V, 2)
    attention = _attention(model, snap, positions, units, key_window)
    unit_norm = np.maximum(np.linalg.norm(units.astype(np.float64), axis=-1), 1e-12)
    unit_cos = ex.u / unit_norm / max(float(np.linalg.norm(query_vector(q).astype(np.float64))), 1e-12)
    ref_clip, ref_frame = snap.gather("ref_clip", positions), snap.gather("ref_frame", positions)
    hits = [VideoEvidence(snap.videos[p], float(ex.total[i]), float(ex.clip[i]), float(ex.frame[i]),
                          int(ex.key[i]), int(pidx[i, ex.key[i]]),
                          (int(key_window[i, 0]), int(key_window[i, 1])), windows[i], pidx[i],
                          ex.proposal_cos[i].astype(np.float64), unit_cos[i], snap.ragged("row_start", p),
                          snap.ragged("row_end", p), attention[i],
                          **_fine(snap, p), ref_clip=ref_clip[i],
                          ref_frame=ref_frame[i])
            for i, p in enumerate(positions)]
    return tuple(hits[i] for i in np.argsort(order))


def _fine(snap: VideoArrays, position: int) -> dict[str, np.ndarray]:
    """What localisation reads of a video: its fine rows (float16, as stored; mapped rows are read here)
    with seconds, segments, propagated context and both's bank statistics (``VideoEvidence``'s fields)."""
    return {key: np.asarray(snap.ragged(key, position)) for key in FINE}


def _attention(model, snap: VideoArrays, positions: np.ndarray, units: np.ndarray,
               key_window: np.ndarray) -> list[np.ndarray]:
    """The key clip's attention over each video's frames (``model.key_attention``; only these are read).
    One batch in the order of the videos' ids: any backend returning the same hits gets the same bits."""
    order = sorted(range(len(positions)), key=lambda i: str(snap.videos[positions[i]]["id"]))
    key = np.stack([units[i, s:e].astype(np.float64).mean(0) for i, (s, e) in enumerate(key_window)])
    alpha = model.key_attention([np.asarray(snap.ragged("frames", positions[i]), np.float32) for i in order],
                                key[order].astype(np.float32))
    out: list[np.ndarray] = [np.zeros(0)] * len(positions)
    for row, i in enumerate(order):
        out[i] = alpha[row]
    return out
