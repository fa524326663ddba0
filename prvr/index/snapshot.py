"""Snapshot: one generation of an index, read-only once built (see ``prvr.index.video_index``).

A snapshot keeps in memory the sketch (``sketch.SKETCH``): what the first pass reads for every video (the
head codes and window factors, 3.6 KB a video at H = 384) and what refines the bounds of the videos the first
pass leaves (the full 8-bit codes, 12.7 KB, and the frame balls, 9 KB; in memory, not mapped: a gallery too
big for the page cache would read them from disk, at random, in every query), and in compact mode each
video's window numbers, all segments in one array each, with the segments' head bases. Every other stored
array (the exact-score and evidence arrays: 250 KB a video) stays memory-mapped and is read only for the
videos a query scores or returns; where they fit in a quarter of memory, a thread maps their pages into the
process at open (``populate``: no page fault on a first query's path), and past that each query reads its
rows ahead (``prefetch``). It implements ``scoring.VideoArrays``.
"""

from __future__ import annotations

import bisect
import mmap
import os
import threading
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path

import numpy as np

from prvr.index import approximate, store
from prvr.index.rank import Stored
from prvr.index.schema import RAGGED, WORDS
from prvr.index.sketch import FIRST_PASS, SKETCH
from prvr.index.storage import Catalog
from prvr.index.words import Words, WordsTable

ADVISE_ABOVE = 0.25  # share of physical memory the mapped arrays must exceed for prefetch
WILLNEED = mmap.MADV_WILLNEED
POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14+: map a range's pages into the process
POPULATE_CHUNK = 4 << 20  # bytes a call: the call holds the GIL (a cold chunk: a disk read of 4 MB)
BASIS = "head_basis"  # a segment's (d, H) head basis (one per segment, not per video)
KEYS_ARRAY = "keys"  # (n, approximate.KEYS, H) float16 each video's window keys (approximate search)
SCENES_ARRAY = "scenes"  # (n, approximate.SCENES, H) float16 its unit keys, in a segment written before them


def populate(segments: list[dict[str, store.Mapped]]) -> None:
    """Map every page of these segments' mapped arrays into this process (``MADV_POPULATE_READ``, a chunk at
    a time), so that a fresh process's first queries take no page fault on them: a minor fault for each page
    a query first touches cost a fresh process's exact rank at 10,000 videos 8.1 against 6.0 ms p50
    (benchmarks/RESULTS.md, session 27). Advice only: where the kernel refuses it, nothing changes."""
    for maps in segments:
        for mapping in maps.values():
            for start in range(0, len(mapping.map) - mapping.offset, POPULATE_CHUNK):
                store.advise(mapping, start, start + POPULATE_CHUNK, POPULATE_READ)


class Snapshot:
    """One generation of an index, read-only once built: its segments' arrays, records and liveness."""

    def __init__(self, root: Path, manifest: dict, verify: bool, table: np.ndarray,
                 previous: Snapshot | None = None) -> None:
        """The snapshot of one manifest; ``previous``: an earlier snapshot of the same index, whose segments
        (immutable: a name is never reused) are not opened, nor their sketches copied, again."""
        self.manifest, self.table = manifest, table
        self.seg_start = np.cumsum([0] + [e["count"] for e in manifest["segments"]]).astype(np.int64)
        self._starts = self.seg_start.tolist()
        known = previous.opened if previous is not None else {}
        self.opened = {e["name"]: known.get(e["name"]) or self._open(root, e, verify, table)
                       for e in manifest["segments"]}  # each segment's arrays, records and mappings
        self.segments = [self.opened[e["name"]][0] for e in manifest["segments"]]
        self.videos = [v for e in manifest["segments"] for v in self.opened[e["name"]][1]]
        self.maps = [self.opened[e["name"]][2] for e in manifest["segments"]]
        self.compact = bool(self.segments) and self.segments[0]["pnorm"].shape[1] != len(table)
        # the segments' head bases (float64 of the stored float32, for the query's head coordinates) and
        # their Gram matrices
        self.bases = (np.stack([np.asarray(seg[BASIS]) for seg in self.segments]).astype(np.float64)
                      if self.segments else np.zeros((0, 0, 0)))
        self.grams = np.einsum("sih,sjh->sij", self.bases, self.bases)
        alive = []
        for entry in manifest["segments"]:
            keep = np.ones(entry["count"], dtype=bool)
            keep[entry["removed"]] = False
            alive.append(keep)
        self.alive = np.concatenate(alive) if alive else np.zeros(0, dtype=bool)
        self.live = np.flatnonzero(self.alive)
        self.catalog = Catalog.of(self.videos, self.live)
        self.position = self.catalog.position
        self._lazy = threading.Lock()  # builds the faiss index once, and each segment's words table
        self._plans: dict[tuple[str, ...], list] = {}  # prefetch's reads of each set of arrays
        # each segment's words table (None: no words), built on first use; a segment's is never built twice
        self._tables: dict[str, WordsTable | None] = {
            name: table for name, table in (previous._tables if previous is not None else {}).items()
            if name in self.opened}
        self.worded = any(int(seg["n_words_offset"][-1]) for seg in self.segments)
        # Reading ahead pays only when the mapped arrays outgrow the page cache; below that, the pages stay
        # cached and mapped, and the advice would be a few hundred syscalls per query
        # (4 ms of a 9 ms query at 2,179 videos).
        mapped = sum(len(m.map) for maps in self.maps for m in maps.values())
        self.reads_ahead = mapped > ADVISE_ABOVE * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        fresh = [self.opened[e["name"]][2] for e in manifest["segments"] if e["name"] not in known]
        if not self.reads_ahead and fresh:  # they fit: their pages are mapped now, off the queries' path
            threading.Thread(target=populate, args=(fresh,), name="prvr-populate", daemon=True).start()

    @staticmethod
    def _open(root: Path, entry: dict, verify: bool, table: np.ndarray
              ) -> tuple[dict[str, np.ndarray], list[dict], dict[str, store.Mapped]]:
        """One segment: its sketch read into memory (its mapping dropped), the rest mapped, each ragged
        array's offsets."""
        arrays, videos, maps = store.load_segment(root, entry, verify)
        compact = arrays["pnorm"].shape[1] != len(table)
        for f in (*SKETCH, "pidx") if compact else SKETCH:
            arrays[f] = np.array(arrays[f])  # a copy in memory; the mapping (and its pages) go
            maps.pop(f, None)
        for count in set(RAGGED.values()):  # where each video's rows of a ragged array start
            arrays[f"{count}_offset"] = np.concatenate([[0], np.cumsum(arrays[count])]).astype(np.int64)
        return arrays, videos, maps

    @property
    def windows(self) -> np.ndarray | None:
        """None when every video stores all windows in window_table order, else the table for ``pidx``."""
        return self.table if self.compact else None

    @cached_property
    def stored(self) -> Stored:
        """The segments' arrays as the refining and exact kernels read them."""
        return Stored.of(self.segments)

    @property
    def window_keyed(self) -> bool:
        """Whether every segment's approximate-search keys are its windows' (``approximate.window_keys``,
        ``KEYS_ARRAY``); a segment written before them holds its units' (``SCENES_ARRAY``) until compacted."""
        return all(KEYS_ARRAY in seg for seg in self.segments)

    def ivf(self, nlist: int):
        """The faiss index of the videos' keys (built on first use)."""
        with self._lazy:
            if getattr(self, "_ivf", None) is None:
                keys, videos = [], []
                for s, seg in enumerate(self.segments):
                    k = np.asarray(seg[KEYS_ARRAY if KEYS_ARRAY in seg else SCENES_ARRAY])  # (n, keys, H)
                    keys.append(k.reshape(-1, k.shape[-1]))
                    videos.append(np.repeat(np.arange(self.seg_start[s], self.seg_start[s + 1]), k.shape[1]))
                self._ivf = approximate.build_ivf(np.concatenate(keys), np.concatenate(videos), nlist)
                for maps in self.maps:  # read once, into faiss's own lists: their pages can go
                    for name in (KEYS_ARRAY, SCENES_ARRAY):
                        if name in maps:
                            store.advise(maps[name], 0, len(maps[name].map), mmap.MADV_DONTNEED)
            return self._ivf

    def words(self) -> Words | None:
        """The live videos' word segments, one table per segment of the index (None: no words at all);
        a table is read and indexed on first use (its segment's words arrays are read whole: a query matches
        every segment)."""
        if not self.worded:
            return None
        tables = []
        with self._lazy:
            for s, entry in enumerate(self.manifest["segments"]):
                name, seg = entry["name"], self.segments[s]
                if name not in self._tables:
                    self._tables[name] = WordsTable.of_videos({k: seg[k] for k in WORDS}, seg["n_words"])
                table = self._tables[name]
                if table is not None:
                    alive = self.alive[self.seg_start[s]:self.seg_start[s + 1]][table.video]
                    tables.append((table, np.arange(self.seg_start[s], self.seg_start[s + 1]), alive))
        return Words(tuple(tables)) if tables else None

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
        """One video's rows of the ragged array ``key`` (``schema.RAGGED``), read from the mapping."""
        s = bisect.bisect_right(self._starts, position) - 1  # segment_of, for one position
        seg, r = self.segments[s], position - self._starts[s]
        offset = seg[f"{RAGGED[key]}_offset"]
        return np.asarray(seg[key][offset[r]:offset[r + 1]])

    def prefetch(self, keys: Iterable[str], positions: np.ndarray) -> None:
        """Start reading these arrays' rows of the videos at ``positions`` from disk, all at once, before a
        kernel or the evidence reads them one page at a time (``store.advise``, MADV_WILLNEED; only when the
        snapshot ``reads_ahead``). The pages stay mapped after the query: they are page cache, which the
        kernel reclaims as any other; unmapping them after each query (MADV_DONTNEED) cost an approximate
        rank at 100,000 videos 8 ms of its 22 (pages cached), in the calls and in the faults that mapped
        them again (benchmarks/RESULTS.md, session 28)."""
        if not self.reads_ahead:
            return
        reads = self._reads(tuple(keys))
        for position in np.asarray(positions, dtype=np.int64).tolist():  # (plain ints: a few hundred calls)
            s = bisect.bisect_right(self._starts, position) - 1
            row = position - self._starts[s]
            for mapping, width, offset in reads[s]:
                lo, hi = (int(offset[row]), int(offset[row + 1])) if offset is not None else (row, row + 1)
                store.advise(mapping, lo * width, hi * width, WILLNEED)

    def _reads(self, keys: tuple[str, ...]) -> list[list[tuple[store.Mapped, int, np.ndarray | None]]]:
        """Per segment, what ``prefetch`` reads of ``keys``: each mapped array's mapping, bytes a row, and
        where each video's rows start (a ragged array) or None (one row a video); worked out once per
        ``keys`` (a few hundred videos a query)."""
        if keys not in self._plans:
            self._plans[keys] = [
                [(maps[key], seg[key].itemsize * (seg[key].size // max(len(seg[key]), 1)),
                  seg[f"{RAGGED[key]}_offset"] if key in RAGGED else None)
                 for key in keys if key in maps]  # (an array kept in memory has no mapping)
                for seg, maps in zip(self.segments, self.maps, strict=True)]
        return self._plans[keys]

    def resident_bytes(self) -> int:
        """Bytes this snapshot holds in memory for its arrays (the sketch, bases, offsets, liveness)."""
        counts = set(RAGGED.values())
        held = (*SKETCH, "pidx") if self.compact else SKETCH
        offsets = sum(seg[f"{c}_offset"].nbytes for seg in self.segments for c in counts)
        return (sum(seg[f].nbytes for seg in self.segments for f in held) + self.bases.nbytes
                + self.grams.nbytes + offsets + self.alive.nbytes + self.live.nbytes)

    def first_pass_bytes(self) -> int:
        """Bytes the first pass reads for every video (the head of the sketch)."""
        return sum(seg[f].nbytes for seg in self.segments for f in FIRST_PASS) + self.alive.nbytes
