"""TF-PRVR's propagation over a video's segments: each row replaced by its segments' propagated features.

In the spirit of TF-PRVR (``../shared/docs/field-notes.md`` section 3), for one video's rows in the query
space and its segment hierarchy (``prvr.temporal.segments.segment_video``):

1. every distinct segment span of the hierarchy (a span that several scales share counts once, at the finest
   of them) gets its feature: the L2-normalised mean of its rows;
2. a graph over the segments: within one scale, the positive cosine of two segments times their temporal
   proximity ``exp(-|centre distance| / (0.1 n))``; across adjacent scales, the positive cosine times their
   temporal IoU (a segment and the coarser one that contains it). Symmetric normalisation
   ``D^-1/2 W D^-1/2``;
3. propagation ``(1 - beta) (I - beta W)^-1 F`` (the closed form of label-propagation's fixed point):
   a segment's feature is pulled towards the features of similar segments nearby and of its parent and
   children;
4. each row becomes the L2-normalised sum of the propagated features of every segment that covers it (one
   per scale): a row then carries its shot's, scene's and the video's context.

A row sitting inside a brief flash keeps its own shot's feature at the finest scale, so the event stays
visible; isolated noise rows are smoothed by their segment. ``propagate_rows`` is the model-side entry
point (``prvr.models.training_free`` applies it before MS-SL's binning when its config says so).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from prvr.temporal.segments import finest, segment_video

PROXIMITY = 0.1  # within-scale proximity decays over this fraction of the video's rows (TF-PRVR)
BETA = 0.7  # TF-PRVR's propagation strength (not tuned here)


def _unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    return x / np.linalg.norm(x, axis=-1, keepdims=True).clip(1e-9)


def segment_graph(spans: np.ndarray, scales: np.ndarray, feats: np.ndarray, n_rows: int) -> np.ndarray:
    """(S, S) normalised segment affinities: same scale cosine x proximity, adjacent scales IoU x cosine."""
    sim = np.clip(feats @ feats.T, 0, None)
    centre = spans.mean(axis=1)
    proximity = np.exp(-np.abs(centre[:, None] - centre[None]) / max(PROXIMITY * n_rows, 1.0))
    a, b = spans[:, None], spans[None]  # (S, 1, 2), (1, S, 2)
    inter = np.clip(np.minimum(a[..., 1], b[..., 1]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
    union = np.maximum(a[..., 1], b[..., 1]) - np.minimum(a[..., 0], b[..., 0])
    same, adjacent = scales[:, None] == scales[None], np.abs(scales[:, None] - scales[None]) == 1
    w = np.where(same, sim * proximity, 0.0) + np.where(adjacent, inter / union * sim, 0.0)
    np.fill_diagonal(w, 0.0)
    degree = w.sum(axis=1)
    degree[degree == 0] = 1.0
    return w / np.sqrt(degree[:, None] * degree[None])


def propagate(x: np.ndarray, segments: np.ndarray, beta: float) -> np.ndarray:
    """(n, H) unit rows: TF-PRVR's propagated segment features summed over the segments covering each row."""
    parts = finest(segments, len(x))
    return np.repeat(propagate_finest(x, segments, beta), parts[:, 1] - parts[:, 0], axis=0)


def propagate_finest(x: np.ndarray, segments: np.ndarray, beta: float) -> np.ndarray:
    """(F, H) unit rows: ``propagate``'s row for each of the F finest segments (every row of a finest
    segment gets the same one), in order. Query-independent: an index stores it with the video."""
    if not 0 <= beta < 1:
        raise ValueError(f"propagation beta must be in [0, 1), got {beta}")
    x = np.asarray(x, np.float64)
    parts = finest(segments, len(x))  # (F, 2): the segments must partition exactly these rows
    seg = np.asarray(segments, np.int64)
    spans, first = np.unique(seg[:, 1:], axis=0, return_index=True)  # each distinct span once
    scales = seg[first, 0]  # the finest scale that has it (segments are listed finest first)
    # every span is a run of finest segments (the scales nest): work on those, not on single rows
    lo, hi = np.searchsorted(parts[:, 0], spans[:, 0]), np.searchsorted(parts[:, 0], spans[:, 1])
    cover = sparse.csr_array((np.ones(int((hi - lo).sum())), (np.repeat(np.arange(len(spans)), hi - lo),
                              np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)]))),
                             shape=(len(spans), len(parts)))  # (S, F) span s covers finest segment f
    feats = _unit(cover @ np.add.reduceat(x, parts[:, 0], axis=0))  # segment means, normalised
    w = segment_graph(spans, scales, feats, len(x))
    prop = (1 - beta) * np.linalg.solve(np.eye(len(spans)) - beta * w, feats)
    # every row of a finest segment is covered by the same spans: one vector per finest segment
    return _unit(cover.T @ prop)


def propagate_rows(raw: np.ndarray, mapped: np.ndarray, beta: float) -> np.ndarray:
    """Rows in the query space (n, H) -> propagated (n, H) float32, over the segments of the raw rows."""
    return propagate(mapped, segment_video(np.asarray(raw, np.float32)), beta).astype(np.float32)
