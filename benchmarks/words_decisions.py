"""Decide the words channel's constants on the words dev set's tuning half; confirm them on its checking half.

    python -m benchmarks.words_decisions [--root DIR] [--shared DIR] [--json FILE]

The set, its galleries and its searches are ``prvr.evaluate.words``' (``--gallery words``): one bench is
prepared (videos, pictures and words read once), then every variant below is measured by searching again
with the constants patched (they are read at search time). Rules, fixed before measuring:

1. The words-match rule (``prvr.index.words``: ``WORDS_MATCH``, the score a line needs to match;
   ``DENSE_Z_FLOOR`` / ``DENSE_Z_FULL``, where the dense part starts and saturates): each variant is compared
   with the defaults on the tuning half by a paired bootstrap over videos (``prvr.evaluate.bootstrap``,
   2000 resamples, seed 0) on R@1 (primary). A variant is decided only when the interval of its difference
   excludes 0 in its favour (``decides`` = +1) AND no more near-miss or off-topic queries get a strong match
   than with the defaults; it is kept only if the checking half agrees beyond its interval too. Otherwise the
   defaults stay.
2. The strong-match threshold for exact text (``prvr.results.confidence.STRONG_WORDS``: the lexical coverage
   a subtitle or on-screen line must reach): the smallest value of the grid at which the tuning half's strong
   precision (right strong hits over strong hits in the top 10, as a person sees them) is at least 0.90 AND
   no tuning near-miss query and no tuning off-topic query gets a strong hit from words (one it does not get
   from the pictures alone: the gallery without words labels it; the pictures' own labels are calibrated
   elsewhere, ``benchmarks.calibrate``); then the checking half (its near misses, the held-back
   ``offtopic_queries_check.txt``) measures it with intervals. None such: 1.0 (every content term).

3. Speech lines matched by their dense part alone (``prvr.index.words.SPEECH_DENSE_ALONE``: the dense score
   a speech line sharing none of the query's content terms needs; 0 as any line, above 1 never), added in
   Session 19 (issue #43: a line of only "that" matched a visual query by its dense part). The grid from the
   strictest (a shared content term required), then 1.0, 0.75: the first value whose tuning R@1 is not
   below the defaults' (paired bootstrap's point difference >= 0) and that adds no near-miss or off-topic
   strong match is chosen; it is kept only if the checking half does not lose either (point difference >= 0
   and its interval does not exclude 0 against it). Otherwise 0 stays. Dense-only speech matches are the
   suspect kind of evidence, so the strictest setting that costs nothing is preferred.

Prints a JSON report (and writes it to ``--json``): every variant's tuning numbers, the decisions, and the
checking half's numbers for the decided settings and the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import prvr.index.words as words_module
import prvr.results.confidence as confidence_module
from prvr.evaluate.bootstrap import decides, paired_bootstrap
from prvr.evaluate.words import prepare, run_queries, summarise

log = logging.getLogger(__name__)

MATCH_GRID = {"WORDS_MATCH": (0.3, 0.4, 0.5, 0.6, 0.7), "DENSE_Z_FLOOR": (1.0, 2.0, 3.0),
              "DENSE_Z_FULL": (4.0, 6.0, 8.0)}
SPEECH_GRID = (math.inf, 1.0, 0.75)  # rule 3, strictest first (inf: a shared content term is required)
STRONG_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
STRONG_PRECISION = 0.90


@contextlib.contextmanager
def patched(**values: float) -> Iterator[None]:
    """The words constants set to ``values`` for the block (module attributes read at search time)."""
    owners = {name: confidence_module if name == "STRONG_WORDS" else words_module for name in values}
    before = {name: getattr(owners[name], name) for name in values}
    try:
        for name, value in values.items():
            setattr(owners[name], name, value)
        yield
    finally:
        for name, value in before.items():
            setattr(owners[name], name, value)


def defaults() -> dict[str, float]:
    """The constants as the code defines them."""
    return {**{n: getattr(words_module, n) for n in MATCH_GRID},
            "SPEECH_DENSE_ALONE": words_module.SPEECH_DENSE_ALONE,
            "STRONG_WORDS": confidence_module.STRONG_WORDS}


def meets_strong_rule(precision: float | None, false_strong: dict[str, int]) -> bool:
    """Rule 2 for one threshold: strong precision at least ``STRONG_PRECISION`` and no near-miss or off-topic
    query given a strong match by words."""
    return precision is not None and precision >= STRONG_PRECISION and not any(false_strong.values())


def choose_strong(rows: list[tuple[float, bool]]) -> float:
    """Rule 2: the smallest threshold that meets it (``(value, meets)`` rows); none: 1.0 (every term)."""
    return min((value for value, ok in rows if ok), default=1.0)


def _brief(numbers: dict) -> dict:
    """The numbers a decision reads, from ``summarise``."""
    def value(d: dict | None) -> float | None:
        return None if d is None else d["value"]

    return {"R@1": numbers["R@1"], "R@5": numbers["R@5"], "mean_iou": numbers["key_moment_mean_iou"],
            "strong_precision": numbers["strong_precision"], "strong_recall": numbers["strong_recall"],
            "near_miss_strong": value(numbers["near_miss_strong"]),
            "off_topic_strong": value(numbers["off_topic_strong"])}


def _false_strong(per: dict, pictures: dict) -> dict[str, int]:
    """Near-miss and off-topic queries with a strong hit that the gallery without words does not give them
    (``pictures``: ``run_queries`` of the same half on it)."""
    return {kind: sum(bool(set(w) - set(p)) for w, p in zip(per[f"{kind}_ids"], pictures[f"{kind}_ids"],
                                                             strict=True))
            for kind in ("near", "off")}


def main(argv: list[str] | None = None) -> dict:
    """Measure every variant on the tuning half, decide, confirm on the checking half."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=None, help="the words set's folder (default: its cache)")
    parser.add_argument("--shared", type=Path, default=None, help="the shared clips (default ../shared)")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0 = time.perf_counter()
    bench = prepare(args.root, args.shared)
    base = defaults()
    report: dict = {"defaults": base, "timings": bench.timings, "match": [], "strong": []}
    try:
        with patched(**base):
            reference = {h: run_queries(bench, h, "words") for h in ("tune", "check")}
        pictures = {h: run_queries(bench, h, "pictures") for h in ("tune", "check")}  # constants: no effect
        ref = reference["tune"]
        groups = list(ref["clip"])
        # 1. the words-match rule, one constant at a time around the defaults
        decided = dict(base)
        for name, grid in MATCH_GRID.items():
            for value in grid:
                if value == base[name] or (name == "DENSE_Z_FULL" and value <= base["DENSE_Z_FLOOR"]):
                    continue
                with patched(**{**base, name: value}):
                    per = run_queries(bench, "tune", "words")
                diff = paired_bootstrap({"ranks": ref["rank"]}, {"ranks": per["rank"]}, groups=groups)
                row = {"constant": name, "value": value, **_brief(summarise(per)), "delta_R@1": diff["R@1"],
                       "decides": decides(diff, "R@1"), "false_strong": _false_strong(per, pictures["tune"])}
                report["match"].append(row)
                log.info("%s=%s: R@1 %.1f (delta %+.1f [%+.1f, %+.1f])", name, value, row["R@1"]["value"],
                         diff["R@1"]["value"], diff["R@1"]["low"], diff["R@1"]["high"])
        base_false = sum(_false_strong(ref, pictures["tune"]).values())
        candidates = [r for r in report["match"]
                      if r["decides"] == 1 and sum(r["false_strong"].values()) <= base_false]
        if candidates:
            best = max(candidates, key=lambda r: r["delta_R@1"]["value"])
            trial = {**base, best["constant"]: best["value"]}
            with patched(**trial):
                per = run_queries(bench, "check", "words")
            diff = paired_bootstrap({"ranks": reference["check"]["rank"]}, {"ranks": per["rank"]},
                                    groups=list(per["clip"]))
            report["match_check"] = {"constant": best["constant"], "value": best["value"],
                                     "delta_R@1": diff["R@1"], "decides": decides(diff, "R@1")}
            if decides(diff, "R@1") == 1:
                decided = trial
        # 3. speech lines matched by their dense part alone (rule 3, before 2: it changes what matches)
        report["speech"] = []
        for value in SPEECH_GRID:
            with patched(**{**decided, "SPEECH_DENSE_ALONE": value}):
                per = run_queries(bench, "tune", "words")
            diff = paired_bootstrap({"ranks": ref["rank"]}, {"ranks": per["rank"]}, groups=groups)
            row = {"SPEECH_DENSE_ALONE": value, **_brief(summarise(per)), "delta_R@1": diff["R@1"],
                   "possible_precision": summarise(per)["possible_precision"],
                   "false_strong": _false_strong(per, pictures["tune"])}
            report["speech"].append(row)
            log.info("SPEECH_DENSE_ALONE=%s: R@1 %.1f (delta %+.1f [%+.1f, %+.1f])", value,
                     row["R@1"]["value"], diff["R@1"]["value"], diff["R@1"]["low"], diff["R@1"]["high"])
        chosen = next((r for r in report["speech"] if r["delta_R@1"]["value"] >= 0
                       and sum(r["false_strong"].values()) <= base_false), None)
        if chosen is not None:
            trial = {**decided, "SPEECH_DENSE_ALONE": chosen["SPEECH_DENSE_ALONE"]}
            with patched(**trial):
                per = run_queries(bench, "check", "words")
            diff = paired_bootstrap({"ranks": reference["check"]["rank"]}, {"ranks": per["rank"]},
                                    groups=list(per["clip"]))
            holds = diff["R@1"]["value"] >= 0 and decides(diff, "R@1") != -1
            report["speech_check"] = {"SPEECH_DENSE_ALONE": chosen["SPEECH_DENSE_ALONE"],
                                      "delta_R@1": diff["R@1"], **_brief(summarise(per)),
                                      "possible_precision": summarise(per)["possible_precision"],
                                      "kept": holds}
            if holds:
                decided = trial
        # 2. the strong-match threshold for exact text, on the decided match rule
        for value in STRONG_GRID:
            with patched(**{**decided, "STRONG_WORDS": value}):
                per = run_queries(bench, "tune", "words")
            numbers = summarise(per)
            precision = numbers["strong_precision"]["value"]
            false = _false_strong(per, pictures["tune"])
            ok = meets_strong_rule(precision, false)
            report["strong"].append({"STRONG_WORDS": value, **_brief(numbers),
                                     "false_strong_from_words": false, "wrong_strong": per["wrong_strong"],
                                     "meets_rule": ok})
        decided["STRONG_WORDS"] = choose_strong([(r["STRONG_WORDS"], r["meets_rule"])
                                                 for r in report["strong"]])
        report["decided"] = decided
        report["confirm"] = {}
        for name, setting in (("decided", decided), ("defaults", base)):
            report["confirm"][name] = {}
            for h in ("tune", "check"):
                with patched(**setting):
                    per = run_queries(bench, h, "words")
                report["confirm"][name][h] = {**_brief(summarise(per)),
                                              "false_strong_from_words": _false_strong(per, pictures[h]),
                                              "wrong_strong": per["wrong_strong"]}
        report["pictures"] = {h: _brief(summarise(pictures[h])) for h in ("tune", "check")}
    finally:
        bench.close()
    report["seconds"] = time.perf_counter() - t0
    text = json.dumps(report, indent=1, default=lambda x: x.tolist() if isinstance(x, np.ndarray) else str(x))
    print(text)
    if args.json:
        args.json.write_text(text)
    return report


if __name__ == "__main__":
    main()
