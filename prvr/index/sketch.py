"""The 8-bit sketch an index stores beside each video, and the query's 16-bit copy: what the bounds read.

- the head (first pass, read for every video): each unit's coordinates in its segment's ``HEAD_DIMS``
  principal directions as 8-bit codes, with the norm of what they leave out (``head_basis``,
  ``head_sketch``): q.C_t <= (A q).(A C_t) + |q - A^T A q| |C_t - A^T A C_t| for the head basis A, so a
  quarter of the bytes of the full codes bound every unit, loosely, and the full codes only the survivors;
- units C_t: 8-bit codes times one scale per unit, with |C_t - C~_t| and |C_t| rounded up (``quantize``);
- window factors 1 / (k |p|) as 16-bit integers times a per-video scale, rounded up, on a grid of fixed-
  length rows when every window is stored (``window_factors``);
- frame balls: a few balls with 8-bit centres covering each video's normalised z rows; each row stores its
  ball and its distance from the centre (``sketch``);
- ``BoundQuery``: the query vector with its 16-bit copy, so that dot products with codes are exact integers.
Why these give rigorous bounds: ``prvr.index.kernels``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import torch

NORM_EPS = 1e-12  # F.normalize's eps, as the model's cosine uses
SLACK = 1e-6  # relative margin on float64 bound arithmetic (its rounding is ~1e-15)
UNIT_LEVELS = 127  # 8-bit codes of units and ball centres
MAX_BALLS = 255  # frame balls per video (ball ids are stored in 8 bits)
FACTOR_LEVELS = 65534  # 16-bit window factors 1 / (k |p|), one level spare for rounding
HEAD_DIMS = 64  # principal directions of the first pass (one 64-byte cache line per unit)
HEAD = ("head_codes", "head_scale", "head_err", "head_norm", "tail")  # per unit, of the head basis
FIRST_PASS = (*HEAD, "pinv", "pinv_scale")  # what every query reads for every video (kept in memory)
CLIP = ("codes", "scale", "err", "norm")  # the full 8-bit units: the clip bound of the first pass's survivors
BALLS = ("ball_codes", "ball_scale", "ball_norm", "ball_radius", "ball_of", "ball_dist")  # the frame bound
SKETCH = (*FIRST_PASS, *CLIP, *BALLS)  # every per-video array ``sketch`` makes


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


def head_basis(units: np.ndarray, dims: int = HEAD_DIMS) -> np.ndarray:
    """(min(dims, H), H) float32 orthonormal rows: the principal directions of a segment's units (n, M, H),
    uncentred (what dot products with a query see). Any orthonormal rows give valid bounds; these make the
    head's bounds tight."""
    x = torch.from_numpy(np.asarray(units, np.float32).reshape(-1, units.shape[-1])).double()
    _, vectors = torch.linalg.eigh(x.T @ x)  # ascending
    return np.ascontiguousarray(vectors.flip(1)[:, :dims].T.float().numpy())


def head_sketch(units: np.ndarray, basis: np.ndarray) -> dict[str, np.ndarray]:
    """The ``HEAD`` arrays of units (n, M, H) for the segment's head basis A (d, H): 8-bit codes of the head
    coordinates h_t = A C_t with their scale, error and norm (``quantize``), and ``tail`` >= |C_t - A^T h_t|,
    the part of the unit the head leaves out (rounded up)."""
    a = torch.from_numpy(np.asarray(basis, np.float32)).double()
    x = torch.from_numpy(np.asarray(units, np.float32)).double()
    head = x @ a.T  # (n, M, d)
    tail = torch.linalg.vector_norm(x - head @ a, dim=-1).numpy()
    codes, scale, err, norm = quantize(head.numpy())
    return {"head_codes": codes, "head_scale": scale, "head_err": err, "head_norm": norm,
            "tail": _round_up(tail * (1 + SLACK) + 1e-30)}


def cover_balls(rows: np.ndarray, n_balls: int, iters: int = 2) -> np.ndarray:
    """Centres (n, B, H) float32 of B balls covering each video's rows (n, P, H).

    Spherical k-means (farthest-point seeds, a few Lloyd rounds); any centres give valid bounds, the
    clustering only makes the balls small.
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


def nearest_ball(rows: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (n, P, H) nearest centre (n, B, H): its index (n, P) and float64 distance (n, P)."""
    x, c = torch.from_numpy(np.asarray(rows, dtype=np.float64)), torch.from_numpy(centres)
    dist = torch.cdist(x, c, compute_mode="donot_use_mm_for_euclid_dist")  # (n, P, B), no cancellation
    near, assign = dist.min(-1)
    return assign.numpy(), near.numpy()


def window_factors(pnorm: np.ndarray, windows: np.ndarray, M: int) -> tuple[np.ndarray, np.ndarray]:
    """16-bit factors f and a per-video scale s with f * s >= 1 / (k |p|) (within one step) for proposal
    norms (n, P) over unit windows (n, P, 2). With every window of M units stored (in window_table order)
    the factors lie on a grid of (M + 1) // 2 rows of M + 1 cells: row r holds the windows of r units
    (cell i: from unit i) and then those of M + 1 - r units (cell i: ending at unit i), so that every cell
    is (c[i + r] - c[i]) with the prefix sums c repeated twice, negated in the row's second part: fixed-
    length rows the kernels vectorise, no cell wasted. Else one factor per stored window."""
    k = windows[..., 1] - windows[..., 0]
    inv = 1.0 / (k * np.maximum(pnorm.astype(np.float64), NORM_EPS))
    if windows.shape[1] == M * (M + 1) // 2:  # every window: the grid
        lengths = np.repeat(np.arange(1, M + 1), np.arange(M, 0, -1))
        starts = np.concatenate([np.arange(M + 1 - length) for length in range(1, M + 1)])
        if not ((k == lengths).all() and (windows[..., 0] == starts).all()):
            raise ValueError("with every window stored, they must be in window_table order")
        rows, first = (M + 1) // 2, k <= (M + 1) // 2
        row = np.where(first, k, M + 1 - k)
        cell = (row - 1) * (M + 1) + np.where(first, windows[..., 0], windows[..., 1])
        grid = np.zeros((len(inv), rows * (M + 1)))
        np.put_along_axis(grid, cell.astype(np.int64), inv, axis=1)
        inv = grid
    scale = _round_up(inv.max(1) / FACTOR_LEVELS)
    steps = scale.astype(np.float64)[:, None]
    factors = np.ceil(inv / steps)
    factors += factors * steps < inv  # division rounding: f * s never below 1 / (k |p|)
    return np.ascontiguousarray(factors, dtype=np.uint16), scale  # rows contiguous: the kernels' vector loads


def frame_balls(zbasis: list[np.ndarray], zcoef: list[np.ndarray], n_balls: int) -> dict[str, np.ndarray]:
    """The ``BALLS`` arrays of a batch of videos from their factored frame-scale features (``schema``: zbasis
    (r, H), zcoef (P r,) each): balls with 8-bit centres c~ covering each video's P rows z_j = (zcoef as
    (P, r))[j] @ zbasis, each row's ball and its distance from the centre (rounded up), each ball's radius.

    The rows lie in the r-dimensional span of zbasis, so the balls are clustered there (coefficients padded
    with zeros to the batch's largest r) and the distances come from the coefficients too, exactly:
    |z_j - c~|^2 = c_j G c_j - 2 c_j . (zbasis c~) + |c~|^2 with G = zbasis zbasis^T (float64), which holds
    whether or not the float32 rows of zbasis are exactly orthonormal."""
    if not 1 <= n_balls <= MAX_BALLS:
        raise ValueError(f"frame_balls must be in 1..{MAX_BALLS}, got {n_balls}")
    n, H = len(zcoef), zbasis[0].shape[1]
    P = len(zcoef[0]) // len(zbasis[0])
    r = max(z.shape[0] for z in zbasis)
    basis, coef = torch.zeros(n, r, H, dtype=torch.float64), torch.zeros(n, P, r, dtype=torch.float64)
    for i, (zb, zc) in enumerate(zip(zbasis, zcoef, strict=True)):
        # torch.tensor copies: the rows may be a read-only mapping
        basis[i, :len(zb)] = torch.tensor(np.asarray(zb, np.float32), dtype=torch.float64)
        coef[i, :, :len(zb)] = torch.tensor(np.asarray(zc, np.float32), dtype=torch.float64).reshape(P, -1)
    centres = torch.from_numpy(cover_balls(coef.float().numpy(), n_balls)).double() @ basis  # (n, B, H)
    ball_codes, ball_scale, _, _ = quantize(centres.numpy())
    c = torch.from_numpy(ball_codes * ball_scale[..., None].astype(np.float64))  # exactly what bounds use
    gram = basis @ basis.transpose(1, 2)  # (n, r, r)
    square = (coef @ gram * coef).sum(-1)  # (n, P): |z_j|^2
    d2 = square[..., None] - 2 * coef @ (c @ basis.transpose(1, 2)).transpose(1, 2) + (c * c).sum(-1)[:, None]
    near, ball_of = d2.min(-1)
    dist = torch.sqrt(near.clamp(min=0) + 1e-12).numpy()
    ball_dist = _round_up(dist * (1 + SLACK) + 1e-7)
    radius = np.full(ball_codes.shape[:2], -np.inf, dtype=np.float32)  # -inf: a ball no row is nearest to
    np.maximum.at(radius, (np.arange(n)[:, None], ball_of.numpy()), ball_dist)
    return {"ball_codes": ball_codes, "ball_scale": ball_scale,
            "ball_norm": _round_up(np.linalg.norm(c.numpy(), axis=-1) * (1 + SLACK) + 1e-30),
            "ball_radius": radius, "ball_of": ball_of.numpy().astype(np.uint8), "ball_dist": ball_dist}


def sketch(units: np.ndarray, pnorm: np.ndarray, windows: np.ndarray, zbasis: list[np.ndarray],
           zcoef: list[np.ndarray], n_balls: int, basis: np.ndarray) -> dict[str, np.ndarray]:
    """The bound arrays of a batch of videos: units (n, M, H), proposal norms (n, P), their unit windows
    (n, P, 2), factored frame-scale features (``frame_balls``), the segment's head basis (d, H) -> the
    ``SKETCH`` arrays (see the module docstring)."""
    codes, scale, err, norm = quantize(units)
    pinv, pinv_scale = window_factors(pnorm, windows, units.shape[1])
    return {**head_sketch(units, basis), "pinv": pinv, "pinv_scale": pinv_scale, "codes": codes,
            "scale": scale, "err": err, "norm": norm, **frame_balls(zbasis, zcoef, n_balls)}


@dataclass
class BoundQuery:
    """A query vector as the kernels take it."""

    vector: np.ndarray  # (H,) float32, contiguous
    norm: float  # |q| (float64)
    levels: np.ndarray  # (H,) int16: q ~ levels * step, so that dot products with 8-bit codes are integers
    step: float
    spread: float  # >= |q - levels * step|

    @classmethod
    def of(cls, q: np.ndarray) -> BoundQuery:
        """The kernels' view of query vector q (H,)."""
        vector = np.ascontiguousarray(q, dtype=np.float32)
        top = min(2**15 - 1, (2**31 - 1) // (UNIT_LEVELS * len(vector)))  # int32 sums cannot overflow
        # as float64, the type query_levels_rows hands it (exact: it reads each element as float64 anyway),
        # so one compiled version serves both
        levels, step, spread, norm = query_levels(vector.astype(np.float64), top)
        return cls(vector, norm, levels, step, spread)


@numba.njit(nogil=True, cache=True)
def query_levels(q, top):  # pragma: no cover - compiled
    """(levels, step, spread, |q|) of ``BoundQuery`` for q (H,) float64: levels in -top..top, the largest
    |q_h| at top. Compiled: a dozen numpy calls on a short vector cost more than the first pass saves."""
    peak, square = 0.0, 0.0
    for h in range(q.shape[0]):
        x = np.float64(q[h])
        peak, square = max(peak, abs(x)), square + x * x
    step = max(peak, NORM_EPS) / top
    levels, rest = np.empty(q.shape[0], np.int16), 0.0
    for h in range(q.shape[0]):
        x = np.float64(q[h])
        level = min(max(np.rint(x / step), -top), top)
        levels[h] = np.int16(level)
        rest += (x - level * step) ** 2
    return levels, step, np.sqrt(rest) * (1 + SLACK) + 1e-300, max(np.sqrt(square), NORM_EPS)


@numba.njit(nogil=True, cache=True)
def query_levels_rows(a, top):  # pragma: no cover - compiled
    """``query_levels`` of each row of a (S, d) (float32 or float64): levels (S, d), steps, spreads, norms
    (S,) each; one compiled call for every segment's head query."""
    S, d = a.shape
    levels, step = np.empty((S, d), np.int16), np.empty(S)
    spread, norm = np.empty(S), np.empty(S)
    for s in range(S):
        levels[s], step[s], spread[s], norm[s] = query_levels(a[s], top)
    return levels, step, spread, norm
