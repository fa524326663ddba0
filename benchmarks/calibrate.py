"""Calibrate a model's confidence labels on the dev set and store them where the app finds them.

    python -m benchmarks.calibrate [--profile lite|clip|clip_whole] [--weights clip=DIR_OR_HUB_ID]
                                   [--dev-set DIR] [--off-topic TUNE CHECK] [--out DIR | --ship]
                                   [--json FILE]

One command for any training-free model (``prvr.models.factory.create_model``): the dev set's
videos (``python -m benchmarks.dev_set``, default ``~/.cache/prvr/dev_set``) are indexed with the model's
features and the app's reference caption bank, as the app indexes them; every query of both halves
(``tune.json``, ``check.json``) and the off-topic queries (tuning: ``benchmarks/offtopic_queries.txt``;
checking: ``benchmarks/offtopic_queries_check.txt``, written for this purpose and used for nothing else) is
ranked over all videos at the model's weights (``Gallery.rank``, the search path's ranking). A hit's label
depends only on its total and its video's reference-caption totals (``prvr.results.confidence.cuts_of``), so
the labels of any candidate cuts follow from one pass.

The cuts are decided on the TUNING half and its off-topic queries only, by rules fixed before measuring:

- strong (``high``): the smallest margin over every reference caption (grid 0-0.5, step 0.005) at which the
  tuning half's strong precision (relevant / strong among the top 10 hits) is at least 0.90 and no tuning
  off-topic query gets a strong hit in its top 10; none such: no hit is ever strong;
- possible (``medium``): a band whose tuning possible precision is at least 0.60 (quantiles 0.8-1.0 of the
  reference totals, margins -0.1-0.3); the one with the most possible hits; none such: no band;
- no match (``none``): a hit is "none" when its total is at most a quantile of its video's reference totals
  plus a margin (quantiles 0-1, margins -0.2-0.2, step 0.0025); among the cuts that label at most 3 % of the
  tuning half's relevant (query, video) pairs "none" (a margin under the issue's 5 % target), the one with
  the most tuning off-topic queries whose top hit is "none"; when none of them labels any such query "none",
  there is no "none" label (a cut that never fires on off-topic queries would only mislabel right ones).

Then the CHECKING half and its off-topic queries measure them, with 95 % bootstrap intervals (2000 resamples,
seed 0; on-topic measures resample the dev set's clips, off-topic ones the queries): strong precision and
recall (session 13's definitions, ``benchmarks.confidence.label_measures``), possible precision, the share of
relevant pairs labelled "none" (all pairs, and the top 10's), and the shares of off-topic queries whose top
hit is "none" and that get a strong hit. The tuning half is reported the same way, and so are session 13's
cuts (strong: margin 0.1; no "none"), for comparison.

The calibration (``prvr.results.confidence.Calibration``: the model's identity, the cuts, the source, the
measurements) is written to ``--out`` (default: the app's default data dir's ``confidence/``, where the
app and ``python -m prvr.evaluate`` look first) or, with ``--ship``, to ``assets/calibrations/`` (shipped with
the code: the offline default's lives there). Prints the JSON report.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from extract.pipeline import parse_weights
from prvr.evaluate.annotated import extract_features, load_moments_file
from prvr.index import GalleryVideo, IndexConfig, VideoIndex
from prvr.models.factory import create_model, training_free_profiles
from prvr.paths import cache_dir, default_data_dir
from prvr.results.confidence import (
    SHIPPED_CALIBRATIONS,
    Calibration,
    Calibrator,
    ConfidenceConfig,
    model_identity,
)
from prvr.results.search import encode_query

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
OFF_TOPIC = {"tune": HERE / "offtopic_queries.txt", "check": HERE / "offtopic_queries_check.txt"}
TOP = 10  # hits a person reads: the precision measures count these
STRONG_PRECISION, POSSIBLE_PRECISION = 0.90, 0.60
NONE_RELEVANT_MAX = 0.03  # the tuning rule's bound on relevant pairs labelled "none" (target: 0.05)
NEVER = 1e6  # a margin no total reaches: the label is never given
RESAMPLES = 2000


def read_queries(path: Path) -> list[str]:
    """One query per line; ``#`` lines and blank lines skipped."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


@dataclass
class Ranked:
    """Every query of one set ranked over all videos (index order of columns)."""

    totals: np.ndarray  # (Nq, V) exact totals at the model's weights
    ranks: np.ndarray  # (Nq, V) 1-based rank of each video in the query's response
    relevant: np.ndarray  # (Nq, V) bool (all False for off-topic queries)
    groups: list  # (Nq,) the bootstrap unit of each query (its clip, or the query itself)


def rank_all(index: VideoIndex, model, tokens: list[np.ndarray], ids: list[str],
             relevant: np.ndarray, groups: list) -> Ranked:
    """Rank every video for every query (``Gallery.rank`` at the model's weights, k = all)."""
    column = {vid: j for j, vid in enumerate(ids)}
    totals, ranks = np.zeros((len(tokens), len(ids))), np.zeros((len(tokens), len(ids)), np.int64)
    for i, t in enumerate(tokens):
        for r, hit in enumerate(index.rank(encode_query(model, t), k=len(ids)).hits, 1):
            totals[i, column[hit.video["id"]]], ranks[i, column[hit.video["id"]]] = hit.total, r
    return Ranked(totals, ranks, relevant, groups)


def reference_totals(index: VideoIndex, model, calibrator: Calibrator, ids: list[str]) -> np.ndarray:
    """(V, R) each video's stored reference-caption totals at the model's weights (what its cuts are made of),
    read through ``rank`` with any query (here the first reference caption)."""
    w = (model.cfg.clip_scale_w, model.cfg.frame_scale_w)
    q = np.asarray(calibrator.references[0].detach().cpu(), np.float32)
    hits = index.rank(q, k=len(ids)).hits
    by_id = {h.video["id"]: w[0] * h.ref_clip.astype(np.float64) + w[1] * h.ref_frame.astype(np.float64)
             for h in hits}
    return np.stack([by_id[v] for v in ids])


def label_matrix(totals: np.ndarray, refs: np.ndarray, cfg: ConfidenceConfig) -> np.ndarray:
    """(Nq, V) labels of every (query, video) under ``cfg``: ``Calibrator.label`` against ``cuts_of``'s
    cuts, vectorised (the same quantile methods)."""
    high = np.quantile(refs, cfg.high_quantile, axis=1, method="higher") + cfg.high_margin
    medium = np.quantile(refs, cfg.medium_quantile, axis=1, method="higher") + cfg.medium_margin
    out = np.full(totals.shape, "low", dtype=object)
    if cfg.none_quantile is not None:
        low = np.quantile(refs, cfg.none_quantile, axis=1, method="lower") + cfg.none_margin
        out[totals <= low[None]] = "none"
    out[totals > medium[None]] = "medium"
    out[totals > high[None]] = "high"
    return out


def top_labels(labels: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """(Nq,) the label of each query's rank-1 hit."""
    return labels[ranks == 1]


def ratio(num: np.ndarray, den: np.ndarray) -> float | None:
    """sum(num) / sum(den), None when the denominator is 0."""
    d = float(np.sum(den))
    return round(float(np.sum(num)) / d, 4) if d else None


def with_interval(num: np.ndarray, den: np.ndarray, groups: list, seed: int = 0) -> dict:
    """{value, low, high, n}: a ratio of per-query sums with its 95 % percentile bootstrap interval over
    ``groups`` (clusters of queries resampled whole)."""
    value = ratio(num, den)
    units = sorted(set(groups), key=str)
    if value is None or len(units) < 2:
        return {"value": value, "low": None, "high": None, "n": int(np.sum(den))}
    index = {u: i for i, u in enumerate(units)}
    g = np.array([index[x] for x in groups])
    num_g, den_g = np.bincount(g, num, len(units)), np.bincount(g, den, len(units))
    draws = np.random.default_rng(seed).integers(0, len(units), (RESAMPLES, len(units)))
    n, d = num_g[draws].sum(1), den_g[draws].sum(1)
    boots = n[d > 0] / d[d > 0]
    low, high = np.percentile(boots, [2.5, 97.5])
    return {"value": value, "low": round(float(low), 4), "high": round(float(high), 4), "n": int(np.sum(den))}


def measures(on: Ranked, off: Ranked, refs: np.ndarray, cfg: ConfidenceConfig) -> dict:
    """The label measures of one half (module docstring) with intervals."""
    lab, off_lab = label_matrix(on.totals, refs, cfg), label_matrix(off.totals, refs, cfg)
    shown, first = on.ranks <= TOP, on.ranks == 1
    strong, possible = (lab == "high") & shown, (lab == "medium") & shown
    rank1_relevant = (first & on.relevant).any(1)
    rank1_strong = (first & (lab == "high")).any(1)
    none = lab == "none"
    off_top = top_labels(off_lab, off.ranks)
    off_groups = list(range(len(off_lab)))
    return {
        "strong_precision": with_interval((strong & on.relevant).sum(1), strong.sum(1), on.groups),
        "strong_recall": with_interval(rank1_relevant & rank1_strong, rank1_relevant, on.groups),
        "possible_precision": with_interval((possible & on.relevant).sum(1), possible.sum(1), on.groups),
        "relevant_none": with_interval((none & on.relevant).sum(1), on.relevant.sum(1), on.groups),
        "relevant_top10_none": with_interval((none & on.relevant & shown).sum(1),
                                             (on.relevant & shown).sum(1), on.groups),
        "rank1_none": with_interval((first & none).any(1), np.ones(len(lab)), on.groups),
        "queries_all_top10_none": with_interval((none | ~shown).all(1), np.ones(len(lab)), on.groups),
        "off_topic_top_none": with_interval(off_top == "none", np.ones(len(off_top)), off_groups),
        "off_topic_strong": with_interval(((off_lab == "high") & (off.ranks <= TOP)).any(1),
                                          np.ones(len(off_top)), off_groups),
        "queries": len(lab), "off_topic_queries": len(off_top)}


def decide(on: Ranked, off: Ranked, refs: np.ndarray) -> tuple[ConfidenceConfig, dict]:
    """The cuts, from the tuning half and its off-topic queries only (module docstring's rules)."""
    shown = on.ranks <= TOP
    decisions: dict = {}
    high_margin = NEVER
    for m in np.round(np.arange(0.0, 0.5001, 0.005), 4):
        cfg = ConfidenceConfig(high_margin=float(m), medium_margin=float(m))
        strong = (label_matrix(on.totals, refs, cfg) == "high") & shown
        off_strong = ((label_matrix(off.totals, refs, cfg) == "high") & (off.ranks <= TOP)).any()
        precise = strong.sum() and (strong & on.relevant).sum() / strong.sum() >= STRONG_PRECISION
        if precise and not off_strong:
            high_margin = float(m)
            break
    decisions["high_margin"] = high_margin if high_margin < NEVER else "never (no margin met the rule)"
    medium = (1.0, high_margin)
    best = 0
    for q in (0.8, 0.9, 0.95, 1.0):
        for m in np.round(np.arange(-0.1, 0.3001, 0.005), 4):
            if q == 1.0 and m >= high_margin or m > high_margin:
                continue
            cfg = ConfidenceConfig(medium_quantile=q, medium_margin=float(m), high_margin=high_margin)
            possible = (label_matrix(on.totals, refs, cfg) == "medium") & shown
            n = int(possible.sum())
            if n > best and (possible & on.relevant).sum() / n >= POSSIBLE_PRECISION:
                best, medium = n, (q, float(m))
    decisions["medium"] = ("no band met the rule" if best == 0
                           else {"quantile": medium[0], "margin": medium[1]})
    if best == 0:
        medium = (1.0, high_margin)
    chosen, score = None, (-1.0, 0.0)
    relevant_pairs = on.relevant.sum()
    for q in (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0):
        if q > medium[0]:
            continue
        for m in np.round(np.arange(-0.2, 0.2001, 0.0025), 4):
            cfg = ConfidenceConfig(medium[0], 1.0, high_margin, medium[1], q, float(m))
            none_rel = ((label_matrix(on.totals, refs, cfg) == "none") & on.relevant).sum() / relevant_pairs
            if none_rel > NONE_RELEVANT_MAX:
                continue
            off_none = float(np.mean(top_labels(label_matrix(off.totals, refs, cfg), off.ranks) == "none"))
            if off_none > 0 and (off_none, -none_rel) > score:
                chosen, score = (q, float(m)), (off_none, -none_rel)
    decisions["none"] = {"quantile": chosen[0], "margin": chosen[1], "tuning_off_topic_top_none": score[0],
                         "tuning_relevant_none": round(-score[1], 4)} if chosen else "no cut met the rule"
    cfg = ConfidenceConfig(medium[0], 1.0, high_margin, medium[1], *(chosen or (None, 0.0)))
    return cfg, decisions


def commit() -> str:
    """The repository's current commit (``unknown`` outside a checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=HERE, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(dev_set: Path, profile: str = "lite", weights: dict[str, str] | None = None,
        off_topic: dict[str, Path] | None = None) -> tuple[Calibration, dict]:
    """Index the dev set with the model, rank every query, decide the cuts on the tuning half, measure both
    halves; returns the calibration and the report."""
    off_topic = off_topic or OFF_TOPIC
    loaded = create_model(profile, weights)  # its profile resolved once: the model, features, queries
    model, encoder = loaded.model, loaded.text_encoder()
    halves = {h: load_moments_file(dev_set, dev_set / f"{h}.json", profile=loaded.profile)
              for h in ("tune", "check")}
    ids = [vid for vid, _ in halves["tune"].videos]
    calibrator = Calibrator.for_model(model, encoder, cache_dir=cache_dir("confidence"),
                                      cfg=ConfidenceConfig())  # its reference bank (the cuts come from here)
    with tempfile.TemporaryDirectory(prefix="prvr-calibrate-") as tmp:
        index = VideoIndex.create(Path(tmp) / "index", model, IndexConfig(), calibrator.reference_queries)
        from extract.features import FeatureFile

        tokens = {}
        for half, aset in halves.items():
            with FeatureFile(extract_features(aset)) as ff:
                if half == "tune":
                    index.add([GalleryVideo.from_features(vid, ff.video(vid)) for vid in ids])
                tokens[half] = [ff.caption(q.id)[1] for q in aset.queries]
        refs = reference_totals(index, model, calibrator, ids)
        on, off = {}, {}
        for half, aset in halves.items():
            relevant = np.array([[vid in q.moments for vid in ids] for q in aset.queries])
            groups = [q.clip if q.clip is not None else q.id for q in aset.queries]
            on[half] = rank_all(index, model, tokens[half], ids, relevant, groups)
            texts = read_queries(off_topic[half])
            nothing = np.zeros((len(texts), len(ids)), bool)
            off[half] = rank_all(index, model, encoder.encode(texts), ids, nothing, list(range(len(texts))))
    cfg, decisions = decide(on["tune"], off["tune"], refs)
    old = ConfidenceConfig()  # session 13's cuts: strong at margin 0.1 over every caption, no "none"
    report = {"profile": profile, "model": model_identity(model), "videos": len(ids),
              "decisions": decisions, "cuts": asdict(cfg),
              "measured": {h: measures(on[h], off[h], refs, cfg) for h in ("tune", "check")},
              "session13_cuts": {h: measures(on[h], off[h], refs, old) for h in ("tune", "check")}}
    spec = " ".join(f"--weights {k}={v}" for k, v in (weights or {}).items())
    if off_topic != OFF_TOPIC:
        spec += f" --off-topic {off_topic['tune']} {off_topic['check']}"
    source = {"command": f"python -m benchmarks.calibrate --profile {profile} {spec}".strip(),
              "data": f"dev set {dev_set.name} ({len(ids)} videos): cuts decided on tune.json "
                      f"({len(halves['tune'].queries)} queries) + {off_topic['tune'].name} "
                      f"({len(off['tune'].totals)}), measured on check.json "
                      f"({len(halves['check'].queries)}) + {off_topic['check'].name} "
                      f"({len(off['check'].totals)})",
              "reference_captions": calibrator.reference_id, "date": datetime.date.today().isoformat(),
              "commit": commit()}
    return Calibration(cfg, model_identity(model), source, report["measured"]), report


def main(argv: list[str] | None = None) -> dict:
    """CLI: calibrate, write the calibration, print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="lite", help="a training-free model's profile: "
                        f"{', '.join(training_free_profiles())} (default: lite)")
    parser.add_argument("--weights", action="append", default=[], metavar="BACKBONE=SPEC",
                        help="e.g. clip=/models/clip-b32 or "
                        "clip=hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K")
    parser.add_argument("--dev-set", type=Path, default=cache_dir("dev_set"),
                        help="the dev set folder (python -m benchmarks.dev_set; default %(default)s)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=default_data_dir() / "confidence",
                       help="where to write the calibration (default: the app's, %(default)s)")
    where.add_argument("--ship", action="store_true", help=f"write it to {SHIPPED_CALIBRATIONS} instead")
    parser.add_argument("--off-topic", type=Path, nargs=2, metavar=("TUNE", "CHECK"),
                        default=(OFF_TOPIC["tune"], OFF_TOPIC["check"]),
                        help="the off-topic query files of the two halves (default: offtopic_queries.txt and "
                        "offtopic_queries_check.txt in benchmarks/)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    weights = parse_weights(args.weights) if args.weights else None
    if isinstance(weights, str):
        parser.error(f"--weights {weights}: write it as BACKBONE=SPEC, e.g. clip={weights}")
    for name in ("tune.json", "check.json"):
        if not (args.dev_set / name).is_file():
            parser.error(f"--dev-set {args.dev_set} has no {name}: build it with "
                         "python -m benchmarks.dev_set")
    off_topic = dict(zip(("tune", "check"), args.off_topic, strict=True))
    calibration, report = run(args.dev_set, args.profile, weights, off_topic)
    path = calibration.write(SHIPPED_CALIBRATIONS if args.ship else args.out)
    report["written"] = str(path)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main()
