"""Results: ranked ``Evidence`` -> docs/design.md Contract 4 result dicts; the confidence protocol.

- ``result_dict``: one hit -> its Contract 4 dict. Where the query matches inside the video (key moment, up
  to 2 more moments, heatmap) comes from ``prvr.results.moments.find_moments`` on the hit's fine rows and
  segments (seconds, independent of the video's length); MS-SL's own key clip stays beside it as ``key_clip``.
  The lines of the video's words that matched the query are listed under ``words`` (best first). The key
  moment says where it came from (``"from"``): a hit ranked by its words (a line matched:
  ``prvr.index.words``, its words score > 0) has the best matched line as its key moment ("words": the words
  are what put it there, and the line's times say exactly where it is said or shown), the other moments
  still from the pictures; any other hit's key moment is the pictures' ("pictures"). The heatmap is always
  the pictures'.
- ``unit_spans`` / ``frame_times``: clip units and attended frames -> seconds, through the official binning.
- ``Confidence``: what labels each hit high / medium / low / none and says whether there is a strong match;
  one object judges all hits of a response (shared and session alike):
  ``prvr.results.confidence.CalibratedConfidence``. ``LABEL_WORDS``: the one vocabulary, each label's words
  on the page; every result dict carries both (``confidence``, ``confidence_label``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from prvr.index import Evidence, VideoEvidence, query_vector
from prvr.models.preprocess import clip_unit_rows
from prvr.results.moments import find_moments


def _row_spans(rows: np.ndarray, row_start: np.ndarray, row_end: np.ndarray) -> np.ndarray:
    """(M, 2) [first, end) raw-row ranges -> (M, 2) seconds from the first row's start to the last's end."""
    return np.stack([row_start[rows[:, 0]], row_end[rows[:, 1] - 1]], axis=1)


@functools.lru_cache(maxsize=4096)
def _bins(n: int, m: int) -> np.ndarray:
    """``clip_unit_rows(n, m)`` as a read-only numpy array, computed once per (n, m): every search asks for
    the same videos' binnings again."""
    rows = clip_unit_rows(n, m).numpy()
    rows.flags.writeable = False
    return rows


def unit_spans(row_start: np.ndarray, row_end: np.ndarray, map_size: int = 32) -> np.ndarray:
    """(map_size, 2) start/end seconds of each clip unit (the official binning of the raw rows)."""
    return _row_spans(_bins(len(row_start), map_size), row_start, row_end)


def frame_times(row_start: np.ndarray, row_end: np.ndarray, max_ctx_l: int = 128) -> np.ndarray:
    """(L,) centre time of each frame the frame branch sees (rows re-binned only past max_ctx_l)."""
    n = len(row_start)
    if n <= max_ctx_l:
        return (row_start + row_end) / 2
    spans = _row_spans(_bins(n, max_ctx_l), row_start, row_end)
    return spans.mean(axis=1)


# the machine value of a result's confidence -> the words the page shows (the API and MCP carry both)
LABEL_WORDS = {"high": "strong match", "medium": "possible match", "low": "unconfirmed", "none": "no match"}


@dataclass(frozen=True)
class Assessment:
    """What a confidence object says about one response."""

    labels: tuple[str, ...]  # one per hit, best first: "high" | "medium" | "low" | "none"
    strong: bool  # False: the app says "no strong match" instead of presenting rank 1 as an answer
    calibrated: bool = True  # False: the model's labels were never calibrated (all "low")


class Confidence(Protocol):
    """Judges the hits of one query: ``assess(q, evidence)`` with q the model's encoded query."""

    def assess(self, q: object, evidence: Evidence) -> Assessment: ...


def _floats(x: np.ndarray | Sequence[float]) -> list[float]:
    """Plain Python floats (JSON-able), rounded to 6 decimals."""
    return np.round(np.asarray(x, dtype=np.float64).reshape(-1), 6).tolist()


def result_dict(rank: int, hit: VideoEvidence, confidence: str, q: np.ndarray, map_size: int = 32,
                max_ctx_l: int = 128) -> dict:
    """One search result as in docs/design.md, Contract 4 (JSON-serialisable); q: the (H,) query vector."""
    spans = unit_spans(hit.row_start, hit.row_end, map_size)  # (M, 2) seconds
    key_start, key_end = hit.key_units
    key_clip = {"start": round(float(spans[key_start, 0]), 3), "end": round(float(spans[key_end - 1, 1]), 3),
                "proposal": int(hit.key_window), "score": round(float(hit.proposal_cos[hit.key]), 6)}
    line = hit.words[0] if hit.words_score > 0 and hit.words else None  # the key moment's, when words rank it
    anchor = (line.start, line.end) if line is not None else None
    if len(hit.fine):
        where = find_moments(q, hit.fine, hit.fine_start, hit.fine_end, hit.segments,
                             context=hit.context if len(hit.context) else None,
                             row_bank=hit.fine_bank, context_bank=hit.context_bank, anchor=anchor)
    else:  # a producer without fine rows: MS-SL's key clip and clip units are all there is
        key = key_clip if line is None else {"start": round(line.start, 3), "end": round(line.end, 3),
                                             "score": round(line.score, 6), "play_from": round(line.start, 3)}
        where = {"key_moment": key, "moments": [key] + ([key_clip] if line is not None else []),
                 "heatmap": {"start": _floats(spans[:, 0]), "end": _floats(spans[:, 1]),
                             "score": _floats(hit.unit_cos)}}
    key = {**where["key_moment"], "from": "pictures" if line is None else "words"}
    where["key_moment"], where["moments"] = key, [key, *where["moments"][1:]]
    times = frame_times(hit.row_start, hit.row_end, max_ctx_l)
    return {
        "rank": rank, "video_id": hit.video["id"], "title": hit.video.get("title", ""),
        "path": hit.video.get("path", ""), "duration": round(float(hit.video.get("duration", 0.0)), 3),
        "score": round(hit.total, 6), "clip_score": round(hit.clip, 6), "frame_score": round(hit.frame, 6),
        "confidence": confidence, "confidence_label": LABEL_WORDS[confidence], **where,
        "words": [m.to_dict() for m in hit.words], "key_clip": key_clip,
        "attention": {"time": _floats(times[: len(hit.attention)]), "weight": _floats(hit.attention)},
    }


def result_dicts(evidence: Evidence, labels: Sequence[str], q: object) -> list[dict]:
    """Contract 4 dicts of every hit, ranked from 1, for the model's encoded query q."""
    vector = query_vector(q)
    return [result_dict(r + 1, h, labels[r], vector, evidence.map_size, evidence.max_ctx_l)
            for r, h in enumerate(evidence.hits)]


@dataclass
class SearchResponse:
    """The ranked results (Contract 4 dicts) plus what the app shows around them; iterates as the list."""

    results: list[dict]
    query: dict  # prvr.results.query.CleanQuery.to_dict(), or {"tokens": L} for raw token features
    no_strong_match: bool  # the app says "no strong match" instead of presenting rank 1 as an answer
    weights: tuple[float, float]  # (clip_w, frame_w) used
    approximate: bool
    stats: dict = field(default_factory=dict)  # scanned / exactly scored videos, milliseconds
    calibrated: bool = True  # False: the model's labels were never calibrated (no strong match, no "none")
    notice: dict | None = None  # prvr.results.query.Notice.to_dict(): the text model cannot read the query

    @property
    def no_match(self) -> bool:
        """Every hit is labelled "none": nothing like the query seems to be in the gallery."""
        return bool(self.results) and all(r["confidence"] == "none" for r in self.results)

    def __iter__(self) -> Iterator[dict]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i: int) -> dict:
        return self.results[i]

    def to_dict(self) -> dict:
        """Everything as one JSON-able dict."""
        return {"results": self.results, "query": self.query, "no_strong_match": self.no_strong_match,
                "no_match": self.no_match, "calibrated": self.calibrated, "weights": list(self.weights),
                "approximate": self.approximate, "stats": self.stats, "notice": self.notice}
