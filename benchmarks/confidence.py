"""How trustworthy the confidence labels are on the demo gallery (prvr/results/confidence.py), as one JSON
object.

    python -m benchmarks.confidence [--out FILE] [--sweep]

Measured on the path users get: the demo gallery is indexed (``prvr.index.VideoIndex`` in a temporary
directory, with the calibrator's reference bank, as the app indexes it) and every query goes through
``prvr.results.search.search`` with k = the number of videos and ``CalibratedConfidence``; a (query, video)
label is the label of that video's hit in the response. Queries: the gallery's 34 captions (positives: their
relevant videos), 32 off-topic queries written for this benchmark (nothing in the gallery shows them) and 12
nonsense / emoji-only strings. Reported, at the model's weights and (``by_clip_weight``) at other weights
of the app's slider:
- ``labels`` (session 13's measures, ``label_measures``; the issue's targets in brackets), over the top
  ``TOP`` = 10 hits of each response: ``strong_precision`` (of the hits labelled strong, the fraction
  relevant; >= 0.90), ``strong_recall`` (of the captions whose rank-1 hit is relevant, the fraction whose
  rank-1 hit is strong; >= 0.40), ``possible_precision`` (of the hits labelled possible, the fraction
  relevant; >= 0.60; None when no hit is labelled possible), ``off_topic_strong`` / ``off_topic_possible``
  (of the off-topic and nonsense queries, the fraction with a strong / possible hit in the top 10; 0 and
  <= 0.10), and ``a_label``: the best label the one-letter query "a" gets (never "medium");
- ``high``: precision and recall of "high" (= "strong match") over caption x video pairs (all pairs);
- ``captions_high_or_medium``: the share of captions whose best relevant video is labelled high or medium
  (and the share of all relevant pairs);
- ``off_topic_high`` / ``nonsense_high``: queries labelled high on any video (target 0);
- ``stable_when_gallery_grows``: every demo label again after 10 unrelated videos join the index (1.0);
- ``ms_per_search_10_hits``: the labelling cost of one 10-hit response (``assess``; the best of 5 rounds).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from prvr.index import Evidence, GalleryVideo, IndexConfig, VideoIndex
from prvr.results.confidence import CalibratedConfidence, Calibrator, ConfidenceConfig
from prvr.results.search import encode_query, search

CLIP_WEIGHTS = (0.0, 0.3, 0.5, 0.7, 1.0)  # the app's slider: 0.7 is MS-SL's default
TOP = 10  # label_measures: the hits of a response a person reads

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


def unrelated_videos(like: list[np.ndarray], n: int, seed: int = 0) -> list[GalleryVideo]:
    """``n`` videos of random non-negative rows with the demo rows' scale (pooled ReLU features)."""
    gen = np.random.default_rng(seed)
    scale = float(np.mean([r.mean() for r in like]))
    out = []
    for i in range(n):
        rows = np.abs(gen.normal(0, scale * 1.25, (int(gen.integers(20, 90)), like[0].shape[1])))
        t = np.arange(len(rows), dtype=np.float64)
        out.append(GalleryVideo(f"unrelated{i}", rows.astype(np.float32), t, t + 1, float(len(rows))))
    return out


def label_matrix(index: VideoIndex, ids: list[str], tokens: list[np.ndarray], weights: tuple[float, float],
                 confidence: CalibratedConfidence, with_ranks: bool = False):
    """(Nq, len(ids)) labels: each query searched over the whole index, each video's label in the response
    (and, ``with_ranks``, (Nq, len(ids)) 1-based ranks of the videos in it)."""
    out, ranks = [], []
    for t in tokens:
        response = search([index], t, k=len(index), weights=weights, confidence=confidence)
        got = {r["video_id"]: r["confidence"] for r in response.results}
        rank = {r["video_id"]: i for i, r in enumerate(response.results, 1)}
        out.append([got[v] for v in ids])
        ranks.append([rank[v] for v in ids])
    return (np.array(out), np.array(ranks)) if with_ranks else np.array(out)


def label_measures(labels: np.ndarray, ranks: np.ndarray, relevant: np.ndarray, top: int = TOP) -> dict:
    """Session 13's label measures (module docstring) of (Nq, Nv) labels and 1-based ranks of the videos in
    each query's response; ``relevant`` (Nq, Nv) bool (all False for off-topic queries)."""
    shown = ranks <= top
    strong, possible = (labels == "high") & shown, (labels == "medium") & shown
    first = ranks == 1
    rank1_relevant = (first & relevant).any(axis=1)
    rank1_strong = (first & (labels == "high")).any(axis=1)
    ratio = lambda a, b: round(float(a) / float(b), 3) if b else None  # noqa: E731
    return {"strong_precision": ratio((strong & relevant).sum(), strong.sum()),
            "strong_recall": ratio((rank1_relevant & rank1_strong).sum(), rank1_relevant.sum()),
            "possible_precision": ratio((possible & relevant).sum(), possible.sum()),
            "strong_hits": int(strong.sum()), "possible_hits": int(possible.sum()),
            "queries_with_strong": ratio(strong.any(axis=1).sum(), len(labels)),
            "queries_with_possible": ratio(possible.any(axis=1).sum(), len(labels)),
            "queries": len(labels)}


def rates(labels: np.ndarray, relevant: np.ndarray, off: np.ndarray, non: np.ndarray,
          ranks: dict[str, np.ndarray] | None = None) -> dict:
    """The benchmark's rates for one labelling (captions x videos, off-topic, nonsense); with ``ranks``
    ({"cap", "off", "non"}: each video's rank in each response) also ``label_measures``."""
    high, strong_or_med = labels == "high", labels != "low"
    tp, n_high = int((high & relevant).sum()), int(high.sum())
    extra = {}
    if ranks is not None:
        caps = label_measures(labels, ranks["cap"], relevant)
        stray = label_measures(np.concatenate([off, non]), np.concatenate([ranks["off"], ranks["non"]]),
                               np.zeros((len(off) + len(non), off.shape[1]), bool))
        a = NONSENSE.index("a")
        order = ("high", "medium", "low")
        extra = {"labels": {**caps, "off_topic_strong": stray["queries_with_strong"],
                            "off_topic_possible": stray["queries_with_possible"],
                            "a_label": min(non[a], key=order.index)}}
    return {**extra,
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


def run(cfg: ConfidenceConfig | None = None, clip_weights: tuple[float, ...] = CLIP_WEIGHTS) -> dict:
    """Index the demo gallery with the default model's calibrator (``cfg``: other cuts; None: the model's
    calibration, shipped in assets/calibrations) and measure the labels through search."""
    from extract.features import FeatureFile
    from prvr.demo.gallery import build_demo_gallery
    from prvr.evaluate.demo import caption_id, extract_demo_features
    from prvr.models.factory import create_model

    loaded = create_model("lite")
    gallery, model, encoder = build_demo_gallery(), loaded.model, loaded.text_encoder()
    with FeatureFile(extract_demo_features(gallery)) as ff:
        videos = [GalleryVideo.from_features(v.id, ff.video(v.id)) for v in gallery.videos]
        cap_tokens = [ff.caption(caption_id(c, gallery))[1] for c in gallery.captions]
    ids = [v.id for v in videos]
    relevant = np.array([[vid in c.relevant for vid in ids] for c in gallery.captions])
    t0 = time.perf_counter()
    cal = Calibrator.for_model(model, encoder, cache_dir=None, cfg=cfg)  # None: the model's calibration
    cfg = cal.cfg
    fit_s = time.perf_counter() - t0
    confidence = cal.confidence()
    queries = {"cap": cap_tokens, "off": encoder.encode(OFF_TOPIC), "non": encoder.encode(NONSENSE)}
    default = (model.cfg.clip_scale_w, model.cfg.frame_scale_w)
    with tempfile.TemporaryDirectory(prefix="prvr-confidence-") as tmp:
        index = VideoIndex.create(Path(tmp) / "index", model, IndexConfig(), cal.reference_queries)
        t0 = time.perf_counter()
        index.add(videos)
        add_ms = (time.perf_counter() - t0) * 1000 / len(videos)

        def labelled(weights: tuple[float, float]) -> dict[str, np.ndarray]:
            return {k: label_matrix(index, ids, q, weights, confidence) for k, q in queries.items()}

        at = {w: labelled((w, 1.0 - w)) for w in clip_weights}
        new = labelled(default)
        ranked = {k: label_matrix(index, ids, q, default, confidence, with_ranks=True)[1]
                  for k, q in queries.items()}
        index.add(unrelated_videos([v.features for v in videos], 10))
        grown = labelled(default)
        hits = index.rank(encode_query(model, cap_tokens[0]), k=len(index))
        ten = Evidence(hits.hits[:8] + hits.hits[:2], hits.weights, 10, 10, hits.map_size, hits.max_ctx_l)
        label_ms = float("inf")
        for _ in range(5):  # the best of 5 rounds of 200: the cost itself, not another process's turn
            t0 = time.perf_counter()
            for _ in range(200):
                confidence.assess(None, ten)
            label_ms = min(label_ms, (time.perf_counter() - t0) / 200 * 1000)
        ref_bytes = sum(seg[k].nbytes for seg in index.snapshot.segments for k in ("ref_clip", "ref_frame"))
    stable = np.mean([(new[k] == grown[k]).mean() for k in new])
    return {
        "model": model.describe()["name"], "config": cfg.__dict__, "reference_captions": len(cal.references),
        "gallery": {"videos": len(ids), "captions": len(gallery.captions)},
        "path": "VideoIndex (temp) + prvr.results.search.search(k = all videos, CalibratedConfidence)",
        "weights": list(default),
        "calibrated": rates(new["cap"], relevant, new["off"], new["non"], ranked),
        "by_clip_weight": {f"{w:g}": rates(m["cap"], relevant, m["off"], m["non"]) for w, m in at.items()},
        "stable_when_gallery_grows": round(float(stable), 4),
        "fit_s_uncached": round(fit_s, 2), "add_ms_per_video": round(add_ms, 1),
        "reference_bytes_per_video": ref_bytes // (len(ids) + 10),
        "ms_per_search_10_hits": round(label_ms, 4),
        "torch_threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> None:
    """Print (and optionally write) the JSON report; ``--sweep`` adds the neighbouring cut choices."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--sweep", action="store_true",
                        help="also report the pre-session-13 cuts (possible: beats 80 %%, strong: beats all)")
    args = parser.parse_args(argv)
    report = run()
    if args.sweep:
        report["sweep"] = {f"medium={m},high={h},margin={g}":
                           run(ConfidenceConfig(m, h, g, 0.0), ())["calibrated"]
                           for m, h, g in ((0.8, 1.0, 0.0), (1.0, 1.0, 0.05))}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
