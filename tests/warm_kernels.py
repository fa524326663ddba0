"""Compile the index kernels that a predictor's first search does not reach into the checkout's numba cache:
the head pass (the app runs it from ``video_index.HEAD_FROM`` candidates on), the frame bounds of a gallery
larger than a shortlist, and the typed Lists of a gallery in two segments. ``tests/conftest.py`` runs this
in a process of its own beside its in-process warm-up, so that a clean clone compiles on both cores before
the first test: ``python -m tests.warm_kernels``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import prvr  # noqa: F401  - the OpenMP settings, before numba and torch start their threads
from prvr.index import IndexConfig, VideoIndex, video_index
from tests.synthetic import gallery, queries, small_model


def main() -> None:
    """Search a random 400-video gallery in two segments, exactly and approximately, by either first pass."""
    model = small_model()
    videos = gallery(400, max_rows=24)
    with tempfile.TemporaryDirectory(prefix="prvr-warm-kernels-") as tmp:
        index = VideoIndex.create(Path(tmp) / "ix", model, IndexConfig())
        index.add(videos[:200])
        index.add(videos[200:])
        for head_from in (0, video_index.HEAD_FROM):  # the head pass first, then the full codes
            video_index.HEAD_FROM = head_from
            for q in model.encode_queries(queries(2)).numpy():
                index.rank(q, 10)
                index.rank(q, 10, approximate=True)


if __name__ == "__main__":
    main()
