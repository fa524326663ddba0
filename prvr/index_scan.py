"""Exact top-k scoring of a stored gallery: rigorous upper bounds from an 8-bit sketch first, exact scores
only where they matter.

Why it is exact. A video's proposals are means of windows over its M clip units C_1..C_M, so with
u_t = q.C_t the clip-scale cosine of window (k, s) is (u_s + ... + u_{s+k-1}) / (k |q| |p_(k,s)|): the M dot
products, prefix sums and the stored proposal norms give every proposal's cosine, hence S_clip and the key
clip j*. The frame-scale feature z_j (key-clip-guided attention with proposal j as the key) does not depend
on the query, so it is computed once per proposal at indexing time and stored normalised: S_frame is one dot
product with the row of j*. ``exact_scores`` does exactly this.

Why it is fast. Scoring is memory-bound (a full scan reads every video's float32 units), so each query first
reads an 8-bit SKETCH of the units, a quarter of the bytes, and computes an UPPER BOUND of every video's
total; then videos are scored exactly in descending bound order until the next bound is below the k-th best
exact total (``top_k``). The result is identical to scoring everything; only the bytes read change.
The bounds (all rigorous):
- clip: unit C_t is stored as 8-bit codes times one scale (C~_t), with |C_t - C~_t| and |C_t|. By
  Cauchy-Schwarz q.C_t <= q.C~_t + |q||C_t - C~_t|, and the float32 dot product q.C~_t is within
  gamma |q||C~_t| of its exact value. A window's cosine is at most its sum of these unit bounds times the
  stored 1 / (k |p|), divided by |q|; S_clip is at most the largest over its windows. One fused pass per
  video (numba), nothing materialised.
- frame: the video's normalised z rows are covered by balls with 8-bit centres c~ (radii measured from c~),
  q^.z <= q^.c~ + r. It is computed only for videos whose clip bound alone does not rule them out.
A relative ``SLACK`` and the absolute ``BOUND_EPS`` cover float rounding in the bounds and the exact scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np
import torch

BOUND_EPS = 1e-4  # added to every upper bound: covers float32 rounding in the exact scores
NORM_EPS = 1e-12  # F.normalize's eps, as the model's cosine uses
SLACK = 1e-6  # relative margin on float64 bound arithmetic (its rounding is ~1e-15)
UNIT_LEVELS = 127  # 8-bit codes of units and ball centres
SKETCH = ("codes", "scale", "err", "norm", "pinv", "ball_codes", "ball_scale", "ball_norm", "ball_radius")
FIRST_PASS = ("codes", "scale", "err", "norm", "pinv")  # what every query reads for every video


def _round_up(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 never below the input (bounds must stay bounds after the cast)."""
    y = np.asarray(x).astype(np.float32)
    return np.where(y.astype(np.float64) < x, np.nextafter(y, np.float32(np.inf)), y).astype(np.float32)


def quantize(x: np.ndarray) -> tuple[np.ndarray, ...]:
    """Rows (..., H) -> 8-bit codes and per row: float32 scale (x ~ codes * scale), rounded-up error norm
    |x - codes * scale| and rounded-up norm |x|."""
    x64 = np.asarray(x, dtype=np.float64)
    peak = np.abs(x64).max(-1)
    scale = np.where(peak > 0, peak / UNIT_LEVELS, 1.0).astype(np.float32)
    codes = np.clip(np.rint(x64 / scale[..., None]), -UNIT_LEVELS, UNIT_LEVELS)
    err = np.linalg.norm(x64 - codes * scale[..., None].astype(np.float64), axis=-1)
    norm = np.linalg.norm(x64, axis=-1)
    return (codes.astype(np.int8), scale, _round_up(err * (1 + SLACK) + 1e-30),
            _round_up(norm * (1 + SLACK) + 1e-30))


def cover_balls(rows: np.ndarray, n_balls: int, iters: int = 2) -> np.ndarray:
    """Centres (n, B, H) float32 of B balls covering each video's rows (n, P, H).

    Spherical k-means (farthest-point seeds, a few Lloyd rounds); any centres give valid balls, the
    clustering only makes them small.
    """
    x = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))
    n, P, _ = x.shape
    B = min(n_balls, P)
    batch = torch.arange(n)
    seeds = [torch.zeros(n, dtype=torch.long)]
    closest = x @ x[batch, seeds[0]].unsqueeze(-1)  # (n, P, 1) similarity to the nearest seed
    for _ in range(B - 1):
        seeds.append(closest.squeeze(-1).argmin(dim=1))
        closest = torch.maximum(closest, x @ x[batch, seeds[-1]].unsqueeze(-1))
    centres = x[batch[:, None], torch.stack(seeds, 1)]  # (n, B, H)
    for _ in range(iters):
        member = torch.nn.functional.one_hot((x @ centres.transpose(1, 2)).argmax(-1), B).float()  # (n,P,B)
        count = member.sum(1)  # (n, B)
        mean = member.transpose(1, 2) @ x / count.clamp(min=1).unsqueeze(-1)
        centres = torch.where(count.unsqueeze(-1) > 0, mean, centres)
    return centres.numpy()


def ball_radii(rows: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """(n, B) float64 radii when each row (n, P, H) joins its nearest centre (n, B, H); 0 for empty balls."""
    x, c = torch.from_numpy(np.asarray(rows, dtype=np.float64)), torch.from_numpy(centres)
    dist = torch.cdist(x, c, compute_mode="donot_use_mm_for_euclid_dist")  # (n, P, B), no cancellation
    near, assign = dist.min(-1)
    return torch.zeros(c.shape[:2], dtype=torch.float64).scatter_reduce(1, assign, near, "amax").numpy()


def sketch(units: np.ndarray, pnorm: np.ndarray, windows: np.ndarray, zhat: np.ndarray, n_balls: int
           ) -> dict[str, np.ndarray]:
    """The bound arrays of a batch of videos: units (n, M, H), proposal norms (n, P), their unit windows
    (n, P, 2), normalised z rows (n, P, H) -> the ``SKETCH`` arrays (see the module docstring)."""
    codes, scale, err, norm = quantize(units)
    k = (windows[..., 1] - windows[..., 0]).astype(np.float64)
    pinv = _round_up(1.0 / (k * np.maximum(pnorm.astype(np.float64), NORM_EPS)))
    ball_codes, ball_scale, _, ball_norm = quantize(cover_balls(zhat, n_balls))
    centres = ball_codes * ball_scale[..., None].astype(np.float64)  # exactly what the bound uses
    radius = _round_up(ball_radii(zhat, centres) * (1 + SLACK) + 1e-7)
    return {"codes": codes, "scale": scale, "err": err, "norm": norm, "pinv": pinv, "ball_codes": ball_codes,
            "ball_scale": ball_scale, "ball_norm": ball_norm, "ball_radius": radius}


@dataclass
class BoundQuery:
    """A query vector as the bound kernels take it."""

    vector: np.ndarray  # (H,) float32, contiguous
    norm: float  # |q| (float64)
    gamma: float  # relative error bound of a float32 dot product of length H, in any summation order

    @classmethod
    def of(cls, q: np.ndarray) -> BoundQuery:
        """The kernels' view of query vector q (H,)."""
        vector = np.ascontiguousarray(q, dtype=np.float32)
        n = len(vector) + 2  # H products and sums, one more for the final scaling (FMA or not)
        gamma = 1.01 * n * 2.0**-24 / (1 - n * 2.0**-24)
        return cls(vector, max(float(np.linalg.norm(vector.astype(np.float64))), NORM_EPS), gamma)


# The kernels run serially and release the GIL (the index spreads pieces of a scan over threads). fastmath
# lets the float32 dot products and the window maxima vectorise; the dot products' rounding, in any order,
# is within gamma * |q| |C~_t| (Cauchy-Schwarz on the absolute values), which the unit bounds add.
KERNEL = {"nogil": True, "cache": True, "fastmath": True}


@numba.njit(inline="always", fastmath=True)
def _dot(codes: np.ndarray, q: np.ndarray) -> float:  # pragma: no cover - compiled
    """float32 dot product of 8-bit codes with a float32 vector."""
    s = np.float32(0.0)
    for h in range(codes.shape[0]):
        s += np.float32(codes[h]) * q[h]
    return s


@numba.njit(inline="always", fastmath=True)
def _unit_prefix(codes, scale, err, norm, q, qn, gamma):  # noqa: ANN001, ANN202  # pragma: no cover
    """(M+1,) prefix sums of the video's unit upper bounds q.C~_t + |q| (err_t + gamma |C~_t|)."""
    M = codes.shape[0]
    c = np.empty(M + 1)
    c[0] = 0.0
    for t in range(M):
        margin = qn * (err[t] + gamma * (norm[t] + err[t]))  # |C~_t| <= |C_t| + err_t
        c[t + 1] = c[t] + _dot(codes[t], q) * np.float64(scale[t]) + margin
    return c


@numba.njit(**KERNEL)
def _clip_all_windows(codes, scale, err, norm, pinv, rows, q, qn, gamma, out):  # noqa: ANN001, ANN202  # pragma: no cover
    """out[i] = max over all M(M+1)/2 windows (length-major order, as window_table) of video rows[i]."""
    M = codes.shape[1]
    for i in range(rows.shape[0]):
        v = rows[i]
        c = _unit_prefix(codes[v], scale[v], err[v], norm[v], q, qn, gamma)
        best, j = -np.inf, 0
        for k in range(1, M + 1):
            for s in range(M - k + 1):  # contiguous: vectorises
                best = max(best, (c[s + k] - c[s]) * pinv[v, j + s])
            j += M - k + 1
        out[i] = best


@numba.njit(**KERNEL)
def _clip_some_windows(codes, scale, err, norm, pinv, pidx, table, rows, q, qn, gamma, out):  # noqa: ANN001, ANN202  # pragma: no cover
    """out[i] = max over the stored windows pidx[v] (rows of ``table``) of video v = rows[i]."""
    for i in range(rows.shape[0]):
        v = rows[i]
        c = _unit_prefix(codes[v], scale[v], err[v], norm[v], q, qn, gamma)
        best = -np.inf
        for j in range(pidx.shape[1]):
            w = pidx[v, j]
            best = max(best, (c[table[w, 1]] - c[table[w, 0]]) * pinv[v, j])
        out[i] = best


@numba.njit(**KERNEL)
def _frame_balls(ball_codes, ball_scale, ball_norm, ball_radius, rows, q, qn, gamma, out):  # noqa: ANN001, ANN202  # pragma: no cover
    """out[i] = max over the balls of video rows[i] of q^.c~ + r."""
    for i in range(rows.shape[0]):
        v = rows[i]
        best = -np.inf
        for b in range(ball_codes.shape[1]):
            dot = _dot(ball_codes[v, b], q) * np.float64(ball_scale[v, b]) + qn * gamma * ball_norm[v, b]
            best = max(best, dot / qn + ball_radius[v, b])
        out[i] = best


def _slack(x: np.ndarray) -> np.ndarray:
    """x plus a relative margin, monotone in x (so it commutes with max)."""
    return x + np.abs(x) * SLACK


def clip_upper(arrays: dict[str, np.ndarray], rows: np.ndarray, q: BoundQuery,
               table: np.ndarray | None = None) -> np.ndarray:
    """(V,) upper bounds of S_clip for the videos ``rows`` of one segment's arrays. ``table`` (P, 2): the
    stored windows are per video (``pidx``) rather than all of them in window_table order."""
    out = np.empty(len(rows))
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    first = (arrays["codes"], arrays["scale"], arrays["err"], arrays["norm"], arrays["pinv"])
    if table is None:
        _clip_all_windows(*first, rows, q.vector, q.norm, q.gamma, out)
    else:
        _clip_some_windows(*first, arrays["pidx"], table, rows, q.vector, q.norm, q.gamma, out)
    return np.minimum(_slack(out) / q.norm, 1.0)


def frame_upper(arrays: dict[str, np.ndarray], rows: np.ndarray, q: BoundQuery) -> np.ndarray:
    """(V,) upper bounds of S_frame (key-clip attention) for the videos ``rows`` of one segment's arrays."""
    out = np.empty(len(rows))
    _frame_balls(arrays["ball_codes"], arrays["ball_scale"], arrays["ball_norm"], arrays["ball_radius"],
                 np.ascontiguousarray(rows, dtype=np.int64), q.vector, q.norm, q.gamma, out)
    return np.minimum(_slack(out), 1.0)


@dataclass
class Exact:
    """Exact scores of some videos (float64), as the model computes them."""

    total: np.ndarray  # (V,)
    clip: np.ndarray  # (V,)
    frame: np.ndarray  # (V,)
    key: np.ndarray  # (V,) position of the key clip among each video's stored proposals
    proposal_cos: np.ndarray  # (V, P) clip-scale cosine of every stored proposal
    u: np.ndarray  # (V, M) raw dot products q.C_t


def exact_scores(units: np.ndarray, pnorm: np.ndarray, windows: np.ndarray,
                 zhat_rows: Callable[[np.ndarray], np.ndarray], q: np.ndarray,
                 weights: tuple[float, float]) -> Exact:
    """Exact scores of V videos: units (V, M, H), pnorm (V, P), windows (V, P, 2) or (P, 2) if shared,
    zhat_rows(key (V,)) -> (V, H) the normalised z of each video's key clip; q (H,).

    Every step is per video (einsum rather than a batched BLAS call, whose rounding can depend on a row's
    place in the batch), so a video's scores do not depend on which videos share the batch: exact ties are
    broken by position, exactly as a full scan breaks them.
    """
    q32 = np.ascontiguousarray(q, dtype=np.float32)
    qn = max(float(np.linalg.norm(q.astype(np.float64))), NORM_EPS)
    u = np.einsum("vmh,h->vm", units, q32)  # (V, M); einsum: the same arithmetic for every video
    csum = np.zeros((len(u), u.shape[1] + 1), dtype=np.float64)
    np.cumsum(u, axis=1, dtype=np.float64, out=csum[:, 1:])
    csum = csum.astype(np.float32)  # (V, M+1); float32 from here: the (V, P) work is memory-bound
    start, end = windows[..., 0].astype(np.int64), windows[..., 1].astype(np.int64)
    if windows.ndim == 2:  # the same windows for every video (all 528): one product with a +-1 matrix
        diff = np.zeros((csum.shape[1], len(windows)), dtype=np.float32)  # (M+1, P)
        diff[end, np.arange(len(windows))] = 1.0
        diff[start, np.arange(len(windows))] -= 1.0
        sums = csum @ diff  # exactly csum[:, end] - csum[:, start]: the other terms are exact zeros
    else:
        sums = np.take_along_axis(csum, end, 1) - np.take_along_axis(csum, start, 1)
    denom = np.maximum(pnorm, np.float32(NORM_EPS)) * ((end - start) * np.float32(qn)).astype(np.float32)
    cos = np.divide(sums, denom, out=sums)  # (V, P)
    key = cos.argmax(axis=1)
    clip = cos[np.arange(len(cos)), key].astype(np.float64)
    frame = np.einsum("vh,h->v", zhat_rows(key), q32).astype(np.float64) / qn
    u = u.astype(np.float64)
    return Exact(weights[0] * clip + weights[1] * frame, clip, frame, key, cos, u)


def top_k(bounds: np.ndarray, candidates: np.ndarray, score: Callable[[np.ndarray], np.ndarray], k: int,
          refine: Callable[[np.ndarray], np.ndarray] | None = None, first_chunk: int = 16
          ) -> tuple[np.ndarray, np.ndarray, int]:
    """Exact top-k among ``candidates`` (positions) given their upper ``bounds``.

    ``score(sorted positions) -> exact totals``; ``refine(sorted positions) -> tighter upper bounds``
    (optional: dearer than ``bounds``, cheaper than ``score``). The best-bounded videos are scored first;
    their k-th best total rules out every video bounded below it, the rest are refined (in one call) and
    then scored in descending bound order, in growing chunks, until the next bound is below the k-th best
    total. Returns (positions, totals) best first, ties broken by position (as a stable full scan would),
    and how many videos were scored exactly.
    """
    if len(candidates) == 0 or k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0), 0
    order = np.argsort(-bounds, kind="stable")
    first = np.sort(candidates[order[:max(first_chunk, 2 * k)]])
    done_pos, done_tot = [first], [score(first)]
    tau = _kth(done_tot[0], k)
    rest = order[len(first):]
    rest = rest[bounds[rest] >= tau]
    positions, bounds = candidates[rest], bounds[rest]
    if refine is not None and len(positions):
        by_position = np.argsort(positions)
        positions = positions[by_position]
        bounds = np.minimum(bounds[by_position], refine(positions))
    order = np.argsort(-bounds, kind="stable")
    i, chunk = 0, max(first_chunk, 2 * k)
    while i < len(order) and bounds[order[i]] >= tau:
        if np.count_nonzero(bounds[order[i:]] >= tau) > (len(order) - i) // 2 and len(order) - i > chunk:
            # the bounds prune little here: score everything left in one call rather than in ever
            # doubling chunks (each chunk gathers its rows anew)
            chunk = len(order) - i
        take = order[i:i + chunk]
        pos = np.sort(positions[take[bounds[take] >= tau]])
        done_pos.append(pos)
        done_tot.append(score(pos) if len(pos) else np.zeros(0))
        i, chunk = i + chunk, chunk * 2
        tau = _kth(np.concatenate(done_tot), k)
    positions, totals = np.concatenate(done_pos), np.concatenate(done_tot)
    best = np.lexsort((positions, -totals))[:k]
    return positions[best], totals[best], len(positions)


def _kth(totals: np.ndarray, k: int) -> float:
    """The k-th largest total (-inf when there are fewer than k)."""
    return -np.inf if len(totals) < k else float(np.partition(totals, len(totals) - k)[len(totals) - k])
