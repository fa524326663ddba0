"""How trustworthy the confidence labels are on the demo gallery (prvr/confidence.py), as one JSON object.

    python -m benchmarks.confidence [--out FILE]

Scores come from ``model.score`` directly on the demo gallery's features (prvr.demo helpers). Queries: the
gallery's 34 captions (positives: their relevant videos), 32 off-topic queries written for this benchmark
(nothing in the gallery shows them) and 12 nonsense / emoji-only strings. Reported:
- ``high``: precision and recall of "high" (= "strong match") over caption x video pairs;
- ``captions_high_or_medium``: the share of captions whose best relevant video is labelled high or medium
  (and the share of all relevant pairs);
- ``off_topic_high`` / ``nonsense_high``: queries labelled high on any video (target 0);
- ``stable_when_gallery_grows``: every demo label recomputed after 10 unrelated videos join (target 1.0);
- the same rates for the old gallery-relative rule (robust z against the gallery's scores) for contrast;
- ``ms_per_search_10_hits``: labelling cost after the one-time fit.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from prvr.confidence import Calibrator, ConfidenceConfig
from prvr.results import ConfidenceRule

OFF_TOPIC = [
    "a dog playing football", "a chef cooking pasta in a kitchen", "a man swimming in the ocean",
    "children riding bicycles", "a wedding dance", "a horse jumping a fence", "a firefighter on a ladder",
    "people skiing down a mountain", "a train crossing a bridge", "a baby laughing",
    "a birthday party with balloons", "a basketball game", "a woman playing the piano",
    "a fisherman on a boat", "a tiger walking in the jungle", "a car crash on the highway",
    "a soldier firing a rifle", "two people arguing in an office", "a surfer on a wave",
    "someone washing a car", "a farmer milking a cow",
    "an elephant in a river", "a crowd at a rock concert", "a kid eating ice cream", "a man fixing a roof",
    "a plane landing at an airport", "snow falling on pine trees", "a girl brushing a horse",
    "a police officer directing traffic", "a couple kissing in the rain", "a boxer in the ring",
    "a chicken crossing the road",
]
NONSENSE = ["🐱🚀☕", "🔥🔥🔥", "😀", "asdfgh qwerty", "xkcd zzz plorp", "lorem ipsum dolor sit amet", "the",
            "??? !!!", "1234567890", "blorf wimble snazz", "ok", "a"]


def unrelated_rows(like: list[np.ndarray], n: int, seed: int = 0) -> list[np.ndarray]:
    """``n`` videos of random non-negative rows with the demo rows' scale (pooled ReLU features)."""
    gen = np.random.default_rng(seed)
    scale = float(np.mean([r.mean() for r in like]))
    shapes = [(int(gen.integers(20, 90)), like[0].shape[1]) for _ in range(n)]
    return [np.abs(gen.normal(0, scale * 1.25, shape)).astype(np.float32) for shape in shapes]


def label_matrix(cal: Calibrator, scores: np.ndarray, nulls: list) -> np.ndarray:
    """(Nq, Nv) labels through the public per-hit function."""
    return np.array([cal.labels(row, nulls) for row in scores])


def old_rule_labels(scores: np.ndarray) -> np.ndarray:
    """The gallery-relative rule this replaces: robust z of each score against the query's gallery scores."""
    rule = ConfidenceRule()
    return np.array([[rule.label(z) for z in rule.z_scores(row, row)] for row in scores])


def rates(labels: np.ndarray, relevant: np.ndarray, off: np.ndarray, non: np.ndarray) -> dict:
    """The benchmark's rates for one labelling (captions x videos, off-topic, nonsense)."""
    high, strong_or_med = labels == "high", labels != "low"
    tp, n_high = int((high & relevant).sum()), int(high.sum())
    return {
        "high": {"precision": round(tp / max(1, n_high), 3), "recall": round(tp / int(relevant.sum()), 3),
                 "pairs_labelled_high": n_high},
        "captions_high_or_medium": round(float(np.where(relevant, strong_or_med, False).any(1).mean()), 3),
        "captions_high": round(float(np.where(relevant, high, False).any(1).mean()), 3),
        "relevant_pairs_high_or_medium": round(float(strong_or_med[relevant].mean()), 3),
        "off_topic_high": int((off == "high").any(1).sum()),
        "off_topic_medium": int((off == "medium").any(1).sum()),
        "nonsense_high": int((non == "high").any(1).sum()),
        "nonsense_medium": int((non == "medium").any(1).sum()),
        "queries": {"captions": len(labels), "off_topic": len(off), "nonsense": len(non)},
    }


def run(cfg: ConfidenceConfig | None = None) -> dict:
    """Fit the calibrator for the default model and measure it on the demo gallery."""
    from extract.features import FeatureFile
    from extract.pipeline import TextEncoder
    from prvr.bridge import BridgeModel
    from prvr.demo import build_demo_gallery, caption_id, extract_demo_features

    cfg = cfg or ConfidenceConfig()
    gallery, model, encoder = build_demo_gallery(), BridgeModel.from_pretrained(), TextEncoder("lite")
    with FeatureFile(extract_demo_features(gallery)) as ff:
        rows = [ff.video(v.id).features for v in gallery.videos]
        cap_tokens = [ff.caption(caption_id(c, gallery))[1] for c in gallery.captions]
    ids = [v.id for v in gallery.videos]
    relevant = np.array([[vid in c.relevant for vid in ids] for c in gallery.captions])
    t0 = time.perf_counter()
    cal = Calibrator.for_model(model, encoder, cache_dir=None, cfg=cfg)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    nulls = cal.nulls_for_rows(rows)
    null_ms = (time.perf_counter() - t0) * 1000 / len(rows)
    videos = model.encode_videos(rows)

    def scores(texts_or_tokens: list) -> np.ndarray:
        tokens = encoder.encode(texts_or_tokens) if isinstance(texts_or_tokens[0], str) else texts_or_tokens
        return model.score(model.encode_queries(tokens), videos).total.numpy()

    s_cap, s_off, s_non = scores(cap_tokens), scores(OFF_TOPIC), scores(NONSENSE)
    new = {k: label_matrix(cal, s, nulls) for k, s in (("cap", s_cap), ("off", s_off), ("non", s_non))}
    old = {k: old_rule_labels(s) for k, s in (("cap", s_cap), ("off", s_off), ("non", s_non))}

    extra = unrelated_rows(rows, 10)
    grown_rows = rows + extra
    grown = model.encode_videos(grown_rows)
    grown_nulls = cal.nulls_for_rows(grown_rows)
    s_all = np.concatenate([s_cap, s_off, s_non])
    q_all = model.encode_queries(cap_tokens + encoder.encode(OFF_TOPIC) + encoder.encode(NONSENSE))
    s_grown = model.score(q_all, grown).total.numpy()
    before = label_matrix(cal, s_all, nulls)
    after = label_matrix(cal, s_grown, grown_nulls)[:, : len(rows)]
    old_after = old_rule_labels(s_grown)[:, : len(rows)]
    old_before = old_rule_labels(s_all)

    hits = (s_cap[0, :8], nulls[:8])  # a 10-hit search labels 10 pairs; time 10 with the demo's 8 + 2
    hit_scores, hit_nulls = list(hits[0]) + list(hits[0][:2]), list(hits[1]) + list(hits[1][:2])
    t0 = time.perf_counter()
    for _ in range(1000):
        cal.no_strong_match(cal.labels(hit_scores, hit_nulls))
    label_ms = (time.perf_counter() - t0) / 1000 * 1000
    return {
        "model": model.describe()["name"], "config": cfg.__dict__, "reference_captions": len(cal.references),
        "gallery": {"videos": len(ids), "captions": len(gallery.captions)},
        "calibrated": rates(new["cap"], relevant, new["off"], new["non"]),
        "gallery_relative_before": rates(old["cap"], relevant, old["off"], old["non"]),
        "stable_when_gallery_grows": round(float((before == after).mean()), 4),
        "gallery_relative_stable_when_gallery_grows": round(float((old_before == old_after).mean()), 4),
        "fit_s_uncached": round(fit_s, 2), "null_ms_per_video": round(null_ms, 2),
        "ms_per_search_10_hits": round(label_ms, 4),
        "torch_threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> None:
    """Print (and optionally write) the JSON report; ``--sweep`` adds the neighbouring cut choices."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--sweep", action="store_true", help="also report medium 0.7/0.9 and high 0.99")
    args = parser.parse_args(argv)
    report = run()
    if args.sweep:
        report["sweep"] = {f"medium={m},high={h}": run(ConfidenceConfig(m, h))["calibrated"]
                           for m, h in ((0.7, 1.0), (0.9, 1.0), (0.8, 0.99))}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
