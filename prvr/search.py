"""Everything about a search that is not storage: queries in, result dicts out.

- ``clean_query``: text (or bytes) -> the text that is searched, with what was changed. Bytes must be UTF-8
  (anything else is refused: guessing an encoding would search for mojibake); control and format characters
  become spaces, whitespace runs collapse, and text longer than ``MAX_QUERY_CHARS`` is cut at the last word
  boundary before the cap (the result metadata says so). An empty query is refused.
- ``temporal_nms``: the top non-overlapping moments of a video from its proposals' clip-scale cosines.
- ``unit_spans`` / ``frame_times``: clip units and attended frames -> seconds, through the official binning.
- ``confidence`` and ``no_strong_match``: the rules in ``ConfidenceRule`` (below).
- ``result_dict``: one result, docs/design.md Contract 4, with plain floats, ints and lists only.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from prvr.preprocess import clip_unit_rows

MAX_QUERY_CHARS = 500  # longer queries are cut (text backbones keep ~64 tokens anyway)
NMS_IOU = 0.0  # a moment is dropped when it overlaps a better one at all: moments never overlap
N_MOMENTS = 3  # moments per result
_CONTROL = ("Cc", "Cf", "Cs", "Co")  # control, format, surrogate, private-use characters become spaces


class QueryError(ValueError):
    """A query that cannot be searched; the message is meant for a person."""


@dataclass(frozen=True)
class CleanQuery:
    """The text that is searched and what cleaning did to the input."""

    text: str
    original_chars: int
    truncated: bool
    replaced_controls: int

    def to_dict(self) -> dict:
        """JSON-able metadata for the response."""
        return {"text": self.text, "original_chars": self.original_chars, "truncated": self.truncated,
                "replaced_controls": self.replaced_controls, "max_chars": MAX_QUERY_CHARS}


def clean_query(query: str | bytes) -> CleanQuery:
    """Validate and normalise a text query (see the module docstring for the rules)."""
    if isinstance(query, bytes | bytearray):
        try:
            query = bytes(query).decode("utf-8")
        except UnicodeDecodeError as e:
            raise QueryError(f"the query is not valid UTF-8 text (bad byte 0x{query[e.start]:02x} at "
                             f"position {e.start}); send UTF-8 encoded text") from None
    if not isinstance(query, str):
        raise QueryError(f"a query must be text, got {type(query).__name__}")
    original = len(query)
    text = unicodedata.normalize("NFC", query)
    controls = sum(1 for ch in text if unicodedata.category(ch) in _CONTROL and not ch.isspace())
    text = "".join(" " if unicodedata.category(ch) in _CONTROL else ch for ch in text)
    text = re.sub(r"\s+", " ", text).strip()
    if not text:
        raise QueryError("the query is empty: type a few words describing the moment you are looking for")
    truncated = len(text) > MAX_QUERY_CHARS
    if truncated:
        cut = text[:MAX_QUERY_CHARS]
        space = cut.rfind(" ")
        text = (cut[:space] if space > MAX_QUERY_CHARS // 2 else cut).strip()
    return CleanQuery(text=text, original_chars=original, truncated=truncated, replaced_controls=controls)


def temporal_nms(start: np.ndarray, end: np.ndarray, score: np.ndarray, n: int = N_MOMENTS,
                 iou: float = NMS_IOU) -> list[int]:
    """Indices of the best ``n`` proposals, best first, dropping any whose IoU with a kept one exceeds iou."""
    kept: list[int] = []
    for i in np.argsort(-score, kind="stable"):
        inter = np.clip(np.minimum(end[kept], end[i]) - np.maximum(start[kept], start[i]), 0, None)
        union = np.maximum(end[kept], end[i]) - np.minimum(start[kept], start[i])
        if not kept or np.all(inter <= iou * union):
            kept.append(int(i))
            if len(kept) == n:
                break
    return kept


def _row_spans(rows: np.ndarray, row_start: np.ndarray, row_end: np.ndarray) -> np.ndarray:
    """(M, 2) [first, end) raw-row ranges -> (M, 2) seconds from the first row's start to the last's end."""
    return np.stack([row_start[rows[:, 0]], row_end[rows[:, 1] - 1]], axis=1)


def unit_spans(row_start: np.ndarray, row_end: np.ndarray, map_size: int = 32) -> np.ndarray:
    """(map_size, 2) start/end seconds of each clip unit (the official binning of the raw rows)."""
    rows = clip_unit_rows(len(row_start), map_size).numpy()
    return _row_spans(rows, row_start, row_end)


def frame_times(row_start: np.ndarray, row_end: np.ndarray, max_ctx_l: int = 128) -> np.ndarray:
    """(L,) centre time of each frame the frame branch sees (rows re-binned only past max_ctx_l)."""
    n = len(row_start)
    if n <= max_ctx_l:
        return (row_start + row_end) / 2
    spans = _row_spans(clip_unit_rows(n, max_ctx_l).numpy(), row_start, row_end)
    return spans.mean(axis=1)


@dataclass(frozen=True)
class ConfidenceRule:
    """Confidence from how far a score stands out of the gallery's score distribution.

    The distribution is the exact totals of a fixed sample of gallery videos (all of a small gallery);
    z = (score - median) / (1.4826 * MAD), a robust z-score that a few relevant videos cannot inflate.
    high: z >= high_z; medium: z >= medium_z; low otherwise. No strong match (abstain): the best result's
    z < abstain_z, or the gallery is too small (< min_sample videos) to tell, in which case the labels
    fall back to "low". The scale has a floor (min_scale) so that near-identical galleries do not turn
    tiny score differences into "high".
    """

    high_z: float = 4.0
    medium_z: float = 2.0
    abstain_z: float = 2.0
    min_sample: int = 3
    min_scale: float = 0.01

    def z_scores(self, scores: np.ndarray, sample: np.ndarray) -> np.ndarray | None:
        """Robust z-scores of ``scores`` against ``sample``; None when the sample is too small."""
        if len(sample) < self.min_sample:
            return None
        med = float(np.median(sample))
        scale = max(1.4826 * float(np.median(np.abs(sample - med))), self.min_scale)
        return (np.asarray(scores, dtype=np.float64) - med) / scale

    def label(self, z: float | None) -> str:
        """high / medium / low for one z-score."""
        if z is None or z < self.medium_z:
            return "low"
        return "high" if z >= self.high_z else "medium"


def _floats(x: np.ndarray | Sequence[float]) -> list[float]:
    """Plain Python floats (JSON-able), rounded to 6 decimals."""
    return [round(float(v), 6) for v in np.asarray(x).reshape(-1)]


@dataclass
class VideoHit:
    """What the index computed for one returned video, before it becomes a result dict."""

    video: dict  # the stored record: id, title, path, duration
    total: float
    clip: float
    frame: float
    key: int  # position of the key clip in the video's proposal list
    proposal_units: np.ndarray  # (P, 2) [start, end) clip units of each stored proposal
    proposal_index: np.ndarray  # (P,) window index 0..527 of each stored proposal
    proposal_cos: np.ndarray  # (P,) clip-scale cosine of each stored proposal
    unit_cos: np.ndarray  # (M,) cosine of each clip unit (the heatmap)
    row_start: np.ndarray  # (n,) seconds of the raw rows
    row_end: np.ndarray
    attention: np.ndarray  # (L,) key clip's attention over the frames
    map_size: int = 32
    max_ctx_l: int = 128


def result_dict(rank: int, hit: VideoHit, confidence: str) -> dict:
    """One search result as in docs/design.md, Contract 4 (JSON-serialisable)."""
    spans = unit_spans(hit.row_start, hit.row_end, hit.map_size)  # (M, 2) seconds
    starts = spans[hit.proposal_units[:, 0], 0]
    ends = spans[hit.proposal_units[:, 1] - 1, 1]

    def moment(j: int) -> dict:
        return {"start": round(float(starts[j]), 3), "end": round(float(ends[j]), 3),
                "proposal": int(hit.proposal_index[j]), "score": round(float(hit.proposal_cos[j]), 6)}

    times = frame_times(hit.row_start, hit.row_end, hit.max_ctx_l)
    return {
        "rank": rank, "video_id": hit.video["id"], "title": hit.video.get("title", ""),
        "path": hit.video.get("path", ""), "duration": round(float(hit.video.get("duration", 0.0)), 3),
        "score": round(hit.total, 6), "clip_score": round(hit.clip, 6), "frame_score": round(hit.frame, 6),
        "confidence": confidence,
        "key_moment": moment(hit.key),
        "moments": [moment(j) for j in temporal_nms(starts, ends, hit.proposal_cos)],
        "heatmap": {"start": _floats(spans[:, 0]), "end": _floats(spans[:, 1]),
                    "score": _floats(hit.unit_cos)},
        "attention": {"time": _floats(times[: len(hit.attention)]), "weight": _floats(hit.attention)},
    }


@dataclass
class SearchResponse:
    """The ranked results (Contract 4 dicts) plus what the app shows around them; iterates as the list."""

    results: list[dict]
    query: dict  # CleanQuery.to_dict(), or {"tokens": L} for raw token features
    no_strong_match: bool  # the app says "no strong match" instead of presenting rank 1 as an answer
    weights: tuple[float, float]  # (clip_w, frame_w) used
    approximate: bool
    stats: dict = field(default_factory=dict)  # scanned / exactly scored videos, milliseconds

    def __iter__(self) -> Iterator[dict]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i: int) -> dict:
        return self.results[i]

    def to_dict(self) -> dict:
        """Everything as one JSON-able dict."""
        return {"results": self.results, "query": self.query, "no_strong_match": self.no_strong_match,
                "weights": list(self.weights), "approximate": self.approximate, "stats": self.stats}


def check_weights(weights: Sequence[float] | None, default: tuple[float, float]) -> tuple[float, float]:
    """(clip_w, frame_w): the given pair or the model's; finite and non-negative (the bounds need it)."""
    if weights is None:
        return float(default[0]), float(default[1])
    if len(weights) != 2:
        raise QueryError(f"weights must be a (clip_w, frame_w) pair, got {list(weights)}")
    w = (float(weights[0]), float(weights[1]))
    if not all(math.isfinite(x) and x >= 0 for x in w) or sum(w) == 0:
        raise QueryError(f"weights must be finite, non-negative and not both 0, got {w}")
    return w
