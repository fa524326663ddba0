"""Exact top-k over a stored gallery: the bounds first, exact scores only where they matter.

``top_k`` is the one rank tail, fed by either backend: candidates come in ``Page``s, each with an upper bound
of every candidate's total and one of every candidate not given yet (the built-in index gives one page of
every live video with its head bounds; Qdrant gives pages of its engine's bound order). The best-bounded
candidates are scored exactly first; their k-th best total tau rules out every candidate bounded below it.
Each other candidate that can still reach tau gets the backend's tighter bound (``refine``: the built-in
index's full codes and frame balls), and only those whose refined bound still reaches tau are scored
exactly; a page whose rest is bounded below tau ends the search. The result is identical to scoring
everything (ties broken by position, as a stable full scan breaks them); only the bytes read change.
The kernels run on numba's threads (``launch``); the arrays they read in place are ``Stored``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np
import torch
from numba.typed import List

from prvr.index.evidence import best_first
from prvr.index.kernels import _clip_scan, _exact_scan, _frame_scan, _head_scan, _slack, tasks_for
from prvr.index.sketch import CLIP, HEAD, NORM_EPS, SLACK, UNIT_LEVELS, BoundQuery, query_levels_rows

BOUND_EPS = 1e-4  # added to every upper bound: covers float32 rounding in the exact scores
KEY_EPS = 1e-4  # the key clip candidates' margin (cosine units): the exact argmax's own float32 rounding
FIRST_CHUNK = 16  # the fewest videos scored exactly first (at least 2k)
SHORTLIST = 256  # the best first bounds refined before the first videos are chosen (with ``refine``)

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


def kernel_input(array: np.ndarray) -> np.ndarray:
    """``array`` as the kernels read it: C-ordered and read-only (a view; a copy only of another layout).
    numba compiles a kernel once per argument type, and an array's layout and writeable flag are part of
    it: mapped files (read-only), arrays built in memory (writeable) and transposes would each compile and
    cache every kernel again, seconds each on a first search."""
    array = np.ascontiguousarray(array)
    if array.flags.writeable:
        array = array.view()
        array.flags.writeable = False
    return array


NO_TAIL = kernel_input(np.zeros((1, 1), np.float32))  # the full codes' tail: none (read-only, as stored)


def typed_list(arrays: Sequence[np.ndarray]) -> List:
    """A typed List of arrays of one type, each as ``kernel_input`` gives it."""
    out = _list_of(kernel_input(arrays[0]))
    for array in arrays[1:]:
        _append(out, kernel_input(array))
    return out


class Stored:
    """The per-video arrays the refining bounds and the exact scores read in place: per array, one numba
    typed List with one entry per segment (video (s, v) is row v of segment s), built on first use. The
    kernels take the Lists one by one (``FRAME``, ``EXACT``): numba types a tuple of them far slower than each
    alone. A segment storing every window in window_table order may lack ``pidx`` (a placeholder stands in:
    the kernels do not read it then); ``zoff`` / ``zcoff`` are where each video's zbasis rows / zcoef
    elements start."""

    def __init__(self, segments: Sequence[Mapping[str, np.ndarray]]) -> None:
        self.segments = segments
        self._lists: dict[str, List] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, segments: Sequence[Mapping[str, np.ndarray]]) -> Stored:
        """The Lists over these segments' arrays, without copies."""
        return cls(segments)

    def lists(self, names: Sequence[str]) -> tuple[List, ...]:
        """The typed Lists of these arrays."""
        with self._lock:
            for name in names:
                if name not in self._lists:
                    self._lists[name] = typed_list([self._array(seg, name) for seg in self.segments])
            return tuple(self._lists[name] for name in names)

    @staticmethod
    def _array(seg: Mapping[str, np.ndarray], name: str) -> np.ndarray:
        """One segment's array ``name``, or where the kernels will not read it, a placeholder: ``pidx`` where
        every window is stored; the frame-scale factors where only the sketch was read (no rows: the frame
        bound stops at its second tier)."""
        videos = len(next(seg[k] for k in ("pinv", "units", "pnorm") if k in seg))
        if name == "pidx" and name not in seg:
            return np.zeros((videos, 1), dtype=np.int16)
        if name in ("zoff", "zcoff"):
            count = "n_zrank" if name == "zoff" else "n_zcoef"
            if count not in seg and f"{count}_offset" not in seg:
                return np.zeros(videos + 1, np.int64)
            return offsets(seg, count)
        if name == "zbasis" and name not in seg:
            return np.zeros((0, 1), np.float32)
        if name == "zcoef" and name not in seg:
            return np.zeros(0, np.float32)
        return seg[name]


def offsets(seg: Mapping[str, np.ndarray], count: str) -> np.ndarray:
    """(V + 1,) int64: where each video's rows of the ragged arrays counted by ``count`` start."""
    if f"{count}_offset" in seg:
        return seg[f"{count}_offset"]
    return np.concatenate([[0], np.cumsum(seg[count])]).astype(np.int64)


HEAD_LISTS = (*HEAD, "pinv", "pinv_scale", "pidx")  # the Lists ``_head_runs`` takes, in order
CLIP_LISTS = (*CLIP, "pinv", "pinv_scale", "pidx")  # the Lists ``_clip_runs`` takes, in order
FRAME = ("err", "norm", "pinv", "pinv_scale", "ball_codes", "ball_scale", "ball_norm", "ball_radius",
         "ball_of", "ball_dist", "zbasis", "zcoef", "zoff", "zcoff", "pidx")  # what ``_frame_runs`` takes
EXACT = ("units", "pnorm", "zbasis", "zcoef", "zoff", "zcoff", "pidx")  # the Lists ``_exact_runs`` takes


NO_PIDX = np.zeros((1, 1), dtype=np.int16)  # the kernels do not read per-video windows without a table


@dataclass(frozen=True)
class HeadQuery:
    """The query as the head pass takes it, one row per segment (each segment has its own head basis A):
    the 16-bit levels of a = A q (float64), their step and spread (widened by |(I - A A^T) a|: A's rows are
    orthonormal to float32 only, see ``prvr.index.kernels``), |a| and |q - A^T a| (rounded up)."""

    levels: np.ndarray  # (S, d) int16
    step: np.ndarray  # (S,)
    spread: np.ndarray  # (S,)
    qerr: np.ndarray  # (S,) |a|
    qtail: np.ndarray  # (S,) >= |q - A^T a|
    norm: float  # |q|

    @classmethod
    def of(cls, q: BoundQuery, bases: np.ndarray, grams: np.ndarray) -> HeadQuery:
        """The head query of q for the segments' bases (S, d, H) (float64 of the stored float32) and their
        Gram matrices A A^T (S, d, d)."""
        a = (torch.from_numpy(bases) @ torch.from_numpy(q.vector).double()).numpy()  # (S, d) float64
        ga = np.einsum("sij,sj->si", grams, a)
        square = np.einsum("si,si->s", a, a)
        # |q - A^T a|^2 = |q|^2 - 2 |a|^2 + a . (A A^T) a; rounding of these float64 sums: far below SLACK
        tail = np.sqrt(np.maximum(q.norm ** 2 - 2 * square + np.einsum("si,si->s", a, ga), 0.0))
        tail = np.sqrt(tail**2 + 1e-14 * q.norm**2)  # the float64 sums' own rounding, where tail is ~0
        drift = np.linalg.norm(a - ga, axis=1)  # |(I - A A^T) a|: A's rows are orthonormal to float32 only
        top = min(2**15 - 1, (2**31 - 1) // (UNIT_LEVELS * max(a.shape[1], 1)))
        levels, step, spread, norm_a = query_levels_rows(a, top)
        return cls(levels, step, (spread + drift) * (1 + SLACK) + 1e-30, norm_a * (1 + SLACK) + 1e-30,
                   tail * (1 + SLACK) + 1e-30, max(q.norm, NORM_EPS))


def head_bounds(stored: Stored, seg_start: np.ndarray, candidates: np.ndarray, q: HeadQuery,
                table: np.ndarray | None, threads: int) -> np.ndarray:
    """(V,) upper bounds of S_clip for the sorted global positions ``candidates``, from the head arrays of
    the first pass (``sketch.FIRST_PASS``)."""
    rows = np.ascontiguousarray(candidates, dtype=np.int64)
    out = np.empty(len(rows))
    launch(_head_scan, threads, *stored.lists(HEAD_LISTS), _table(table),
           np.ascontiguousarray(seg_start, dtype=np.int64), rows, q.levels, q.step, q.norm, q.qerr, q.spread,
           q.qtail, out, tasks_for(len(rows), threads))
    return out


def clip_bounds(stored: Stored, seg_start: np.ndarray, positions: np.ndarray, q: BoundQuery,
                table: np.ndarray | None, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """(V,) upper bounds of S_clip for sorted global ``positions`` from the full 8-bit codes, and their
    (V, M+1) prefix sums of unit upper bounds, which ``frame_bounds`` takes."""
    rows = np.ascontiguousarray(positions, dtype=np.int64)
    codes = stored.lists(("codes",))[0]
    out, hi = np.empty(len(rows)), np.empty((len(rows), codes[0].shape[1] + 1))
    launch(_clip_scan, threads, *stored.lists(CLIP_LISTS), _table(table),
           np.ascontiguousarray(seg_start, dtype=np.int64), rows, q.levels, q.step, q.norm, q.spread, NO_TAIL,
           out, hi, tasks_for(len(rows), threads))
    return out, hi


def frame_bounds(stored: Stored, seg_start: np.ndarray, positions: np.ndarray, hi: np.ndarray, at: np.ndarray,
                 q: BoundQuery, table: np.ndarray | None, enough: np.ndarray, threads: int,
                 tight: bool = True) -> np.ndarray:
    """(V,) upper bounds of S_frame for sorted global ``positions``, given their prefix sums hi[at]: below
    ``enough`` (V,) where the three tiers of ``kernels._frame_pass`` can show it (``tight`` False: the first
    two, which read no frame-scale factors)."""
    out = np.empty(len(positions))
    launch(_frame_scan, threads, *stored.lists(FRAME), _table(table),
           np.ascontiguousarray(seg_start, dtype=np.int64), np.ascontiguousarray(positions, dtype=np.int64),
           hi, np.ascontiguousarray(at, dtype=np.int64), q.levels, q.step, q.vector, q.norm, q.spread,
           KEY_EPS * q.norm, np.ascontiguousarray(enough, dtype=np.float64), tight, out,
           tasks_for(len(positions), threads))
    return np.minimum(_slack(out), 1.0)


class ClipBounds(NamedTuple):
    """The full codes' clip bounds of sorted positions with their prefix sums (``clip_bounds``), where a
    first pass computed them: a refine of any of these positions takes them from here, not again."""

    positions: np.ndarray  # (V,) sorted
    clip: np.ndarray  # (V,)
    hi: np.ndarray  # (V, M + 1)

    def of(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(clip, hi) of these sorted positions, or None when any is not among them."""
        at = np.searchsorted(self.positions, positions)
        if not len(positions) or at[-1] >= len(self.positions) or not np.array_equal(self.positions[at],
                                                                                      positions):
            return None
        return self.clip[at], self.hi[at]


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
    u, cos, key, frame = launch(_exact_scan, threads, *stored.lists(EXACT), _table(table),
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


class Page(NamedTuple):
    """Candidates of a rank, as a backend gives them: positions (their storage or insertion order, which
    breaks ties), an upper bound of each one's total, and an upper bound of the total of every candidate not
    given yet (-inf: none is left)."""

    positions: np.ndarray  # (V,) int64
    bounds: np.ndarray  # (V,) float64
    rest: float


def top_k(pages: Iterable[Page], k: int, score: Callable[[np.ndarray], np.ndarray],
          refine: Callable[[np.ndarray, float], np.ndarray] | None = None, eps: float = BOUND_EPS,
          shortlist: int = SHORTLIST) -> tuple[np.ndarray, np.ndarray, int]:
    """The exact top-k of the candidates the pages give (see the module docstring): (positions, totals) best
    first, ties broken by position, and how many were scored exactly.

    ``score(sorted positions) -> exact totals``; ``refine(sorted positions, tau) -> tighter upper bounds of
    their totals`` (None: the pages' bounds are all there is). ``eps`` is added to every bound: the float
    rounding of the exact scores (and of the backend's bounds); ``shortlist``: how many of the best-bounded
    candidates ``refine`` orders before the first are scored (where refining costs a fetch, fewer)."""
    positions, totals = [np.zeros(0, dtype=np.int64)], [np.zeros(0)]
    tau = -np.inf
    for page in pages:
        order = np.argsort(page.positions, kind="stable")
        pos = np.asarray(page.positions, dtype=np.int64)[order]
        bound = np.asarray(page.bounds, dtype=np.float64)[order]
        if sum(len(p) for p in positions) < k and len(pos):  # no tau yet: the best-bounded videos first
            first = top_n(bound, max(FIRST_CHUNK, 2 * k))
            if refine is not None:  # their order by the tighter bounds of a shortlist
                short = top_n(bound, max(shortlist, len(first)))
                first = short[top_n(refine(pos[short], -np.inf), len(first))]
            positions.append(pos[first])
            totals.append(score(pos[first]))
            tau = kth_largest(np.concatenate(totals), k)
            rest = np.ones(len(pos), dtype=bool)
            rest[first] = False
            pos, bound = pos[rest], bound[rest]
        keep = bound + eps >= tau  # the others that can still reach tau
        pos = pos[keep]
        if len(pos) and refine is not None:
            pos = pos[refine(pos, tau) + eps >= tau]
        if len(pos):
            positions.append(pos)
            totals.append(score(pos))
            tau = kth_largest(np.concatenate(totals), k)
        if page.rest + eps < tau:
            break
    every, totals = np.concatenate(positions), np.concatenate(totals)
    best = best_first(totals, every, k)
    return every[best], totals[best], len(every)
