"""Results: ranked ``Evidence`` -> docs/design.md Contract 4 result dicts, plus confidence.

- ``temporal_nms``: the top non-overlapping moments of a video from its proposals' clip-scale cosines.
- ``unit_spans`` / ``frame_times``: clip units and attended frames -> seconds, through the official binning.
- ``Confidence``: what labels each hit high / medium / low and says whether there is a strong match; one
  object judges all hits of a response (shared and session alike). ``GalleryConfidence`` is today's rule
  (``ConfidenceRule``: a hit's robust z-score against a sample of the shared gallery's scores).
- ``result_dicts``: Evidence + labels -> Contract 4 dicts with plain floats, ints and lists only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from prvr.index.evidence import Evidence, VideoEvidence
from prvr.preprocess import clip_unit_rows

NMS_IOU = 0.0  # a moment is dropped when it overlaps a better one at all: moments never overlap
N_MOMENTS = 3  # moments per result


def temporal_nms(start: np.ndarray, end: np.ndarray, score: np.ndarray, n: int = N_MOMENTS,
                 iou: float = NMS_IOU) -> list[int]:
    """Indices of the best ``n`` proposals, best first, dropping any whose IoU with a kept one exceeds iou
    (greedy: each kept proposal suppresses the rest at once, vectorised)."""
    order = np.argsort(-np.asarray(score), kind="stable")
    s, e = np.asarray(start)[order], np.asarray(end)[order]
    alive = np.ones(len(order), dtype=bool)
    kept: list[int] = []
    while len(kept) < n:
        left = np.flatnonzero(alive)
        if not len(left):
            break
        i = left[0]
        kept.append(int(order[i]))
        inter = np.clip(np.minimum(e, e[i]) - np.maximum(s, s[i]), 0, None)
        union = np.maximum(e, e[i]) - np.minimum(s, s[i])
        alive &= inter <= iou * union
        alive[i] = False
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


@dataclass(frozen=True)
class Assessment:
    """What a confidence object says about one response."""

    labels: tuple[str, ...]  # one per hit, best first: "high" | "medium" | "low"
    strong: bool  # False: the app says "no strong match" instead of presenting rank 1 as an answer


class Confidence(Protocol):
    """Judges the hits of one query: ``assess(q, evidence)`` with q the model's encoded query."""

    def assess(self, q: object, evidence: Evidence) -> Assessment: ...


@dataclass(frozen=True)
class GalleryConfidence:
    """``ConfidenceRule`` against the exact totals of a fixed sample of one gallery (``index``: anything with
    ``sample_totals(q, weights, n)``, the shared ``VideoIndex``) for the same query and weights."""

    index: object
    rule: ConfidenceRule = ConfidenceRule()
    sample: int = 128

    def assess(self, q: object, evidence: Evidence) -> Assessment:
        """Labels by robust z-score; strong when the best hit's z reaches the rule's abstain_z."""
        z = self.rule.z_scores(evidence.totals, self.index.sample_totals(q, evidence.weights, self.sample))
        labels = tuple(self.rule.label(None if z is None else float(v)) for v in
                       (z if z is not None else [None] * len(evidence)))
        return Assessment(labels, z is not None and len(z) > 0 and bool(z[0] >= self.rule.abstain_z))


def _floats(x: np.ndarray | Sequence[float]) -> list[float]:
    """Plain Python floats (JSON-able), rounded to 6 decimals."""
    return [round(float(v), 6) for v in np.asarray(x).reshape(-1)]


def result_dict(rank: int, hit: VideoEvidence, confidence: str, map_size: int = 32,
                max_ctx_l: int = 128) -> dict:
    """One search result as in docs/design.md, Contract 4 (JSON-serialisable)."""
    spans = unit_spans(hit.row_start, hit.row_end, map_size)  # (M, 2) seconds
    starts = spans[hit.proposal_units[:, 0], 0]
    ends = spans[hit.proposal_units[:, 1] - 1, 1]

    def moment(j: int) -> dict:
        return {"start": round(float(starts[j]), 3), "end": round(float(ends[j]), 3),
                "proposal": int(hit.proposal_index[j]), "score": round(float(hit.proposal_cos[j]), 6)}

    times = frame_times(hit.row_start, hit.row_end, max_ctx_l)
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


def result_dicts(evidence: Evidence, labels: Sequence[str]) -> list[dict]:
    """Contract 4 dicts of every hit, ranked from 1."""
    return [result_dict(r + 1, h, labels[r], evidence.map_size, evidence.max_ctx_l)
            for r, h in enumerate(evidence.hits)]


@dataclass
class SearchResponse:
    """The ranked results (Contract 4 dicts) plus what the app shows around them; iterates as the list."""

    results: list[dict]
    query: dict  # prvr.query.CleanQuery.to_dict(), or {"tokens": L} for raw token features
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


