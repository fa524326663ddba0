"""The built-in store: a persistent, exact, fast gallery of encoded videos in one directory, for one
two-branch model (``BuiltinStore``, the ``prvr.index.storage.GalleryStore`` of ``store`` segments +
manifest), and ``VideoIndex``, a ``Gallery`` over it.

```python
index = VideoIndex.create("runs/index", model, IndexConfig(mode="exact"))   # or VideoIndex.open(path, model)
index.add([GalleryVideo("v1", features, start, end, duration=..., title=..., path=...)])
evidence = index.rank(q, k=10, weights=None)     # q: the model's encoded query; Evidence, best first
index.remove(["v1"]); index.compact()
```

Modes: ``exact`` stores all P proposals of the model (528; 32 medoids for an MS-SL++ model) and ranks
exactly by ``model.score``; ``compact`` stores the 32 MS-SL++ length-aware medoids
(``prvr.models.clustering``) per video, exact with respect to the model run with ``clusters=32``, at 1/16 of
the per-proposal storage. Exact ranking's one page is every live video bounded by the first pass (the head
of the sketch); ``rank(..., approximate=True)`` picks candidate videos with faiss first
(``prvr.index.approximate``: 8 window keys a video), bounded by the same head pass. Each video also stores
what results read (``prvr.index.encoding``): its fine rows and segments, and the scores of the gallery's
reference bank.

Concurrency: every read (``rank``, ``ids``, ``position``...) uses one immutable ``Snapshot`` of the index,
taken at its start; a write builds the next snapshot aside and swaps it in with one assignment, so reads
run in parallel with each other and with a write, and never see half an update. Writes are serialised by
a thread lock and, across processes, by the store's writer lock.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from prvr.index import approximate, store
from prvr.index.encoding import ReferenceQueries, segment_arrays
from prvr.index.gallery import Gallery
from prvr.index.query import Weights
from prvr.index.rank import SHORTLIST, ClipBounds, Exact, HeadQuery, Page, clip_bounds, head_bounds
from prvr.index.schema import FIXED, RAGGED, SCHEMA_VERSION, WORDS
from prvr.index.scoring import VideoArrays, exact_of
from prvr.index.sketch import BoundQuery, head_basis, sketch
from prvr.index.snapshot import BASIS, KEYS_ARRAY, Snapshot
from prvr.index.storage import Catalog, DataFolder, Fixed, Ragged, Refine
from prvr.index.words import Words
from prvr.models.branches import EncodedQueries
from prvr.models.preprocess import window_table

STORED_CONFIG = ("mode", "frame_balls")  # what the stored data depends on: the manifest's, always
MODES = ("exact", "compact")
# Fewer candidates than this are bounded by the full codes at once, not by the head first: the head pass costs
# about half a full pass a video (the window grid is the same), and in a small gallery the k-th best total
# is low, so most videos pass the head's looser bound and are read again by the full codes (2,179 synthetic
# videos: 92 % did; 10,000: 15 %): exact rank p50 at 2,179 videos 5.5 -> 4.2 ms, at 5,000 7.1 -> 6.3, at
# 10,000 7.6 with the head first, 8.7 without (benchmarks/RESULTS.md, session 27).
HEAD_FROM = 6000
UNIT_KEY_VIDEOS = 512  # approximate candidates where a segment holds units' keys (recall@10 0.992 at 100,000)


@dataclass(frozen=True)
class IndexConfig:
    mode: str = "exact"  # "exact": every proposal of the model; "compact": 32 MS-SL++ medoids per video
    frame_balls: int = 16  # balls covering each video's z rows for the frame-scale bound (6 KB per video)
    segment_videos: int = 512  # an add writes segments of at most this many videos
    encode_batch: int = 64  # videos encoded (and attended over every proposal) at once
    lock_timeout: float = 10.0  # seconds a writer waits for another writer
    verify_checksums: bool = True  # sha256 every file on open (sizes are always checked)
    nlist: int = 0  # approximate search: IVF lists (0: sqrt of the number of keys)
    nprobe: int = 64  # approximate search: lists visited per query (benchmarks.scale: recall@10 0.995)
    candidate_units: int = 2048  # approximate search: nearest keys faiss gives (>= 8 x candidate_videos)
    # approximate search: videos (by their best key) ranked exactly; 128 of 8 window keys a video held
    # 0.998-1.000 of the exact top 10 at 2,000 and 10,000 videos (benchmarks/RESULTS.md, session 19)
    candidate_videos: int = 128


class BuiltinStore:
    """An index directory (``prvr.index.storage.GalleryStore``); see the module docstring. The config is the
    given one (else, on open, the one the index was created with), with the stored data's mode and frame
    balls."""

    def __init__(self, root: str | Path, cfg: IndexConfig | None = None) -> None:
        self.root, self._given = Path(root), cfg
        self.cfg = cfg or IndexConfig()
        self.where = str(self.root)
        self._writing = threading.Lock()  # one writer per process (the store's flock: one per directory)
        self._read: dict | None = None  # the manifest ``identity`` read, for ``load``
        self.snapshot: Snapshot | None = None

    @property
    def mode(self) -> str:
        """What the index stores of each video."""
        return self.cfg.mode

    @property
    def encode_batch(self) -> int:
        """Videos encoded at once."""
        return self.cfg.encode_batch

    # ------------------------------------------------------------------ opening
    def exists(self) -> bool:
        """Whether the directory holds an index (its manifest)."""
        return (self.root / store.MANIFEST).exists()

    def create(self, identity: dict) -> dict:
        """Make a new, empty index directory with this identity (refuses an existing index)."""
        if self.cfg.mode not in MODES:
            raise ValueError(f"index mode must be 'exact' or 'compact', got {self.cfg.mode!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        with store.writer_lock(self.root, self.cfg.lock_timeout):
            if self.exists():
                raise store.IndexStoreError(f"{self.root} already holds an index; open it instead")
            manifest = {"format": store.FORMAT, "schema_version": SCHEMA_VERSION, "generation": 0, **identity,
                        "frame_balls": self.cfg.frame_balls, "config": dataclasses.asdict(self.cfg),
                        "segments": [], "counts": {"videos": 0}}
            store.commit_manifest(self.root, manifest)
        self._start(manifest)
        return manifest

    def identity(self) -> dict:
        """The manifest (an IndexStoreError when the directory holds no index of this schema)."""
        self._read = store.read_manifest(self.root)
        return self._read

    def load(self) -> None:
        """Open the segments of the manifest ``identity`` read."""
        manifest = self._read if self._read is not None else store.read_manifest(self.root)
        cfg = self._given
        if cfg is None:
            known = {f.name for f in dataclasses.fields(IndexConfig)}
            cfg = IndexConfig(**{k: v for k, v in manifest.get("config", {}).items() if k in known})
        self.cfg = dataclasses.replace(cfg, **{k: manifest[k] for k in STORED_CONFIG})
        self._start(manifest)

    def _start(self, manifest: dict) -> None:
        """Ready for reads and writes at this manifest."""
        self.table = window_table(int(manifest["map_size"])).numpy()
        self.snapshot = self._snapshot(manifest, self.cfg.verify_checksums)
        self._read = None

    def _snapshot(self, manifest: dict, verify: bool) -> Snapshot:
        """The snapshot of one manifest (the segments the current one opened are not opened again)."""
        return Snapshot(self.root, manifest, verify, self.table, self.snapshot)

    def refresh(self) -> None:
        """Re-read the manifest if another writer changed it."""
        manifest = store.read_manifest(self.root)
        if manifest["generation"] != self.snapshot.manifest["generation"]:
            self.snapshot = self._snapshot(manifest, self.cfg.verify_checksums)

    def close(self) -> None:
        """The built-in store holds nothing open."""

    # ------------------------------------------------------------------ what is in it (one snapshot)
    @property
    def catalog(self) -> Catalog:
        """The live videos of the current snapshot."""
        return self.snapshot.catalog

    def describe(self) -> dict:
        """The built-in index: its mode and directory name (never a server path)."""
        return {"backend": "built-in", "mode": self.cfg.mode, "name": self.root.name,
                "videos": len(self.snapshot.live)}

    def media_paths(self) -> set[str]:
        """The media paths every record of this index names, removed videos' included (their files may
        still be served by a reader of an older generation)."""
        return {v.get("path", "") for v in self.snapshot.videos} - {""}

    def data_folder(self, data_dir: Path) -> DataFolder:
        """The index's own directory."""
        return DataFolder(self.root, True)

    def view(self) -> BuiltinView:
        """The current snapshot, for one rank."""
        return BuiltinView(self.snapshot, self.cfg)

    # ------------------------------------------------------------------ writing
    def _commit(self, change: Callable[[Snapshot, dict], dict]) -> None:
        """Under the writer locks: re-read the manifest, apply ``change``, commit atomically, swap in the
        new snapshot (the one moment a write touches what readers see)."""
        with self._writing, store.writer_lock(self.root, self.cfg.lock_timeout):
            current = store.read_manifest(self.root)
            snap = self.snapshot
            if current["generation"] != snap.manifest["generation"]:
                snap = self._snapshot(current, self.cfg.verify_checksums)  # another writer committed
            manifest = change(snap, dict(current))
            manifest["generation"] = current["generation"] + 1
            manifest["counts"] = {"videos": sum(s["count"] - len(s["removed"]) for s in manifest["segments"]),
                                  "segments": len(manifest["segments"])}
            store.commit_manifest(self.root, manifest, previous=current)
            store.remove_debris(self.root, manifest)
            self.snapshot = self._snapshot(manifest, verify=False)  # files this process just wrote

    def append(self, records: list[dict], fixed: Fixed, ragged: Ragged,
               check: Callable[[Catalog], None]) -> None:
        """Write segments of these videos and commit them in one manifest update."""
        def change(snap: Snapshot, manifest: dict) -> dict:
            check(snap.catalog)
            manifest["segments"] = list(manifest["segments"])
            for a in range(0, len(records), self.cfg.segment_videos):
                b = slice(a, a + self.cfg.segment_videos)
                part = self._segment_arrays({k: x[b] for k, x in fixed.items()},
                                            {k: x[b] for k, x in ragged.items()})
                manifest["segments"].append(store.write_segment(self.root, part, records[b]))
            return manifest

        self._commit(change)

    def _segment_arrays(self, fixed: Fixed, ragged: Ragged) -> dict[str, np.ndarray]:
        """All stored arrays of one segment: the videos' fixed and ragged arrays, the segment's head basis,
        the sketch, the approximate search's keys."""
        basis = head_basis(fixed["units"])
        spans = self.table[fixed["pidx"].astype(np.int64)]  # (n, P, 2) each stored window's units
        bounds = sketch(fixed["units"], fixed["pnorm"], spans, ragged["zbasis"], ragged["zcoef"],
                        self.cfg.frame_balls, basis)
        keys = approximate.window_keys(fixed["units"], spans, approximate.KEYS)
        return {**segment_arrays(fixed, ragged), BASIS: basis, KEYS_ARRAY: keys, **bounds}

    def remove(self, ids: Sequence[str], check: Callable[[Catalog], None]) -> None:
        """Mark these videos removed in one manifest update (a segment with none left is dropped)."""
        def change(snap: Snapshot, manifest: dict) -> dict:
            check(snap.catalog)
            manifest["segments"] = [dict(s, removed=list(s["removed"])) for s in manifest["segments"]]
            for i in ids:
                pos = snap.position[i]
                seg = int(snap.segment_of(pos))
                manifest["segments"][seg]["removed"].append(int(pos - snap.seg_start[seg]))
            manifest["segments"] = [s for s in manifest["segments"] if len(s["removed"]) < s["count"]]
            return manifest

        self._commit(change)

    def set_words(self, video_id: str, words: dict[str, np.ndarray],
                  check: Callable[[Catalog], None]) -> None:
        """Rewrite the segment holding the video with its new words arrays, in its place in the manifest
        (every position, removed row and other array as it was), in one manifest update; the old segment
        is retired as any other."""
        def change(snap: Snapshot, manifest: dict) -> dict:
            check(snap.catalog)
            pos = snap.position[video_id]
            s = int(snap.segment_of(pos))
            row, entry, seg = int(pos - snap.seg_start[s]), manifest["segments"][s], snap.segments[s]
            arrays = {f[:-4]: seg[f[:-4]] for f in entry["files"] if f.endswith(".npy")}
            for key in WORDS:
                offset = seg[f"{RAGGED[key]}_offset"]
                new = np.asarray(words[key], dtype=seg[key].dtype)
                if not len(new):  # (an empty words_vec of any width: this segment's)
                    new = new.reshape((0, *seg[key].shape[1:]))
                arrays[key] = np.concatenate([seg[key][:offset[row]], new, seg[key][offset[row + 1]:]])
                counts = np.array(seg[RAGGED[key]], dtype=np.int64)
                counts[row] = len(new)
                arrays[RAGGED[key]] = counts
            written = store.write_segment(self.root, arrays, snap.opened[entry["name"]][1])
            manifest["segments"] = list(manifest["segments"])
            manifest["segments"][s] = dict(written, removed=list(entry["removed"]))
            return manifest

        self._commit(change)

    def compact(self) -> None:
        """Rewrite the live videos into fresh segments; drop removed rows."""
        def change(snap: Snapshot, manifest: dict) -> dict:
            manifest["segments"] = []
            for a in range(0, len(snap.live), self.cfg.segment_videos):
                part = snap.live[a:a + self.cfg.segment_videos]
                fixed = {k: snap.gather(k, part) for k in FIXED}
                ragged = {k: [snap.ragged(k, p) for p in part] for k in RAGGED}
                seg = self._segment_arrays(fixed, ragged)
                records = [snap.videos[p] for p in part]
                manifest["segments"].append(store.write_segment(self.root, seg, records))
            return manifest

        self._commit(change)


class BuiltinView:
    """One snapshot for one rank (``prvr.index.storage.StoreView``): ids are global positions."""

    def __init__(self, snap: Snapshot, cfg: IndexConfig) -> None:
        self.snap, self.cfg, self.live = snap, cfg, len(snap.live)
        self.known: ClipBounds | None = None  # the full codes' bounds, where the pages computed them

    def shortlist(self, k: int) -> int:
        """Refining reads memory: the default shortlist."""
        return SHORTLIST

    def pages(self, bq: BoundQuery, k: int, w: Weights, approx: bool, refine: Refine,
              frame_bounded: bool) -> Iterable[Page]:
        """One page: every live video (or the approximate candidates) bounded by the head pass, or where
        they are fewer than ``HEAD_FROM``, by the full codes (which ``refine`` then reuses)."""
        snap, cfg = self.snap, self.cfg
        candidates = snap.live
        # units' keys (a segment written before window keys) need more candidates for the same recall
        videos = cfg.candidate_videos if snap.window_keyed else max(cfg.candidate_videos, UNIT_KEY_VIDEOS)
        if approx and len(snap.live) > videos:
            candidates = approximate.candidates(snap.ivf(cfg.nlist), bq.vector, snap.alive, cfg.nprobe,
                                                cfg.candidate_units, videos)
        threads = torch.get_num_threads()
        if len(candidates) < HEAD_FROM:
            clip, hi = clip_bounds(snap.stored, snap.seg_start, candidates, bq, snap.windows, threads)
            self.known = ClipBounds(candidates, clip, hi)
        else:  # the head pass (rank.top_k refines the best-bounded shortlist and the survivors of tau)
            head = HeadQuery.of(bq, snap.bases, snap.grams)
            clip = head_bounds(snap.stored, snap.seg_start, candidates, head, snap.windows, threads)
        return [Page(candidates, w.clip * clip + w.frame, -np.inf)]

    def clip_known(self) -> ClipBounds | None:
        """The full codes' bounds the pages computed (None: the head pass bounded them)."""
        return self.known

    def arrays(self, ids: np.ndarray, names: Sequence[str]) -> tuple[VideoArrays, np.ndarray]:
        """The snapshot itself (mapped: rows are read where used)."""
        return self.snap, ids

    def prefetch(self, names: Sequence[str], ids: np.ndarray) -> None:
        """Read ahead (``Snapshot.prefetch``)."""
        self.snap.prefetch(names, ids)

    def words(self) -> Words | None:
        """The snapshot's word segments (``Snapshot.words``)."""
        return self.snap.words()


class VideoIndex(Gallery):
    """A ``Gallery`` over the built-in store; see the module docstring."""

    storage: BuiltinStore

    @classmethod
    def create(cls, root: str | Path, model, cfg: IndexConfig | None = None,
               references: ReferenceQueries | None = None) -> VideoIndex:
        """Make a new, empty index directory for this model (refuses an existing index); ``references``:
        the encoded reference queries whose scores each video stores (confidence), None for none."""
        return cls.create_on(BuiltinStore(root, cfg), model, references)

    @classmethod
    def open(cls, root: str | Path, model, cfg: IndexConfig | None = None,
             references: ReferenceQueries | None = None) -> VideoIndex:
        """Open an existing index (``Gallery.open_on``); the config is the given one (else the one the index
        was created with), with the stored data's mode and frame balls; the given object is not changed."""
        return cls.open_on(BuiltinStore(root, cfg), model, references)

    @classmethod
    def open_or_create(cls, root: str | Path, model, cfg: IndexConfig | None = None,
                       references: ReferenceQueries | None = None) -> VideoIndex:
        """Open the index at root, or create it when there is none."""
        return cls.open_or_create_on(BuiltinStore(root, cfg), model, references)

    # ------------------------------------------------------------------ the built-in store's own
    @property
    def root(self) -> Path:
        """The index directory."""
        return self.storage.root

    @property
    def cfg(self) -> IndexConfig:
        """The store's config."""
        return self.storage.cfg

    @property
    def snapshot(self) -> Snapshot:
        """The current snapshot."""
        return self.storage.snapshot

    @property
    def manifest(self) -> dict:
        """The manifest of the current snapshot."""
        return self.storage.snapshot.manifest

    def compact(self) -> None:
        """Rewrite the live videos into fresh segments; drop removed rows."""
        self.storage.compact()

    def exact(self, positions: np.ndarray, q: np.ndarray | EncodedQueries,
              weights: Sequence[float] | None = None) -> Exact:
        """Exact scores of the videos at sorted ``positions`` (live or not) for q."""
        return exact_of(self.model, self.snapshot, np.asarray(positions, dtype=np.int64), q,
                        self.weights(weights))

    def first_pass_bytes(self) -> int:
        """Bytes an exact query reads for every video (the head of the sketch); the rest is read per
        candidate."""
        return self.snapshot.first_pass_bytes()

    def resident_bytes(self) -> int:
        """Bytes of the arrays this index keeps in memory (the first pass and what locates the rest)."""
        return self.snapshot.resident_bytes()

    def stored_bytes(self) -> int:
        """Bytes of every stored file (what the index occupies on disk, manifest aside)."""
        return sum(f["bytes"] for seg in self.manifest["segments"] for f in seg["files"].values())
