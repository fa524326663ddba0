"""Exact top-k scoring of a stored gallery: cheap upper bounds first, exact scores only where they matter.

Why it is exact. A video's proposals are means of windows over its M clip units C_1..C_M, so with
u_t = q.C_t the clip-scale cosine of window (k, s) is (u_s + ... + u_{s+k-1}) / (k |q| |p_(k,s)|): the M dot
products, prefix sums and the stored proposal norms give every proposal's cosine, hence S_clip and the key
clip j*. The frame-scale feature z_j (key-clip-guided attention with proposal j as the key) does not depend
on the query, so it is computed once per proposal at indexing time and stored normalised: S_frame is one dot
product with the row of j*. ``exact_scores`` does exactly this.

Why it is fast. Reading every video's units is memory-bound, so each query first computes an UPPER BOUND
of every video's total from small resident arrays (``Summary``), then scores videos exactly in descending
bound order and stops as soon as the next bound is below the k-th best exact total (``top_k``). The result
is identical to scoring everything; only the amount of data read changes. The bounds (all rigorous):
- clip: with a fixed orthonormal basis B (H x d, PCA of the units), q.C_t <= (B'q).(B'C_t) + |q_rest||C_rest|
  (Cauchy-Schwarz on the part outside the basis) =: |q| h_t. A window's sum of h_t is at most the sum of the
  k largest positive h_t, and 1/(k|p|) at most its maximum g_k over the video's proposals of length k, so
  S_clip <= max_k g_k * topsum_k(h+).
- frame: the video's normalised z rows are covered by a few balls (centre c, radius r); q^.z <= q^.c + r,
  with q.c bounded like q.C_t above. S_frame <= the largest ball bound.
A margin of ``BOUND_EPS`` covers float rounding of the bound arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

BOUND_EPS = 1e-4  # added to every upper bound: covers float32 rounding in the bound arithmetic
NORM_EPS = 1e-12  # F.normalize's eps, as the model's cosine uses


@dataclass
class Summary:
    """Resident per-video arrays for the upper bounds (N videos, M units, d basis dims, B balls)."""

    head: np.ndarray  # (N, M, d) float32: clip units in the basis
    tail: np.ndarray  # (N, M) float32: norm of each unit outside the basis (rounded up)
    gk: np.ndarray  # (N, M) float32: max over stored proposals of length k of 1 / (k |p|); 0 if none
    zc: np.ndarray  # (N, B, d) float32: ball centres of the normalised z rows, in the basis
    zct: np.ndarray  # (N, B) float32: norm of each centre outside the basis (rounded up)
    zr: np.ndarray  # (N, B) float32: ball radii (rounded up)

    FIELDS = ("head", "tail", "gk", "zc", "zct", "zr")

    def __len__(self) -> int:
        return len(self.head)

    def take(self, idx: np.ndarray) -> Summary:
        """The rows ``idx`` of every array."""
        return Summary(*(getattr(self, f)[idx] for f in self.FIELDS))


def _round_up(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 never below the input (bounds must stay bounds after the cast)."""
    y = x.astype(np.float32)
    return np.where(y.astype(np.float64) < x, np.nextafter(y, np.float32(np.inf)), y).astype(np.float32)


def fit_basis(units: np.ndarray, dim: int) -> np.ndarray:
    """(H, dim) orthonormal float64 basis: the top eigenvectors of the units' second-moment matrix."""
    x = units.reshape(-1, units.shape[-1]).astype(np.float64)
    dim = min(dim, x.shape[1])
    _, vectors = np.linalg.eigh(x.T @ x)  # ascending eigenvalues; the H x H matrix keeps this cheap
    return np.ascontiguousarray(vectors[:, ::-1][:, :dim])


def _project(x: np.ndarray, basis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectors (..., H) -> float32 coordinates in the basis (..., d) and the rounded-up rest norm (...)."""
    x = x.astype(np.float64)
    head = x @ basis
    rest2 = np.maximum((x * x).sum(-1) - (head * head).sum(-1), 0.0)
    return head.astype(np.float32), _round_up(np.sqrt(rest2) * (1 + 1e-6) + 1e-7)


def length_inverse_norms(pnorm: np.ndarray, windows: np.ndarray, map_size: int) -> np.ndarray:
    """(n, P) proposal norms + (n, P, 2) unit windows -> (n, M): max of 1 / (k |p|) per length k."""
    k = (windows[..., 1] - windows[..., 0]).astype(np.int64)  # (n, P)
    inv = 1.0 / (k * np.maximum(pnorm.astype(np.float64), NORM_EPS))
    out = np.zeros((len(pnorm), map_size))
    np.maximum.at(out, (np.arange(len(pnorm))[:, None].repeat(k.shape[1], 1), k - 1), inv)
    return _round_up(out)


def cover_balls(rows: np.ndarray, n_balls: int, iters: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Cover each video's rows (n, P, H) with n_balls balls: centres (n, B, H), radii (n, B) float64.

    Spherical k-means (farthest-point seeds, a few Lloyd rounds); any centres give valid balls, the
    clustering only makes them small. The radii are measured from the float32 centres that are returned.
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
    assign = (x @ centres.transpose(1, 2)).argmax(-1)  # (n, P)
    dist = (x.double() - centres.double().gather(1, assign.unsqueeze(-1).expand_as(x))).norm(dim=-1)
    radius = torch.zeros(n, B, dtype=torch.float64).scatter_reduce(1, assign, dist, "amax")
    return centres.numpy(), radius.numpy()


def summarize(units: np.ndarray, pnorm: np.ndarray, windows: np.ndarray, zhat: np.ndarray,
              basis: np.ndarray, n_balls: int) -> Summary:
    """Resident bound arrays for a batch of videos (see the module docstring)."""
    head, tail = _project(units, basis)
    centres, radius = cover_balls(zhat, n_balls)
    zc, zct = _project(centres, basis)
    zr = _round_up(radius * (1 + 1e-6) + 1e-7)
    return Summary(head, tail, length_inverse_norms(pnorm, windows, units.shape[1]), zc, zct, zr)


def upper_bounds(s: Summary, q: np.ndarray, basis: np.ndarray, weights: tuple[float, float],
                 chunk: int = 8192) -> np.ndarray:
    """(N,) upper bound of every video's total score for query vector q (H,)."""
    q64 = q.astype(np.float64)
    qn = max(float(np.linalg.norm(q64)), NORM_EPS)
    qh64 = q64 @ basis
    q_rest = float(np.sqrt(max(qn * qn - float(qh64 @ qh64), 0.0)))
    qh = (qh64 / qn).astype(np.float32)
    rest = np.float32(q_rest / qn)
    out = np.empty(len(s), dtype=np.float32)
    for a in range(0, len(s), chunk):
        b = slice(a, a + chunk)
        h = np.maximum(s.head[b] @ qh + rest * s.tail[b], 0)  # (n, M) >= q^.C_t, clipped at 0
        top = np.cumsum(-np.sort(-h, axis=1), axis=1)  # (n, M): sum of the k largest
        clip = np.minimum((s.gk[b] * top).max(1), 1.0)
        frame = np.minimum((s.zc[b] @ qh + rest * s.zct[b] + s.zr[b]).max(1), 1.0)
        out[b] = weights[0] * clip + weights[1] * frame
    return out + BOUND_EPS * (1 + weights[0] + weights[1])


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
          first_chunk: int = 64) -> tuple[np.ndarray, np.ndarray, int]:
    """Exact top-k among ``candidates`` (positions) given their upper ``bounds``.

    ``score(sorted positions) -> exact totals``. Videos are scored in descending bound order, in growing
    chunks, until the next bound is below the k-th best total. Returns (positions, totals) best first, ties
    broken by position (as a stable full scan would), and how many videos were scored exactly.
    """
    if len(candidates) == 0 or k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0), 0
    order = np.argsort(-bounds, kind="stable")
    pos_done, tot_done = [], []
    tau, i, chunk = -np.inf, 0, max(first_chunk, 2 * k)
    while i < len(order) and bounds[order[i]] >= tau:
        if tau > -np.inf and np.count_nonzero(bounds[order[i:]] >= tau) > (len(order) - i) // 2:
            # the bounds prune little here: one pass over everything, which reads the stored arrays in
            # place (consecutive rows) instead of gathering copies
            pos_done, tot_done, i, chunk = [], [], 0, len(order)
        take = order[i:i + chunk]
        take = take[bounds[take] >= tau] if chunk < len(order) else take
        pos = np.sort(candidates[take])
        pos_done.append(pos)
        tot_done.append(score(pos))
        i, chunk = i + chunk, chunk * 2
        totals = np.concatenate(tot_done)
        if len(totals) >= k:
            tau = np.partition(totals, len(totals) - k)[len(totals) - k]
    positions, totals = np.concatenate(pos_done), np.concatenate(tot_done)
    best = np.lexsort((positions, -totals))[:k]
    return positions[best], totals[best], len(positions)
