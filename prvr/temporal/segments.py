"""Query-independent temporal segments of one video, at several scales, from its own feature rows.

In the spirit of TF-PRVR (``../shared/docs/field-notes.md`` section 3): boundaries are placed where the
content changes, found as peaks of multi-scale detail responses, and the scales form a hierarchy.

1. Rows are L2-normalised (cosine geometry, as every model here compares them) and, when wider than 64,
   projected by a fixed random sign matrix to 64 dimensions: distances between window means are kept to
   within a few tens of percent (Johnson-Lindenstrauss), enough to find where they peak, and a 20-minute
   video's 1,200 1280-d rows then take ~8 ms instead of ~120 (one core, idle machine).
2. Scale ``j`` (window ``w = 2**j`` rows) has an undecimated Haar detail response at every gap ``t`` between
   rows ``t - 1`` and ``t``: the distance between the mean of the ``w`` rows before and the ``w`` rows after
   (windows truncated at the video's ends). A scene cut is a step: its response is a peak at the cut on
   every scale, wider and more robust to noise at coarse scales.
3. Boundaries of scale ``j``: peaks of its response above its own mean + std (``scipy.signal.find_peaks``,
   peaks at least ``w`` rows apart), each moved to the sharpest change within ``w // 2`` rows (the finest
   response's maximum there), so that every scale agrees on where a cut lies.
4. Hierarchy: a scale's partition keeps every boundary of the coarser scales plus its own (a boundary
   within one row of a kept one is the same cut), so segments nest from coarse to fine.

TF-PRVR measures change as the turning of consecutive velocity vectors; with 1 s rows a static shot's
velocities are noise whose directions turn at random, so the window-mean difference (the vector-valued Haar
detail) is used instead: it is flat inside a static or slowly moving shot and peaks at a cut or a fade.

``segment_video(rows) -> (S, 3) int32`` rows ``[scale, start_row, end_row)``: for every scale, the segments
that partition ``[0, n)``, in time order, scales ascending (0 = finest). There are ``max(1, ceil(log2(n)))``
scales (windows ``2**j < n``), each listed even when its partition equals a neighbour's. A constant video, or
one row, is one segment per scale. Deterministic (the projection's seed is fixed).

``finest(segments, n)`` checks that the finest scale partitions ``[0, n)``; ``resample`` moves segments found
on the extracted rows onto a model's coarser rows (MS-SL re-bins past ``max_ctx_l`` frames).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from scipy.signal import find_peaks

SKETCH_DIM = 64  # rows wider than this are randomly projected to this width first (speed)
SKETCH_SEED = 0
MIN_RESPONSE = 1e-3  # unit rows: float32 noise of a constant video is far below; a real cut is > 0.1


def _prefix_sums(rows: np.ndarray) -> np.ndarray:
    """(n + 1, D) float32 prefix sums of the L2-normalised rows (zero rows stay zero); checks the input."""
    x = np.asarray(rows)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"segment_video: expected a non-empty (rows, dim) array, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"segment_video: expected floating point rows, got dtype {x.dtype}")
    if not np.isfinite(x).all():
        raise ValueError("segment_video: rows contain NaN or inf")
    x = x.astype(np.float32)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    x /= np.where(norm > 0, norm, 1.0)
    if x.shape[1] > SKETCH_DIM:  # window-mean distances survive a random projection (Johnson-Lindenstrauss)
        # torch's matmul, not numpy's: right after the model's torch ops, numpy's BLAS threads take ~20 ms
        # to take over the cores for this small product (two thread pools handing over), torch's do not
        x = (torch.from_numpy(x) @ torch.from_numpy(_projection(x.shape[1]))).numpy()
    return np.concatenate([np.zeros((1, x.shape[1]), np.float32), np.cumsum(x, axis=0)])


@functools.lru_cache(maxsize=8)
def _projection(dim: int) -> np.ndarray:
    """A fixed (dim, SKETCH_DIM) random sign matrix scaled to keep norms (the same for every video)."""
    signs = np.random.default_rng(SKETCH_SEED).integers(0, 2, (dim, SKETCH_DIM)) * 2 - 1
    return (signs / np.sqrt(SKETCH_DIM)).astype(np.float32)


def haar_response(csum: np.ndarray, w: int, gaps: np.ndarray) -> np.ndarray:
    """Detail response of window w at each gap t (rows t - 1 | t): distance of the window means."""
    n = len(csum) - 1
    lo, hi = np.maximum(gaps - w, 0), np.minimum(gaps + w, n)
    before = (csum[gaps] - csum[lo]) / (gaps - lo)[:, None]
    after = (csum[hi] - csum[gaps]) / (hi - gaps)[:, None]
    return np.linalg.norm(after - before, axis=1)


def _boundaries(csum: np.ndarray, w: int, finest: np.ndarray) -> np.ndarray:
    """Gaps of scale w's peaks above mean + std, each moved to the sharpest change within w // 2 gaps.

    Coarse scales are evaluated on every (w // 4)-th gap only (their response varies slowly): the cost of
    all scales together stays a few times that of the finest."""
    n = len(csum) - 1
    stride = max(1, w // 4)
    gaps = np.arange(1, n, stride)
    response = finest[gaps - 1] if w == 1 else haar_response(csum, w, gaps)
    if len(response) == 0 or response.max() < MIN_RESPONSE:
        return np.zeros(0, np.int64)
    height = max(response.mean() + response.std(), MIN_RESPONSE)
    padded = np.concatenate([[0.0], response, [0.0]])  # a peak may sit at the first or last gap
    peaks, _ = find_peaks(padded, height=height, distance=max(1, w // stride))
    half = w // 2  # refine: the finest response's maximum within half gaps of each peak (inner gaps only)
    padded = np.pad(finest, half, constant_values=-1.0)
    window = np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1)
    centre = gaps[peaks - 1]
    return centre - half + np.argmax(window[centre - 1], axis=1)


def segment_video(rows: np.ndarray) -> np.ndarray:
    """(S, 3) int32 ``[scale, start_row, end_row)``: nested partitions of the rows, see the module doc."""
    csum = _prefix_sums(rows)
    n = len(csum) - 1
    n_scales = max(1, int(np.ceil(np.log2(n))))  # windows 2**j < n, at least one scale
    finest = haar_response(csum, 1, np.arange(1, n))  # (n - 1,) response of gaps 1 .. n - 1
    taken = np.zeros(n + 2, bool)  # gaps holding a boundary of a coarser (or this) scale
    partitions = []
    for j in reversed(range(n_scales)):  # coarse to fine: finer scales add boundaries
        for b in _boundaries(csum, 2**j, finest):
            if not taken[b - 1:b + 2].any():  # within one row of a kept boundary: the same cut
                taken[b] = True
        edges = np.concatenate([[0], np.flatnonzero(taken[1:n]) + 1, [n]])
        partitions.append(np.stack([np.full(len(edges) - 1, j), edges[:-1], edges[1:]], axis=1))
    return np.concatenate(partitions[::-1]).astype(np.int32)


def finest(segments: np.ndarray, n_rows: int) -> np.ndarray:
    """(S0, 2) [start_row, end_row) of the finest scale; checks that it partitions ``[0, n_rows)``."""
    seg = np.asarray(segments)
    if seg.ndim != 2 or seg.shape[1] != 3 or len(seg) == 0:
        raise ValueError(f"segments: expected a non-empty (S, 3) [scale, start, end) array, got {seg.shape}")
    part = seg[seg[:, 0] == seg[:, 0].min(), 1:].astype(np.int64)
    if part[0, 0] != 0 or part[-1, 1] != n_rows or (part[1:, 0] != part[:-1, 1]).any() or \
            (part[:, 1] <= part[:, 0]).any():
        raise ValueError(f"segments: the finest scale does not partition the video's {n_rows} rows "
                         f"(got {part[:3].tolist()} ... {part[-3:].tolist()})")
    return part


def resample(segments: np.ndarray, row_start: np.ndarray, target_start: np.ndarray) -> np.ndarray:
    """Segments of rows starting at ``row_start`` (s) -> the same cuts on rows starting at ``target_start``.

    For a model whose rows are coarser than the extracted ones (MS-SL re-bins past max_ctx_l frames): each
    boundary moves to the target row starting nearest to it; segments that become empty are dropped."""
    seg = np.asarray(segments)
    row_start, target_start = np.asarray(row_start, np.float64), np.asarray(target_start, np.float64)
    if len(row_start) == len(target_start) and np.array_equal(row_start, target_start):
        return seg.astype(np.int32)
    finest(seg, len(row_start))
    times = row_start[np.clip(seg[:, 1:], 0, len(row_start) - 1)]
    times[:, 1] = np.where(seg[:, 2] == len(row_start), np.inf, times[:, 1])  # the video's end stays the end
    nearest = np.abs(target_start[None, None, :] - times[..., None]).argmin(axis=-1)
    nearest[:, 1] = np.where(np.isinf(times[:, 1]), len(target_start), nearest[:, 1])
    nearest[seg[:, 1] == 0, 0] = 0
    out = np.concatenate([seg[:, :1], nearest], axis=1)
    return out[out[:, 2] > out[:, 1]].astype(np.int32)
