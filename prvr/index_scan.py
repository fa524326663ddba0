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
total; the best-bounded few are scored exactly, their k-th best total tau rules out every video bounded
below it, and only the others get the tighter frame bound and, where even that reaches tau, an exact score
(``swept_top_k``, one compiled call; ``top_k`` where there is no frame bound). The result is identical to
scoring everything; only the bytes read change. The passes run on numba's threads (``_launch``).
The bounds (all rigorous):
- clip: unit C_t is stored as 8-bit codes times one scale (C~_t), with |C_t - C~_t| and |C_t|. By
  Cauchy-Schwarz q.C_t <= q.C~_t + |q||C_t - C~_t|; q.C~_t is computed exactly, in integers, with a 16-bit
  copy of the query q~ (``BoundQuery.levels``), which adds |q - q~||C~_t|. A window's cosine is at most
  its sum of these unit bounds times 1 / (k |p|), stored as a 16-bit factor rounded up
  (``window_factors``: on a grid whose fixed-length rows vectorise), divided by |q|; S_clip is at most
  the largest over its windows. One fused pass per video (numba), nothing materialised.
- frame: computed only for videos the clip bound cannot rule out. The video's normalised z rows are
  covered by a few balls with 8-bit centres c~ (each row j stores its ball and its distance d_j from c~,
  each ball its radius), so S_frame <= max over balls of q^.c~ + radius: a few integer dot products.
  Where that is not low enough, the key clip tightens it: S_frame = q^.z_j* involves only j*, and the
  window with the largest upper bound also has a lower bound; j* can only be a window whose upper bound
  reaches it (a handful, usually neighbours in one scene), so S_frame <= max over those candidate
  windows of q^.c~_ball(j) + d_j. Where even that cannot rule the video out, the candidates' stored z
  rows give q^.z_j itself: a few rows read instead of the video's whole exact score.
A relative ``SLACK`` and the absolute ``BOUND_EPS`` cover float rounding in the bounds and the exact scores;
a factor rounded up makes a negative window sum more negative, by at most one step, which the kernels add.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.typed import List

BOUND_EPS = 1e-4  # added to every upper bound: covers float32 rounding in the exact scores
NORM_EPS = 1e-12  # F.normalize's eps, as the model's cosine uses
SLACK = 1e-6  # relative margin on float64 bound arithmetic (its rounding is ~1e-15)
UNIT_LEVELS = 127  # 8-bit codes of units and ball centres
FIRST_CHUNK = 16  # the fewest videos scored exactly first (at least 2k)
PARALLEL_ROWS = 256  # fewest videos worth spreading over the threads
TASK_ROWS = 2048  # fewest videos per task when a thread's share is split into several
SCAN_TASKS = 4  # most tasks per thread
KEY_EPS = 1e-4  # the key clip candidates' margin (cosine units): the exact argmax's own float32 rounding
MAX_BALLS = 255  # frame balls per video (ball ids are stored in 8 bits)
FACTOR_LEVELS = 65534  # 16-bit window factors 1 / (k |p|), one level spare for rounding
SKETCH = ("codes", "scale", "err", "norm", "pinv", "pinv_scale", "ball_codes", "ball_scale", "ball_norm",
          "ball_radius", "ball_of", "ball_dist")
FIRST_PASS = ("codes", "scale", "err", "norm", "pinv", "pinv_scale")  # what every query reads for every video


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


def sketch(units: np.ndarray, pnorm: np.ndarray, windows: np.ndarray, zhat: np.ndarray, n_balls: int
           ) -> dict[str, np.ndarray]:
    """The bound arrays of a batch of videos: units (n, M, H), proposal norms (n, P), their unit windows
    (n, P, 2), normalised z rows (n, P, H) -> the ``SKETCH`` arrays (see the module docstring)."""
    if not 1 <= n_balls <= MAX_BALLS:
        raise ValueError(f"frame_balls must be in 1..{MAX_BALLS}, got {n_balls}")
    codes, scale, err, norm = quantize(units)
    pinv, pinv_scale = window_factors(pnorm, windows, units.shape[1])
    ball_codes, ball_scale, _, _ = quantize(cover_balls(zhat, n_balls))
    centres = ball_codes * ball_scale[..., None].astype(np.float64)  # exactly what the bounds use
    ball_of, dist = nearest_ball(zhat, centres)
    ball_dist = _round_up(dist * (1 + SLACK) + 1e-7)
    radius = np.full(ball_codes.shape[:2], -np.inf, dtype=np.float32)  # -inf: a ball no row is nearest to
    np.maximum.at(radius, (np.arange(len(radius))[:, None], ball_of), ball_dist)
    return {"codes": codes, "scale": scale, "err": err, "norm": norm, "pinv": pinv, "pinv_scale": pinv_scale,
            "ball_codes": ball_codes, "ball_scale": ball_scale,
            "ball_norm": _round_up(np.linalg.norm(centres, axis=-1) * (1 + SLACK) + 1e-30),
            "ball_radius": radius, "ball_of": ball_of.astype(np.uint8), "ball_dist": ball_dist}


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
        levels, step, spread, norm = _query_levels(vector, top)
        return cls(vector, norm, levels, step, spread)


@numba.njit(nogil=True, cache=True)
def _query_levels(q, top):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """(levels, step, spread, |q|) of ``BoundQuery`` for q (H,) float32: levels in -top..top, the largest
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


# The serial kernels release the GIL; the parallel drivers (below) run them on numba's threads, in parts.
# Reassociation lets the float32 dot products of the exact scores vectorise (the bounds' dot products are
# exact integers, their float64 arithmetic is covered by SLACK). No other fast-math liberties: the bounds
# use infinities.
KERNEL = {"nogil": True, "cache": True, "fastmath": {"reassoc", "contract", "nsz"}}


DOT_LANES = 32  # int8 x int16 products per vector step: one 512-bit register of int16 pairs
GRID_LANES = 8  # float64 grid cells per vector step


def _shuffle(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, lanes: list[int]) -> ir.Value:
    """Lanes of a ++ b, as LLVM's shufflevector."""
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), len(lanes)), lanes))


def _load(builder: ir.IRBuilder, array: ir.Value, at: ir.Value, vector: ir.VectorType) -> ir.Value:
    """A vector of ``array``'s elements from element ``at`` on (unaligned)."""
    return builder.load(builder.bitcast(builder.gep(array.data, [at]), vector.as_pointer()), align=1)


def _fold(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, groups: int) -> ir.Value:
    """Two vectors of ``groups`` rows' partial sums each (equal runs of lanes) -> one vector of twice the
    rows, each row's lanes halved by adding its two halves: a transposing reduction step."""
    n = a.type.count
    size = n // groups
    halves = [[offset + j * size + part * size // 2 + lane for offset in (0, n) for j in range(groups)
               for lane in range(size // 2)] for part in (0, 1)]
    return builder.add(_shuffle(builder, a, b, halves[0]), _shuffle(builder, a, b, halves[1]))


@intrinsic
def _int_dot_rows(typingctx, x, q, out):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """out[t] = int32 x[t, :n] . q[:n] for the rows t of x (R, H) int8, q (H,) int16, n = H - H % 32, as
    LLVM vector code: four rows at a time (each block of q loaded once, four independent sums), each
    block's 32 products summed in even/odd pairs, which x86 compiles to vpmaddwd (or VNNI's vpdpwssd), and
    the four rows' sums reduced together. Plain vector code elsewhere."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        xa, qa, oa = (context.make_array(t)(context, builder, a) for t, a in zip(signature.args, args,
                                                                                  strict=True))
        rows, H = (builder.extract_value(xa.shape, d) for d in (0, 1))
        i32 = ir.IntType(32)
        wide, pairs = ir.VectorType(i32, DOT_LANES), ir.VectorType(i32, DOT_LANES // 2)
        even, odd = (list(range(first, DOT_LANES, 2)) for first in (0, 1))
        blocks = builder.udiv(H, ir.Constant(H.type, DOT_LANES))

        def load(a, at, bits):  # noqa: ANN001, ANN202
            return builder.sext(_load(builder, a, at, ir.VectorType(ir.IntType(bits), DOT_LANES)), wide)

        def sums(first, n):  # noqa: ANN001, ANN202  # rows first..first+n-1: their sums, n lanes each
            accs = [cgutils.alloca_once_value(builder, ir.Constant(pairs, [0] * (DOT_LANES // 2)))
                    for _ in range(n)]
            with cgutils.for_range(builder, blocks) as loop:
                at = builder.mul(loop.index, ir.Constant(H.type, DOT_LANES))
                qv = load(qa, at, 16)
                for r, acc in enumerate(accs):
                    row = builder.add(builder.mul(builder.add(first, ir.Constant(H.type, r)), H), at)
                    p = builder.mul(load(xa, row, 8), qv)
                    pair = builder.add(_shuffle(builder, p, p, even), _shuffle(builder, p, p, odd))
                    builder.store(builder.add(builder.load(acc), pair), acc)
            return [builder.load(acc) for acc in accs]

        def store(first, n, v):  # noqa: ANN001, ANN202  # v (n,) -> out[first:first + n]
            ptr = builder.bitcast(builder.gep(oa.data, [first]), ir.VectorType(i32, n).as_pointer())
            builder.store(v, ptr, align=4)

        fours = builder.udiv(rows, ir.Constant(rows.type, 4))
        with cgutils.for_range(builder, fours) as g:
            first = builder.mul(g.index, ir.Constant(rows.type, 4))
            a0, a1, a2, a3 = sums(first, 4)
            v = _fold(builder, _fold(builder, a0, a1, 1), _fold(builder, a2, a3, 1), 2)  # 4 rows x 4 lanes
            v = builder.add(_shuffle(builder, v, v, [j * 4 + k for j in range(4) for k in (0, 1)]),
                            _shuffle(builder, v, v, [j * 4 + k for j in range(4) for k in (2, 3)]))
            store(first, 4, builder.add(_shuffle(builder, v, v, [0, 2, 4, 6]),
                                        _shuffle(builder, v, v, [1, 3, 5, 7])))
        done = builder.mul(fours, ir.Constant(rows.type, 4))
        with cgutils.for_range(builder, builder.sub(rows, done)) as loop:
            first = builder.add(done, loop.index)
            reduce = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [pairs]),
                                                    f"llvm.vector.reduce.add.v{DOT_LANES // 2}i32")
            total = builder.call(reduce, sums(first, 1))
            store(first, 1, builder.insert_element(ir.Constant(ir.VectorType(i32, 1), [0]), total,
                                                   ir.Constant(i32, 0)))
        return context.get_dummy_value()

    def ok(a: types.Type, dtype: types.Type, ndim: int) -> bool:
        return isinstance(a, types.Array) and a.dtype == dtype and a.ndim == ndim and a.layout == "C"

    if not (ok(x, types.int8, 2) and ok(q, types.int16, 1) and ok(out, types.int32, 1)):
        return None
    return types.void(x, q, out), codegen


@numba.njit(inline="always")
def _int_dots(x, q, out):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """out[t] = x[t] . q for the rows of x (R, H) int8 and q (H,) int16, exact in int32 (``BoundQuery`` keeps
    the sums in range)."""
    _int_dot_rows(x, q, out)
    R, H = x.shape
    for t in range(R):
        total = out[t]
        for h in range(H - H % DOT_LANES, H):
            total += np.int32(x[t, h]) * np.int32(q[h])
        out[t] = total


@numba.njit(inline="always")
def _code_dot(dot, scale, step):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """step (levels . codes) scale: a row stored as 8-bit codes times ``scale`` dotted with the query's
    16-bit copy, from their exact integer product ``dot`` (``_int_dots``)."""
    return np.float64(dot) * np.float64(scale) * step


@numba.njit(inline="always", fastmath={"reassoc", "contract", "nsz"})
def _row_dots(x, q, out):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """out[t] = x[t] . q in float32 for the rows of x (M, H) (cast to float32), four rows at a time: four
    independent sums keep the vector units busy, and each q element is loaded once for four rows."""
    M, H = x.shape
    t = 0
    while t + 4 <= M:
        s0 = s1 = s2 = s3 = np.float32(0.0)
        for h in range(H):
            qh = q[h]
            s0 += np.float32(x[t, h]) * qh
            s1 += np.float32(x[t + 1, h]) * qh
            s2 += np.float32(x[t + 2, h]) * qh
            s3 += np.float32(x[t + 3, h]) * qh
        out[t], out[t + 1], out[t + 2], out[t + 3] = s0, s1, s2, s3
        t += 4
    while t < M:
        s = np.float32(0.0)
        for h in range(H):
            s += np.float32(x[t, h]) * q[h]
        out[t] = s
        t += 1


@numba.njit(inline="always", fastmath={"reassoc", "contract", "nsz"})
def _twice(c, cc):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """cc = the prefix sums c (M + 1) twice over: every grid cell reads cc[i + r] - cc[i]."""
    W = c.shape[0]
    for t in range(W):
        cc[t] = c[t]
        cc[W + t] = c[t]


@numba.njit(inline="always")
def _cell_sum(cc, r, i, M):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """The window sum of grid cell (r, i) from the prefix sums twice over: cc[i + r] - cc[i], negated in
    the row's second part (i > M - r: the window of M + 1 - r units ending at unit i)."""
    x = cc[i + r] - cc[i]
    return -x if i > M - r else x


@numba.njit(inline="always", fastmath={"reassoc", "contract", "nsz"})
def _grid_values(c, factors, step, cc, out, lanes):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """Every window's value (c[end] - c[start]) * factor * step over the factor grid (``window_factors``)
    from prefix sums c, into out (empty cells -inf), and lanes[i] = the largest in column i: fixed-length
    rows vectorise."""
    W = c.shape[0]
    M = W - 1
    _twice(c, cc)
    lanes[:] = -np.inf
    for r in range(1, (M + 1) // 2 + 1):
        row, o = factors[(r - 1) * W:r * W], out[(r - 1) * W:r * W]
        for i in range(W):
            x = _cell_sum(cc, r, i, M) * (np.float64(row[i]) * step)
            o[i] = x if row[i] > 0 else -np.inf
            lanes[i] = o[i] if o[i] > lanes[i] else lanes[i]


@intrinsic
def _grid_top(typingctx, cc, factors):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """The largest (cc[i + r] - cc[i]) * f over the grid cells (r, i) of the first W - W % 8 columns
    (negated in a row's second part, -inf where f is 0: ``_grid_values`` without the step), for cc the
    prefix sums twice over (2W,) float64 and factors (R W,) uint16, as LLVM vector code: eight cells at a
    time and one running maximum, where numba's loops spend more on each short row than on its cells."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        ca, fa = (context.make_array(t)(context, builder, a)
                  for t, a in zip(signature.args, args, strict=True))
        i32, i64, f64 = ir.IntType(32), ir.IntType(64), ir.DoubleType()
        cells, keys, lanes = (ir.VectorType(t, GRID_LANES) for t in (f64, ir.IntType(16), i64))
        W = builder.udiv(builder.extract_value(ca.shape, 0), ir.Constant(i64, 2))
        R, M = builder.udiv(builder.extract_value(fa.shape, 0), W), builder.sub(W, ir.Constant(i64, 1))
        lowest = ir.Constant(cells, [float("-inf")] * GRID_LANES)
        lane = ir.Constant(lanes, list(range(GRID_LANES)))

        def splat(x):  # noqa: ANN001, ANN202
            one = builder.insert_element(ir.Constant(lanes, ir.Undefined), x, ir.Constant(i32, 0))
            return _shuffle(builder, one, one, [0] * GRID_LANES)

        best = cgutils.alloca_once_value(builder, lowest)
        with cgutils.for_range(builder, R) as rows:
            r = builder.add(rows.index, ir.Constant(i64, 1))
            second = splat(builder.sub(M, r))  # cells i > M - r: windows ending at unit i
            with cgutils.for_range(builder, builder.udiv(W, ir.Constant(i64, GRID_LANES))) as chunk:
                i = builder.mul(chunk.index, ir.Constant(i64, GRID_LANES))
                f = _load(builder, fa, builder.add(builder.mul(rows.index, W), i), keys)
                x = builder.fmul(builder.fsub(_load(builder, ca, builder.add(i, r), cells),
                                              _load(builder, ca, i, cells)), builder.uitofp(f, cells))
                x = builder.select(builder.icmp_signed(">", builder.add(splat(i), lane), second),
                                   builder.fneg(x), x)
                empty = builder.icmp_unsigned("==", f, ir.Constant(keys, [0] * GRID_LANES))
                x = builder.select(empty, lowest, x)
                top = builder.load(best)
                builder.store(builder.select(builder.fcmp_ordered(">", x, top), x, top), best)
        reduce = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f64, [cells]),
                                                f"llvm.vector.reduce.fmax.v{GRID_LANES}f64")
        return builder.call(reduce, [builder.load(best)])

    def ok(a: types.Type, dtype: types.Type) -> bool:
        return isinstance(a, types.Array) and a.dtype == dtype and a.ndim == 1 and a.layout == "C"

    if not (ok(cc, types.float64) and ok(factors, types.uint16)):
        return None
    return types.float64(cc, factors), codegen


@numba.njit(inline="always", fastmath={"reassoc", "contract", "nsz"})
def _grid_max(c, factors, step, cc):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """The largest window value over the factor grid, as ``_grid_values`` computes them (step applied
    last: the same up to float64 rounding)."""
    W = c.shape[0]
    M = W - 1
    _twice(c, cc)
    best = _grid_top(cc, factors)
    for i in range(W - W % GRID_LANES, W):  # the columns left over
        for r in range(1, (M + 1) // 2 + 1):
            f = factors[(r - 1) * W + i]
            x = _cell_sum(cc, r, i, M) * np.float64(f)
            best = x if f > 0 and x > best else best
    return best * step


@numba.njit(inline="always")
def _grid_window(r, i, M):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """(start, end) units of the window in grid row r, cell i."""
    return (i, i + r) if i <= M - r else (i - (M + 1 - r), i)


@numba.njit(inline="always", fastmath={"reassoc", "contract", "nsz"})
def _window_values(c, factors, step, pidx_row, table, out):  # noqa: ANN001, ANN202  # pragma: no cover
    """out[j] = (c[end_j] - c[start_j]) * factors[j] * step for a video's stored windows pidx_row of
    ``table``, from prefix sums c."""
    for j in range(out.shape[0]):
        w = pidx_row[j]
        out[j] = (c[table[w, 1]] - c[table[w, 0]]) * (np.float64(factors[j]) * step)


@numba.njit(inline="always")
def _max(x):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """max of a float array, as eight independent running maxima (numba leaves a max reduction scalar)."""
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = -np.inf
    n = x.shape[0] - x.shape[0] % 8
    for j in range(0, n, 8):
        b0, b1, b2, b3 = max(b0, x[j]), max(b1, x[j + 1]), max(b2, x[j + 2]), max(b3, x[j + 3])
        b4, b5, b6, b7 = max(b4, x[j + 4]), max(b5, x[j + 5]), max(b6, x[j + 6]), max(b7, x[j + 7])
    best = max(max(max(b0, b1), max(b2, b3)), max(max(b4, b5), max(b6, b7)))
    for j in range(n, x.shape[0]):
        best = max(best, x[j])
    return best


@numba.njit(inline="always")
def _margin(err, norm, qn, spread):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """How far step * (levels . codes_t) * scale_t may be from q.C_t: the unit's quantisation error
    (|q| err_t) and the query's (spread |C~_t|, with |C~_t| <= |C_t| + err_t)."""
    return qn * err + spread * (norm + err)


@numba.njit(inline="always")
def _peak(c):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """max |c_t| of prefix sums: a window sum is at most twice it in size."""
    peak = 0.0
    for t in range(c.shape[0]):
        peak = max(peak, abs(c[t]))
    return peak


@numba.njit(inline="always")
def _negative(best, c, step):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """A bound from the largest window value ``best``: a factor rounded up by up to one ``step`` makes a
    negative window sum more negative, so a negative maximum moves up by at most 2 max |c| step."""
    return best if best >= 0 else min(0.0, best + 2.0 * _peak(c) * step)


@numba.njit(**KERNEL)
def _clip_pass(codes, scale, err, norm, pinv, pinv_scale, pidx, table, rows, levels, step, qn, spread,  # noqa: ANN001, ANN202
               out, hi):  # noqa: ANN001  # pragma: no cover - compiled
    """out[i] >= max_j cos(q, p_j) for video v = rows[i] (at most 1): the largest window upper bound; hi[i]
    = the prefix sums of its unit upper bounds q.C_t <= step (levels . codes_t) scale_t + margin_t (the
    frame pass starts from them)."""
    M, P = codes.shape[1], pinv.shape[1]
    values, cc, dots = np.empty(P), np.empty(2 * M + 2), np.empty(M, np.int32)
    for i in range(rows.shape[0]):
        v = rows[i]
        _int_dots(codes[v], levels, dots)
        hi[i, 0] = 0.0
        for t in range(M):
            d = _code_dot(dots[t], scale[v, t], step)  # q~.C~_t
            hi[i, t + 1] = hi[i, t] + d + _margin(err[v, t], norm[v, t], qn, spread)
        unit = np.float64(pinv_scale[v])  # of the window factors
        if table.shape[0] == 0:
            best = _grid_max(hi[i], pinv[v], unit, cc)
        else:
            _window_values(hi[i], pinv[v], unit, pidx[v], table, values)
            best = _max(values)
        out[i] = min(_slack(_negative(best, hi[i], unit)) / qn, 1.0)


@numba.njit(**KERNEL)
def _frame_pass(err, norm, pinv, pinv_scale, ball_codes, ball_scale, ball_norm, ball_radius, ball_of,  # noqa: ANN001, ANN202
                ball_dist, zhat, pidx, table, rows, hi, at, levels, step, q, qn, spread, key_eps, enough,  # noqa: ANN001
                out):  # noqa: ANN001  # pragma: no cover - compiled
    """out[i] >= q^.z_j* for video v = rows[i], j* its key clip, given hi[at[i]], the prefix sums of its unit
    upper bounds; below ``enough[i]`` where these bounds can show it, in three tiers, each only where the
    one before is not below ``enough[i]``.

    1. Every z row: each lies within its ball's radius of the ball's centre c~, so q^.z_j <= the largest
       q^.c~_b + radius_b (exact integer dot products).
    2. Only the key clip: every window's cosine lies in [lo_j, hi_j] (times |q|) and the key clip (the
       exact argmax) has hi_j* >= lo_top, ``top`` the window with the largest upper bound, so only windows
       with hi_j >= lo_top (less ``key_eps`` for the exact scores' own rounding) can be it, and
       q^.z_j <= q^.c~_ball(j) + d_j bounds each of them. lo_top takes the factor rounded down (one step
       less); a window whose sum is negative is compared with the cut lowered by the most its rounded-up
       factor can have lowered it.
    3. The stored z rows of the candidates whose own ball bound q^.c~_ball(j) + d_j is not below
       ``enough[i]``: q^.z_j itself (float64 sums of the float32 rows), until one reaches ``enough[i]``
       (then the video keeps its tier-2 bound: it must be scored anyway). Not without a threshold.
    """
    M, B, H = err.shape[1], ball_codes.shape[1], q.shape[0]
    grid, W = table.shape[0] == 0, M + 1
    values, dots, reach, ints = np.empty(pinv.shape[1]), np.empty(B), np.empty(B), np.empty(B, np.int32)
    cand = np.empty(pinv.shape[1], dtype=np.int64)  # the stored proposals that can be the key clip
    cc, lanes = np.empty(2 * W), np.empty(W)
    offset = np.zeros(M + 1, dtype=np.int64)  # the stored proposals of k units start at offset[k - 1]
    for k in range(1, M + 1):
        offset[k] = offset[k - 1] + M + 1 - k
    for i in range(rows.shape[0]):
        v, h = rows[i], hi[at[i]]
        every = -np.inf  # the bound over every z row
        _int_dots(ball_codes[v], levels, ints)
        for b in range(B):  # dots[b] >= q^.c~_b (the query's rounding: spread |c~_b|)
            dot = _code_dot(ints[b], ball_scale[v, b], step)
            dots[b] = (dot + spread * ball_norm[v, b]) / qn
            every = max(every, dots[b] + ball_radius[v, b])
        out[i] = every
        if every < enough[i]:
            continue
        fstep = np.float64(pinv_scale[v])
        if grid:  # the largest upper bound: its column, then its row
            _grid_values(h, pinv[v], fstep, cc, values, lanes)
            best = _max(lanes)
            col = 0
            while lanes[col] < best:
                col += 1
            r = 1
            while values[(r - 1) * W + col] < best:
                r += 1
            top = (r - 1) * W + col
            start, end = _grid_window(r, col, M)
        else:
            _window_values(h, pinv[v], fstep, pidx[v], table, values)
            best = _max(values)
            top = 0
            while values[top] < best:
                top += 1
            start, end = table[pidx[v, top], 0], table[pidx[v, top], 1]
        low = h[end] - h[start]  # lo_top's window sum: hi_top's less twice the margins of its units
        for t in range(start, end):
            low -= 2.0 * _margin(err[v, t], norm[v, t], qn, spread)
        factor = np.float64(pinv[v, top]) - (1.0 if low >= 0 else 0.0)
        cut = low * (factor * fstep) - key_eps
        if cut < 0:
            cut -= 2.0 * _peak(h) * fstep
        n = 0
        if grid:
            for col in range(W):
                if lanes[col] >= cut:  # a candidate in this column
                    for r in range(1, (M + 1) // 2 + 1):
                        if values[(r - 1) * W + col] >= cut:
                            first, last = _grid_window(r, col, M)
                            cand[n] = offset[last - first - 1] + first  # its stored proposal
                            n += 1
        else:
            for j in range(values.shape[0]):
                if values[j] >= cut:
                    cand[n] = j
                    n += 1
        reach[:] = -np.inf  # per ball: the farthest candidate from its centre
        for c in range(n):
            p = cand[c]
            reach[ball_of[v, p]] = max(reach[ball_of[v, p]], ball_dist[v, p])
        key = -np.inf
        for b in range(B):
            key = max(key, dots[b] + reach[b])
        out[i] = min(every, key)
        if out[i] < enough[i] or enough[i] == -np.inf:
            continue
        tight = -np.inf  # the candidates' z rows
        for c in range(n):
            p = cand[c]
            near = dots[ball_of[v, p]] + ball_dist[v, p]
            if near >= enough[i]:
                dot = 0.0
                for h in range(H):
                    dot += np.float64(zhat[v, p, h]) * np.float64(q[h])
                near = dot / qn
            tight = max(tight, near)
            if tight >= enough[i]:
                break
        if tight < enough[i]:  # every candidate bounded, the exact dot or its ball
            out[i] = tight


@numba.njit(**KERNEL)
def _exact(units, pnorm, zhat, pidx, table, rows, q, qn, u_out, cos_out, key_out, frame_out):  # noqa: ANN001, ANN202  # pragma: no cover
    """Exact scores of videos rows[i]: u_out[i] = q.C_t, cos_out[i] = every stored proposal's clip-scale
    cosine, key_out[i] = its first argmax, frame_out[i] = q.z_key (float32, one video at a time)."""
    M, P = units.shape[1], pnorm.shape[1]
    csum = np.empty(M + 1, dtype=np.float32)
    qn32 = np.float32(qn)
    for i in range(rows.shape[0]):
        v = rows[i]
        _row_dots(units[v], q, u_out[i])
        acc = 0.0
        csum[0] = 0.0
        for t in range(M):
            acc += np.float64(u_out[i, t])
            csum[t + 1] = np.float32(acc)
        eps = np.float32(NORM_EPS)
        if table.shape[0] == 0:  # all windows, length-major
            j = 0
            for k in range(1, M + 1):
                scale = np.float32(k * np.float64(qn32))
                for s in range(M - k + 1):
                    cos_out[i, j + s] = (csum[s + k] - csum[s]) / (max(pnorm[v, j + s], eps) * scale)
                j += M - k + 1
        else:
            for j in range(P):
                w = pidx[v, j]
                s, e = table[w, 0], table[w, 1]
                scale = np.float32((e - s) * np.float64(qn32))
                cos_out[i, j] = (csum[e] - csum[s]) / (max(pnorm[v, j], eps) * scale)
        best, key = -np.inf, 0
        for j in range(P):  # the first argmax, as torch's max
            if cos_out[i, j] > best:
                best, key = cos_out[i, j], j
        key_out[i] = key
        f = np.float32(0.0)
        for h in range(q.shape[0]):
            f += zhat[v, key, h] * q[h]
        frame_out[i] = f


# Parallel drivers: each cuts its videos into ``tasks`` equal parts and runs the serial kernel on each part,
# on numba's threads (OpenMP where available: a launch costs tens of microseconds, where waking Python
# threads costs hundreds). A video's result does not depend on the part it falls in.
PARALLEL = {"parallel": True, "nogil": True, "cache": True}


@numba.njit(**PARALLEL)
def _clip_scan(codes, scale, err, norm, pinv, pinv_scale, pidx, table, rows, levels, step, qn, spread, out,  # noqa: ANN001, ANN202
               hi, tasks):  # noqa: ANN001  # pragma: no cover - compiled
    """``_clip_pass`` in parts."""
    n = rows.shape[0]
    for c in numba.prange(tasks):
        a, b = c * n // tasks, (c + 1) * n // tasks
        _clip_pass(codes, scale, err, norm, pinv, pinv_scale, pidx, table, rows[a:b], levels, step, qn,
                   spread, out[a:b], hi[a:b])


@numba.njit(inline="always")
def _segment_run(seg_start, positions, a):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """(s, b): the segment s holding sorted global positions[a] (segment s holds seg_start[s] up to
    seg_start[s + 1]) and the end b of the run positions[a:b] inside it."""
    s = np.searchsorted(seg_start, positions[a], side="right") - 1
    return s, np.searchsorted(positions, seg_start[s + 1])


@numba.njit(**KERNEL)
def _frame_runs(err, norm, pinv, pinv_scale, ball_codes, ball_scale, ball_norm, ball_radius, ball_of,  # noqa: ANN001, ANN202
                ball_dist, zhat, pidx, table, seg_start, positions, hi, at, levels, step, q, qn, spread,  # noqa: ANN001
                key_eps, enough, out):  # noqa: ANN001  # pragma: no cover - compiled
    """``_frame_pass`` of sorted global positions, the arrays typed Lists over segments (as ``Stored``):
    one call per segment."""
    a = 0
    while a < positions.shape[0]:
        s, b = _segment_run(seg_start, positions, a)
        _frame_pass(err[s], norm[s], pinv[s], pinv_scale[s], ball_codes[s], ball_scale[s], ball_norm[s],
                    ball_radius[s], ball_of[s], ball_dist[s], zhat[s], pidx[s], table,
                    positions[a:b] - seg_start[s], hi, at[a:b], levels, step, q, qn, spread, key_eps,
                    enough[a:b], out[a:b])
        a = b


@numba.njit(**KERNEL)
def _exact_runs(units, pnorm, zhat, pidx, table, seg_start, positions, q, qn, u_out, cos_out, key_out,  # noqa: ANN001, ANN202
                frame_out):  # noqa: ANN001  # pragma: no cover - compiled
    """``_exact`` of sorted global positions, the arrays typed Lists over segments (as ``Stored``): one
    call per segment."""
    a = 0
    while a < positions.shape[0]:
        s, b = _segment_run(seg_start, positions, a)
        _exact(units[s], pnorm[s], zhat[s], pidx[s], table, positions[a:b] - seg_start[s], q, qn, u_out[a:b],
               cos_out[a:b], key_out[a:b], frame_out[a:b])
        a = b


@numba.njit(**PARALLEL)
def _frame_scan(err, norm, pinv, pinv_scale, ball_codes, ball_scale, ball_norm, ball_radius, ball_of,  # noqa: ANN001, ANN202
                ball_dist, zhat, pidx, table, seg_start, positions, hi, at, levels, step, q, qn, spread,  # noqa: ANN001
                key_eps, enough, out, tasks):  # noqa: ANN001  # pragma: no cover - compiled
    """``_frame_runs`` in parts."""
    n = positions.shape[0]
    for c in numba.prange(tasks):
        a, b = c * n // tasks, (c + 1) * n // tasks
        _frame_runs(err, norm, pinv, pinv_scale, ball_codes, ball_scale, ball_norm, ball_radius, ball_of,
                    ball_dist, zhat, pidx, table, seg_start, positions[a:b], hi, at[a:b], levels, step, q,
                    qn, spread, key_eps, enough[a:b], out[a:b])


@numba.njit(**PARALLEL)
def _exact_scan(units, pnorm, zhat, pidx, table, seg_start, positions, q, qn, tasks):  # noqa: ANN001, ANN202  # pragma: no cover
    """``_exact_runs`` in parts: (u, cos, key, frame) as ``_exact`` writes them."""
    n, M, P = positions.shape[0], units[0].shape[1], pnorm[0].shape[1]
    u_out, cos_out = np.empty((n, M), np.float32), np.empty((n, P), np.float32)
    key_out, frame_out = np.empty(n, np.int64), np.empty(n, np.float32)
    for c in numba.prange(tasks):
        a, b = c * n // tasks, (c + 1) * n // tasks
        _exact_runs(units, pnorm, zhat, pidx, table, seg_start, positions[a:b], q, qn, u_out[a:b],
                    cos_out[a:b], key_out[a:b], frame_out[a:b])
    return u_out, cos_out, key_out, frame_out


@numba.njit(nogil=True, cache=True)
def _best_bounded(bounds, n):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """Sorted indices of the n largest bounds (any of equal ones): a sorted buffer of n, one pass."""
    idx, val, m = np.empty(n, np.int64), np.empty(n), 0
    for j in range(bounds.shape[0]):
        if m < n:
            p, m = m, m + 1
        elif bounds[j] > val[m - 1]:
            p = m - 1
        else:
            continue
        while p > 0 and val[p - 1] < bounds[j]:
            val[p], idx[p] = val[p - 1], idx[p - 1]
            p -= 1
        val[p], idx[p] = bounds[j], j
    return np.sort(idx[:m])


@numba.njit(nogil=True, cache=True)
def _kth_largest(x, k):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """The k-th largest of x (-inf when there are fewer than k)."""
    return -np.inf if x.shape[0] < k else np.sort(x)[x.shape[0] - k]


@numba.njit(nogil=True, cache=True)
def _scored(units, pnorm, zhat, pidx, table, seg_start, positions, q, qn, w0, w1, threads):  # noqa: ANN001, ANN202  # pragma: no cover
    """Exact totals of sorted global positions, by ``_exact_scan``; the float64 arithmetic of
    ``exact_rows`` (no fast-math here: the same totals to the last bit, so ties rank the same)."""
    _, cos, key, frame = _exact_scan(units, pnorm, zhat, pidx, table, seg_start, positions, q, qn,
                                     max(1, min(threads, positions.shape[0])))
    totals = np.empty(key.shape[0])
    for i in range(key.shape[0]):
        totals[i] = w0 * np.float64(cos[i, key[i]]) + w1 * (np.float64(frame[i]) / qn)
    return totals


@numba.njit(nogil=True, cache=True)
def _swept(codes, scale, first_err, first_norm, first_pinv, first_pinv_scale, first_pidx, candidates,  # noqa: ANN001, ANN202
           seg_start, err, norm, pinv, pinv_scale, ball_codes, ball_scale, ball_norm, ball_radius, ball_of,  # noqa: ANN001
           ball_dist, zhat, pidx, units, pnorm, table, levels, step, q, qn, spread, key_eps, w0, w1, eps, k,  # noqa: ANN001
           n_first, threads):  # noqa: ANN001  # pragma: no cover - compiled
    """The clip pass, then ``top_k`` with the frame bound, in one compiled call (see ``swept_top_k``): the
    positions scored exactly and their totals."""
    n = candidates.shape[0]
    clip, prefix = np.empty(n), np.empty((n, codes.shape[1] + 1))
    _clip_scan(codes, scale, first_err, first_norm, first_pinv, first_pinv_scale, first_pidx, table,
               candidates, levels, step, qn, spread, clip, prefix, tasks_for(n, threads))
    clip *= w0
    first = _best_bounded(clip, min(n, n_first))  # the best bounds: clip + w1 + eps, the same order
    positions = candidates[first]
    totals = _scored(units, pnorm, zhat, pidx, table, seg_start, positions, q, qn, w0, w1, threads)
    tau = _kth_largest(totals, k)
    rest = np.ones(n, np.bool_)
    rest[first] = False
    at = np.flatnonzero(rest & (clip + w1 + eps >= tau))  # the others that can still reach tau
    if at.shape[0] == 0:
        return positions, totals
    pos = candidates[at]
    frame = np.empty(at.shape[0])
    _frame_scan(err, norm, pinv, pinv_scale, ball_codes, ball_scale, ball_norm, ball_radius, ball_of,
                ball_dist, zhat, pidx, table, seg_start, pos, prefix, at, levels, step, q, qn,
                spread, key_eps, (tau - eps - clip[at]) / w1, frame, tasks_for(at.shape[0], threads))
    frame = np.minimum(_slack(frame), 1.0)  # as frame_upper returns it
    keep = pos[clip[at] + w1 * frame + eps >= tau]
    if keep.shape[0] == 0:
        return positions, totals
    more = _scored(units, pnorm, zhat, pidx, table, seg_start, keep, q, qn, w0, w1, threads)
    return np.concatenate((positions, keep)), np.concatenate((totals, more))


@numba.njit(nogil=True, cache=True)
def tasks_for(n: int, threads: int) -> int:  # pragma: no cover - compiled
    """Parts of a pass over n videos on ``threads``: one per thread, a few per thread for big passes (a
    thread slowed by another process leaves its later parts to the others); one for a small pass."""
    if threads <= 1 or n < PARALLEL_ROWS:
        return 1
    return threads * max(1, min(SCAN_TASKS, n // (threads * TASK_ROWS)))


_ONE_CALLER = threading.Lock()  # numba's fallback threading layer (workqueue) takes one caller at a time


def _launch(kernel: Callable, threads: int, *args: object) -> object:
    """Run a parallel driver on up to ``threads`` of numba's threads, parts handed out one at a time (a
    thread slowed by another process leaves its later parts to the others); returns what it returns. The
    thread count and the hand-out are the calling thread's own settings in numba: concurrent searches do
    not share them."""
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    try:
        safe = numba.threading_layer() != "workqueue"
    except ValueError:  # no parallel run yet: the layer is chosen by the first
        safe = False
    with numba.parallel_chunksize(1), contextlib.nullcontext() if safe else _ONE_CALLER:
        return kernel(*args)


NO_TABLE = np.zeros((0, 2), dtype=np.int64)  # the kernels' "every window": the factor grid


def _table(table: np.ndarray | None) -> np.ndarray:
    """The window table as the kernels take it: per-video window ids (``pidx``) into it, or every window."""
    return NO_TABLE if table is None else np.ascontiguousarray(table, dtype=np.int64)


@numba.njit(cache=True)
def _list_of(array):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """A typed List holding ``array``. Built in compiled, cached code: a List built from Python compiles its
    methods for each element type in every process (4 s for an index's 14 Lists here)."""
    out = List()
    out.append(array)
    return out


@numba.njit(cache=True)
def _append(out, array):  # noqa: ANN001, ANN202  # pragma: no cover - compiled
    """out.append(array), compiled and cached (see ``_list_of``)."""
    out.append(array)


def _typed_list(arrays: Sequence[np.ndarray]) -> List:
    """A typed List of arrays of one type."""
    out = _list_of(arrays[0])
    for array in arrays[1:]:
        _append(out, array)
    return out


class Stored(NamedTuple):
    """The per-video arrays the frame bound and the exact scores read in place, one numba typed List per
    array with one entry per segment: video (s, v) is row v of segment s. The kernels take the Lists one
    by one (``FRAME``, ``EXACT``): numba types a tuple of them far slower than each alone."""

    err: List
    norm: List
    pinv: List
    pinv_scale: List
    pidx: List
    ball_codes: List
    ball_scale: List
    ball_norm: List
    ball_radius: List
    ball_of: List
    ball_dist: List
    units: List
    pnorm: List
    zhat: List

    @classmethod
    def of(cls, segments: Sequence[dict[str, np.ndarray]]) -> Stored:
        """The typed Lists over the segments' arrays, without copies (a segment storing every window in
        window_table order may lack ``pidx``: the kernels do not read it then, a placeholder stands in)."""
        def array(seg: dict[str, np.ndarray], name: str) -> np.ndarray:
            if name == "pidx" and name not in seg:
                return np.zeros((len(seg["units"]), 1), dtype=np.int16)
            return seg[name]

        return cls(*(_typed_list([array(seg, name) for seg in segments]) for name in cls._fields))


FRAME = ("err", "norm", "pinv", "pinv_scale", "ball_codes", "ball_scale", "ball_norm", "ball_radius",
         "ball_of", "ball_dist", "zhat", "pidx")  # the Lists ``_frame_runs`` takes, in order
EXACT = ("units", "pnorm", "zhat", "pidx")  # the Lists ``_exact_runs`` takes, in order


@numba.njit(cache=True)
def _slack(x: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """x plus a relative margin, monotone in x (so it commutes with max)."""
    return x + np.abs(x) * SLACK


NO_PIDX = np.zeros((1, 1), dtype=np.int16)  # the kernels do not read per-video windows without a table


def _first_pidx(arrays: dict[str, np.ndarray], table: np.ndarray | None) -> np.ndarray:
    """The per-video stored windows the first pass reads (only with a window table)."""
    return arrays["pidx"] if table is not None else NO_PIDX


def clip_upper(arrays: dict[str, np.ndarray], rows: np.ndarray, q: BoundQuery,
               table: np.ndarray | None = None, hi: np.ndarray | None = None, threads: int = 1, tasks: int = 1
               ) -> tuple[np.ndarray, np.ndarray]:
    """(V,) upper bounds of S_clip for the videos ``rows`` of the first-pass arrays, and (V, M+1) prefix sums
    that ``frame_upper`` takes (written into ``hi`` when given), in ``tasks`` parts on ``threads``.
    ``table`` (W, 2): the stored windows are per video (``pidx``) rather than all of them in window_table
    order."""
    out = np.empty(len(rows))
    hi = np.empty((len(rows), arrays["codes"].shape[1] + 1)) if hi is None else hi
    args = (*(arrays[f] for f in FIRST_PASS), _first_pidx(arrays, table), _table(table),
            np.ascontiguousarray(rows, dtype=np.int64), q.levels, q.step, q.norm, q.spread, out, hi)
    if tasks > 1:
        _launch(_clip_scan, threads, *args, tasks)
    else:
        _clip_pass(*args)
    return out, hi


def frame_upper(arrays: dict[str, np.ndarray], rows: np.ndarray, hi: np.ndarray, q: BoundQuery,
                table: np.ndarray | None = None, enough: np.ndarray | None = None) -> np.ndarray:
    """(V,) upper bounds of S_frame (key-clip attention) for the videos ``rows`` of one segment's arrays,
    given their prefix sums ``hi`` (V, M+1) from ``clip_upper``: the frame bound ``swept_top_k`` applies. A
    video whose bound over every z row is already below ``enough`` (V,) gets that bound; the others, the
    tighter key-clip bound too, and where even that is not below ``enough``, the key-clip candidates' own z
    rows (see ``_frame_pass``)."""
    out = np.empty(len(rows))
    enough = np.full(len(out), -np.inf) if enough is None else np.ascontiguousarray(enough, dtype=np.float64)
    stored = Stored.of([arrays])
    _frame_runs(*(getattr(stored, f) for f in FRAME), _table(table), _one_segment(arrays),
                np.ascontiguousarray(rows, dtype=np.int64), np.ascontiguousarray(hi, dtype=np.float64),
                np.arange(len(rows)), q.levels, q.step, q.vector, q.norm, q.spread, KEY_EPS * q.norm, enough,
                out)
    return np.minimum(_slack(out), 1.0)


def _one_segment(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """seg_start of one segment's arrays alone."""
    return np.array([0, len(arrays["units"])])


@dataclass
class Exact:
    """Exact scores of some videos (float64), as the model computes them."""

    total: np.ndarray  # (V,)
    clip: np.ndarray  # (V,)
    frame: np.ndarray  # (V,)
    key: np.ndarray  # (V,) position of the key clip among each video's stored proposals
    proposal_cos: np.ndarray  # (V, P) clip-scale cosine of every stored proposal
    u: np.ndarray  # (V, M) raw dot products q.C_t


def exact_rows(stored: Stored, seg_start: np.ndarray, positions: np.ndarray, q: np.ndarray | BoundQuery,
               weights: tuple[float, float], table: np.ndarray | None = None, threads: int = 1) -> Exact:
    """Exact scores of sorted global positions of ``stored`` (segment s starts at seg_start[s]; units, pnorm,
    zhat; pidx with ``table``).

    One video at a time with the same arithmetic, always by the same compiled driver (in one part per
    thread), so a video's scores do not depend on which videos share the call: exact ties are broken by
    position, exactly as a full scan breaks them.
    """
    bq, V = q if isinstance(q, BoundQuery) else BoundQuery.of(q), len(positions)
    u, cos, key, frame = _launch(_exact_scan, threads, *(getattr(stored, f) for f in EXACT), _table(table),
                                 np.ascontiguousarray(seg_start, dtype=np.int64),
                                 np.ascontiguousarray(positions, dtype=np.int64), bq.vector, bq.norm,
                                 max(1, min(threads, V)))
    clip = cos[np.arange(V), key].astype(np.float64)
    frame = frame.astype(np.float64) / bq.norm
    return Exact(weights[0] * clip + weights[1] * frame, clip, frame, key, cos, u.astype(np.float64))


def exact_scores(arrays: dict[str, np.ndarray], rows: np.ndarray, q: np.ndarray | BoundQuery,
                 weights: tuple[float, float], table: np.ndarray | None = None) -> Exact:
    """``exact_rows`` of the videos ``rows`` of one segment's arrays."""
    return exact_rows(Stored.of([arrays]), _one_segment(arrays), rows, q, weights, table)


def top_k(bounds: np.ndarray, candidates: np.ndarray, score: Callable[[np.ndarray], np.ndarray], k: int,
          first_chunk: int = FIRST_CHUNK) -> tuple[np.ndarray, np.ndarray, int]:
    """Exact top-k among ``candidates`` (sorted positions) given their upper ``bounds``.

    ``score(sorted positions) -> exact totals``. The best-bounded videos are scored first; their k-th best
    total tau rules out every video bounded below it. The others are scored in descending bound order, in
    growing chunks, until the next bound is below the k-th best total so far. Returns (positions, totals)
    best first, ties broken by position (as a stable full scan would), and how many videos were scored
    exactly.
    """
    if len(candidates) == 0 or k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0), 0
    n_first = min(len(candidates), max(first_chunk, 2 * k))
    top = np.argpartition(-bounds, n_first - 1)[:n_first]  # the best-bounded, in linear time
    first = np.sort(candidates[top])
    done_pos, done_tot = [first], [score(first)]
    tau = _kth(done_tot[0], k)
    left = bounds >= tau
    left[top] = False
    rest = np.flatnonzero(left)  # in position order
    rest = rest[np.argsort(-bounds[rest], kind="stable")]
    i, chunk = 0, max(first_chunk, 2 * k)
    while i < len(rest) and bounds[rest[i]] >= tau:
        if np.count_nonzero(bounds[rest[i:]] >= tau) > (len(rest) - i) // 2 and len(rest) - i > chunk:
            # the bounds prune little here: score everything left in one call rather than in ever
            # doubling chunks (each chunk gathers its rows anew)
            chunk = len(rest) - i
        take = rest[i:i + chunk]
        pos = np.sort(candidates[take[bounds[take] >= tau]])
        done_pos.append(pos)
        done_tot.append(score(pos) if len(pos) else np.zeros(0))
        i, chunk = i + chunk, chunk * 2
        tau = _kth(np.concatenate(done_tot), k)
    return _best(np.concatenate(done_pos), np.concatenate(done_tot), k)


def swept_top_k(first: dict[str, np.ndarray], stored: Stored, seg_start: np.ndarray, candidates: np.ndarray,
                q: BoundQuery, weights: tuple[float, float], k: int, table: np.ndarray | None = None,
                threads: int = 1) -> tuple[np.ndarray, np.ndarray, int]:
    """The exact top-k of ``candidates`` (sorted global positions) with the clip and frame bounds, as one
    compiled call: the clip bounds from the first-pass arrays ``first`` (all segments in one array each),
    the rest from ``stored`` (segment s starts at seg_start[s]); weights[1] > 0.

    The best-bounded videos (weights[0] clip + weights[1], the frame score taken as 1) are scored first,
    and their k-th best total tau rules out every video bounded below it. Each other video that can still
    reach tau gets the frame bound (``frame_upper``), and only those whose bound still reaches tau are
    scored exactly. Returns what ``top_k`` returns.
    """
    if len(candidates) == 0 or k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0), 0
    eps = BOUND_EPS * (1 + weights[0] + weights[1])
    positions, totals = _launch(
        _swept, threads, *(first[f] for f in FIRST_PASS), _first_pidx(first, table),
        np.ascontiguousarray(candidates, dtype=np.int64), np.ascontiguousarray(seg_start, dtype=np.int64),
        *(getattr(stored, f) for f in FRAME), stored.units, stored.pnorm, _table(table), q.levels, q.step,
        q.vector, q.norm, q.spread, KEY_EPS * q.norm, float(weights[0]), float(weights[1]), eps, k,
        max(FIRST_CHUNK, 2 * k), threads)
    return _best(positions, totals, k)


def _best(positions: np.ndarray, totals: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The k best (positions, totals), ties broken by position, and how many were scored."""
    best = np.lexsort((positions, -totals))[:k]
    return positions[best], totals[best], len(positions)


def _kth(totals: np.ndarray, k: int) -> float:
    """The k-th largest total (-inf when there are fewer than k)."""
    return -np.inf if len(totals) < k else float(np.partition(totals, len(totals) - k)[len(totals) - k])
