"""The checks of what a query asks of a gallery, written once: ``k`` and the branch weights, and the error a
query that cannot be searched raises (its message is meant for a person)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

MAX_K = 1000  # more hits than a person reads; bounds the work of one rank


class QueryError(ValueError):
    """A query that cannot be searched; the message is meant for a person."""


class Weights(NamedTuple):
    """(clip_w, frame_w), checked: finite, non-negative, not both 0 (the bounds need it)."""

    clip: float
    frame: float


def check_weights(weights: Sequence[float] | None, default: tuple[float, float]) -> Weights:
    """The given pair (already checked ``Weights`` pass through) or the default, as ``Weights``."""
    if isinstance(weights, Weights):
        return weights
    if weights is None:
        return Weights(float(default[0]), float(default[1]))
    if len(weights) != 2:
        raise QueryError(f"weights must be a (clip_w, frame_w) pair, got {list(weights)}")
    w = (float(weights[0]), float(weights[1]))
    if not all(math.isfinite(x) and x >= 0 for x in w) or sum(w) == 0:
        raise QueryError(f"weights must be finite, non-negative and not both 0, got {w}")
    return Weights(*w)


def check_k(k: object, limit: int = MAX_K) -> int:
    """``k`` as an int in [1, limit], else a QueryError naming what was given."""
    if not isinstance(k, int | np.integer) or isinstance(k, bool) or not 1 <= k <= limit:
        raise QueryError(f"k must be a whole number from 1 to {limit}, got {k!r}")
    return int(k)


SEARCH_MODES = ("auto", "exact", "approximate")  # how a gallery is searched (the app's --search)
# auto: approximate from this many videos of each store, where its p50 measured below exact's at recall@10
# >= 0.99 on the same quiet runs (benchmarks/RESULTS.md, session 22): Qdrant at 2,000 (16 ms against 26-28,
# recall 1.0), the built-in index at 10,000 (at 2,000 the two were within a millisecond: exact misses nothing)
APPROXIMATE_FROM = {"built-in": 10_000, "qdrant": 2_000}


class SearchMode(NamedTuple):
    """Whether a gallery is searched approximately, and why (in words, for /info)."""

    approximate: bool
    why: str


def search_mode(mode: str, videos: int, backend: str) -> SearchMode:
    """How a gallery of ``videos`` videos in ``backend`` (``Gallery.describe()["backend"]``) is searched
    under ``mode`` (``SEARCH_MODES``): as forced, or (auto) approximate from ``APPROXIMATE_FROM``."""
    if mode not in SEARCH_MODES:
        raise ValueError(f"search must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
    if mode != "auto":
        return SearchMode(mode == "approximate", f"{mode} search asked for (--search {mode})")
    start = APPROXIMATE_FROM[backend]
    if videos >= start:
        return SearchMode(True, f"approximate: {videos} videos, at least {start} (from there it is faster "
                                "than exact at recall@10 >= 0.99; --search exact forces every video scored)")
    return SearchMode(False, f"exact: {videos} videos, fewer than {start} (exact is fast enough there and "
                             "misses nothing; --search approximate forces candidates from the index)")
