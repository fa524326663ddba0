"""Annotated video sets (videos + queries with their moments) and their evaluation: retrieval and moments.

One implementation for every annotated set: the generated demo gallery (``prvr.demo.annotated_set``) and any
folder of videos with a moments file (``load_moments_file``), both evaluated by ``evaluate_set``.

Moments file (JSON), for ``python -m prvr.evaluate --videos DIR --moments FILE.json``::

    {"videos": [{"file": "mix01.mp4",
                 "queries": [{"text": "a man arm-wrestles at a table", "start": 12.0, "end": 21.5}, ...]},
                ...]}

``file`` is a video file name inside DIR; ``start`` < ``end`` are seconds. Every video file in DIR (mp4, avi,
mov, mkv, webm) is in the gallery, listed or not (unlisted ones are distractors). A query is relevant to
the videos it is listed under: the same text under two videos (or twice under one) is one query with
several relevant videos (or moments).

Protocol (``evaluate_set``): what users get. The set's videos are indexed (``prvr.index.VideoIndex`` in a
temporary directory, as the app indexes uploads: with the scores and row statistics of the reference caption
bank, ``prvr.confidence``, which localisation normalises by) and every query goes through
``prvr.search.search`` with k = the number of videos: at the model's weights for the ``two_branch`` row, at
(1, 0) for ``clip`` and at (0, 1) for ``frame``. A query's rank is that of its FIRST-ranked relevant video in
the response (1-based; equal totals in index order); R@k = % of queries with rank <= k; SumR = R@1 + R@5 +
R@10. Localisation is judged on that first-ranked relevant video's result, against the query's annotated
moments in it (best IoU over them): IoU >= 0.3 / 0.5 / 0.7 rates, mean IoU and the rate of predicted centres
inside a moment, for (a) the result's ``key_moment`` (``prvr.moments`` over the stored fine rows and
segments), (b) its ``key_clip`` (MS-SL's raw key clip) and (c) a random window: one of the 528 MS-SL proposals
uniformly at random, reported as its exact expectation (nothing is sampled).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from prvr.preprocess import clip_unit_rows, n_proposals, proposal_units

log = logging.getLogger(__name__)

VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm")
RECALLS = (1, 5, 10)
IOU_LEVELS = (0.3, 0.5, 0.7)
IOU_HIT = 0.5  # key_moment_acc / key_clip_acc: IoU at least this


@dataclass(frozen=True)
class Query:
    id: str
    text: str
    moments: dict[str, tuple[tuple[float, float], ...]]  # relevant video id -> its annotated spans (s)


@dataclass(frozen=True)
class AnnotatedSet:
    videos: tuple[tuple[str, Path], ...]  # (id, file), the gallery in order
    queries: tuple[Query, ...]
    features: Path  # feature cache (HDF5, prvr-features) of the videos and the query texts


def load_moments_file(videos_dir: str | Path, moments_file: str | Path, features: Path | None = None
                      ) -> AnnotatedSet:
    """Read a moments file (module docstring) over the videos in ``videos_dir``; errors name the bad entry."""
    videos_dir, moments_file = Path(videos_dir), Path(moments_file)
    if not videos_dir.is_dir():
        raise FileNotFoundError(f"--videos {videos_dir}: not a directory")
    files = sorted(p for p in videos_dir.iterdir() if p.suffix.lower() in VIDEO_SUFFIXES)
    if not files:
        raise ValueError(f"--videos {videos_dir}: no video files ({', '.join(VIDEO_SUFFIXES)})")
    try:
        spec = json.loads(moments_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--moments {moments_file}: cannot read it as JSON ({e})") from None
    entries = spec.get("videos") if isinstance(spec, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{moments_file}: expected {{\"videos\": [{{\"file\", \"queries\"}}, ...]}}")
    names, spans = {p.name for p in files}, {}  # text -> {file: [(start, end), ...]}
    for entry in entries:
        name = entry.get("file")
        if name not in names:
            raise ValueError(f"{moments_file}: video {name!r} is not a video file in {videos_dir}")
        for n, q in enumerate(entry.get("queries", [])):
            try:
                text, start, end = str(q["text"]).strip(), float(q["start"]), float(q["end"])
            except (KeyError, TypeError, ValueError):
                text, start, end = "", 0.0, 0.0
            if not (0 <= start < end) or not text:
                raise ValueError(f"{moments_file}: {name} query {n} needs text and 0 <= start < end, got {q}")
            spans.setdefault(text, {}).setdefault(name, []).append((start, end))
    if not spans:
        raise ValueError(f"{moments_file}: no queries")
    queries = [Query(f"q{k:05d}", text, {vid: tuple(m) for vid, m in per_video.items()})
               for k, (text, per_video) in enumerate(spans.items())]
    cache = features or videos_dir / ".prvr-features-lite.h5"
    return AnnotatedSet(tuple((p.name, p) for p in files), tuple(queries), cache)


def extract_features(aset: AnnotatedSet, profile: str = "lite") -> Path:
    """Write the set's video and query features into its cache file; only new or changed items run."""
    from extract.decode import sha256_file
    from extract.features import FeatureFile, FeatureWriter
    from extract.pipeline import TextEncoder, VideoExtractor

    path = aset.features
    have_videos, have_captions = {}, {}
    if path.exists():
        with FeatureFile(path) as ff:
            have_videos = {v: ff.video(v).sha256 for v in ff.video_ids()}
            have_captions = {c: ff.caption(c)[0] for c in ff.caption_ids()}
    videos = [(vid, p, sha) for vid, p in aset.videos if have_videos.get(vid) != (sha := sha256_file(p))]
    captions = [(q.id, q.text) for q in aset.queries if have_captions.get(q.id) != q.text]
    if not videos and not captions:
        return path
    extractor = VideoExtractor(profile) if videos else None
    encoder = TextEncoder(profile) if captions else None
    path.parent.mkdir(parents=True, exist_ok=True)
    with FeatureWriter(path, (extractor or encoder).profile) as writer:
        for vid, p, sha in videos:
            log.info("extracting %s features of %s", profile, p.name)
            writer.add_video(vid, extractor.extract(p, sha256=sha))
        if encoder is not None:
            for (cid, text), rows in zip(captions, encoder.encode([t for _, t in captions]), strict=True):
                writer.add_caption(cid, text, rows)
    return path


# --------------------------------------------------------------------------------------------- metrics


def first_relevant_ranks(scores: np.ndarray, relevant: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per query: 1-based rank of its best-ranked relevant video, and that video's index (official order)."""
    order = np.argsort(-scores, axis=1)  # numpy's default sort, as the official evaluation
    position = np.take_along_axis(relevant, order, axis=1).argmax(axis=1)
    return position + 1, order[np.arange(len(order)), position]


def recall_metrics(ranks: np.ndarray, ks: Sequence[int] = RECALLS) -> dict[str, float]:
    """R@k (percent) for each k and their sum."""
    out = {f"R@{k}": 100.0 * float(np.mean(ranks <= k)) for k in ks}
    out["SumR"] = sum(out.values())
    return out


def random_recalls(n_videos: int, n_relevant: np.ndarray) -> dict[str, float]:
    """Expected R@k under a uniformly random ranking: 1 - C(N - r, k) / C(N, k), averaged over queries."""
    import math

    out = {f"R@{k}": 100.0 * float(np.mean([1 - math.comb(n_videos - r, k) / math.comb(n_videos, k)
                                             if k <= n_videos else 1.0 for r in n_relevant]))
           for k in RECALLS}
    out["SumR"] = sum(out.values())
    return out


def span_iou(spans: np.ndarray, moments: Sequence[tuple[float, float]]) -> np.ndarray:
    """(P,) best temporal IoU of each (P, 2) span with any of the moments."""
    a = np.asarray(spans, np.float64).reshape(-1, 2)[:, None]  # (P, 1, 2)
    m = np.asarray(moments, np.float64).reshape(-1, 2)[None]  # (1, M, 2)
    inter = np.clip(np.minimum(a[..., 1], m[..., 1]) - np.maximum(a[..., 0], m[..., 0]), 0, None)
    union = np.maximum(a[..., 1], m[..., 1]) - np.minimum(a[..., 0], m[..., 0])
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0).max(axis=1)


def centre_inside(spans: np.ndarray, moments: Sequence[tuple[float, float]]) -> np.ndarray:
    """(P,) whether each span's midpoint lies inside one of the moments."""
    mid = np.asarray(spans, np.float64).reshape(-1, 2).mean(axis=1)
    m = np.asarray(moments, np.float64).reshape(-1, 2)
    return ((m[None, :, 0] <= mid[:, None]) & (mid[:, None] <= m[None, :, 1])).any(axis=1)


def proposal_spans(start: np.ndarray, end: np.ndarray, map_size: int = 32) -> np.ndarray:
    """(P, 2) seconds of every MS-SL proposal of a video with rows [start_i, end_i) (official binning)."""
    rows = clip_unit_rows(len(start), map_size).numpy()
    units = np.stack([start[rows[:, 0]], end[rows[:, 1] - 1]], axis=1)
    first, stop = (u.numpy() for u in proposal_units(torch.arange(n_proposals(map_size)), map_size))
    return np.stack([units[first, 0], units[stop - 1, 1]], axis=1)


# ---------------------------------------------------------------------------------------------- scoring


def reference_bank(model, profile: str = "lite"):
    """The app's reference caption bank (``prvr.confidence``) encoded by ``model`` for an index: its
    ``ReferenceQueries`` (caption tokens by ``profile``'s text encoder, cached as the app caches them)."""
    from extract.pipeline import TextEncoder
    from prvr.confidence import Calibrator
    from prvr.paths import cache_dir

    calibrator = Calibrator.for_model(model, TextEncoder(profile), cache_dir=cache_dir("confidence"))
    return calibrator.reference_queries


def evaluate_set(aset: AnnotatedSet, model=None, references=None) -> dict:
    """Retrieval and localisation metrics of ``model`` (default: the bridge) on an annotated set, measured
    through the search path (module docstring); ``references``: the index's ``ReferenceQueries`` (default:
    ``reference_bank(model)``, as the app)."""
    from extract.features import FeatureFile
    from extract.profiles import check_identity
    from prvr.index import GalleryVideo, IndexConfig, VideoIndex
    from prvr.search import search

    if model is None:
        from prvr.bridge import BridgeModel

        model = BridgeModel.from_pretrained()
    path = extract_features(aset)
    ids = [vid for vid, _ in aset.videos]
    with FeatureFile(path) as ff:
        if model.profile is not None:
            check_identity(model.profile, ff.profile, f"feature file {path}")
        rows = [ff.video(vid) for vid in ids]
        tokens = [ff.caption(q.id)[1] for q in aset.queries]
    relevant = np.array([[vid in q.moments for vid in ids] for q in aset.queries])
    spans = [proposal_spans(r.start, r.end, model.cfg.map_size) for r in rows]
    rows_weights = {"two_branch": None, "clip": (1.0, 0.0), "frame": (0.0, 1.0)}
    metrics, judged = {}, {}
    with tempfile.TemporaryDirectory(prefix="prvr-evaluate-") as tmp:
        index = VideoIndex.create(Path(tmp) / "index", model, IndexConfig(),
                                  references if references is not None else reference_bank(model))
        index.add([GalleryVideo.from_features(vid, r) for vid, r in zip(ids, rows, strict=True)])
        for name, weights in rows_weights.items():
            ranks, found = [], []
            for q, t in zip(aset.queries, tokens, strict=True):
                results = search([index], t, k=len(ids), weights=weights).results
                rank = next(r for r, res in enumerate(results, 1) if res["video_id"] in q.moments)
                ranks.append(rank)
                found.append(results[rank - 1])
            truth = [q.moments[res["video_id"]] for q, res in zip(aset.queries, found, strict=True)]
            predicted = {"key_moment": [_span(res["key_moment"]) for res in found],
                         "key_clip": [_span(res["key_clip"]) for res in found],
                         "random": [spans[ids.index(res["video_id"])] for res in found]}  # exact expectation
            judged[name] = {kind: [_judge(p, t) for p, t in zip(spans_, truth, strict=True)]
                            for kind, spans_ in predicted.items()}
            metrics[name] = {**recall_metrics(np.array(ranks)),
                             **_summary(judged[name]["key_moment"], "key_moment"),
                             **_summary(judged[name]["key_clip"], "key_clip")}
    # the random row: a random ranking, and a random proposal on a random relevant video (expectations)
    chance = [[_judge(spans[j], q.moments[vid]) for j, vid in enumerate(ids) if vid in q.moments]
              for q in aset.queries]
    pooled = [(np.concatenate([iou for iou, _ in c]), np.concatenate([ins for _, ins in c])) for c in chance]
    metrics["random"] = {**random_recalls(len(ids), relevant.sum(axis=1)), **_summary(pooled, "key_moment")}
    return {"videos": len(ids), "queries": len(aset.queries),
            "relevant_per_query": float(relevant.sum(axis=1).mean()), "metrics": metrics,
            "localisation": {kind: _localisation(v) for kind, v in judged["two_branch"].items()}}


def _span(moment: dict) -> np.ndarray:
    """[start, end] seconds of a moment dict."""
    return np.array([moment["start"], moment["end"]])


def _judge(spans: np.ndarray, truth: Sequence[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(P,) best IoU with the truth and (P,) centre inside it, for (P, 2) or (2,) predicted spans."""
    return span_iou(spans, truth), centre_inside(spans, truth)


def _summary(judged: list, name: str) -> dict[str, float]:
    """{name_acc: % IoU >= IOU_HIT, name_inside: % centre inside}; per query, the mean over its spans."""
    return {f"{name}_acc": 100.0 * float(np.mean([np.mean(iou >= IOU_HIT) for iou, _ in judged])),
            f"{name}_inside": 100.0 * float(np.mean([np.mean(inside) for _, inside in judged]))}


def _localisation(pairs: list) -> dict[str, float]:
    """IoU >= each level (%), mean IoU, centre inside (%) of per-query (iou, inside) arrays (query means)."""
    out = {f"iou>={t}": 100.0 * float(np.mean([np.mean(np.asarray(iou) >= t) for iou, _ in pairs]))
           for t in IOU_LEVELS}
    out["mean_iou"] = float(np.mean([np.mean(iou) for iou, _ in pairs]))
    out["centre_inside"] = 100.0 * float(np.mean([np.mean(inside) for _, inside in pairs]))
    return out


def format_report(report: dict) -> str:
    """A readable table of ``evaluate_set``'s report: retrieval rows, then localisation rows."""
    lines = [f"{report['queries']} queries, {report['videos']} videos"]
    columns = [*(f"R@{k}" for k in RECALLS), "SumR", "key_moment_acc", "key_clip_acc"]
    lines.append(f"{'':12s}" + "".join(f"{c:>16s}" for c in columns))
    for name, row in report["metrics"].items():
        lines.append(f"{name:12s}" + "".join(f"{row[c]:16.1f}" if c in row else f"{'-':>16s}"
                                             for c in columns))
    columns = [*(f"iou>={t}" for t in IOU_LEVELS), "mean_iou", "centre_inside"]
    lines.append(f"{'':12s}" + "".join(f"{c:>16s}" for c in columns))
    for name, row in report["localisation"].items():
        lines.append(f"{name:12s}" + "".join(f"{row[c]:16.2f}" for c in columns))
    return "\n".join(lines)
