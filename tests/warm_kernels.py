"""Compile the index kernels that a predictor's first search does not reach into the checkout's numba cache:
the head pass (the app runs it from ``video_index.HEAD_FROM`` candidates on), the frame bounds of a gallery
larger than a shortlist, and the typed Lists of a gallery in two segments. ``tests/conftest.py`` runs this
in a process of its own beside its in-process warm-up (the predictor's: the clip pass, the exact scores and
the moments), so that a clean clone compiles on both cores before the first test: ``python -m
tests.warm_kernels``. The bounds are called directly, as ``tests/test_index.py`` calls them, not through a
search, which would compile the warm-up's kernels a second time beside it."""

from __future__ import annotations

import numpy as np

import prvr  # noqa: F401  - the OpenMP settings, before numba and torch start their threads
from prvr.index.rank import CLIP_LISTS, EXACT, HeadQuery, Stored, frame_bounds, head_bounds
from prvr.index.sketch import BoundQuery
from tests.test_index import _scan_data, split, stored_arrays


def main() -> None:
    """The head pass and the frame bounds over 200 random videos in two segments, on two threads, and the
    typed Lists of every array the passes read."""
    units, pnorm, windows, zhat, queries = _scan_data(200, 8, seed=11)
    segments = split(stored_arrays(units, pnorm, windows, zhat, 16), 100)
    stored, seg_start, rows = Stored.of(segments), np.array([0, 100, 200]), np.arange(200)
    bases = np.stack([s["head_basis"].astype(np.float64) for s in segments])
    q = BoundQuery.of(queries[0])
    head_bounds(stored, seg_start, rows, HeadQuery.of(q, bases, bases @ bases.transpose(0, 2, 1)), None, 2)
    hi = np.ones((len(rows), units.shape[1] + 1)).cumsum(1)  # prefix sums of unit bounds, as the clip pass's
    frame_bounds(stored, seg_start, rows, hi, rows, q, None, np.full(len(rows), -np.inf), 2)
    stored.lists(CLIP_LISTS + EXACT)  # the typed Lists of the other passes' arrays, of two segments


if __name__ == "__main__":
    main()
