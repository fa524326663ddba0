"""VideoIndex: a persistent, exact, fast gallery of encoded videos for one two-branch model.

```python
index = VideoIndex.create("runs/index", model, IndexConfig(mode="exact"))   # or VideoIndex.open(path, model)
index.add([GalleryVideo("v1", features, start, end, duration=..., title=..., path=...)])
evidence = index.rank(q, k=10, weights=None)     # q: the model's encoded query; Evidence, best first
index.remove(["v1"]); index.compact()
```

Modes: ``exact`` stores all P proposals of the model (528; 32 medoids for an MS-SL++ model) and ranks
exactly by ``model.score``; ``compact`` stores the 32 MS-SL++ length-aware medoids
(``prvr.models.clustering``) per video, exact with respect to the model run with ``clusters=32``, at 1/16 of
the per-proposal storage. ``rank(..., approximate=True)`` picks candidate videos with faiss first
(``prvr.index.approximate``), then scores them exactly. Text, confidence and result dicts live above the index
(``prvr.results.search``, ``prvr.results.response``); each video also stores what they read
(``prvr.index.ingest``): its fine rows and segments, and the scores of the reference bank the index was
created with (``references``: encoded queries, never text), from which confidence cuts are computed at search
time for any weights.

Concurrency: every read (``rank``, ``ids``, ``position``...) uses one immutable ``Snapshot`` of the index,
taken at its start; a write builds the next snapshot aside and swaps it in with one assignment, so reads
run in parallel with each other and with a write, and never see half an update. Writes are serialised by
a thread lock and, across processes, by the store's writer lock.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from prvr.index import approximate, store
from prvr.index.evidence import VideoEvidence
from prvr.index.gallery import Catalog, Gallery, IndexMismatchError, Weights, bank_identity, model_identity
from prvr.index.ingest import (
    GalleryError,
    GalleryVideo,
    ReferenceQueries,
    check_encoded,
    check_ids,
    check_videos,
    encode_for_index,
    segment_arrays,
)
from prvr.index.rank import BOUND_EPS, Exact, HeadQuery, Page, head_bounds, top_k
from prvr.index.schema import EVIDENCE, FIXED, RAGGED, SCHEMA_VERSION
from prvr.index.scoring import evidence_of, exact_of, is_csa, query_vector, refined_bounds
from prvr.index.sketch import BoundQuery, head_basis, sketch
from prvr.index.snapshot import BASIS, Snapshot
from prvr.models.branches import EncodedQueries
from prvr.models.preprocess import window_table
from prvr.words import counted

log = logging.getLogger(__name__)

STORED_CONFIG = ("mode", "frame_balls")  # what the stored data depends on: the manifest's, always
SCORED = ("units", "pnorm", "zbasis", "zcoef")  # the mapped arrays an exact score reads


@dataclass(frozen=True)
class IndexConfig:
    mode: str = "exact"  # "exact": every proposal of the model; "compact": 32 MS-SL++ medoids per video
    frame_balls: int = 16  # balls covering each video's z rows for the frame-scale bound (6 KB per video)
    segment_videos: int = 512  # an add writes segments of at most this many videos
    encode_batch: int = 64  # videos encoded (and attended over every proposal) at once
    lock_timeout: float = 10.0  # seconds a writer waits for another writer
    verify_checksums: bool = True  # sha256 every file on open (sizes are always checked)
    nlist: int = 0  # approximate search: IVF lists (0: sqrt of the number of scene centres)
    nprobe: int = 64  # approximate search: lists visited per query (benchmarks.scale: recall@10 0.995)
    candidate_units: int = 8192  # approximate search: nearest scene centres retrieved by faiss
    candidate_videos: int = 512  # approximate search: videos (by their best scene centre) ranked exactly


class VideoIndex(Gallery):
    """An index directory opened for one model; see the module docstring."""

    def __init__(self, root: Path, model, cfg: IndexConfig, manifest: dict,
                 references: ReferenceQueries | None = None) -> None:
        self.root, self.model, self.cfg, self.references = Path(root), model, cfg, references
        self._csa = is_csa(model)
        self._writing = threading.Lock()  # one writer per process (the store's flock: one per directory)
        self.table = window_table(int(manifest["map_size"])).numpy()
        self.snapshot = self._snapshot(manifest, cfg.verify_checksums)

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(cls, root: str | Path, model, cfg: IndexConfig | None = None,
               references: ReferenceQueries | None = None) -> VideoIndex:
        """Make a new, empty index directory for this model (refuses an existing index); ``references``:
        the encoded reference queries whose scores each video stores (confidence), None for none."""
        cfg = cfg or IndexConfig()
        if cfg.mode not in ("exact", "compact"):
            raise ValueError(f"index mode must be 'exact' or 'compact', got {cfg.mode!r}")
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        with store.writer_lock(root, cfg.lock_timeout):
            if (root / store.MANIFEST).exists():
                raise store.IndexStoreError(f"{root} already holds an index; open it instead")
            manifest = {"format": store.FORMAT, "schema_version": SCHEMA_VERSION, "generation": 0,
                        "mode": cfg.mode, **model_identity(model), "frame_balls": cfg.frame_balls,
                        "config": dataclasses.asdict(cfg), "references": bank_identity(references),
                        "segments": [], "counts": {"videos": 0}}
            store.commit_manifest(root, manifest)
        return cls(root, model, cfg, manifest, references)

    @classmethod
    def open(cls, root: str | Path, model, cfg: IndexConfig | None = None,
             references: ReferenceQueries | None = None) -> VideoIndex:
        """Open an existing index; refuses one built for another model, profile, schema or reference bank
        (without ``references`` it opens for reading; adding then needs the bank it was built with). The
        config is the given one (else the one the index was created with), with the stored data's mode and
        frame balls; the given object is not changed."""
        root = Path(root)
        manifest = store.read_manifest(root)
        for key, theirs in model_identity(model).items():
            if manifest.get(key) != theirs:
                raise IndexMismatchError(f"{root} was built with {key} = {manifest.get(key)!r}, but the "
                                         f"model in use has {key} = {theirs!r}; rebuild the index for it")
        if references is not None and manifest.get("references") != bank_identity(references):
            raise IndexMismatchError(f"{root} stores the scores of reference bank "
                                     f"{manifest.get('references')}, not of the one in use "
                                     f"{bank_identity(references)}; rebuild the index")
        if cfg is None:
            known = {f.name for f in dataclasses.fields(IndexConfig)}
            cfg = IndexConfig(**{k: v for k, v in manifest.get("config", {}).items() if k in known})
        cfg = dataclasses.replace(cfg, **{k: manifest[k] for k in STORED_CONFIG})
        return cls(root, model, cfg, manifest, references)

    @classmethod
    def open_or_create(cls, root: str | Path, model, cfg: IndexConfig | None = None,
                       references: ReferenceQueries | None = None) -> VideoIndex:
        """Open the index at root, or create it when there is none."""
        if (Path(root) / store.MANIFEST).exists():
            return cls.open(root, model, cfg, references)
        return cls.create(root, model, cfg, references)

    def _snapshot(self, manifest: dict, verify: bool) -> Snapshot:
        """The snapshot of one manifest (the segments the current one opened are not opened again)."""
        return Snapshot(self.root, manifest, verify, self.table, getattr(self, "snapshot", None))

    def refresh(self) -> None:
        """Re-read the manifest if another writer changed it."""
        manifest = store.read_manifest(self.root)
        if manifest["generation"] != self.snapshot.manifest["generation"]:
            self.snapshot = self._snapshot(manifest, self.cfg.verify_checksums)

    # ------------------------------------------------------------------ what is in it (one snapshot)
    @property
    def catalog(self) -> Catalog:
        """The live videos of the current snapshot."""
        return self.snapshot.catalog

    @property
    def manifest(self) -> dict:
        """The manifest of the current snapshot."""
        return self.snapshot.manifest

    def describe(self) -> dict:
        """The built-in index: its mode and directory name (never a server path)."""
        return {"backend": "built-in", "mode": self.cfg.mode, "name": self.root.name, "videos": len(self)}

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

    def media_paths(self) -> set[str]:
        """The media paths every record of this index names, removed videos' included (their files may
        still be served by a reader of an older generation)."""
        return {v.get("path", "") for v in self.snapshot.videos} - {""}

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

    def add(self, videos: Sequence[GalleryVideo]) -> None:
        """Encode and append videos (one atomic update); GalleryError leaves the index untouched."""
        videos = list(videos)
        if not videos:
            return
        check_videos(videos, set(self.position))  # before encoding: bad input costs nothing
        self._check_bank()
        fixed, ragged = encode_for_index(self.model, videos, self.cfg.mode, self.cfg.encode_batch,
                                         self.references)

        def change(snap: Snapshot, manifest: dict) -> dict:
            check_videos(videos, set(snap.position))  # again: another writer may have added them
            return self._append(snap, manifest, [v.record() for v in videos], fixed, ragged)

        self._commit(change)
        log.info("indexed %s (%d in the index)", counted(len(videos), "video"), len(self))

    def _check_bank(self) -> None:
        """GalleryError when this process cannot store what the index's videos store (reference scores)."""
        if self.manifest.get("references") != bank_identity(self.references):
            raise GalleryError(f"{self.root} stores reference scores of bank "
                               f"{self.manifest.get('references')}; open it with that bank (references=...) "
                               "to add videos")

    def add_encoded(self, records: list[dict], fixed: dict[str, np.ndarray],
                    ragged: dict[str, list[np.ndarray]]) -> None:
        """Append videos whose model outputs were computed elsewhere, in ``encode_for_index``'s layout
        (``schema.FIXED`` arrays, one row per video; ``schema.RAGGED`` lists, one array per video)."""
        check_encoded(fixed, ragged, len(records))
        bank = (self.manifest.get("references") or {}).get("count", 0)
        if fixed["ref_clip"].shape[1:] != (bank,) or fixed["ref_frame"].shape[1:] != (bank,):
            raise GalleryError(f"add_encoded: this index stores {bank} reference scores per video, got "
                               f"{fixed['ref_clip'].shape[1:]}")

        def change(snap: Snapshot, manifest: dict) -> dict:
            check_ids([r["id"] for r in records], snap.position)
            return self._append(snap, manifest, records, fixed, ragged)

        self._commit(change)

    def _append(self, snap: Snapshot, manifest: dict, records: list[dict], fixed: dict[str, np.ndarray],
                ragged: dict[str, list[np.ndarray]]) -> dict:
        """Write segments for these videos into a manifest copy."""
        manifest["segments"] = list(manifest["segments"])
        for a in range(0, len(records), self.cfg.segment_videos):
            b = slice(a, a + self.cfg.segment_videos)
            part = self._segment_arrays(snap, {k: x[b] for k, x in fixed.items()},
                                        {k: x[b] for k, x in ragged.items()})
            manifest["segments"].append(store.write_segment(self.root, part, records[b]))
        return manifest

    def _segment_arrays(self, snap: Snapshot, fixed: dict[str, np.ndarray],
                        ragged: dict[str, list[np.ndarray]]) -> dict[str, np.ndarray]:
        """All stored arrays of one segment: the videos' fixed and ragged arrays, the segment's head basis,
        the sketch, the scenes."""
        basis = head_basis(fixed["units"])
        bounds = sketch(fixed["units"], fixed["pnorm"], self.table[fixed["pidx"].astype(np.int64)],
                        ragged["zbasis"], ragged["zcoef"], self.cfg.frame_balls, basis)
        scenes = approximate.scene_centres(fixed["units"])
        return {**segment_arrays(fixed, ragged), BASIS: basis, "scenes": scenes, **bounds}

    def remove(self, ids: Sequence[str]) -> None:
        """Remove videos by id (one atomic manifest update); unknown ids are an error, nothing changes."""
        ids = list(dict.fromkeys(ids))  # an id given twice is removed once

        def change(snap: Snapshot, manifest: dict) -> dict:
            unknown = [i for i in ids if i not in snap.position]
            if unknown:
                raise GalleryError(f"no video with id {unknown[:5]} in the index")
            manifest["segments"] = [dict(s, removed=list(s["removed"])) for s in manifest["segments"]]
            for i in ids:
                pos = snap.position[i]
                seg = int(snap.segment_of(pos))
                manifest["segments"][seg]["removed"].append(int(pos - snap.seg_start[seg]))
            manifest["segments"] = [s for s in manifest["segments"] if len(s["removed"]) < s["count"]]
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
                seg = self._segment_arrays(snap, fixed, ragged)
                records = [snap.videos[p] for p in part]
                manifest["segments"].append(store.write_segment(self.root, seg, records))
            return manifest

        self._commit(change)

    # ------------------------------------------------------------------ ranking
    def _top(self, q: np.ndarray | EncodedQueries, k: int, w: Weights,
             approximate: bool) -> tuple[list[VideoEvidence], int, int]:
        """The k best live videos' evidence from one snapshot, how many were scored exactly, how many live."""
        snap = self.snapshot
        positions, exact, scored, read = self._best(snap, q, k, w, approximate)
        winners = np.sort(positions)
        snap.prefetch(EVIDENCE, winners)
        hits = evidence_of(self.model, snap, positions, q, w, exact)
        # done with what this query read from disk: its pages leave the process's resident memory (the
        # page cache keeps them; the hits' arrays read them again if used)
        snap.release(EVIDENCE, winners)
        snap.release(SCORED, read)
        return hits, scored, len(snap.live)

    def exact(self, positions: np.ndarray, q: np.ndarray | EncodedQueries,
              weights: Sequence[float] | None = None) -> Exact:
        """Exact scores of the videos at sorted ``positions`` (live or not) for q."""
        return exact_of(self.model, self.snapshot, np.asarray(positions, dtype=np.int64), q,
                        self.weights(weights))

    def _best(self, snap: Snapshot, q: np.ndarray | EncodedQueries, k: int, w: Weights,
              approx: bool) -> tuple[np.ndarray, Exact | None, int, np.ndarray]:
        """Top-k live positions, their exact scores (best first), how many videos were scored exactly and
        which: one page of every live video (or of the approximate candidates) bounded by the head pass,
        refined by the full codes and the frame balls (``rank.top_k``)."""
        if not len(snap.live):
            return np.zeros(0, dtype=np.int64), None, 0, np.zeros(0, dtype=np.int64)
        bq, table, threads = BoundQuery.of(query_vector(q)), snap.windows, torch.get_num_threads()
        candidates = snap.live
        if approx and len(snap.live) > self.cfg.candidate_videos:
            cfg = self.cfg
            candidates = approximate.candidates(snap.ivf(cfg.nlist), bq.vector, snap.alive, cfg.nprobe,
                                                cfg.candidate_units, cfg.candidate_videos)
        if approx:  # a few thousand candidates: the full codes bound them better, and at once
            first = refined_bounds(self.model, snap, candidates, bq, w, -np.inf, threads)
        else:
            head = HeadQuery.of(bq, snap.bases, snap.grams)
            clip = head_bounds(snap.stored, snap.seg_start, candidates, head, table, threads)
            first = w.clip * clip + w.frame

        def refine(positions: np.ndarray, tau: float) -> np.ndarray:
            return refined_bounds(self.model, snap, positions, bq, w, tau, threads)

        scored: list[tuple[np.ndarray, Exact]] = []  # what top_k scored: evidence reuses the winners' rows

        def score(positions: np.ndarray) -> np.ndarray:
            snap.prefetch(SCORED + (("frames",) if self._csa else ()), positions)
            scored.append((positions, exact_of(self.model, snap, positions, q, w, bq)))
            return scored[-1][1].total

        pages = [Page(candidates, first, -np.inf)]
        positions, _, n = top_k(pages, k, score, refine, BOUND_EPS * (1 + w.clip + w.frame))
        if not scored:
            return positions, None, n, np.zeros(0, dtype=np.int64)
        every = np.concatenate([p for p, _ in scored])  # distinct positions
        order = np.argsort(every)
        rows = order[np.searchsorted(every, positions, sorter=order)]
        return positions, Exact.concat([ex for _, ex in scored]).take(rows), n, every[order]
