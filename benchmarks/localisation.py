"""Localisation variants of the key moment on the demo gallery and the real-video set; JSON.

    python -m benchmarks.localisation [--real DIR]    # DIR: benchmarks/real_set.py's output (optional)

The model is the offline default (the bridge, its default config: rows propagated before scoring). For each
query, the key moment is found by ``prvr.results.moments.find_moments`` under several ``MomentConfig``
settings and on two kinds of localisation rows, and judged against the annotated moments
(``prvr.evaluate.annotated.span_iou`` / ``centre_inside``) under two protocols:

- ``first``: on the query's first-ranked relevant video only (``prvr.evaluate.retrieval``'s protocol);
- ``all``: on every relevant video of the query (more pairs: 60 on the demo gallery, 84 on the real set,
  and independent of how the model ranks them), so that a choice is not made on 34 + 21 queries alone.

Rows (``BridgeConfig.fine_top_k``): ``top5`` = the class mix of the top 5 classes (what the ranking reads;
session 9's localisation rows), ``all`` = the full class posterior (the default now). Both with the
reference bank's statistics of every row and context row (``prvr.temporal.hubness.bank_stats`` of
``prvr.evaluate.annotated.reference_bank``'s vectors), which ``find_moments`` reads unless ``reference_z`` is
off.

Variants (``MomentConfig`` fields; names without a rows prefix are on the ``top5`` rows without the bank,
as session 9 measured them):
- ``rows_t``: the t statistic over every hierarchy segment on the rows as given (session 9's moments);
- ``propagated_t``: the same on the rows after TF-PRVR's propagation (``propagation_beta`` 0.7);
- ``rows_t+refine{T}`` / ``propagated_t+refine{T}``: then refined down the hierarchy while a finer segment
  matches better than the rest of its parent with t >= T on the rows' own similarities (``descend_t``);
- ``{rows}+bank_z`` / ``{rows}+raw``: the default moments (propagated_t + refine 3) on those rows, with the
  similarities z-scored by the reference bank's statistics (``reference_z``) or raw cosines.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import prvr  # noqa: F401  - applies the compatibility fix first
from prvr.demo import gallery as demo
from prvr.evaluate import demo as demo_set
from prvr.evaluate.annotated import (
    AnnotatedSet,
    centre_inside,
    extract_features,
    first_relevant_ranks,
    load_moments_file,
    span_iou,
)
from prvr.index import bank_vectors, localisation_arrays
from prvr.results.moments import MomentConfig, find_moments
from prvr.temporal.segments import segment_video

NO_REFINE = float("inf")
RAW = MomentConfig(reference_z=False)
VARIANTS = {  # name -> (rows, config)
    "rows_t": ("top5", MomentConfig(propagation_beta=None, descend_t=NO_REFINE, reference_z=False)),
    "propagated_t": ("top5", MomentConfig(descend_t=NO_REFINE, reference_z=False)),
    **{f"rows_t+refine{t:g}": ("top5", MomentConfig(propagation_beta=None, descend_t=t, reference_z=False))
       for t in (1.5, 2.0, 3.0)},
    **{f"propagated_t+refine{t:g}": ("top5", MomentConfig(descend_t=t, reference_z=False))
       for t in (1.5, 2.0, 3.0)},
    "top5+bank_z": ("top5", MomentConfig()),
    "all+raw": ("all", RAW),
    **{f"all+bank_z+refine{t:g}": ("all", MomentConfig(descend_t=t)) for t in (2.0, 4.0)},
    "all+bank_z (default)": ("all", MomentConfig()),
}


def localisation_inputs(model, rows, bank: np.ndarray) -> tuple:
    """find_moments' inputs after the query for one video's extracted rows, exactly as an index stores them
    (``prvr.index.encoding.localisation_arrays``): vectors, start, end, segments, and as keywords the context
    and both bank statistics."""
    vectors, start, end = model.encode_rows(rows.features, rows.start, rows.end)
    a = localisation_arrays(vectors, start, end, segment_video(rows.features), bank)
    return ((a["fine"], a["fine_start"], a["fine_end"], a["segments"]),
            {"context": a["context"], "row_bank": a["fine_bank"], "context_bank": a["context_bank"]})


def judged_pairs(model, aset: AnnotatedSet, bank: np.ndarray) -> tuple[dict, np.ndarray, dict]:
    """Protocol name -> (query, video) index pairs to localise in; the query vectors; rows kind -> video ->
    the inputs find_moments needs."""
    from dataclasses import replace

    from extract.features import FeatureFile
    from prvr.models.bridge import BridgeModel

    with FeatureFile(extract_features(aset)) as ff:
        rows = [ff.video(v) for v, _ in aset.videos]
        tokens = [ff.caption(q.id)[1] for q in aset.queries]
    queries = model.encode_queries(tokens)
    scores = model.score(queries, model.encode_videos([r.features for r in rows])).total.numpy()
    relevant = np.array([[vid in q.moments for vid, _ in aset.videos] for q in aset.queries])
    _, best = first_relevant_ranks(scores, relevant)
    pairs = {"first": list(enumerate(best.tolist())),
             "all": [(i, int(j)) for i in range(len(aset.queries)) for j in np.flatnonzero(relevant[i])]}
    top5 = BridgeModel(model.head, model.class_text, replace(model.cfg, fine_top_k=model.cfg.top_k),
                       model.profile)
    fine = {kind: {j: localisation_inputs(m, r, bank) for j, r in enumerate(rows)}
            for kind, m in (("top5", top5), ("all", model))}
    return pairs, queries.numpy(), fine


def metrics(ious: np.ndarray, inside: np.ndarray) -> dict[str, float]:
    """IoU >= 0.3 / 0.5 / 0.7 (%), mean IoU, centre inside (%)."""
    out = {f"iou>={t}": round(100.0 * float(np.mean(ious >= t)), 1) for t in (0.3, 0.5, 0.7)}
    return {**out, "mean_iou": round(float(ious.mean()), 3), "centre_inside": round(100.0 * inside.mean(), 1)}


def evaluate(model, aset: AnnotatedSet, bank: np.ndarray) -> dict:
    """Protocol -> variant -> metrics of the key moment."""
    pairs, q, fine = judged_pairs(model, aset, bank)
    ids = [vid for vid, _ in aset.videos]
    report = {}
    for protocol, judged in pairs.items():
        report[protocol] = {"pairs": len(judged)}
        for name, (kind, cfg) in VARIANTS.items():
            ious, inside = [], []
            for i, j in judged:
                args, kw = fine[kind][j]
                key = find_moments(q[i], *args, cfg=cfg, **kw)["key_moment"]
                span, truth = np.array([key["start"], key["end"]]), aset.queries[i].moments[ids[j]]
                ious.append(span_iou(span, truth)[0])
                inside.append(centre_inside(span, truth)[0])
            report[protocol][name] = metrics(np.array(ious), np.array(inside))
    return report


def main() -> None:
    """Print the metrics per set, protocol and variant as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", type=Path, default=None, help="the real set's dir (with moments.json)")
    args = parser.parse_args()
    from prvr.evaluate.annotated import reference_bank
    from prvr.models.factory import create_model

    model = create_model("lite").model
    bank = bank_vectors(reference_bank(model))
    sets = {"demo": demo_set.annotated_set(demo.build_demo_gallery())}
    if args.real is not None:
        sets["real"] = load_moments_file(args.real, args.real / "moments.json")
    print(json.dumps({name: evaluate(model, aset, bank) for name, aset in sets.items()}, indent=1))


if __name__ == "__main__":
    main()
