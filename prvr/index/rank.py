"""Exact top-k over a stored gallery: the bounds first, exact scores only where they matter.

``top_k`` is the one rank tail. The best-bounded videos (the clip bound, the frame score taken as 1) are
scored exactly first; their k-th best total tau rules out every video bounded below it. Each other video
that can still reach tau gets the frame bound (unless there is none: a CSA model scores frames its own
way), and only those whose bound still reaches tau are scored exactly. The result is identical to scoring
everything (ties broken by position, as a stable full scan breaks them); only the bytes read change.
The kernels run on numba's threads (``launch``); the arrays they read in place are ``Stored``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np
from numba.typed import List

from prvr.index.evidence import best_first
from prvr.index.kernels import _clip_scan, _exact_scan, _frame_scan, _slack, tasks_for
from prvr.index.sketch import FIRST_PASS, BoundQuery

BOUND_EPS = 1e-4  # added to every upper bound: covers float32 rounding in the exact scores
KEY_EPS = 1e-4  # the key clip candidates' margin (cosine units): the exact argmax's own float32 rounding
FIRST_CHUNK = 16  # the fewest videos scored exactly first (at least 2k)

_ONE_CALLER = threading.Lock()  # numba's fallback threading layer (workqueue) takes one caller at a time


def launch(kernel: Callable, threads: int, *args: object) -> object:
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
def _list_of(array):  # pragma: no cover - compiled
    """A typed List holding ``array``. Built in compiled, cached code: a List built from Python compiles its
    methods for each element type in every process (4 s for an index's 14 Lists here)."""
    out = List()
    out.append(array)
    return out


@numba.njit(cache=True)
def _append(out, array):  # pragma: no cover - compiled
    """out.append(array), compiled and cached (see ``_list_of``)."""
    out.append(array)


def typed_list(arrays: Sequence[np.ndarray]) -> List:
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

        return cls(*(typed_list([array(seg, name) for seg in segments]) for name in cls._fields))


FRAME = ("err", "norm", "pinv", "pinv_scale", "ball_codes", "ball_scale", "ball_norm", "ball_radius",
         "ball_of", "ball_dist", "zhat", "pidx")  # the Lists ``_frame_runs`` takes, in order
EXACT = ("units", "pnorm", "zhat", "pidx")  # the Lists ``_exact_runs`` takes, in order


NO_PIDX = np.zeros((1, 1), dtype=np.int16)  # the kernels do not read per-video windows without a table


def clip_bounds(first: dict[str, np.ndarray], candidates: np.ndarray, q: BoundQuery, table: np.ndarray | None,
                threads: int) -> tuple[np.ndarray, np.ndarray]:
    """(V,) upper bounds of S_clip for the videos ``candidates`` of the first-pass arrays (all segments in
    one array each) and their (V, M+1) prefix sums of unit upper bounds, which ``frame_bounds`` takes."""
    rows = np.ascontiguousarray(candidates, dtype=np.int64)
    out, hi = np.empty(len(rows)), np.empty((len(rows), first["codes"].shape[1] + 1))
    pidx = first["pidx"] if table is not None else NO_PIDX
    launch(_clip_scan, threads, *(first[f] for f in FIRST_PASS), pidx, _table(table), rows, q.levels, q.step,
           q.norm, q.spread, out, hi, tasks_for(len(rows), threads))
    return out, hi


def frame_bounds(stored: Stored, seg_start: np.ndarray, positions: np.ndarray, hi: np.ndarray, at: np.ndarray,
                 q: BoundQuery, table: np.ndarray | None, enough: np.ndarray, threads: int) -> np.ndarray:
    """(V,) upper bounds of S_frame for sorted global ``positions``, given their prefix sums hi[at]: below
    ``enough`` (V,) where the three tiers of ``kernels._frame_pass`` can show it."""
    out = np.empty(len(positions))
    launch(_frame_scan, threads, *(getattr(stored, f) for f in FRAME), _table(table),
           np.ascontiguousarray(seg_start, dtype=np.int64), np.ascontiguousarray(positions, dtype=np.int64),
           hi, np.ascontiguousarray(at, dtype=np.int64), q.levels, q.step, q.vector, q.norm, q.spread,
           KEY_EPS * q.norm, np.ascontiguousarray(enough, dtype=np.float64), out,
           tasks_for(len(positions), threads))
    return np.minimum(_slack(out), 1.0)


@dataclass(frozen=True)
class Exact:
    """Exact scores of some videos (float64), as the model computes them."""

    total: np.ndarray  # (V,)
    clip: np.ndarray  # (V,)
    frame: np.ndarray  # (V,)
    key: np.ndarray  # (V,) position of the key clip among each video's stored proposals
    proposal_cos: np.ndarray  # (V, P) clip-scale cosine of every stored proposal
    u: np.ndarray  # (V, M) raw dot products q.C_t

    def take(self, rows: np.ndarray) -> Exact:
        """These rows (indices into the videos) of every field."""
        return Exact(*(getattr(self, f.name)[rows] for f in dataclasses.fields(self)))

    @staticmethod
    def concat(parts: Sequence[Exact]) -> Exact:
        """The videos of several Exact, one after another."""
        return Exact(*(np.concatenate([getattr(p, f.name) for p in parts])
                       for f in dataclasses.fields(Exact)))


def exact_rows(stored: Stored, seg_start: np.ndarray, positions: np.ndarray, q: BoundQuery,
               weights: tuple[float, float], table: np.ndarray | None = None, threads: int = 1) -> Exact:
    """Exact scores of sorted global positions of ``stored`` (segment s starts at seg_start[s]).

    One video at a time with the same arithmetic, always by the same compiled driver (in one part per
    thread), so a video's scores do not depend on which videos share the call: exact ties are broken by
    position, exactly as a full scan breaks them.
    """
    V = len(positions)
    u, cos, key, frame = launch(_exact_scan, threads, *(getattr(stored, f) for f in EXACT), _table(table),
                                np.ascontiguousarray(seg_start, dtype=np.int64),
                                np.ascontiguousarray(positions, dtype=np.int64), q.vector, q.norm,
                                max(1, min(threads, V)))
    clip = cos[np.arange(V), key].astype(np.float64)
    frame = frame.astype(np.float64) / q.norm
    return Exact(weights[0] * clip + weights[1] * frame, clip, frame, key, cos, u.astype(np.float64))


def top_n(values: np.ndarray, n: int) -> np.ndarray:
    """Sorted indices of the n largest values (any of equal ones), in linear time."""
    n = min(n, len(values))
    return np.sort(np.argpartition(-values, n - 1)[:n]) if n > 0 else np.zeros(0, dtype=np.int64)


def kth_largest(values: np.ndarray, k: int) -> float:
    """The k-th largest value (-inf when there are fewer than k)."""
    return -np.inf if len(values) < k else float(np.partition(values, len(values) - k)[len(values) - k])


def top_k(clip: np.ndarray, candidates: np.ndarray, weights: tuple[float, float], k: int,
          score: Callable[[np.ndarray], np.ndarray],
          frame_bound: Callable[[np.ndarray, np.ndarray], np.ndarray] | None
          ) -> tuple[np.ndarray, np.ndarray, int]:
    """The exact top-k of ``candidates`` (sorted positions) given their clip bounds (see the module
    docstring): (positions, totals) best first, ties broken by position, and how many were scored exactly.

    ``score(sorted positions) -> exact totals``; ``frame_bound(indices into candidates, enough) -> frame
    bounds`` (None: the frame score is only known to be at most 1).
    """
    if len(candidates) == 0 or k <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0), 0
    w0, w1 = weights
    eps = BOUND_EPS * (1 + w0 + w1)
    clip = w0 * clip
    first = top_n(clip, max(FIRST_CHUNK, 2 * k))  # the best bounds: clip + w1 + eps, the same order
    positions = candidates[first]
    totals = score(positions)
    tau = kth_largest(totals, k)
    rest = np.ones(len(candidates), dtype=bool)
    rest[first] = False
    at = np.flatnonzero(rest & (clip + w1 + eps >= tau))  # the others that can still reach tau
    if len(at) and frame_bound is not None and w1 > 0:
        frame = frame_bound(at, (tau - eps - clip[at]) / w1)
        at = at[clip[at] + w1 * frame + eps >= tau]
    if len(at):
        positions = np.concatenate((positions, candidates[at]))
        totals = np.concatenate((totals, score(candidates[at])))
    best = best_first(totals, positions, k)
    return positions[best], totals[best], len(positions)
