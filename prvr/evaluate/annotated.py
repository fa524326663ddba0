"""Annotated video sets (videos + queries with their moments) and their evaluation: retrieval and moments.

One implementation for every annotated set: the demo gallery (``prvr.evaluate.demo.annotated_set``) and any
folder of videos with a moments file (``load_moments_file``), both evaluated by ``evaluate_set``.

Moments file (JSON), for ``python -m prvr.evaluate --videos DIR --moments FILE.json``::

    {"videos": [{"file": "mix01.mp4",
                 "queries": [{"text": "a man arm-wrestles at a table", "start": 12.0, "end": 21.5}, ...]},
                ...]}

``file`` is a video in DIR; ``start`` < ``end`` in seconds; optional ``clip`` (the source clip: intervals then
resample whole clips), ``kind`` and ``source`` (where the answer is: subtitles, speech, screen) are kept.
Every video file in DIR is in the gallery (unlisted ones: distractors); the same text under several videos
(or twice) is one query with several relevant videos (or moments).

Protocol (``evaluate_set``): what users get. The videos are indexed as the app indexes uploads (with the
reference caption bank) and each query goes through ``prvr.results.search.search`` with k = all videos, at the
model's weights (``two_branch``), (1, 0) (``clip``) and (0, 1) (``frame``). A query's rank is its first-ranked
relevant video's (1-based; ties in index order): R@1/5/10, SumR. Localisation on that video against the
query's moments (best IoU): IoU >= 0.3/0.5/0.7, mean IoU and centre inside, for ``key_moment``, ``key_clip``
and a uniformly random MS-SL proposal (its exact expectation). ``ci`` repeats every number as
``{value, low, high}``: a 95 % percentile bootstrap (``prvr.evaluate.bootstrap``), per query or per clip.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from extract.decode import sha256_file
from extract.features import FeatureFile, FeatureWriter
from extract.pipeline import TextEncoder, VideoExtractor, as_resolved
from extract.profiles import Profile, check_identity, get_profile
from extract.words.segment import SOURCES, WordSegment
from prvr.evaluate.bootstrap import N_RESAMPLES, intervals, paired_bootstrap
from prvr.index import GalleryVideo, IndexConfig, VideoIndex
from prvr.models.factory import create_model
from prvr.models.preprocess import clip_unit_rows, n_proposals, proposal_units
from prvr.paths import cache_dir
from prvr.results.confidence import Calibrator
from prvr.results.query import clean_query
from prvr.results.search import search

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
    clip: str | None = None  # the source clip the query describes, if the moments file says (bootstrap unit)
    kind: str | None = None  # e.g. "clip" or "event", if the moments file says
    source: str | None = None  # where the answer is: "subtitles", "speech" or "screen" (the words set)


@dataclass(frozen=True)
class AnnotatedSet:
    videos: tuple[tuple[str, Path], ...]  # (id, file), the gallery in order
    queries: tuple[Query, ...]
    features: Path  # feature cache (HDF5, prvr-features) of the videos and the query texts
    profile: str | Profile = "lite"  # the feature profile the cache holds: a name, or a resolved profile
    weights: dict[str, str] | None = None  # --weights of a named profile's backbones (None: its defaults)


def load_moments_file(videos_dir: str | Path, moments_file: str | Path, features: Path | None = None,
                      profile: str | Profile = "lite", weights: dict[str, str] | None = None) -> AnnotatedSet:
    """Read a moments file (module docstring) over the videos in ``videos_dir``; errors name the bad entry.

    ``profile`` / ``weights``: the features to evaluate on (default: the offline ``lite``; a resolved profile,
    ``LoadedModel.profile``, takes no weights); each profile and weights identity has its own feature cache
    in ``videos_dir``."""
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
    names, spans, extra = {p.name for p in files}, {}, {}  # text -> {file: [(start, end), ...]}; clip, kind
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
            extra.setdefault(text, tuple(None if q.get(f) is None else str(q[f])
                                         for f in ("clip", "kind", "source")))
    if not spans:
        raise ValueError(f"{moments_file}: no queries")
    queries = [Query(f"q{k:05d}", text, {vid: tuple(m) for vid, m in per_video.items()}, *extra[text])
               for k, (text, per_video) in enumerate(spans.items())]
    cache = features or videos_dir / feature_cache_name(profile, weights)
    return AnnotatedSet(tuple((p.name, p) for p in files), tuple(queries), cache, profile, weights)


def feature_cache_name(profile: str | Profile, weights: dict[str, str] | None = None) -> str:
    """The set's feature cache file for a profile and its weights (a profile on its default weights keeps the
    name it always had)."""
    resolved = as_resolved(profile, weights)
    named = resolved.identity()["weights"]
    if named == dict(get_profile(resolved.name).weights):
        return f".prvr-features-{resolved.name}.h5"
    digest = hashlib.sha256(json.dumps(named, sort_keys=True).encode()).hexdigest()[:12]
    return f".prvr-features-{resolved.name}-{digest}.h5"


def extract_features(aset: AnnotatedSet, profile: str | Profile | None = None) -> Path:
    """Write the set's video and query features into its cache file; only new or changed items run."""
    profile = as_resolved(profile or aset.profile, aset.weights)  # once, for the extractor and the encoder
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
            log.info("extracting %s features of %s", profile.name, p.name)
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
    return {name: float(np.mean(v)) for name, v in _random_recall_values(n_videos, n_relevant).items()}


def _recall_values(ranks: np.ndarray) -> dict[str, np.ndarray]:
    """Per-query values (percent) whose means are ``recall_metrics``."""
    out = {f"R@{k}": 100.0 * (np.asarray(ranks) <= k) for k in RECALLS}
    out["SumR"] = sum(out.values())
    return out


def _random_recall_values(n_videos: int, n_relevant: np.ndarray) -> dict[str, np.ndarray]:
    """Per-query expected R@k (percent) under a random ranking, whose means are ``random_recalls``."""
    out = {f"R@{k}": 100.0 * np.array([1 - math.comb(n_videos - r, k) / math.comb(n_videos, k)
                                        if k <= n_videos else 1.0 for r in n_relevant]) for k in RECALLS}
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


def reference_bank(model, profile: str | Profile = "lite", weights: dict[str, str] | None = None):
    """The app's reference caption bank (``prvr.results.confidence``) encoded by ``model`` for an index: its
    ``ReferenceQueries`` (caption tokens by ``profile``'s text encoder, cached as the app caches them)."""
    calibrator = Calibrator.for_model(model, TextEncoder(profile, weights), cache_dir=cache_dir("confidence"))
    return calibrator.reference_queries


def evaluate_set(aset: AnnotatedSet, model=None, references=None,
                 words: Mapping[str, Sequence[WordSegment]] | None = None, text_encoder=None) -> dict:
    """Retrieval and localisation metrics of ``model`` (default: the model factory's for the set's profile) on
    an annotated set, measured through the search path (module docstring); ``references``: the index's
    ``ReferenceQueries`` (default: ``reference_bank(model)``, as the app).

    ``words`` (video id -> its word segments, as an upload reads them): the same videos are indexed a second
    time with their words (``Gallery.add(..., text_encoder)``; default encoder: the set's profile's) and
    searched with each query's cleaned text beside its features (the words' lexical match, as
    ``search_text``): the ``words`` row (the model's weights), its paired difference with ``two_branch``
    and the queries whose rank moved, with the lines their first hit matched (``report["words"]``)."""
    if model is None:
        model = create_model(aset.profile, aset.weights).model
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
    metrics, judged, values = {}, {}, {}  # values: per-query numbers whose means are the metrics
    with tempfile.TemporaryDirectory(prefix="prvr-evaluate-") as tmp:
        bank = references if references is not None else reference_bank(model, aset.profile, aset.weights)
        index = VideoIndex.create(Path(tmp) / "index", model, IndexConfig(), bank)
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
            values[name] = {**_recall_values(np.array(ranks)),
                            **_summary_values(judged[name]["key_moment"], "key_moment"),
                            **_summary_values(judged[name]["key_clip"], "key_clip")}
        if words is not None:
            moved = _words_row(aset, index, bank, rows, tokens, words, text_encoder, Path(tmp), ids, metrics,
                               values)
    # the random row: a random ranking, and a random proposal on a random relevant video (expectations)
    chance = [[_judge(spans[j], q.moments[vid]) for j, vid in enumerate(ids) if vid in q.moments]
              for q in aset.queries]
    pooled = [(np.concatenate([iou for iou, _ in c]), np.concatenate([ins for _, ins in c])) for c in chance]
    metrics["random"] = {**random_recalls(len(ids), relevant.sum(axis=1)), **_summary(pooled, "key_moment")}
    values["random"] = {**_random_recall_values(len(ids), relevant.sum(axis=1)),
                        **_summary_values(pooled, "key_moment")}
    localisation = {kind: _localisation(v) for kind, v in judged["two_branch"].items()}
    ci = confidence_intervals(aset.queries, values,
                              {kind: _localisation_values(v) for kind, v in judged["two_branch"].items()})
    for part, table in (("metrics", metrics), ("localisation", localisation)):
        for row, numbers in table.items():
            for name, value in numbers.items():
                ci[part][row][name]["value"] = value  # the reported number itself (equal up to rounding)
    report = {"videos": len(ids), "queries": len(aset.queries),
              "relevant_per_query": float(relevant.sum(axis=1).mean()), "metrics": metrics,
              "localisation": localisation, "ci": ci}
    if words is not None:
        groups = [q.clip for q in aset.queries]
        paired = paired_bootstrap({"ranks": moved.pop("ranks_pictures")}, {"ranks": moved.pop("ranks_words")},
                                  groups if all(g is not None for g in groups) else None)
        report["words"] = {**moved, "paired_words_minus_pictures": {k: paired[k] for k in ("R@1", "R@5")}}
    return report


def _words_row(aset: AnnotatedSet, plain: VideoIndex, bank, rows: list, tokens: list,
               words: Mapping[str, Sequence], text_encoder, tmp: Path, ids: list[str], metrics: dict,
               values: dict) -> dict:
    """``evaluate_set``'s ``words`` row (added to ``metrics`` and ``values``): the videos indexed with their
    words, each query searched with its cleaned text; the queries whose first relevant rank moved against
    the pictures-only gallery ``plain`` (the two_branch row's), each with the lines its first hits matched."""
    encode = text_encoder or TextEncoder(aset.profile, aset.weights).encode
    index = VideoIndex.create(tmp / "words", plain.model, IndexConfig(), bank)
    index.add([GalleryVideo.from_features(vid, r, words=words.get(vid, ())) for vid, r in zip(ids, rows,
                                                                                             strict=True)],
              text_encoder=encode)
    ranks, before, found, moved = [], [], [], []
    for q, t in zip(aset.queries, tokens, strict=True):
        text = clean_query(q.text).text  # what search_text hands the galleries
        base = search([plain], t, k=len(ids), text=text).results
        results = search([index], t, k=len(ids), text=text).results
        rank = next(r for r, res in enumerate(results, 1) if res["video_id"] in q.moments)
        was = next(r for r, res in enumerate(base, 1) if res["video_id"] in q.moments)
        ranks.append(rank)
        before.append(was)
        found.append(results[rank - 1])
        if rank != was:
            moved.append({"query": q.text, "clip": q.clip, "rank_pictures": was, "rank_words": rank,
                          "first": results[0]["video_id"], "first_words": results[0].get("words", []),
                          "relevant_words": results[rank - 1].get("words", [])})
    judged = [_judge(_span(res["key_moment"]), q.moments[res["video_id"]])
              for q, res in zip(aset.queries, found, strict=True)]
    metrics["words"] = {**recall_metrics(np.array(ranks)), **_summary(judged, "key_moment")}
    values["words"] = {**_recall_values(np.array(ranks)), **_summary_values(judged, "key_moment")}
    index.close()
    return {"segments": {src: sum(1 for segs in words.values() for s in segs if s.source == src)
                         for src in SOURCES},
            "videos_with_words": sum(1 for vid in ids if words.get(vid)), "moved": moved,
            "ranks_pictures": np.array(before), "ranks_words": np.array(ranks)}


def confidence_intervals(queries: Sequence[Query], metric_values: dict, localisation_values: dict) -> dict:
    """``evaluate_set``'s ``ci``: {value, low, high} of every number, from per-query values, resampled per
    clip when every query names one (else per query), with one draw for all numbers."""
    clips = [q.clip for q in queries]
    groups = clips if all(c is not None for c in clips) else None
    flat = {(part, row, name): v for part, table in (("metrics", metric_values),
                                                     ("localisation", localisation_values))
            for row, numbers in table.items() for name, v in numbers.items()}
    got = intervals({"\t".join(key): v for key, v in flat.items()}, groups)
    out: dict = {"unit": "clip" if groups is not None else "query", "resamples": N_RESAMPLES, "level": 0.95,
                 "metrics": {}, "localisation": {}}
    for (part, row, name) in flat:
        out[part].setdefault(row, {})[name] = got["\t".join((part, row, name))]
    return out


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


def _summary_values(judged: list, name: str) -> dict[str, np.ndarray]:
    """Per-query values (percent) whose means are ``_summary``."""
    return {f"{name}_acc": np.array([100.0 * np.mean(iou >= IOU_HIT) for iou, _ in judged]),
            f"{name}_inside": np.array([100.0 * np.mean(inside) for _, inside in judged])}


def _localisation_values(pairs: list) -> dict[str, np.ndarray]:
    """Per-query values whose means are ``_localisation``."""
    out = {f"iou>={t}": np.array([100.0 * np.mean(np.asarray(iou) >= t) for iou, _ in pairs])
           for t in IOU_LEVELS}
    out["mean_iou"] = np.array([np.mean(iou) for iou, _ in pairs])
    out["centre_inside"] = np.array([100.0 * np.mean(inside) for _, inside in pairs])
    return out


def _localisation(pairs: list) -> dict[str, float]:
    """IoU >= each level (%), mean IoU, centre inside (%) of per-query (iou, inside) arrays (query means)."""
    out = {f"iou>={t}": 100.0 * float(np.mean([np.mean(np.asarray(iou) >= t) for iou, _ in pairs]))
           for t in IOU_LEVELS}
    out["mean_iou"] = float(np.mean([np.mean(iou) for iou, _ in pairs]))
    out["centre_inside"] = 100.0 * float(np.mean([np.mean(inside) for _, inside in pairs]))
    return out


def format_report(report: dict) -> str:
    """A readable table of ``evaluate_set``'s report: retrieval rows, then localisation rows; each number
    with its 95 % bootstrap interval below it when the report has ``ci``."""
    ci = report.get("ci")
    lines = [f"{report['queries']} queries, {report['videos']} videos"]
    if ci:
        lines[0] += f" (95 % bootstrap intervals over {ci['unit']}s, {ci['resamples']} resamples)"

    def table(part: str, columns: list[str], digits: int) -> None:
        lines.append(f"{'':12s}" + "".join(f"{c:>18s}" for c in columns))
        for name, row in report[part].items():
            lines.append(f"{name:12s}" + "".join(f"{row[c]:18.{digits}f}" if c in row else f"{'-':>18s}"
                                                 for c in columns))
            if ci and name in ci.get(part, {}):
                bounds = ci[part][name]
                cells = [f"[{bounds[c]['low']:.{digits}f}, {bounds[c]['high']:.{digits}f}]"
                         if c in bounds else "" for c in columns]
                lines.append(f"{'':12s}" + "".join(f"{cell:>18s}" for cell in cells))

    table("metrics", [*(f"R@{k}" for k in RECALLS), "SumR", "key_moment_acc", "key_clip_acc"], 1)
    table("localisation", [*(f"iou>={t}" for t in IOU_LEVELS), "mean_iou", "centre_inside"], 2)
    if "words" in report:  # the words row's difference and the queries it moved, with the lines that did it
        w = report["words"]
        lines.append(f"words: {w['videos_with_words']} videos with words, segments {w['segments']}; "
                     "words - pictures: " + ", ".join(
                         f"{k} {d['value']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"
                         for k, d in w["paired_words_minus_pictures"].items()))
        for m in w["moved"]:
            said = "; ".join(f"{x['source']} {x['text']!r}" for x in m["first_words"][:2]) or "-"
            lines.append(f"  rank {m['rank_pictures']} -> {m['rank_words']}: {m['query']!r}; first "
                         f"{m['first']} ({said})")
    return "\n".join(lines)
