"""Query-independent temporal segments of one video, at several scales, from its own feature rows.

As in TF-PRVR (``../shared/docs/field-notes.md`` section 3), boundaries lie where the content changes, as
peaks of multi-scale detail responses, and the scales nest. Rows are L2-normalised and, wider than 64,
projected by a fixed random sign matrix to 64 dimensions (Johnson-Lindenstrauss: the peaks stay, the cost
falls). Scale ``j``'s response at the gap before row ``t`` is the distance between the means of the ``2**j``
rows before and after (an undecimated Haar detail, flat inside a shot, peaking at a cut or fade; TF-PRVR's
turning of velocity vectors is noise inside a static shot of 1 s rows). Its boundaries are peaks above its
mean + std, at least ``2**j`` rows apart, each moved to the sharpest change within half a window so that
scales agree; a scale also keeps every coarser boundary, so segments nest from coarse to fine.

``segment_video(rows) -> (S, 3) int32`` rows ``[scale, start_row, end_row)``: per scale
(``max(1, ceil(log2(n)))`` of them, 0 = finest, ascending) the segments partitioning ``[0, n)`` in time
order; deterministic. ``finest`` checks the finest scale's partition; ``resample`` moves segments onto a
model's coarser rows (MS-SL re-bins past ``max_ctx_l``). The projection's measured cost:
benchmarks/RESULTS.md, "Issue #42: history moved from module docstrings".
"""

from __future__ import annotations

import functools

import numpy as np
import torch

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
    # imported here: scipy.signal costs every start of the app about a second; only an add computes segments
    from scipy.signal import find_peaks

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
