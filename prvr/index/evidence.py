"""Evidence: what an index returns for one query vector, and what the results layer builds results from.

This is the contract between a gallery backend (``VideoIndex`` here; any other store of the same model's
encoded videos) and ``prvr.results.response``. A backend fills it from its own storage; the results layer
reads only these fields. Fields are added with defaults, so that older producers stay valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from prvr.index.words import WordMatch


def _none(*shape: int, dtype: type = np.float32):
    """A default for an array field an older producer does not fill: an empty array."""
    return field(default_factory=lambda: np.zeros(shape, dtype))


def best_first(totals: np.ndarray, order: np.ndarray, k: int, words: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k best: those with a words score (``words`` > 0: a line matched the query,
    ``prvr.index.words``) first, by it, then by total, equal totals by ``order`` (storage or insertion order,
    or which gallery came first): the one order of hits in every backend and every merge. Without words
    scores (or all 0) the order is by total alone."""
    keys = (order, -np.asarray(totals, dtype=np.float64))
    if words is not None and np.any(np.asarray(words) > 0):
        keys = (*keys, -np.asarray(words, dtype=np.float64))
    return np.lexsort(keys)[:k]


@dataclass(frozen=True)
class VideoEvidence:
    """One ranked video for one query: its record, MS-SL's exact scores and what results are built from.

    Scores are the model's exact float64 values for the query (``model.score``: total = clip_w * clip +
    frame_w * frame). The key clip is MS-SL's clip-scale argmax proposal (the first of equal ones, as torch).
    Clip units are the ``map_size`` bins of the official binning of the video's raw rows; proposals are
    windows [start, end) of clip units, numbered in ``prvr.models.preprocess.window_table`` order.

    Localisation (``prvr.results.moments``) reads the video's rows at the model's finest resolution
    (``model.encode_rows``: every 1 s row for the training-free model, the <= max_ctx_l encoded frames for
    MS-SL) as stored: unit vectors in float16, with their seconds, and its query-independent segments over
    those rows (``prvr.temporal.segments``: ``[scale, first, end)``). Confidence (``prvr.results.confidence``)
    reads the clip and frame scores of the index's reference bank on this video (R each, float16; the total of
    a reference query at weights w is w_clip * ref_clip + w_frame * ref_frame, as for the query). A producer
    without them leaves them empty: results then fall back to MS-SL's key clip and labels to "low".
    """

    video: Mapping  # the stored record: "id" (always), "title", "path", "duration" (s), "sha256", ...
    total: float  # exact MS-SL total score
    clip: float  # exact clip-scale score: the key clip's cosine
    frame: float  # exact frame-scale score
    key: int  # position of the key clip among this video's stored proposals (index into proposal_*)
    key_window: int  # the key clip's window number (window_table order)
    key_units: tuple[int, int]  # the key clip's [start, end) clip units
    proposal_units: np.ndarray  # (P, 2) int: [start, end) clip units of each stored proposal
    proposal_index: np.ndarray  # (P,) int: window number of each stored proposal
    proposal_cos: np.ndarray  # (P,) float: clip-scale cosine of each stored proposal with the query
    unit_cos: np.ndarray  # (M,) float: cosine of each clip unit with the query (the heatmap)
    row_start: np.ndarray  # (n,) float seconds: start of each raw feature row of the video
    row_end: np.ndarray  # (n,) float seconds: end of each raw feature row
    attention: np.ndarray  # (L,) float: the key clip's attention over the video's encoded frames
    fine: np.ndarray = _none(0, 0, dtype=np.float16)  # (n', H) float16 unit rows of model.encode_rows
    fine_start: np.ndarray = _none(0)  # (n',) float32 seconds: start of each fine row
    fine_end: np.ndarray = _none(0)  # (n',) float32 seconds: end of each fine row
    segments: np.ndarray = _none(0, 3, dtype=np.int32)  # (S, 3) int32 [scale, first, end) over the fine rows
    # (F, H) float32: the fine rows propagated over the segments (prvr.temporal.propagation.propagate_finest
    # at prvr.results.moments' default beta), one row per finest segment; what moments score candidates on
    context: np.ndarray = _none(0, 0)
    # (n', 2) / (F, 2) float32: prvr.temporal.hubness.bank_stats of the fine rows / of the context rows
    # against the index's reference bank (mean, std of their cosines); (0, 2) without a bank: moments use raw
    # cosines
    fine_bank: np.ndarray = _none(0, 2)
    context_bank: np.ndarray = _none(0, 2)
    ref_clip: np.ndarray = _none(0, dtype=np.float16)  # (R,) clip scores of the reference queries
    ref_frame: np.ndarray = _none(0, dtype=np.float16)  # (R,) frame scores of the reference queries
    # the words channel (prvr.index.words): the video's segments that matched the query, best first, and its
    # words score (the best one's; 0: none matched, the video ranks by its pictures)
    words: tuple[WordMatch, ...] = ()
    words_score: float = 0.0

    @property
    def id(self) -> str:
        """The video's id."""
        return str(self.video["id"])


@dataclass(frozen=True)
class Evidence:
    """Ranked evidence of a gallery for one query vector, best first (by exact total; equal totals in
    storage order), at most k videos.

    ``scored_exactly``: how many videos the backend scored exactly (the rest were ruled out by bounds or
    never candidates); ``searched``: how many live videos the query ran over. ``map_size`` / ``max_ctx_l``:
    the model's clip units per video and frames seen by the frame branch (to map units and frames to
    seconds). ``approximate``: candidates came from an approximate pre-selection (scores still exact).
    """

    hits: tuple[VideoEvidence, ...]
    weights: tuple[float, float]  # (clip_w, frame_w) of the totals
    scored_exactly: int
    searched: int
    map_size: int
    max_ctx_l: int
    approximate: bool = False

    def __len__(self) -> int:
        return len(self.hits)

    @property
    def totals(self) -> np.ndarray:
        """(V,) float64 exact totals, best first."""
        return np.array([h.total for h in self.hits], dtype=np.float64)

    @classmethod
    def merge(cls, parts: Sequence[Evidence], k: int) -> Evidence:
        """The best k of several galleries' evidence for the same query vector and weights (equal totals:
        the earlier part first)."""
        if not parts:
            raise ValueError("merge needs at least one Evidence")
        first = parts[0]
        for p in parts[1:]:
            if (p.weights, p.map_size, p.max_ctx_l) != (first.weights, first.map_size, first.max_ctx_l):
                raise ValueError("merged evidence must come from the same model and weights")
        every = [h for p in parts for h in p.hits]
        hits = [every[i] for i in best_first(np.array([h.total for h in every]), np.arange(len(every)), k,
                                             np.array([h.words_score for h in every]))]
        return cls(tuple(hits), first.weights, sum(p.scored_exactly for p in parts),
                   sum(p.searched for p in parts), first.map_size, first.max_ctx_l,
                   any(p.approximate for p in parts))
