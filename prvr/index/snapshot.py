"""Snapshot: one generation of an index, read-only once built (see ``prvr.index.video_index``).

A snapshot holds the arrays of the segments its manifest names: the first pass's arrays of all segments in
memory (one array each), the rest memory-mapped, and reads any video's rows of any stored array by its
global position (``gather`` for one-row-per-video arrays, ``ragged`` for variable-length ones).
"""

from __future__ import annotations

import bisect
import threading
from functools import cached_property
from pathlib import Path

import numpy as np

from prvr.index import approximate, store
from prvr.index.gallery import Catalog
from prvr.index.rank import Stored
from prvr.index.schema import ARRAYS, RAGGED
from prvr.index.sketch import FIRST_PASS, SKETCH
from prvr.models.preprocess import window_table

# per-video arrays the OS pages in on demand; the first pass's arrays (read by every query) are loaded into
# memory instead, so that the bulk of a big index cannot push them out of the page cache between queries
MAPPED = (*(a.name for a in ARRAYS if a.mapped), "scenes", *(f for f in SKETCH if f not in FIRST_PASS))
RESIDENT = (*FIRST_PASS, "pidx")  # what the first pass reads: kept in memory, all segments in one array each


class Snapshot:
    """One generation of an index, read-only once built: its segments' arrays, records and liveness."""

    def __init__(self, root: Path, manifest: dict, verify: bool) -> None:
        self.manifest = manifest
        self.segments: list[dict[str, np.ndarray]] = []
        self.videos: list[dict] = []
        self.table = window_table(int(manifest["map_size"])).numpy()
        self.seg_start = np.cumsum([0] + [e["count"] for e in manifest["segments"]])
        self._starts = self.seg_start.tolist()
        # the first pass's arrays of all segments, each in one array (the segments hold views into it): a
        # query scans any range of the gallery in one kernel call
        self.first: dict[str, np.ndarray] = {}
        alive = []
        for s, entry in enumerate(manifest["segments"]):
            arrays, videos = store.load_segment(root, entry, MAPPED, verify)
            for count in set(RAGGED.values()):  # where each video's rows of a ragged array start
                arrays[f"{count}_offset"] = np.concatenate([[0], np.cumsum(arrays[count])])
            for f in RESIDENT:
                if f not in self.first:
                    self.first[f] = np.empty((self.seg_start[-1], *arrays[f].shape[1:]), arrays[f].dtype)
                view = self.first[f][self.seg_start[s]:self.seg_start[s + 1]]
                view[...] = arrays[f]
                arrays[f] = view
            self.segments.append(arrays)
            self.videos.extend(videos)
            keep = np.ones(entry["count"], dtype=bool)
            keep[entry["removed"]] = False
            alive.append(keep)
        self.alive = np.concatenate(alive) if alive else np.zeros(0, dtype=bool)
        self.live = np.flatnonzero(self.alive)
        self.catalog = Catalog.of(self.videos, self.live)
        self.position = self.catalog.position
        self._lazy = threading.Lock()  # builds the typed Lists and the faiss index once

    @property
    def windows(self) -> np.ndarray | None:
        """None when every video stores all windows in window_table order, else the table for ``pidx``."""
        return None if self.segments[0]["pnorm"].shape[1] == len(self.table) else self.table

    @cached_property
    def stored(self) -> Stored:
        """The segments' arrays as the frame-bound and exact kernels read them."""
        with self._lazy:
            return Stored.of(self.segments)

    def ivf(self, nlist: int):
        """The faiss index of the scene centres (built on first use)."""
        with self._lazy:
            if getattr(self, "_ivf", None) is None:
                self._ivf = approximate.build_ivf(
                    np.concatenate([np.asarray(seg["scenes"]) for seg in self.segments]), nlist)
            return self._ivf

    def segment_of(self, positions: np.ndarray | int) -> np.ndarray:
        """The segment holding each global position."""
        return np.searchsorted(self.seg_start, positions, side="right") - 1

    def gather(self, key: str, positions: np.ndarray) -> np.ndarray:
        """Per-video rows of array ``key`` for sorted positions (reads only those rows)."""
        seg = self.segment_of(positions)
        first = self.segments[int(seg[0])][key]
        out = np.empty((len(positions),) + first.shape[1:], dtype=first.dtype)
        for s in np.unique(seg):
            where = seg == s
            out[where] = self.segments[s][key][positions[where] - self.seg_start[s]]
        return out

    def ragged(self, key: str, position: int) -> np.ndarray:
        """One video's rows of the ragged array ``key`` (``schema.RAGGED``; memory-mapped ones stay so)."""
        s = bisect.bisect_right(self._starts, position) - 1  # segment_of, for one position
        seg, r = self.segments[s], position - self._starts[s]
        offset = seg[f"{RAGGED[key]}_offset"]
        return seg[key][offset[r]:offset[r + 1]]

    def frames(self, position: int) -> np.ndarray:
        """The stored encoded frames (L, H) of one video."""
        return np.asarray(self.ragged("frames", position))

    def rows(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw row start / end seconds of one video."""
        return np.asarray(self.ragged("row_start", position)), np.asarray(self.ragged("row_end", position))
