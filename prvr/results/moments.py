"""Where a query matches inside one video: moments made of the video's own segments, and a heatmap.

The results layer's localisation: it never changes a score or a ranking (MS-SL's key clip stays beside it).
Input, for one video: the query vector, the video's rows in the query space at the model's finest resolution
with their seconds (``model.encode_rows``) and its query-independent segments on those rows
(``prvr.temporal.segments``). The rule, step by step:

1. Each row's cosine with the query; where the index stored the rows' statistics against the reference
   caption bank (``reference_z``), their z-scores among the bank's cosines (a row close to every caption,
   a blank card or a vague scene, is no evidence for this one).
2. Candidates: every segment of every scale of the hierarchy, scored by the two-sample t statistic of the
   rows inside against the rest, ``(mean_in - mean_out) / (sd * sqrt(1 / n_in + 1 / n_out))``, on the rows
   after TF-PRVR's propagation over the segments (``propagation_beta``): unit-free, and a one-row sliver
   needs a far larger contrast than a whole scene to win.
3. Refinement: a candidate holding a finer segment whose own rows match clearly better (t >= ``descend_t``
   = 3, strict because consecutive rows are correlated) is replaced by it, down the hierarchy.
4. The key moment is the best candidate, refined; up to ``n_moments - 1`` more follow, best first, each
   overlapping no kept moment and still matching better inside than outside (t > 0).
5. A moment never starts or ends on a blank row (``blank_rows``: a row repeating a neighbour's vector to
   cosine ``blank_cos``, a frozen picture such as a grey card), so the player opens on content.

A moment reports ``score`` (its rows' mean cosine, the heatmap's scale), ``contrast`` (the t statistic it
was chosen by: moments are listed by it) and ``play_from`` (``play_from``: the middle of its first row, the
frame that row was computed from). The heatmap has one cell per row up to ``max_cells``, then equal bins.
Measurements behind these choices and the alternatives dropped: benchmarks/RESULTS.md ("Moments",
"Localisation and segment ranking", "Session 13", "Issue #42: history moved from module docstrings").
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from prvr.temporal.hubness import bank_z
from prvr.temporal.propagation import BETA, propagate_finest
from prvr.temporal.segments import finest


@dataclass(frozen=True)
class MomentConfig:
    n_moments: int = 3  # key moment + up to 2 more, non-overlapping
    max_cells: int = 128  # heatmap cells at most (one per row below this)
    propagation_beta: float | None = BETA  # candidates scored on propagated rows (None: the rows as given)
    descend_t: float = 3.0  # refine into a finer segment whose own rows match better at this t (step 4)
    reference_z: bool = True  # z-score similarities by each row's reference bank statistics, when given
    blank_cos: float | None = 0.99995  # a row repeating a neighbour this closely is blank (step 6; None: off)

    def __post_init__(self) -> None:
        """Refuse settings the search cannot use, naming the field."""
        if self.n_moments < 1 or self.max_cells < 1:
            raise ValueError(f"MomentConfig: n_moments {self.n_moments} and max_cells {self.max_cells} "
                             "must be >= 1")
        if self.blank_cos is not None and not 0 < self.blank_cos <= 1:
            raise ValueError(f"MomentConfig.blank_cos must be in (0, 1] or None, got {self.blank_cos}")
        if self.propagation_beta is not None and not 0 <= self.propagation_beta < 1:
            raise ValueError(f"MomentConfig.propagation_beta must be in [0, 1) or None, got "
                             f"{self.propagation_beta}")


@numba.njit(cache=True)
def _contrast(sim: np.ndarray, first: int, stop: int, spans: np.ndarray, out: np.ndarray) -> None:
    """out[c]: the t statistic of the rows of ``spans[c]`` against the rest of ``sim[first:stop]`` (step 3;
    the spans lie inside it; 0 for a span that is all of it)."""
    n = stop - first
    csum = np.zeros(n + 1)
    for i in range(n):
        csum[i + 1] = csum[i] + sim[first + i]
    mean, var = csum[n] / n, 0.0
    for i in range(n):
        var += (sim[first + i] - mean) ** 2
    sd = max(np.sqrt(var / n), 1e-9)  # the stretch's own spread
    for c in range(len(spans)):
        a, b = spans[c, 0] - first, spans[c, 1] - first
        n_in = float(b - a)
        if n_in >= n:
            out[c] = 0.0  # the whole stretch contrasts with nothing
            continue
        n_out = max(n - n_in, 1.0)
        sum_in = csum[b] - csum[a]
        out[c] = (sum_in / n_in - (csum[n] - sum_in) / n_out) / (sd * np.sqrt(1 / n_in + 1 / n_out))


@numba.njit(cache=True)
def _refine(sim: np.ndarray, spans: np.ndarray, first: int, stop: int, level: float) -> tuple[int, int]:
    """Step 4: descend from [first, stop) into nested spans whose own rows match clearly better."""
    while True:
        inside = np.zeros(len(spans), np.bool_)
        for c in range(len(spans)):
            a, b = spans[c, 0], spans[c, 1]
            inside[c] = a >= first and b <= stop and b - a < stop - first
        nested = spans[inside]
        if len(nested) == 0:
            return first, stop
        t = np.empty(len(nested))
        _contrast(sim, first, stop, nested, t)
        best = np.argmax(t)
        if t[best] < level:
            return first, stop
        first, stop = nested[best, 0], nested[best, 1]


@numba.njit(cache=True)
def _choose(sim: np.ndarray, context_sim: np.ndarray, spans: np.ndarray, level: float,
            n_moments: int, blank: np.ndarray,
            taken: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps 3-6: the chosen moments' (m, 2) [first, stop) rows, the candidate each was refined from, and
    every candidate's t statistic (``blank``: (n,) bool, rows a moment may not start or end on; ``taken``:
    (n,) bool, rows already given to a moment, overlapped by none of these)."""
    n = len(sim)
    t = np.empty(len(spans))
    _contrast(context_sim, np.int64(0), n, spans, t)  # int64, not Literal[int](0): one compiled version
    chosen = np.zeros((n_moments, 2), np.int64)
    which = np.zeros(n_moments, np.int64)
    m = 0
    if n_moments == 0:
        return chosen[:0], which[:0], t
    for k in np.argsort(-t, kind="mergesort"):
        if (m or taken.any()) and t[k] <= 0:
            break
        first, stop = _refine(sim, spans, spans[k, 0], spans[k, 1], level)
        while first < stop and blank[first]:
            first += 1
        while stop > first and blank[stop - 1]:
            stop -= 1
        if first == stop or taken[first:stop].any():
            continue
        taken[first:stop] = True
        chosen[m, 0], chosen[m, 1], which[m] = first, stop, k
        m += 1
        if m == n_moments:
            break
    return chosen[:m], which[:m], t


def blank_rows(vectors: np.ndarray, blank_cos: float | None = MomentConfig.blank_cos) -> np.ndarray:
    """(n,) bool: rows whose vector repeats a neighbour's (cosine >= ``blank_cos``): frozen pictures such as
    a grey or black card (step 6); all False when ``blank_cos`` is None or every row would be blank."""
    v = np.asarray(vectors, np.float32)
    out = np.zeros(len(v), np.bool_)
    if blank_cos is None or len(v) < 2:
        return out
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    same = np.einsum("nh,nh->n", v[1:], v[:-1]) >= blank_cos
    out[1:] |= same
    out[:-1] |= same
    return out if not out.all() else np.zeros(len(v), np.bool_)


def _unit_query(q: np.ndarray, vectors: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The (H,) float32 unit query, after checking that the shapes of query, rows and seconds agree."""
    q, vectors = np.asarray(q, np.float32), np.asarray(vectors)
    if q.ndim != 1 or vectors.ndim != 2 or vectors.shape[1] != q.shape[0] or len(vectors) == 0:
        raise ValueError(f"find_moments: query {q.shape} and rows {vectors.shape}: expected (H,) and (n, H)")
    if np.shape(start) != (len(vectors),) or np.shape(end) != (len(vectors),):
        raise ValueError(f"find_moments: {len(vectors)} rows, start {np.shape(start)}, end {np.shape(end)}")
    return q / max(float(np.linalg.norm(q)), 1e-12)


def _cosines(rows: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """(n,) cosine of each unit row with the unit query."""
    # einsum, not BLAS: a matrix-vector product this small is slower through threads on a busy machine
    return np.einsum("nh,h->n", np.asarray(rows, np.float32), unit)


def _normalised(sim: np.ndarray, bank: np.ndarray | None, cfg: MomentConfig) -> np.ndarray:
    """The similarities as z-scores by the rows' bank statistics where they are stored and asked for."""
    return bank_z(sim, bank) if cfg.reference_z and bank is not None and len(bank) > 0 else sim


def heatmap(sim: np.ndarray, start: np.ndarray, end: np.ndarray, max_cells: int) -> dict:
    """Row similarities as at most ``max_cells`` cells: {"start", "end", "score"} (seconds, mean cos)."""
    n = len(sim)
    if n <= max_cells:  # one cell per row
        return {"start": np.round(start, 3).tolist(), "end": np.round(end, 3).tolist(),
                "score": np.round(sim.astype(np.float64), 6).tolist()}
    edges = np.unique(np.linspace(0, n, max_cells + 1).round().astype(np.int64))
    score = np.add.reduceat(sim.astype(np.float64), edges[:-1]) / np.diff(edges)
    return {"start": np.round(start[edges[:-1]], 3).tolist(), "end": np.round(end[edges[1:] - 1], 3).tolist(),
            "score": np.round(score, 6).tolist()}


def play_from(moment: dict) -> float:
    """Where a player showing ``moment`` starts (seconds): its ``play_from`` (module docstring), or its start
    for a moment without one (MS-SL's key clip, where a producer stores no fine rows)."""
    return float(moment.get("play_from", moment["start"]))


def anchor_rows(start: np.ndarray, end: np.ndarray, span: tuple[float, float]) -> tuple[int, int]:
    """[first, stop) of the rows overlapping ``span`` (seconds); the row nearest it when none does."""
    start, end = np.asarray(start, np.float64), np.asarray(end, np.float64)
    over = np.flatnonzero((end > span[0]) & (start < max(span[1], span[0] + 1e-6)))
    if len(over):
        return int(over[0]), int(over[-1]) + 1
    near = int(np.argmin(np.abs((start + end) / 2 - (span[0] + span[1]) / 2)))
    return near, near + 1


def find_moments(q: np.ndarray, vectors: np.ndarray, start: np.ndarray, end: np.ndarray,
                 segments: np.ndarray, cfg: MomentConfig | None = None,
                 context: np.ndarray | None = None, row_bank: np.ndarray | None = None,
                 context_bank: np.ndarray | None = None, anchor: tuple[float, float] | None = None) -> dict:
    """{"key_moment", "moments", "heatmap"} of one video for query q (see the module docstring).

    ``vectors`` (n, H) unit rows with ``start``/``end`` (n,) seconds; ``segments`` (S, 3) ``[scale, first,
    end)`` over these n rows; ``context``: ``propagate_finest(vectors, segments, cfg.propagation_beta)``
    if an index stored it (it depends on the video only), else computed here. A moment: {"start", "end"
    (seconds), "score", "contrast", "rows": [first, end), "play_from" (seconds)}. ``anchor``: the key
    moment's span is given (seconds: the words that matched, ``prvr.results.response``): it is the key
    moment, over the rows it overlaps (their mean cosine and t statistic), played from its start; the other
    moments are chosen from the pictures as always, overlapping none of its rows.
    """
    cfg = cfg or MomentConfig()
    unit = _unit_query(q, vectors, start, end)
    vectors = np.asarray(vectors, np.float32)  # stored as float16: converted once, for each use below
    cos = _cosines(vectors, unit)
    sim = _normalised(cos, row_bank, cfg)
    start, end = np.asarray(start, np.float64), np.asarray(end, np.float64)
    seg = np.asarray(segments, np.int64)
    parts = finest(seg, len(sim))  # the segments must cover exactly these rows
    code = np.unique(seg[:, 1] * (len(sim) + 1) + seg[:, 2])  # distinct candidates, as one int each
    spans = np.stack([code // (len(sim) + 1), code % (len(sim) + 1)], axis=1)  # (C, 2)
    if cfg.propagation_beta is None:
        context_sim = sim
    else:
        if context is None:
            context = propagate_finest(np.asarray(vectors, np.float32), seg, cfg.propagation_beta)
        per_part = _normalised(_cosines(context, unit), context_bank, cfg)
        context_sim = np.repeat(per_part, parts[:, 1] - parts[:, 0])
    taken, key = np.zeros(len(sim), np.bool_), []
    if anchor is not None:
        first, stop = anchor_rows(start, end, anchor)
        taken[first:stop] = True
        t = np.zeros(1)
        _contrast(np.ascontiguousarray(context_sim, np.float64), 0, len(sim), np.array([[first, stop]]), t)
        key = [{"start": round(float(anchor[0]), 3), "end": round(float(anchor[1]), 3),
                "score": round(float(cos[first:stop].mean()), 6), "contrast": round(float(t[0]), 4),
                "rows": [first, stop], "play_from": round(float(anchor[0]), 3)}]
    chosen, which, t = _choose(np.ascontiguousarray(sim, np.float64),
                               np.ascontiguousarray(context_sim, np.float64), spans, float(cfg.descend_t),
                               cfg.n_moments - len(key), blank_rows(vectors, cfg.blank_cos), taken)
    moments = key + [{"start": round(float(start[first]), 3), "end": round(float(end[stop - 1]), 3),
                      "score": round(float(cos[first:stop].mean()), 6), "contrast": round(float(t[k]), 4),
                      "rows": [int(first), int(stop)],
                      "play_from": round(float(start[first] + end[first]) / 2, 3)}
                     for (first, stop), k in zip(chosen.tolist(), which.tolist(), strict=True)]
    return {"key_moment": moments[0], "moments": moments, "heatmap": heatmap(cos, start, end, cfg.max_cells)}
