"""The words dev set (``prvr.evaluate.words_set``) through the app's ingest and search path: what the words
(subtitles, speech, text on screen) add to finding the video and the moment, and whether "strong match" can
be trusted for them.

    python -m prvr.evaluate --gallery words [--root DIR] [--shared DIR] [--words all|subtitles|off]
                            [--weights speech=DIR_OR_HUB_ID] [--profile P --weights clip=...] [--json]

Protocol (``evaluate_words``): the set is built (or reused) in ``--root`` (default ``~/.cache/prvr/
words_set``). Every video of the folder is read as the app reads an upload: its picture features by the
model factory's profile (``prvr.evaluate.annotated.extract_features``, cached beside the videos) and its
words by ``extract.words.reader.WordsReader`` (``WordsConfig(mode, speech=...)``; a sidecar found by
``find_sidecar``; cached per video and reader in ``.prvr-words-<reader>.json``). Two galleries of the same
videos are searched with the app's search path (``prvr.results.search.search_text``, the model's calibrated
confidence as the app loads it, k = every video): ``words`` (the videos with their words, ``Gallery.add(...,
text_encoder)``) and ``pictures`` (the same videos without words: what search was before words). For each
half (``tune``: decide; ``check``: confirm):

- R@1 and R@5 of the first-ranked relevant video (all queries, and per kind: exact, paraphrase);
- the key moment on that video against the query's spans: IoU >= 0.5 and mean IoU; the share whose key
  moment came from words (``key_moment.from``);
- labels: strong precision (of every "strong match" among the top 10 hits of the half's queries, the share
  on a relevant video; the same for "possible match"), strong recall (of the queries whose first hit is
  right, the share labelled strong), and false strong matches: the share of near-miss queries (a wrong number
  or name: no video is right) and of off-topic queries (``benchmarks/offtopic_queries.txt`` for tuning,
  ``offtopic_queries_check.txt`` for checking) with a strong hit in their top 10.

Every number has a 95 % bootstrap interval (``prvr.evaluate.bootstrap``: 2000 resamples, seed 0): resampling
videos for the set's queries (a video's queries share its words), queries for off-topic ones; ratios
(precision) are resampled as ratios of sums. ``--weights speech=...`` gives the reader that Whisper model
(a folder or a hub id): the first thing to run where hubs reach (README).
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from extract.decode import sha256_file
from extract.features import FeatureFile
from extract.words.reader import WordsConfig, WordsReader
from extract.words.segment import WordSegment
from extract.words.subtitles import find_sidecar
from prvr.evaluate.annotated import AnnotatedSet, extract_features, load_moments_file, span_iou
from prvr.evaluate.bootstrap import intervals, ratio_interval
from prvr.evaluate.words_set import DEFAULT_ROOT, DEFAULT_SHARED, HALVES, RECIPE_PATH, build
from prvr.index import GalleryVideo, IndexConfig, VideoIndex
from prvr.models.factory import create_model
from prvr.paths import cache_dir
from prvr.results.confidence import Calibrator
from prvr.results.query import clean_query
from prvr.results.search import search_text

log = logging.getLogger(__name__)

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
WORDS_CODE = Path(__file__).resolve().parents[2] / "extract" / "words"  # the readers' modules
OFF_TOPIC = {"tune": BENCHMARKS / "offtopic_queries.txt", "check": BENCHMARKS / "offtopic_queries_check.txt"}
TOP = 10  # the hits a person reads: label measures count these
STRONG, POSSIBLE = "high", "medium"  # the machine values of "strong match", "possible match"
VARIANTS = ("words", "pictures")
COMMAND = "python -m prvr.evaluate --gallery words"


class MemoEncoder:
    """A text encoder that encodes each text once (the bench searches the same queries many times: with and
    without words, and for every variant of the constants). Each text is encoded alone, as the app encodes a
    query (a batch pads, which moves the features by float noise)."""

    def __init__(self, encode: Callable[[list[str]], list[np.ndarray]]) -> None:
        self.encode, self.memo = encode, {}

    def prime(self, texts: Sequence[str]) -> None:
        """Encode the texts not seen yet."""
        for text in dict.fromkeys(t for t in texts if t not in self.memo):
            self.memo[text] = self.encode([text])[0]

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        """Token features of each text (what the wrapped encoder gives)."""
        self.prime(texts)
        return [self.memo[t] for t in texts]


def read_queries(path: Path) -> list[str]:
    """One query a line; blank lines and ``#`` comments skipped."""
    return [s for line in path.read_text().splitlines() if (s := line.strip()) and not s.startswith("#")]


# --------------------------------------------------------------------------------------------- the words


def read_words(videos: Sequence[tuple[str, Path]], reader: WordsReader, cache: Path | None = None,
               ) -> dict[str, dict]:
    """Video id -> ``{"segments": [WordSegment], "skipped": [...], "sources": [...], "seconds": s}`` read
    by ``reader`` as an upload is (its sidecar found beside it), cached in ``cache`` per file content and
    reader."""
    stored = json.loads(cache.read_text()) if cache is not None and cache.is_file() else {}
    keys = {}
    for vid, path in videos:
        sidecar = find_sidecar(path)
        keys[vid] = f"{path.name}:{sha256_file(path)}:{sha256_file(sidecar) if sidecar else ''}"
    stored = {k: v for k, v in stored.items() if k in set(keys.values())}  # other versions of the videos go
    out = {}
    for vid, path in videos:
        key, sidecar = keys[vid], find_sidecar(path)
        if key not in stored:
            t0 = time.perf_counter()
            report = reader.read(path, sidecar=sidecar)
            stored[key] = {"segments": [s.to_dict() for s in report.segments],
                           "skipped": list(report.skipped), "sources": list(report.sources),
                           "seconds": time.perf_counter() - t0}
            log.info("words of %s: %d segments from %s in %.1f s%s", path.name, len(report.segments),
                     ", ".join(report.sources) or "no source", stored[key]["seconds"],
                     "".join(f"; skipped: {s}" for s in report.skipped))
            if cache is not None:
                tmp = cache.with_suffix(".tmp")
                tmp.write_text(json.dumps(stored, indent=1))
                tmp.replace(cache)
        entry = stored[key]
        out[vid] = {**entry, "segments": [WordSegment(**s) for s in entry["segments"]]}
    return out


def _letters(text: str) -> str:
    """Case-folded letters and digits only: what reading a line must give back, spacing and punctuation
    aside."""
    return "".join(c for c in text.casefold() if c.isalnum())


def found_written(split: dict, words: dict[str, dict]) -> dict[str, dict[str, int]]:
    """Per source, how many of the composites' written lines (``split.json``'s ``written``: slides,
    overlays, sidecar lines) the reader found: a segment of that source overlapping the element's span whose
    letters hold the line's; {"screen": {"lines": n, "found": k}, "subtitles": {...}}."""
    out: dict[str, dict[str, int]] = {}
    for vid, elements in split["written"].items():
        name = split["videos"][vid]
        for key, element in elements.items():
            start, end = split["spans"][vid][key]
            near = [_letters(s.text) for s in words[name]["segments"]
                    if s.source == element["source"] and s.start < end and s.end > start]
            tally = out.setdefault(element["source"], {"lines": 0, "found": 0})
            for line in element["lines"]:
                tally["lines"] += 1
                tally["found"] += any(_letters(line) in seg for seg in near)
    return out


def words_cache_name(reader: WordsReader) -> str:
    """The set's words cache for one reader configuration (its ``describe()``: mode, models, versions) and
    the words readers' code as it is (a change to how frames are sampled or lines merged reads again)."""
    code = sorted((f.name, hashlib.sha256(f.read_bytes()).hexdigest()) for f in WORDS_CODE.glob("*.py"))
    key = json.dumps([reader.describe(), code], sort_keys=True, default=str)
    return f".prvr-words-{hashlib.sha256(key.encode()).hexdigest()[:12]}.json"


# ------------------------------------------------------------------------------------------------ the bench


@dataclass
class WordsBench:
    """Everything one evaluation searches: the model, its encoder and confidence, the two galleries, the
    halves' queries, near misses and off-topic queries. Built once (``prepare``); ``measure`` runs searches
    only, so variants of search-time constants can be measured on the same bench."""

    root: Path
    model: object
    encoder: Callable[[list[str]], list[np.ndarray]]  # the profile's text encoder: texts -> token features
    confidence: object
    indexes: dict[str, object]  # "words" / "pictures" -> a gallery of every video
    ids: list[str]  # gallery order (file names)
    halves: dict[str, AnnotatedSet]
    near_miss: dict[str, list[dict]]
    off_topic: dict[str, list[str]]
    words: dict[str, dict]  # video id -> read_words entry
    reader: dict  # WordsReader.describe()
    split: dict  # the set's split.json (spans, written lines)
    timings: dict[str, float]
    tmp: tempfile.TemporaryDirectory

    def close(self) -> None:
        """Remove the galleries' temporary folder."""
        for index in self.indexes.values():
            index.close()
        self.tmp.cleanup()


def prepare(root: Path | None = None, shared: Path | None = None, weights: dict[str, str] | None = None,
            words: str = "all", device: str | None = None, profile: str | None = None, seed: int = 0,
            off_topic: dict[str, Path] | None = None, recipe: Path = RECIPE_PATH) -> WordsBench:
    """Build (or reuse) the set, read its pictures and words, index it twice (with and without words);
    ``off_topic``: half -> a file of off-topic queries (default ``OFF_TOPIC``)."""
    root, shared = Path(root or DEFAULT_ROOT), Path(shared or DEFAULT_SHARED)
    weights = dict(weights or {})
    speech = weights.pop("speech", None)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    built = build(shared, root, seed, recipe)
    timings["build_s"] = time.perf_counter() - t0
    loaded = create_model(profile, weights or None, None, device)
    model, encoder = loaded.model, loaded.text_encoder()
    halves = {h: load_moments_file(root, built.moments[h], profile=loaded.profile) for h in HALVES}
    videos = halves["tune"].videos  # every video file of the folder, in order (both halves' gallery)
    t0 = time.perf_counter()
    features = extract_features(AnnotatedSet(videos, (), halves["tune"].features, loaded.profile))
    timings["pictures_s"] = time.perf_counter() - t0
    reader = WordsReader(WordsConfig(mode=words, speech=speech, device=device))
    reader.prepare()  # its models loaded: describe() names them (the words cache's key)
    t0 = time.perf_counter()
    read = read_words(videos, reader, root / words_cache_name(reader))
    timings["words_s"] = time.perf_counter() - t0
    timings["words_read_s"] = sum(w["seconds"] for w in read.values())  # what reading cost (cached or not)
    calibrator = Calibrator.for_model(model, encoder, cache_dir=cache_dir("confidence"))
    ids = [vid for vid, _ in videos]
    with FeatureFile(features) as ff:
        plain = [GalleryVideo.from_features(vid, ff.video(vid), path=str(path)) for vid, path in videos]
    tmp = tempfile.TemporaryDirectory(prefix="prvr-words-")
    t0 = time.perf_counter()
    indexes = {}
    for variant in VARIANTS:
        index = VideoIndex.create(Path(tmp.name) / variant, model, IndexConfig(),
                                  calibrator.reference_queries)
        if variant == "words":
            index.add([replace(v, words=tuple(read[v.id]["segments"])) for v in plain],
                      text_encoder=encoder.encode)
        else:
            index.add(plain)
        indexes[variant] = index
    timings["index_s"] = time.perf_counter() - t0
    near = {h: json.loads(built.moments[h].read_text()).get("near_miss", []) for h in HALVES}
    topics = {h: read_queries(p) for h, p in (off_topic or OFF_TOPIC).items()}
    memo = MemoEncoder(encoder.encode)
    t0 = time.perf_counter()  # every query as search_text will encode it (cleaned)
    memo.prime([clean_query(t).text for t in [*(q.text for a in halves.values() for q in a.queries),
                                              *(m["text"] for v in near.values() for m in v),
                                              *(t for v in topics.values() for t in v)]])
    timings["encode_queries_s"] = time.perf_counter() - t0
    return WordsBench(root, model, memo, calibrator.confidence(), indexes, ids, halves, near,
                      topics, read, reader.describe(), built.split, timings, tmp)


# -------------------------------------------------------------------------------------------- measuring


def _strong(results: Sequence[dict], label: str = STRONG) -> list[bool]:
    """Whether each of the top hits is labelled ``label`` (default: a strong match)."""
    return [r["confidence"] == label for r in results[:TOP]]


def run_queries(bench: WordsBench, half: str, variant: str) -> dict:
    """Per-query arrays of one half on one gallery: ranks, key moment IoU and source, labels; near-miss
    and off-topic strong hits."""
    index = bench.indexes[variant]
    n = len(bench.ids)
    aset = bench.halves[half]
    rows = {k: [] for k in ("rank", "iou", "from_words", "strong_right", "strong_all", "top_strong_right",
                            "possible_right", "possible_all", "clip", "kind", "source", "text")}
    wrong: list[tuple[str, list[str]]] = []  # queries with a strong hit on a video that is not theirs
    for q in aset.queries:
        results = search_text([index], q.text, bench.encoder, k=n, confidence=bench.confidence).results
        rank = next(r for r, res in enumerate(results, 1) if res["video_id"] in q.moments)
        hit = results[rank - 1]
        moment = hit["key_moment"]
        rows["rank"].append(rank)
        rows["iou"].append(float(span_iou(np.array([[moment["start"], moment["end"]]]),
                                          q.moments[hit["video_id"]])[0]))
        rows["from_words"].append(float(moment.get("from") == "words"))
        strong = _strong(results)
        rows["strong_all"].append(sum(strong))
        rows["strong_right"].append(sum(s for s, r in zip(strong, results, strict=False)
                                        if r["video_id"] in q.moments))
        others = [r["video_id"] for s, r in zip(strong, results, strict=False)
                  if s and r["video_id"] not in q.moments]
        if others:
            wrong.append((q.text, others))
        rows["top_strong_right"].append(float(rank == 1 and strong[0]))
        possible = _strong(results, POSSIBLE)
        rows["possible_all"].append(sum(possible))
        rows["possible_right"].append(sum(s for s, r in zip(possible, results, strict=False)
                                          if r["video_id"] in q.moments))
        rows["clip"].append(q.clip)
        rows["kind"].append(q.kind)
        rows["source"].append(q.source or "")
        rows["text"].append(q.text)
    near = [_strong_ids(bench, index, m["text"]) for m in bench.near_miss[half]]
    off = [_strong_ids(bench, index, t) for t in bench.off_topic[half]]
    return {**{k: np.asarray(v) for k, v in rows.items()},
            "near_strong": np.asarray([bool(s) for s in near], np.float64), "near_ids": near,
            "near_clip": [m["near"] for m in bench.near_miss[half]],
            "off_strong": np.asarray([bool(s) for s in off], np.float64), "off_ids": off,
            "wrong_strong": wrong}


def _strong_ids(bench: WordsBench, index, text: str) -> list[str]:
    """The videos labelled a strong match among a query's top hits (no video is right for it)."""
    results = search_text([index], text, bench.encoder, k=TOP, confidence=bench.confidence).results
    return [r["video_id"] for r, s in zip(results, _strong(results), strict=False) if s]


def summarise(per: dict) -> dict:
    """The half's numbers with intervals from ``run_queries``' arrays."""
    ranks, groups = per["rank"], list(per["clip"])
    values = {"R@1": 100.0 * (ranks <= 1), "R@5": 100.0 * (ranks <= 5),
              "key_moment_iou>=0.5": 100.0 * (per["iou"] >= 0.5), "key_moment_mean_iou": per["iou"],
              "key_moment_from_words": 100.0 * per["from_words"]}
    out = {"queries": len(ranks), **intervals(values, groups)}
    for kind in ("exact", "paraphrase"):
        pick = per["kind"] == kind
        if pick.any():
            out[f"R@1_{kind}"] = intervals({"v": 100.0 * (ranks[pick] <= 1)},
                                           [g for g, p in zip(groups, pick, strict=True) if p])["v"]
    for source in ("subtitles", "speech", "screen"):
        pick = per["source"] == source
        if pick.any():
            out[f"R@1_{source}"] = intervals({"v": 100.0 * (ranks[pick] <= 1)},
                                             [g for g, p in zip(groups, pick, strict=True) if p])["v"]
    out["strong_precision"] = ratio_interval(per["strong_right"], per["strong_all"], groups)
    right = ranks == 1
    out["strong_recall"] = ratio_interval(per["top_strong_right"], right.astype(float), groups)
    out["possible_precision"] = ratio_interval(per["possible_right"], per["possible_all"], groups)
    out["near_miss_strong"] = (ratio_interval(per["near_strong"], np.ones(len(per["near_strong"])),
                                              per["near_clip"]) if len(per["near_strong"]) else None)
    out["off_topic_strong"] = (ratio_interval(per["off_strong"], np.ones(len(per["off_strong"])))
                               if len(per["off_strong"]) else None)
    out["near_miss"], out["off_topic"] = len(per["near_strong"]), len(per["off_strong"])
    return out


def measure(bench: WordsBench, halves: Sequence[str] = HALVES, variants: Sequence[str] = VARIANTS) -> dict:
    """``summarise`` of every half on every gallery: {variant: {half: numbers}}, and the per-query arrays."""
    per = {v: {h: run_queries(bench, h, v) for h in halves} for v in variants}
    return {"table": {v: {h: summarise(per[v][h]) for h in halves} for v in variants}, "per_query": per}


def evaluate_words(root: Path | None = None, shared: Path | None = None,
                   weights: dict[str, str] | None = None, words: str = "all", device: str | None = None,
                   profile: str | None = None, seed: int = 0, off_topic: dict[str, Path] | None = None,
                   recipe: Path = RECIPE_PATH) -> dict:
    """The words set's report (module docstring): build, read, index, search; JSON-able."""
    t0 = time.perf_counter()
    bench = prepare(root, shared, weights, words, device, profile, seed, off_topic, recipe)
    try:
        t1 = time.perf_counter()
        got = measure(bench)
        bench.timings["search_s"] = time.perf_counter() - t1
    finally:
        bench.close()
    bench.timings["total_s"] = time.perf_counter() - t0
    skipped = {vid: w["skipped"] for vid, w in bench.words.items() if w["skipped"]}
    segments = {src: sum(1 for w in bench.words.values() for s in w["segments"] if s.source == src)
                for src in ("subtitles", "speech", "screen")}
    return {"set": str(bench.root), "seed": seed, "videos": len(bench.ids),
            "queries": {h: len(bench.halves[h].queries) for h in HALVES},
            "model": bench.model.describe() if hasattr(bench.model, "describe") else {},
            "reader": bench.reader, "segments": segments,
            "written_found": found_written(bench.split, bench.words), "skipped": skipped,
            "timings": bench.timings,
            "command": COMMAND, **got["table"]}


def _cell(d: dict | None, digits: int = 1, scale: float = 1.0) -> str:
    """value [low, high], or '-' when there is nothing to measure."""
    if not d or d.get("value") is None:
        return "-"
    return (f"{d['value'] * scale:.{digits}f} [{d['low'] * scale:.{digits}f}, "
            f"{d['high'] * scale:.{digits}f}]")


def format_words_report(report: dict) -> str:
    """The report as a table: one row per gallery and half."""
    cols = [("R@1", "R@1", 1, 1), ("R@5", "R@5", 1, 1), ("IoU>=0.5", "key_moment_iou>=0.5", 1, 1),
            ("mean IoU", "key_moment_mean_iou", 2, 1), ("strong right", "strong_precision", 2, 1),
            ("near-miss strong", "near_miss_strong", 2, 1), ("off-topic strong", "off_topic_strong", 2, 1)]
    lines = [f"words set {report['set']}: {report['videos']} videos, queries tune "
             f"{report['queries']['tune']}, check {report['queries']['check']} (95 % bootstrap intervals "
             "over videos; off-topic over queries)",
             f"words read: {report['segments']} segments by source; reader {json.dumps(report['reader'])}",
             "written lines found: " + ", ".join(f"{s} {d['found']}/{d['lines']}"
                                                 for s, d in report["written_found"].items()),
             f"{'gallery / half':18s}" + "".join(f"{c[0]:>22s}" for c in cols)]
    for variant in VARIANTS:
        for half in HALVES:
            row = report[variant][half]
            lines.append(f"{variant + ' / ' + half:18s}" + "".join(f"{_cell(row.get(k), d, s):>22s}"
                                                                  for _, k, d, s in cols))
    for half in HALVES:
        row = report["words"][half]
        extra = ", ".join(f"{k[4:]} {_cell(row[k])}" for k in row if k.startswith("R@1_"))
        lines.append(f"words / {half}: R@1 by kind and source: {extra}; key moment from words "
                     f"{_cell(row['key_moment_from_words'])} %; strong recall "
                     f"{_cell(row['strong_recall'], 2)}; possible right "
                     f"{_cell(row['possible_precision'], 2)}")
    t = report["timings"]
    lines.append("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()))
    return "\n".join(lines)
