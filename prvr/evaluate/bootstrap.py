"""Percentile bootstrap intervals for an annotated set's metrics, and a paired bootstrap between two variants.

The unit of resampling is the query: every metric of ``prvr.evaluate.annotated.evaluate_set`` is a mean over
queries of a per-query value, so one resample draws the queries with replacement (the same draw for every
metric, and, in ``paired_bootstrap``, for both variants) and recomputes the metrics on it. Per-query inputs:

- ``ranks``: the 1-based rank of the query's first-ranked relevant video (R@1/5/10, SumR);
- ``iou``: per query, the IoU with the annotated moments of the key moment on that video (a number, or an
  array of IoUs whose mean is the query's value, as for the random window's 528 proposals);
- ``inside``: the same for "the predicted centre is inside an annotated moment" (bools, or an array).

Queries of one clip are not independent (a clip's 2-3 queries and its phases share its pictures); pass
``groups`` (e.g. each query's clip) to resample whole groups instead (a cluster bootstrap: wider, more honest
intervals when groups hold several queries). The metric of a resample is then the mean over all the
queries of the drawn groups.

``python -m prvr.evaluate.bootstrap A.json [B.json]`` reads files of such arrays (``{"ranks": [...], "iou":
[...], "inside": [...], "groups": [...]}``, one entry per query in the same order; ``groups`` optional,
read from A) and prints the intervals, or the paired differences B - A. ``ratio_interval``: a ratio of sums
(a precision: right strong hits over strong hits) resampled as a ratio. Pure numpy.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import numpy as np

RECALLS = (1, 5, 10)
IOU_LEVELS = (0.3, 0.5, 0.7)
N_RESAMPLES = 2000
LEVEL = 0.95


def per_query_values(ranks: Sequence[int] | np.ndarray | None = None, iou: Sequence | None = None,
                     inside: Sequence | None = None) -> dict[str, np.ndarray]:
    """Each metric's per-query value (its mean over queries is the metric, in percent where evaluate_set
    reports percent)."""
    out: dict[str, np.ndarray] = {}
    if ranks is not None:
        r = np.asarray(ranks, np.float64)
        for k in RECALLS:
            out[f"R@{k}"] = 100.0 * (r <= k)
        out["SumR"] = sum(out[f"R@{k}"] for k in RECALLS)
    if iou is not None:
        per = [np.atleast_1d(np.asarray(v, np.float64)) for v in iou]
        for t in IOU_LEVELS:
            out[f"iou>={t}"] = np.array([100.0 * np.mean(v >= t) for v in per])
        out["mean_iou"] = np.array([np.mean(v) for v in per])
    if inside is not None:
        out["centre_inside"] = np.array([100.0 * np.mean(np.atleast_1d(np.asarray(v, np.float64)))
                                         for v in inside])
    sizes = {len(v) for v in out.values()}
    if len(sizes) > 1:
        raise ValueError(f"per-query arrays of different lengths: {sorted(sizes)}")
    if sizes == {0}:
        raise ValueError("no queries")
    return out


def resample_indices(n: int, n_resamples: int = N_RESAMPLES, seed: int = 0) -> np.ndarray:
    """(n_resamples, n) query indices drawn with replacement, reproducible from ``seed``."""
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def _replicates(values: np.ndarray, idx: np.ndarray, groups: Sequence | None) -> np.ndarray:
    """(n_resamples,) means of ``values`` over resampled queries (``idx`` rows), or over the queries of
    resampled groups (``idx`` then indexes the groups, in ``np.unique`` order)."""
    if groups is None:
        return values[idx].mean(axis=1)
    _, member = np.unique(np.asarray(groups), return_inverse=True)
    sums, counts = np.bincount(member, weights=values), np.bincount(member)
    return sums[idx].sum(axis=1) / counts[idx].sum(axis=1)


def _n_units(n: int, groups: Sequence | None) -> int:
    """How many units a resample draws: queries, or groups."""
    if groups is None:
        return n
    if len(groups) != n:
        raise ValueError(f"groups has {len(groups)} entries for {n} queries")
    return len(np.unique(np.asarray(groups)))


def _interval(point: float, boots: np.ndarray, level: float) -> dict[str, float]:
    """{value, low, high} from a point estimate and its bootstrap replicates (percentile method)."""
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(boots, [tail, 100.0 - tail])
    return {"value": float(point), "low": float(low), "high": float(high)}


def intervals(values: dict[str, np.ndarray], groups: Sequence | None = None, n_resamples: int = N_RESAMPLES,
              seed: int = 0, level: float = LEVEL) -> dict[str, dict[str, float]]:
    """{metric: {value, low, high}} of metrics given as per-query values (each metric is their mean), all
    resampled with the same draw of queries (or of ``groups``)."""
    values = {k: np.asarray(v, np.float64) for k, v in values.items()}
    sizes = {len(v) for v in values.values()}
    if len(sizes) != 1 or sizes == {0}:
        raise ValueError(f"per-query arrays must be non-empty and of one length, got {sorted(sizes)}")
    n = sizes.pop()
    idx = resample_indices(_n_units(n, groups), n_resamples, seed)
    return {name: _interval(v.mean(), _replicates(v, idx, groups), level) for name, v in values.items()}


def bootstrap(ranks: Sequence[int] | np.ndarray | None = None, iou: Sequence | None = None,
              inside: Sequence | None = None, groups: Sequence | None = None, n_resamples: int = N_RESAMPLES,
              seed: int = 0, level: float = LEVEL) -> dict[str, dict[str, float]]:
    """Point estimate and percentile bootstrap interval of every metric: {metric: {value, low, high}}."""
    return intervals(per_query_values(ranks, iou, inside), groups, n_resamples, seed, level)


def paired_bootstrap(a: dict, b: dict, groups: Sequence | None = None, n_resamples: int = N_RESAMPLES,
                     seed: int = 0, level: float = LEVEL) -> dict[str, dict[str, float]]:
    """Difference B - A of every metric on the same queries, resampled jointly: {metric: {value, low, high,
    p_le_0}}; ``a`` and ``b`` are keyword dicts of ``bootstrap``'s per-query arrays (ranks, iou, inside)."""
    va, vb = per_query_values(**a), per_query_values(**b)
    common = [k for k in va if k in vb]
    n = len(va[common[0]])
    if any(len(vb[k]) != n for k in common):
        raise ValueError("the two variants must be measured on the same queries, in the same order")
    idx = resample_indices(_n_units(n, groups), n_resamples, seed)
    out = {}
    for name in common:
        diff = vb[name] - va[name]
        boots = _replicates(diff, idx, groups)
        out[name] = {**_interval(diff.mean(), boots, level), "p_le_0": float(np.mean(boots <= 0))}
    return out


def ratio_interval(num: np.ndarray, den: np.ndarray, groups: Sequence | None = None,
                   n_resamples: int = N_RESAMPLES, seed: int = 0, level: float = LEVEL) -> dict:
    """{value, low, high, num, den} of sum(num) / sum(den) with a percentile bootstrap over items (or over
    ``groups``); value None when den sums to 0 (nothing to measure), bounds over resamples with den > 0."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    out = {"num": float(num.sum()), "den": float(den.sum())}
    if den.sum() == 0:
        return {"value": None, "low": None, "high": None, **out}
    if groups is None:
        member, n = np.arange(len(num)), len(num)
    else:
        _, member = np.unique(np.asarray(groups), return_inverse=True)
        n = int(member.max()) + 1
    sums_n, sums_d = np.bincount(member, num, n), np.bincount(member, den, n)
    idx = resample_indices(n, n_resamples, seed)
    bn, bd = sums_n[idx].sum(axis=1), sums_d[idx].sum(axis=1)
    ok = bd > 0
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(bn[ok] / bd[ok], [tail, 100.0 - tail])
    return {"value": float(num.sum() / den.sum()), "low": float(low), "high": float(high), **out}


def decides(paired: dict[str, dict[str, float]], metric: str = "SumR") -> int:
    """+1 if B beats A on ``metric`` beyond the interval (low > 0), -1 if A beats B (high < 0), else 0."""
    d = paired[metric]
    return 1 if d["low"] > 0 else -1 if d["high"] < 0 else 0


def format_intervals(table: dict[str, dict[str, float]]) -> str:
    """One line per metric: value [low, high]."""
    return "\n".join(f"{name:14s} {d['value']:8.2f} [{d['low']:8.2f}, {d['high']:8.2f}]"
                     for name, d in table.items())


def main(argv: list[str] | None = None) -> int:
    """CLI: intervals of one per-query file, or paired differences of two."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="one or two JSON files of per-query arrays")
    parser.add_argument("--resamples", type=int, default=N_RESAMPLES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    keys = ("ranks", "iou", "inside")
    loaded = []
    for name in args.files[:2]:
        with open(name) as f:
            loaded.append(json.load(f))
    data = [{k: v for k, v in d.items() if k in keys} for d in loaded]
    groups = loaded[0].get("groups")
    if len(data) == 1:
        print(format_intervals(bootstrap(**data[0], groups=groups, n_resamples=args.resamples,
                                         seed=args.seed)))
    else:
        print(format_intervals(paired_bootstrap(*data, groups=groups, n_resamples=args.resamples,
                                                seed=args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
