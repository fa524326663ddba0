"""Where a query matches inside one video: moments made of the video's own segments, and a heatmap.

This is the results layer's localisation; it never changes a score or a ranking (MS-SL's key clip is kept
beside it). Inputs, for one video: the query vector ``q`` (H,), the video's rows in the query space at the
model's finest resolution with their seconds (``model.encode_rows``), and its query-independent segments of
those same rows (``prvr.segments.segment_video``).

1. ``s_t = cos(q, row_t)`` for every row.
2. A threshold from the video's own similarities, so that nothing depends on the video's length or on the
   model's cosine scale: ``theta = lo + alpha * (hi - lo)``, ``lo`` the ``low_quantile`` of the rows'
   similarities (what the video looks like where it does not match), ``hi`` the best finest-scale segment's
   mean (where it matches best; a segment mean rather than one row, which can be a sliver).
3. Each finest-scale segment ``k`` weighs ``d_k * (m_k - theta)``: its duration (seconds) times how far its
   mean similarity lies above the threshold.
4. The key moment is the run of adjacent segments of largest total weight (a maximum subarray): the whole
   coherent span where the query matches. A run grows as long as what it adds lies above the threshold on
   average; a single best row cannot win over the scene around it. Up to ``n_moments - 1`` more moments:
   the same on what is left (never overlapping a kept one), each only if its weight is positive.

Moments come best first (by weight); each reports ``score``, the mean similarity of its rows. The heatmap
has one cell per row up to ``max_cells`` cells, then the rows' similarities averaged into ``max_cells``
equal bins.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prvr.segments import finest


@dataclass(frozen=True)
class MomentConfig:
    alpha: float = 0.5  # threshold: this fraction of the way from the low quantile to the best segment
    low_quantile: float = 0.5  # the video's typical similarity where it does not match
    n_moments: int = 3  # key moment + up to 2 more, non-overlapping
    max_cells: int = 128  # heatmap cells at most (one per row below this)


def _best_run(weight: np.ndarray) -> tuple[int, int, float]:
    """[a, b) of the contiguous run of largest ``weight`` sum (earliest start on ties), and that sum."""
    csum = np.concatenate([[0.0], np.cumsum(weight)])
    gain = csum[1:] - np.minimum.accumulate(csum[:-1])  # best run ending at each position
    b = int(np.argmax(gain)) + 1
    a = int(np.argmin(csum[:b]))
    return a, b, float(gain[b - 1])


def _check(q: np.ndarray, vectors: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Similarities (n,) of the query to the rows, after checking that the shapes agree."""
    q, vectors = np.asarray(q, np.float32), np.asarray(vectors, np.float32)
    if q.ndim != 1 or vectors.ndim != 2 or vectors.shape[1] != q.shape[0] or len(vectors) == 0:
        raise ValueError(f"find_moments: query {q.shape} and rows {vectors.shape}: expected (H,) and (n, H)")
    if np.shape(start) != (len(vectors),) or np.shape(end) != (len(vectors),):
        raise ValueError(f"find_moments: {len(vectors)} rows, start {np.shape(start)}, end {np.shape(end)}")
    norm = float(np.linalg.norm(q))
    return vectors @ (q / norm if norm > 0 else q)


def heatmap(sim: np.ndarray, start: np.ndarray, end: np.ndarray, max_cells: int) -> dict:
    """Row similarities as at most ``max_cells`` cells: {"start", "end", "score"} (seconds, mean cos)."""
    n = len(sim)
    edges = np.unique(np.linspace(0, n, min(n, max_cells) + 1).round().astype(np.int64))
    score = np.add.reduceat(sim.astype(np.float64), edges[:-1]) / np.diff(edges)
    return {"start": np.round(start[edges[:-1]], 3).tolist(), "end": np.round(end[edges[1:] - 1], 3).tolist(),
            "score": np.round(score, 6).tolist()}


def find_moments(q: np.ndarray, vectors: np.ndarray, start: np.ndarray, end: np.ndarray,
                 segments: np.ndarray, cfg: MomentConfig = MomentConfig()) -> dict:
    """{"key_moment", "moments", "heatmap"} of one video for query q (see the module docstring).

    ``vectors`` (n, H) unit rows with ``start``/``end`` (n,) seconds; ``segments`` (S, 3) from
    ``segment_video`` over these n rows. A moment is {"start", "end", "score", "rows": [first, end)}.
    """
    sim = _check(q, vectors, start, end)
    start, end = np.asarray(start, np.float64), np.asarray(end, np.float64)
    seg = finest(segments, len(sim))  # (K, 2) rows
    seg_sum = np.add.reduceat(sim.astype(np.float64), seg[:, 0])
    seg_mean = seg_sum / (seg[:, 1] - seg[:, 0])
    lo, hi = float(np.quantile(sim, cfg.low_quantile)), float(seg_mean.max())
    theta = lo + cfg.alpha * (hi - lo)
    weight = (end[seg[:, 1] - 1] - start[seg[:, 0]]) * (seg_mean - theta)
    free, moments = [(0, len(seg))], []  # segment ranges not yet used
    while free and len(moments) < cfg.n_moments:
        runs = [(lo_ + a, lo_ + b, v) for lo_, hi_ in free for a, b, v in [_best_run(weight[lo_:hi_])]]
        a, b, value = max(runs, key=lambda r: r[2])
        if moments and value <= 0:
            break
        first, stop = int(seg[a, 0]), int(seg[b - 1, 1])
        moments.append({"start": round(float(start[first]), 3), "end": round(float(end[stop - 1]), 3),
                        "score": round(float(sim[first:stop].mean()), 6), "rows": [first, stop]})
        piece = next(p for p in free if p[0] <= a < p[1])
        free.remove(piece)
        free += [p for p in ((piece[0], a), (b, piece[1])) if p[1] > p[0]]
    return {"key_moment": moments[0], "moments": moments,
            "heatmap": heatmap(sim, start, end, cfg.max_cells)}
