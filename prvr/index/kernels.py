"""The compiled kernels of exact search (numba): the clip pass, the frame pass and the exact scores.

Why it is exact. A video's proposals are means of windows over its M clip units C_1..C_M, so with
u_t = q.C_t the clip-scale cosine of window (k, s) is (u_s + ... + u_{s+k-1}) / (k |q| |p_(k,s)|): the M dot
products, prefix sums and the stored proposal norms give every proposal's cosine, hence S_clip and the key
clip j*. The frame-scale feature z_j (key-clip-guided attention with proposal j as the key) does not depend
on the query, so it is computed once per proposal at indexing time and stored normalised, factored
(``schema``: row j of zcoef as (P, r), times zbasis): S_frame is q^ . z_j* = zcoef_j* . (zbasis q^).
``_exact`` does exactly this.

Why it is fast. Scoring is memory-bound (a full scan reads every video's float32 units), so each query first
reads the head of the 8-bit sketch (``prvr.index.sketch``), a sixth of the full codes' bytes, and computes an
UPPER BOUND of every video's total; ``prvr.index.rank`` refines it with the full codes and the frame balls
only where it can reach the k-th best total, and scores exactly only the videos whose refined bound still
can. The bounds (all rigorous):
- head (``_clip_pass`` on the head codes): with the segment's head basis A, q.C_t = a.h_t + (q - A^T a).(C_t
  - A^T h_t) + ((I - A A^T) a).h_t for a = A q and h_t = A C_t, at most a.h_t + |q - A^T a| tail_t + (a small
  term of A's float32 rounding, added to the query's spread); a.h_t as below. Tight where the head basis holds
  most of the units' energy (principal directions of the segment's units).
- clip (``_clip_pass``): by Cauchy-Schwarz q.C_t <= q.C~_t + |q||C_t - C~_t|; q.C~_t is computed exactly, in
  integers, with the query's 16-bit copy q~, which adds |q - q~||C~_t|. A window's cosine is at most its sum
  of these unit bounds times its 16-bit factor (rounded up, >= 1 / (k |p|)), divided by |q|; S_clip is at
  most the largest over its windows (``_grid_lanes`` / ``_window_values``, then ``_max``: the one window
  maximum). One fused pass per video, nothing materialised but one video's windows.
- frame (``_frame_pass``, three tiers): the z rows lie in balls with 8-bit centres, so S_frame <= max over
  balls of q^.c~ + radius; then only the key clip candidates (windows whose upper bound reaches the largest
  lower bound) and their balls; then those candidates' own z rows.
A relative ``SLACK`` and the absolute ``BOUND_EPS`` cover float rounding in the bounds and the exact scores;
a factor rounded up makes a negative window sum more negative, by at most one step, which the kernels add.
"""

from __future__ import annotations

import numba
import numpy as np

from prvr.index.sketch import NORM_EPS, SLACK

PARALLEL_ROWS = 256  # fewest videos worth spreading over the threads
TASK_ROWS = 2048  # fewest videos per task when a thread's share is split into several
SCAN_TASKS = 4  # most tasks per thread

# The serial kernels release the GIL; the parallel drivers (below) run them on numba's threads, in parts.
# Reassociation lets the float32 dot products of the exact scores vectorise (the bounds' dot products are
# exact integers, their float64 arithmetic is covered by SLACK). No other fast-math liberties: the bounds
# use infinities.
KERNEL = {"nogil": True, "cache": True, "fastmath": {"reassoc", "contract", "nsz"}}


@numba.njit(inline="always")
def _int_dots(x, q, out):  # pragma: no cover - compiled
    """out[t] = x[t] . q for the rows of x (R, H) int8 and q (H,) int16, exact in int32 (``BoundQuery`` keeps
    the sums in range; integer sums reassociate freely, so LLVM vectorises the loop)."""
    R, H = x.shape
    for t in range(R):
        total = np.int32(0)
        for h in range(H):
            total += np.int32(x[t, h]) * np.int32(q[h])
        out[t] = total


@numba.njit(inline="always")
def _code_dot(dot, scale, step):  # pragma: no cover - compiled
    """step (levels . codes) scale: a row stored as 8-bit codes times ``scale`` dotted with the query's
    16-bit copy, from their exact integer product ``dot`` (``_int_dots``)."""
    return np.float64(dot) * np.float64(scale) * step


@numba.njit(inline="always", fastmath={"reassoc", "contract", "nsz"})
def _row_dots(x, q, out):  # pragma: no cover - compiled
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
def _twice(c, cc):  # pragma: no cover - compiled
    """cc = the prefix sums c (M + 1) twice over: every grid cell reads cc[i + r] - cc[i]."""
    W = c.shape[0]
    for t in range(W):
        cc[t] = c[t]
        cc[W + t] = c[t]


@numba.njit(inline="always")
def _cell_sum(cc, r, i, M):  # pragma: no cover - compiled
    """The window sum of grid cell (r, i) from the prefix sums twice over: cc[i + r] - cc[i], negated in
    the row's second part (i > M - r: the window of M + 1 - r units ending at unit i)."""
    x = cc[i + r] - cc[i]
    return -x if i > M - r else x


@numba.njit(inline="always", fastmath={"reassoc", "contract", "nsz"})
def _grid_lanes(c, factors, step, cc, lanes):  # pragma: no cover - compiled
    """lanes[i] = the largest window value (c[end] - c[start]) * factor * step in column i of the factor
    grid (``window_factors``; empty cells -inf) from prefix sums c, leaving cc = c twice over. Only the
    column maxima are kept, so the fixed-length rows vectorise; the frame pass recomputes the few cells it
    needs (``_cell_value``)."""
    W = c.shape[0]
    M = W - 1
    _twice(c, cc)
    lanes[:] = -np.inf
    for r in range(1, (M + 1) // 2 + 1):
        row, ends = factors[(r - 1) * W:r * W], cc[r:r + W]
        for i in range(W):
            x = ends[i] - cc[i]
            x = (-x if i > M - r else x) * (np.float64(row[i]) * step)
            lanes[i] = max(lanes[i], x if row[i] != 0 else -np.inf)


@numba.njit(inline="always")
def _cell_value(cc, factors, step, r, i, M):  # pragma: no cover - compiled
    """The value of grid cell (r, i) as ``_grid_lanes`` computes it (-inf for an empty cell)."""
    f = factors[(r - 1) * (M + 1) + i]
    return _cell_sum(cc, r, i, M) * (np.float64(f) * step) if f != 0 else -np.inf


@numba.njit(inline="always")
def _grid_window(r, i, M):  # pragma: no cover - compiled
    """(start, end) units of the window in grid row r, cell i."""
    return (i, i + r) if i <= M - r else (i - (M + 1 - r), i)


@numba.njit(inline="always", fastmath={"reassoc", "contract", "nsz"})
def _window_values(c, factors, step, pidx_row, table, out):  # pragma: no cover
    """out[j] = (c[end_j] - c[start_j]) * factors[j] * step for a video's stored windows pidx_row of
    ``table``, from prefix sums c."""
    for j in range(out.shape[0]):
        w = pidx_row[j]
        out[j] = (c[table[w, 1]] - c[table[w, 0]]) * (np.float64(factors[j]) * step)


@numba.njit(inline="always")
def _max(x):  # pragma: no cover - compiled
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
def _margin(err, norm, qerr, spread):  # pragma: no cover - compiled
    """How far step * (levels . codes_t) * scale_t may be from q.C_t: the unit's quantisation error
    (|q| err_t, ``qerr`` the norm of the query the codes are dotted with) and the query's (spread |C~_t|,
    with |C~_t| <= |C_t| + err_t)."""
    return qerr * err + spread * (norm + err)


@numba.njit(inline="always")
def _peak(c):  # pragma: no cover - compiled
    """max |c_t| of prefix sums: a window sum is at most twice it in size."""
    peak = 0.0
    for t in range(c.shape[0]):
        peak = max(peak, abs(c[t]))
    return peak


@numba.njit(inline="always")
def _negative(best, c, step):  # pragma: no cover - compiled
    """A bound from the largest window value ``best``: a factor rounded up by up to one ``step`` makes a
    negative window sum more negative, so a negative maximum moves up by at most 2 max |c| step."""
    return best if best >= 0 else min(0.0, best + 2.0 * _peak(c) * step)


@numba.njit(**KERNEL)
def _clip_pass(codes, scale, err, norm, tail, pinv, pinv_scale, pidx, table, rows, levels, step, qn, qerr,
               spread, qtail, out, hi):  # pragma: no cover - compiled
    """out[i] >= max_j cos(q, p_j) for video v = rows[i] (at most 1): the largest window upper bound of the
    unit upper bounds q.C_t <= step (levels . codes_t) scale_t + margin_t + qtail tail_t (``tail``: what the
    codes leave out, the head's; qtail = 0 for the full codes, whose ``tail`` is not read). hi[i] (when hi
    has a row per video) = the prefix sums of the unit upper bounds, which the frame pass starts from."""
    M, P = codes.shape[1], pinv.shape[1]
    values, cc, lanes, dots = np.empty(P), np.empty(2 * M + 2), np.empty(M + 1), np.empty(M, np.int32)
    h = np.empty(M + 1)
    keep = hi.shape[0] == rows.shape[0]
    for i in range(rows.shape[0]):
        v = rows[i]
        _int_dots(codes[v], levels, dots)
        h[0] = 0.0
        for t in range(M):
            d = _code_dot(dots[t], scale[v, t], step)  # q~.C~_t
            d += _margin(err[v, t], norm[v, t], qerr, spread)
            if qtail > 0:
                d += qtail * tail[v, t]
            h[t + 1] = h[t] + d
        unit = np.float64(pinv_scale[v])  # of the window factors
        if table.shape[0] == 0:
            _grid_lanes(h, pinv[v], unit, cc, lanes)
            best = _max(lanes)
        else:
            _window_values(h, pinv[v], unit, pidx[v], table, values)
            best = _max(values)
        out[i] = min(_slack(_negative(best, h, unit)) / qn, 1.0)
        if keep:
            hi[i, :] = h


@numba.njit(**KERNEL)
def _frame_pass(err, norm, pinv, pinv_scale, ball_codes, ball_scale, ball_norm, ball_radius, ball_of,
                ball_dist, zbasis, zcoef, zoff, zcoff, pidx, table, rows, hi, at, levels, step, q, qn, spread,
                key_eps, enough, tight, out):  # pragma: no cover - compiled
    """out[i] >= q^.z_j* for video v = rows[i], j* its key clip, given hi[at[i]], the prefix sums of its unit
    upper bounds; below ``enough[i]`` where these bounds can show it, in three tiers, each only where the
    one before is not below ``enough[i]``.

    1. Every z row: each lies within its ball's radius of the ball's centre c~, so q^.z_j <= the largest
       q^.c~_b + radius_b (exact integer dot products).
    2. Only the key clip: every window's cosine lies in [lo_j, hi_j] (times |q|) and the key clip (the
       exact argmax) has hi_j* >= lo_top for any window ``top`` (the one with the largest upper bound is
       taken: its lower bound tends to be the largest), so only windows
       with hi_j >= lo_top (less ``key_eps`` for the exact scores' own rounding) can be it, and
       q^.z_j <= q^.c~_ball(j) + d_j bounds each of them. lo_top takes the factor rounded down (one step
       less); a window whose sum is negative is compared with the cut lowered by the most its rounded-up
       factor can have lowered it.
    3. The stored z rows of the candidates whose own ball bound q^.c~_ball(j) + d_j is not below
       ``enough[i]``: q^.z_j itself (float64 sums of the float32 factors: zcoef_j . (zbasis q^)), until
       one reaches ``enough[i]`` (then the video keeps its tier-2 bound: it must be scored anyway). Not
       without a threshold, nor unless ``tight`` (a caller whose rows come from disk passes first without
       them, then reads them all at once).
    """
    M, B, H = err.shape[1], ball_codes.shape[1], q.shape[0]
    grid, W = table.shape[0] == 0, M + 1
    values, dots, reach, ints = np.empty(pinv.shape[1]), np.empty(B), np.empty(B), np.empty(B, np.int32)
    y = np.empty(H)  # zbasis q (float64) of one video (its rank r <= H)
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
        if grid:  # the largest upper bound: its column, then its row (any window would do: see 2.)
            _grid_lanes(h, pinv[v], fstep, cc, lanes)
            best = _max(lanes)
            col = 0
            while lanes[col] < best:
                col += 1
            r, peak = 1, -np.inf
            for row in range(1, (M + 1) // 2 + 1):
                x = _cell_value(cc, pinv[v], fstep, row, col, M)
                if x > peak:
                    r, peak = row, x
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
                        if _cell_value(cc, pinv[v], fstep, r, col, M) >= cut:
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
        first, rank, coefs = zoff[v], zoff[v + 1] - zoff[v], zcoff[v]
        if rank == 0 or not tight:  # the factors not to be read (not yet, or not held): tier 2 it is
            continue
        zbound = -np.inf  # the candidates' z rows (not ``tight``: that flag holds for every video)
        projected = False
        for c in range(n):
            p = cand[c]
            near = dots[ball_of[v, p]] + ball_dist[v, p]
            if near >= enough[i]:
                if not projected:  # y = zbasis q, once per video
                    for r in range(rank):
                        acc = 0.0
                        for h in range(H):
                            acc += np.float64(zbasis[first + r, h]) * np.float64(q[h])
                        y[r] = acc
                    projected = True
                dot = 0.0
                for r in range(rank):
                    dot += np.float64(zcoef[coefs + p * rank + r]) * y[r]
                near = dot / qn
            zbound = max(zbound, near)
            if zbound >= enough[i]:
                break
        if zbound < enough[i]:  # every candidate bounded, the exact dot or its ball
            out[i] = zbound


@numba.njit(**KERNEL)
def _exact(units, pnorm, zbasis, zcoef, zoff, zcoff, pidx, table, rows, q, qn, u_out,  # pragma: no cover
           cos_out, key_out, frame_out):
    """Exact scores of videos rows[i]: u_out[i] = q.C_t, cos_out[i] = every stored proposal's clip-scale
    cosine, key_out[i] = its first argmax, frame_out[i] = q.z_key = zcoef_key . (zbasis q) (float32, one video
    at a time)."""
    M, P = units.shape[1], pnorm.shape[1]
    csum = np.empty(M + 1, dtype=np.float32)
    y = np.empty(zbasis.shape[1], dtype=np.float32)
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
        first, rank, coefs = zoff[v], zoff[v + 1] - zoff[v], zcoff[v] + key * (zoff[v + 1] - zoff[v])
        _row_dots(zbasis[first:first + rank], q, y[:rank])
        f = np.float32(0.0)
        for r in range(rank):
            f += zcoef[coefs + r] * y[r]
        frame_out[i] = f


# Parallel drivers: each cuts its videos into ``tasks`` equal parts and runs the serial kernel on each part,
# on numba's threads (OpenMP where available: a launch costs tens of microseconds, where waking Python
# threads costs hundreds). A video's result does not depend on the part it falls in.
PARALLEL = {"parallel": True, "nogil": True, "cache": True}


@numba.njit(inline="always")
def _segment_run(seg_start, positions, a):  # pragma: no cover - compiled
    """(s, b): the segment s holding sorted global positions[a] (segment s holds seg_start[s] up to
    seg_start[s + 1]) and the end b of the run positions[a:b] inside it."""
    s = np.searchsorted(seg_start, positions[a], side="right") - 1
    return s, np.searchsorted(positions, seg_start[s + 1])


@numba.njit(**KERNEL)
def _head_runs(codes, scale, err, norm, tail, pinv, pinv_scale, pidx, table, seg_start, rows, levels, step,
               qn, qerr, spread, qtail, out):  # pragma: no cover - compiled
    """The head's ``_clip_pass`` over sorted global rows, the arrays typed Lists over segments (as
    ``Stored``), each segment's run with that segment's head query (row s of levels, step, qerr, spread,
    qtail)."""
    none = np.empty((0, codes[0].shape[1] + 1))
    a = 0
    while a < rows.shape[0]:
        s, b = _segment_run(seg_start, rows, a)
        _clip_pass(codes[s], scale[s], err[s], norm[s], tail[s], pinv[s], pinv_scale[s], pidx[s], table,
                   rows[a:b] - seg_start[s], levels[s], step[s], qn, qerr[s], spread[s], qtail[s], out[a:b],
                   none)
        a = b


@numba.njit(**PARALLEL)
def _head_scan(codes, scale, err, norm, tail, pinv, pinv_scale, pidx, table, seg_start, rows, levels, step,
               qn, qerr, spread, qtail, out, tasks):  # pragma: no cover - compiled
    """``_head_runs`` in parts."""
    n = rows.shape[0]
    for c in numba.prange(tasks):
        a, b = c * n // tasks, (c + 1) * n // tasks
        _head_runs(codes, scale, err, norm, tail, pinv, pinv_scale, pidx, table, seg_start, rows[a:b], levels,
                   step, qn, qerr, spread, qtail, out[a:b])


@numba.njit(**KERNEL)
def _clip_runs(codes, scale, err, norm, pinv, pinv_scale, pidx, table, seg_start, positions, levels, step, qn,
               spread, no_tail, out, hi):  # pragma: no cover - compiled
    """The full codes' ``_clip_pass`` of sorted global positions, the arrays typed Lists over segments (as
    ``Stored``): one call per segment. ``no_tail`` (1, 1) float32, read-only as the head's tails are (one
    compiled ``_clip_pass`` for both): the full codes have no tail."""
    a = 0
    while a < positions.shape[0]:
        s, b = _segment_run(seg_start, positions, a)
        _clip_pass(codes[s], scale[s], err[s], norm[s], no_tail, pinv[s], pinv_scale[s], pidx[s], table,
                   positions[a:b] - seg_start[s], levels, step, qn, qn, spread, 0.0, out[a:b], hi[a:b])
        a = b


@numba.njit(**PARALLEL)
def _clip_scan(codes, scale, err, norm, pinv, pinv_scale, pidx, table, seg_start, positions, levels, step, qn,
               spread, no_tail, out, hi, tasks):  # pragma: no cover - compiled
    """``_clip_runs`` in parts."""
    n = positions.shape[0]
    for c in numba.prange(tasks):
        a, b = c * n // tasks, (c + 1) * n // tasks
        _clip_runs(codes, scale, err, norm, pinv, pinv_scale, pidx, table, seg_start, positions[a:b], levels,
                   step, qn, spread, no_tail, out[a:b], hi[a:b])


@numba.njit(**KERNEL)
def _frame_runs(err, norm, pinv, pinv_scale, ball_codes, ball_scale, ball_norm, ball_radius, ball_of,
                ball_dist, zbasis, zcoef, zoff, zcoff, pidx, table, seg_start, positions, hi, at, levels,
                step, q, qn, spread, key_eps, enough, tight, out):  # pragma: no cover - compiled
    """``_frame_pass`` of sorted global positions, the arrays typed Lists over segments (as ``Stored``):
    one call per segment."""
    a = 0
    while a < positions.shape[0]:
        s, b = _segment_run(seg_start, positions, a)
        _frame_pass(err[s], norm[s], pinv[s], pinv_scale[s], ball_codes[s], ball_scale[s], ball_norm[s],
                    ball_radius[s], ball_of[s], ball_dist[s], zbasis[s], zcoef[s], zoff[s], zcoff[s],
                    pidx[s], table, positions[a:b] - seg_start[s], hi, at[a:b], levels, step, q, qn, spread,
                    key_eps, enough[a:b], tight, out[a:b])
        a = b


@numba.njit(**KERNEL)
def _exact_runs(units, pnorm, zbasis, zcoef, zoff, zcoff, pidx, table, seg_start, positions, q, qn, u_out,
                cos_out, key_out, frame_out):  # pragma: no cover - compiled
    """``_exact`` of sorted global positions, the arrays typed Lists over segments (as ``Stored``): one
    call per segment."""
    a = 0
    while a < positions.shape[0]:
        s, b = _segment_run(seg_start, positions, a)
        _exact(units[s], pnorm[s], zbasis[s], zcoef[s], zoff[s], zcoff[s], pidx[s], table,
               positions[a:b] - seg_start[s], q, qn, u_out[a:b], cos_out[a:b], key_out[a:b], frame_out[a:b])
        a = b


@numba.njit(**PARALLEL)
def _frame_scan(err, norm, pinv, pinv_scale, ball_codes, ball_scale, ball_norm, ball_radius, ball_of,
                ball_dist, zbasis, zcoef, zoff, zcoff, pidx, table, seg_start, positions, hi, at, levels,
                step, q, qn, spread, key_eps, enough, tight, out, tasks):  # pragma: no cover - compiled
    """``_frame_runs`` in parts."""
    n = positions.shape[0]
    for c in numba.prange(tasks):
        a, b = c * n // tasks, (c + 1) * n // tasks
        _frame_runs(err, norm, pinv, pinv_scale, ball_codes, ball_scale, ball_norm, ball_radius, ball_of,
                    ball_dist, zbasis, zcoef, zoff, zcoff, pidx, table, seg_start, positions[a:b], hi,
                    at[a:b], levels, step, q, qn, spread, key_eps, enough[a:b], tight, out[a:b])


@numba.njit(**PARALLEL)
def _exact_scan(units, pnorm, zbasis, zcoef, zoff, zcoff, pidx, table, seg_start, positions, q, qn,
                tasks):  # pragma: no cover - compiled
    """``_exact_runs`` in parts: (u, cos, key, frame) as ``_exact`` writes them."""
    n, M, P = positions.shape[0], units[0].shape[1], pnorm[0].shape[1]
    u_out, cos_out = np.empty((n, M), np.float32), np.empty((n, P), np.float32)
    key_out, frame_out = np.empty(n, np.int64), np.empty(n, np.float32)
    for c in numba.prange(tasks):
        a, b = c * n // tasks, (c + 1) * n // tasks
        _exact_runs(units, pnorm, zbasis, zcoef, zoff, zcoff, pidx, table, seg_start, positions[a:b], q, qn,
                    u_out[a:b], cos_out[a:b], key_out[a:b], frame_out[a:b])
    return u_out, cos_out, key_out, frame_out


@numba.njit(nogil=True, cache=True)
def tasks_for(n: int, threads: int) -> int:  # pragma: no cover - compiled
    """Parts of a pass over n videos on ``threads``: one per thread, a few per thread for big passes (a
    thread slowed by another process leaves its later parts to the others); one for a small pass."""
    if threads <= 1 or n < PARALLEL_ROWS:
        return 1
    return threads * max(1, min(SCAN_TASKS, n // (threads * TASK_ROWS)))


@numba.njit(cache=True)
def _slack(x):  # pragma: no cover - compiled
    """x plus a relative margin, monotone in x (so it commutes with max)."""
    return x + np.abs(x) * SLACK
