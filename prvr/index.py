"""VideoIndex: a persistent, exact, fast gallery of encoded videos for one two-branch model.

```python
index = VideoIndex.create("runs/index", model, IndexConfig(mode="exact"))   # or VideoIndex.open(path, model)
index.add([GalleryVideo("v1", features, start, end, duration=..., title=..., path=...)])
response = index.search("a cat jumps onto the sofa", k=10, weights=None)   # or raw tokens (L, Dq)
for r in response: ...                      # docs/design.md Contract 4 dicts; response.no_strong_match
index.remove(["v1"]); index.compact()
```

Modes: ``exact`` stores all P proposals of the model (528; 32 medoids for an MS-SL++ model) and returns
exactly ``model.score``'s scores and ranking; ``compact`` stores the 32 MS-SL++ length-aware medoids
(``prvr.clustering``) per video, exact with respect to the model run with ``clusters=32``, at 1/16 of the
per-proposal storage. ``search(..., approximate=True)`` first picks candidate videos with faiss (an IVF
index over a few scene centres per video: clusters of its clip-unit directions), then scores the best
candidates exactly: the returned scores are exact, the set may miss a video (recall measured in
benchmarks/search_speed.py). Exact scoring and its pruning bounds: ``prvr.index_scan``. Storage and atomic
updates: ``prvr.index_store``. Input videos and their encoding: ``prvr.gallery``. Results: ``prvr.search``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from prvr import index_store as store
from prvr import ral
from prvr.gallery import GalleryError, GalleryVideo, check_videos, encode_for_index
from prvr.index_scan import (
    BOUND_EPS,
    FIRST_PASS,
    SKETCH,
    BoundQuery,
    Exact,
    Stored,
    clip_upper,
    cover_balls,
    exact_rows,
    sketch,
    swept_top_k,
    tasks_for,
    top_k,
)
from prvr.model import EncodedQueries, EncodedVideos
from prvr.preprocess import pad, window_table
from prvr.search import (
    ConfidenceRule,
    QueryError,
    SearchResponse,
    VideoHit,
    check_weights,
    clean_query,
    result_dict,
)

log = logging.getLogger(__name__)

# per-video arrays the OS pages in on demand; the first pass's arrays (read by every query) are loaded into
# memory instead, so that the bulk of a big index cannot push them out of the page cache between queries
MAPPED = ("units", "pnorm", "zhat", "frames", "scenes", *(f for f in SKETCH if f not in FIRST_PASS))
RESIDENT = (*FIRST_PASS, "pidx")  # what the first pass reads: kept in memory, all segments in one array each
SCENES = 4  # per-video unit-cluster centres that approximate search indexes with faiss


class IndexMismatchError(store.IndexStoreError):
    """The index was built for another model, feature profile or schema."""


@dataclass
class IndexConfig:
    mode: str = "exact"  # "exact": every proposal of the model; "compact": 32 MS-SL++ medoids per video
    frame_balls: int = 16  # balls covering each video's z rows for the frame-scale bound (6 KB per video)
    segment_videos: int = 512  # an add writes segments of at most this many videos
    encode_batch: int = 64  # videos encoded (and attended over every proposal) at once
    background: int = 128  # videos whose totals form the score distribution of the confidence rule
    lock_timeout: float = 10.0  # seconds a writer waits for another writer
    verify_checksums: bool = True  # sha256 every file on open (sizes are always checked)
    nlist: int = 0  # approximate search: IVF lists (0: sqrt of the number of scene centres)
    nprobe: int = 128  # approximate search: lists visited per query
    candidate_units: int = 8192  # approximate search: nearest scene centres retrieved by faiss
    candidate_videos: int = 2048  # approximate search: videos (by their best scene centre) ranked exactly


class VideoIndex:
    """An index directory opened for one model; see the module docstring."""

    def __init__(self, root: Path, model, cfg: IndexConfig, manifest: dict,  # noqa: ANN001
                 text_encoder: Callable[[list[str]], list[np.ndarray]] | None = None):
        self.root, self.model, self.cfg = Path(root), model, cfg
        self._text_encoder = text_encoder
        self._faiss = None
        # a CSA model's frame score needs the query's frame-branch tokens, not only q: encode_query keeps
        # them here, keyed by q's bytes, for the exact scoring of that q (the last few queries only)
        self._csa = bool(getattr(model.cfg, "csa", False))
        self._csa_tokens: dict[bytes, EncodedQueries] = {}
        self._load(manifest)

    # ------------------------------------------------------------------ opening
    @staticmethod
    def _identity(model) -> dict:  # noqa: ANN001
        """What an index records about its model: fingerprint, profile identity, geometry."""
        return {"model_fingerprint": model.fingerprint(), "profile": getattr(model, "profile", None),
                "map_size": int(model.cfg.map_size), "max_ctx_l": int(model.cfg.max_ctx_l)}

    @classmethod
    def create(cls, root: str | Path, model, cfg: IndexConfig | None = None, **kw) -> VideoIndex:  # noqa: ANN001
        """Make a new, empty index directory for this model (refuses an existing index)."""
        cfg = cfg or IndexConfig()
        if cfg.mode not in ("exact", "compact"):
            raise ValueError(f"index mode must be 'exact' or 'compact', got {cfg.mode!r}")
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        with store.writer_lock(root, cfg.lock_timeout):
            if (root / store.MANIFEST).exists():
                raise store.IndexStoreError(f"{root} already holds an index; open it instead")
            manifest = {"format": store.FORMAT, "schema_version": store.SCHEMA_VERSION, "generation": 0,
                        "mode": cfg.mode, **cls._identity(model), "frame_balls": cfg.frame_balls,
                        "segments": [], "counts": {"videos": 0}}
            store.commit_manifest(root, manifest)
        return cls(root, model, cfg, manifest, **kw)

    @classmethod
    def open(cls, root: str | Path, model, cfg: IndexConfig | None = None, **kw) -> VideoIndex:  # noqa: ANN001
        """Open an existing index; refuses one built for another model, profile or schema."""
        root = Path(root)
        manifest = store.read_manifest(root)
        mine = cls._identity(model)
        for key, theirs in mine.items():
            if manifest.get(key) != theirs:
                raise IndexMismatchError(f"{root} was built with {key} = {manifest.get(key)!r}, but the "
                                         f"model in use has {key} = {theirs!r}; rebuild the index for it")
        cfg = cfg or IndexConfig()
        cfg.mode, cfg.frame_balls = manifest["mode"], manifest["frame_balls"]
        return cls(root, model, cfg, manifest, **kw)

    @classmethod
    def open_or_create(cls, root: str | Path, model, cfg: IndexConfig | None = None, **kw) -> VideoIndex:  # noqa: ANN001
        """Open the index at root, or create it when there is none."""
        if (Path(root) / store.MANIFEST).exists():
            return cls.open(root, model, cfg, **kw)
        return cls.create(root, model, cfg, **kw)

    def _load(self, manifest: dict) -> None:
        """Read the segments the manifest names: resident bound arrays, memory-mapped bulk."""
        self.manifest = manifest
        self.segments, self.videos, alive = [], [], []
        self.table = window_table(int(manifest["map_size"])).numpy()
        self.seg_start = np.cumsum([0] + [e["count"] for e in manifest["segments"]])
        # the first pass's arrays of all segments, each in one array (the segments hold views into it): a
        # query scans any range of the gallery in one kernel call
        self.first: dict[str, np.ndarray] = {}
        for s, entry in enumerate(manifest["segments"]):
            arrays, videos = store.load_segment(self.root, entry, MAPPED, self.cfg.verify_checksums)
            arrays["frame_offset"] = np.concatenate([[0], np.cumsum(arrays["n_frames"])])
            arrays["row_offset"] = np.concatenate([[0], np.cumsum(arrays["n_rows"])])
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
        self.position = {v["id"]: i for i, v in enumerate(self.videos) if self.alive[i]}
        self._faiss = None
        self._stored: Stored | None = None

    @property
    def stored(self) -> Stored:
        """The segments' per-video arrays as the frame-bound and exact kernels read them (built when first
        needed)."""
        if self._stored is None:
            self._stored = Stored.of(self.segments)
        return self._stored

    def refresh(self) -> None:
        """Re-read the manifest if another writer changed it."""
        manifest = store.read_manifest(self.root)
        if manifest["generation"] != self.manifest["generation"]:
            self._load(manifest)

    def __len__(self) -> int:
        return len(self.position)

    @property
    def ids(self) -> list[str]:
        """Live video ids in index order."""
        return [v["id"] for i, v in enumerate(self.videos) if self.alive[i]]

    def first_pass_bytes(self) -> int:
        """Bytes an exact query reads for every video (the 8-bit sketch); the rest is read per candidate."""
        return sum(seg[f].nbytes for seg in self.segments for f in FIRST_PASS) + self.alive.nbytes

    def stored_bytes(self) -> int:
        """Bytes of every stored array (what the index occupies on disk, manifest aside)."""
        return sum(a.nbytes for seg in self.segments for a in seg.values())

    # ------------------------------------------------------------------ writing
    def _commit(self, change: Callable[[dict], dict]) -> None:
        """Under the writer lock: re-read the manifest, apply ``change``, commit atomically, reload."""
        with store.writer_lock(self.root, self.cfg.lock_timeout):
            current = store.read_manifest(self.root)
            if current["generation"] != self.manifest["generation"]:
                self._load(current)  # another writer committed: validate against its content
            manifest = change(dict(current))
            manifest["generation"] = current["generation"] + 1
            manifest["counts"] = {"videos": sum(s["count"] - len(s["removed"]) for s in manifest["segments"]),
                                  "segments": len(manifest["segments"])}
            store.commit_manifest(self.root, manifest)
            store.remove_debris(self.root, manifest)
        self._load(manifest)

    def add(self, videos: Sequence[GalleryVideo]) -> None:
        """Encode and append videos (one atomic update); GalleryError leaves the index untouched."""
        videos = list(videos)
        if not videos:
            return

        def change(manifest: dict) -> dict:
            check_videos(videos, set(self.position))
            enc = encode_for_index(self.model, videos, self.cfg.mode, self.cfg.encode_batch)
            arrays = {k: np.concatenate(enc[k]) for k in ("units", "pnorm", "pidx", "zhat")}
            rows = [(np.asarray(v.start, np.float32), np.asarray(v.end, np.float32)) for v in videos]
            return self._append(manifest, [v.record() for v in videos], arrays, enc["frames"], rows)

        self._commit(change)
        log.info("indexed %d videos (%d in the index)", len(videos), len(self))

    def add_encoded(self, records: list[dict], arrays: dict[str, np.ndarray], frames: list[np.ndarray],
                    rows: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Append videos whose model outputs were computed elsewhere (``encode_for_index`` layout:
        units, pnorm, pidx, zhat per video; encoded frames; row start/end seconds). For benchmarks."""
        def change(manifest: dict) -> dict:
            ids = [r["id"] for r in records]
            if len(set(ids)) != len(ids) or set(ids) & set(self.position):
                raise GalleryError("add_encoded: duplicate video ids")
            return self._append(manifest, records, arrays, frames, rows)

        self._commit(change)

    def _append(self, manifest: dict, records: list[dict], arrays: dict[str, np.ndarray],
                frames: list[np.ndarray], rows: list[tuple[np.ndarray, np.ndarray]]) -> dict:
        """Write segments for these videos into a manifest copy."""
        manifest["segments"] = list(manifest["segments"])
        for a in range(0, len(records), self.cfg.segment_videos):
            b = slice(a, a + self.cfg.segment_videos)
            part = self._segment_arrays({k: x[b] for k, x in arrays.items()}, frames[b], rows[b])
            manifest["segments"].append(store.write_segment(self.root, part, records[b]))
        return manifest

    def _segment_arrays(self, arrays: dict[str, np.ndarray], frames: list[np.ndarray],
                        rows: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        """All stored arrays of one segment: units, pnorm, pidx, zhat + frames, row times and the sketch."""
        bounds = sketch(arrays["units"], arrays["pnorm"], self.table[arrays["pidx"].astype(np.int64)],
                        arrays["zhat"], self.cfg.frame_balls)
        units = arrays["units"]
        unit_dirs = units / np.maximum(np.linalg.norm(units, axis=-1, keepdims=True), 1e-12)
        scenes = cover_balls(unit_dirs, SCENES)
        scenes /= np.maximum(np.linalg.norm(scenes, axis=-1, keepdims=True), 1e-12)
        return {**arrays, "frames": np.concatenate(frames),
                "n_frames": np.array([len(f) for f in frames], dtype=np.int64),
                "row_start": np.concatenate([r[0] for r in rows]),
                "row_end": np.concatenate([r[1] for r in rows]),
                "n_rows": np.array([len(r[0]) for r in rows], dtype=np.int64),
                "scenes": scenes.astype(np.float16), **bounds}

    def remove(self, ids: Sequence[str]) -> None:
        """Remove videos by id (one atomic manifest update); unknown ids are an error, nothing changes."""
        ids = list(ids)

        def change(manifest: dict) -> dict:
            unknown = [i for i in ids if i not in self.position]
            if unknown:
                raise GalleryError(f"no video with id {unknown[:5]} in the index")
            manifest["segments"] = [dict(s, removed=list(s["removed"])) for s in manifest["segments"]]
            for i in ids:
                pos = self.position[i]
                seg = int(self._segment_of(pos))
                manifest["segments"][seg]["removed"].append(int(pos - self.seg_start[seg]))
            manifest["segments"] = [s for s in manifest["segments"] if len(s["removed"]) < s["count"]]
            return manifest

        self._commit(change)

    def compact(self) -> None:
        """Rewrite the live videos into fresh segments; drop removed rows."""
        def change(manifest: dict) -> dict:
            live = np.flatnonzero(self.alive)
            manifest["segments"] = []
            for a in range(0, len(live), self.cfg.segment_videos):
                part = live[a:a + self.cfg.segment_videos]
                arrays = {k: self._gather(k, part) for k in ("units", "pnorm", "pidx", "zhat")}
                frames = [self._ragged(p) for p in part]
                seg = self._segment_arrays(arrays, frames, [self._rows(p) for p in part])
                records = [self.videos[p] for p in part]
                manifest["segments"].append(store.write_segment(self.root, seg, records))
            return manifest

        self._commit(change)

    # ------------------------------------------------------------------ reading per video
    def _segment_of(self, positions: np.ndarray | int) -> np.ndarray:
        """The segment holding each global position."""
        return np.searchsorted(self.seg_start, positions, side="right") - 1

    def _locate(self, positions: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Group sorted global positions by segment: (segment, local rows, indices into positions)."""
        seg = self._segment_of(positions)
        return [(int(s), positions[seg == s] - self.seg_start[s], np.flatnonzero(seg == s))
                for s in np.unique(seg)]

    def _gather(self, key: str, positions: np.ndarray) -> np.ndarray:
        """Per-video rows of array ``key`` for sorted positions (reads only those rows).

        A run of consecutive rows inside one segment comes back as a view of the memory map: a full scan
        then reads the data in place instead of copying it first.
        """
        parts = self._locate(positions)
        if len(parts) == 1 and parts[0][1][-1] - parts[0][1][0] + 1 == len(positions):
            s, rows, _ = parts[0]
            return self.segments[s][key][rows[0]:rows[-1] + 1]
        first = self.segments[parts[0][0]][key]
        out = np.empty((len(positions),) + first.shape[1:], dtype=first.dtype)
        for s, rows, where in parts:
            out[where] = self.segments[s][key][rows]
        return out

    def _ragged(self, position: int) -> np.ndarray:
        """The stored encoded frames (L, H) of one video."""
        s = int(self._segment_of(position))
        seg, r = self.segments[s], position - self.seg_start[s]
        return np.asarray(seg["frames"][seg["frame_offset"][r]:seg["frame_offset"][r + 1]])

    def _rows(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw row start / end seconds of one video."""
        s = int(self._segment_of(position))
        seg, r = self.segments[s], position - self.seg_start[s]
        a, b = seg["row_offset"][r], seg["row_offset"][r + 1]
        return seg["row_start"][a:b], seg["row_end"][a:b]

    def exact(self, positions: np.ndarray, q: np.ndarray | BoundQuery, weights: tuple[float, float]) -> Exact:
        """index_scan.Exact for sorted positions: reads their units, norms and one z row each."""
        threads = torch.get_num_threads() if len(positions) > 1 else 1
        ex = exact_rows(self.stored, self.seg_start, positions, q, weights, self._windows, threads)
        if not self._csa:
            return ex
        # CSA replaces the key-clip-attention frame score
        frame = self._csa_frame(positions, q.vector if isinstance(q, BoundQuery) else q)
        return dataclasses.replace(ex, frame=frame, total=weights[0] * ex.clip + weights[1] * frame)

    def _csa_frame(self, positions: np.ndarray, q: np.ndarray) -> np.ndarray:
        """CSA frame scores (float64) of the videos at ``positions`` for q, from their stored frames."""
        tokens = self._csa_tokens.get(np.ascontiguousarray(q, dtype=np.float32).tobytes())
        if tokens is None:
            raise QueryError("this index's model scores frames with CSA, which needs the query's tokens: "
                             "get q from encode_query (or search with the text or token features)")
        device = self.model.device
        frames, mask = pad([torch.from_numpy(self._ragged(p).copy()) for p in positions])
        with torch.no_grad():
            scores = ral.csa_scores(self.model.text_weight_fc, tokens.tokens.to(device),
                                    tokens.token_mask.to(device), frames.to(device), mask.to(device),
                                    pad_to=self.model.cfg.max_ctx_l)
        return scores[0].double().cpu().numpy()

    # ------------------------------------------------------------------ searching
    def encode_query(self, query: str | bytes | np.ndarray | torch.Tensor) -> tuple[np.ndarray, dict]:
        """A text (validated, then encoded by the profile's text backbone) or raw tokens (L, Dq) -> q (H,)."""
        if isinstance(query, str | bytes | bytearray):
            cleaned = clean_query(query)
            tokens, info = self.text_encoder([cleaned.text])[0], cleaned.to_dict()
        else:
            tokens = np.asarray(query.detach().cpu() if isinstance(query, torch.Tensor) else query)
            if tokens.ndim != 2 or len(tokens) == 0 or not np.isfinite(tokens).all():
                raise QueryError(f"token features must be a finite (L >= 1, dim) array, "
                                 f"got shape {tokens.shape}")
            info = {"tokens": int(len(tokens))}
        try:
            q = self.model.encode_queries([np.asarray(tokens, dtype=np.float32)])
        except ValueError as e:
            raise QueryError(str(e)) from None
        if isinstance(q, EncodedQueries):  # a CSA model: keep the tokens for exact frame scoring
            vector = q.vectors.reshape(-1).float().cpu().numpy()
            self._csa_tokens[vector.tobytes()] = q
            while len(self._csa_tokens) > 64:  # the oldest first (dicts keep insertion order)
                self._csa_tokens.pop(next(iter(self._csa_tokens)))
            return vector, info
        return q.reshape(-1).float().cpu().numpy(), info

    @property
    def text_encoder(self) -> Callable[[list[str]], list[np.ndarray]]:
        """The model's profile text backbone (built on first use) or the one given at open."""
        if self._text_encoder is None:
            from extract.pipeline import TextEncoder

            profile = (self.manifest.get("profile") or {}).get("name")
            if profile is None:
                raise QueryError("the model records no feature profile, so text cannot be encoded; pass "
                                 "text_encoder= when opening the index, or search with token features")
            self._text_encoder = TextEncoder(profile).encode
        return self._text_encoder

    def rank(self, q: np.ndarray, k: int = 10, weights: Sequence[float] | None = None,
             approximate: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
        """Top-k live positions with exact totals for query vector q, and how many were scored exactly."""
        w = check_weights(weights, (self.model.cfg.clip_scale_w, self.model.cfg.frame_scale_w))
        if not self.alive.any():
            return np.zeros(0, dtype=np.int64), np.zeros(0), 0
        candidates = self._approximate_candidates(q) if approximate else np.flatnonzero(self.alive)
        bq, windows, threads = BoundQuery.of(q), self._windows, torch.get_num_threads()
        if w[1] > 0 and not self._csa:
            return swept_top_k(self.first, self.stored, self.seg_start, candidates, bq, w, k, windows,
                               threads)
        # CSA scores frames its own way (at most 1): the stored z do not bound it, so no frame bound
        tasks = tasks_for(len(candidates), threads)
        clip = clip_upper(self.first, candidates, bq, windows, None, threads, tasks)[0]
        return top_k(w[0] * clip + w[1] + BOUND_EPS * (1 + w[0] + w[1]), candidates,
                     lambda pos: self.exact(pos, bq, w).total, k)

    @property
    def _windows(self) -> np.ndarray | None:
        """None when every video stores all windows in window_table order, else the table for ``pidx``."""
        return None if self.segments[0]["pnorm"].shape[1] == len(self.table) else self.table

    def _approximate_candidates(self, q: np.ndarray) -> np.ndarray:
        """Live positions of the videos whose scene centres (clusters of their unit directions) are nearest
        to q, by a faiss IVF index built on first use (and after every change)."""
        live = np.flatnonzero(self.alive)
        if len(live) <= self.cfg.candidate_videos:  # every video would be a candidate: exact, without faiss
            return live
        if self._faiss is None:
            self._faiss = self._build_faiss()
        ivf = self._faiss
        ivf.nprobe = self.cfg.nprobe
        qn = (q / max(float(np.linalg.norm(q)), 1e-12)).astype(np.float32)[None]
        sims, labels = ivf.search(qn, min(self.cfg.candidate_units, ivf.ntotal))
        found = labels[0] >= 0
        videos, sims = labels[0][found] // SCENES, sims[0][found]
        keep = self.alive[videos]
        videos, sims = videos[keep], sims[keep]
        first = np.unique(videos, return_index=True)[1]  # results come best first: a video's best centre
        best = first[np.argsort(-sims[first], kind="stable")][: self.cfg.candidate_videos]
        return np.sort(videos[best])

    def _build_faiss(self):  # noqa: ANN202
        """faiss IVF index (inner product, 8-bit scalar-quantised lists) over every video's scene centres."""
        import faiss

        vectors = np.ascontiguousarray(
            np.concatenate([np.asarray(seg["scenes"], dtype=np.float32) for seg in self.segments]).reshape(
                -1, self.segments[0]["scenes"].shape[-1]))
        nlist = self.cfg.nlist or max(1, min(int(math.sqrt(len(vectors))), len(vectors) // 39))
        # 8-bit lists: a quarter of the bytes per probed list; candidates are re-scored exactly anyway
        ivf = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(vectors.shape[1]), vectors.shape[1], nlist,
                                            faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
        ivf.train(vectors[np.random.default_rng(0).permutation(len(vectors))[: 40 * nlist]])
        ivf.add(vectors)
        log.info("built the approximate-search index: %d scene vectors in %d lists", len(vectors), nlist)
        return ivf

    def search(self, query: str | bytes | np.ndarray | torch.Tensor, k: int = 10,
               weights: Sequence[float] | None = None, approximate: bool = False) -> SearchResponse:
        """Rank the gallery for a query; Contract 4 result dicts plus confidence and no-strong-match."""
        t0 = time.perf_counter()
        if not isinstance(k, int) or k < 1:
            raise QueryError(f"k must be a positive integer, got {k!r}")
        q, info = self.encode_query(query)
        w = check_weights(weights, (self.model.cfg.clip_scale_w, self.model.cfg.frame_scale_w))
        t1 = time.perf_counter()
        positions, totals, scored = self.rank(q, k, w, approximate)
        t2 = time.perf_counter()
        rule = ConfidenceRule()
        z = rule.z_scores(totals, self._background(q, w))
        results = []
        if len(positions):
            order = np.argsort(positions)  # read in storage order, report in rank order
            hits = self._hits(positions[order], q, w)
            hits = [hits[i] for i in np.argsort(order)]
            results = [result_dict(r + 1, h, rule.label(None if z is None else float(z[r])))
                       for r, h in enumerate(hits)]
        strong = z is not None and len(z) > 0 and z[0] >= rule.abstain_z
        stats = {"videos": len(self), "scored_exactly": int(scored), "encode_ms": 1e3 * (t1 - t0),
                 "rank_ms": 1e3 * (t2 - t1), "total_ms": 1e3 * (time.perf_counter() - t0)}
        return SearchResponse(results, info, not strong, w, approximate, stats)

    def _background(self, q: np.ndarray, w: tuple[float, float]) -> np.ndarray:
        """Exact totals of a fixed sample of live videos: the score distribution for confidence."""
        live = np.flatnonzero(self.alive)
        if len(live) > self.cfg.background:
            live = np.sort(np.random.default_rng(0).choice(live, self.cfg.background, replace=False))
        return self.exact(live, q, w).total if len(live) else np.zeros(0)

    def _hits(self, positions: np.ndarray, q: np.ndarray, w: tuple[float, float]) -> list[VideoHit]:
        """Everything a result needs for these (sorted) positions, attention included."""
        ex = self.exact(positions, q, w)
        units = np.array(self._gather("units", positions))  # a writable copy: it becomes a tensor
        pidx = self._gather("pidx", positions).astype(np.int64)
        windows = self.table[pidx]  # (V, P, 2)
        key_window = windows[np.arange(len(positions)), ex.key]  # (V, 2)
        attention = self._attention(positions, units, key_window, pidx[np.arange(len(positions)), ex.key])
        unit_norm = np.maximum(np.linalg.norm(units.astype(np.float64), axis=-1), 1e-12)
        unit_cos = ex.u / unit_norm / max(float(np.linalg.norm(q.astype(np.float64))), 1e-12)
        cfg = self.model.cfg
        return [VideoHit(self.videos[p], float(ex.total[i]), float(ex.clip[i]), float(ex.frame[i]),
                         int(ex.key[i]), windows[i], pidx[i], ex.proposal_cos[i], unit_cos[i],
                         *self._rows(p), attention[i], int(cfg.map_size), int(cfg.max_ctx_l))
                for i, p in enumerate(positions)]

    def _attention(self, positions: np.ndarray, units: np.ndarray, key_window: np.ndarray,
                   key_index: np.ndarray) -> list[np.ndarray]:
        """The key clip's attention over each video's frames, from the model (only these videos are read)."""
        frames = [torch.from_numpy(self._ragged(p).copy()) for p in positions]
        lengths = torch.tensor([len(f) for f in frames])
        padded = torch.nn.utils.rnn.pad_sequence(frames, batch_first=True)
        mask = (torch.arange(padded.shape[1]) < lengths[:, None]).float()
        u = torch.from_numpy(units).double()
        key = torch.stack([u[i, s:e].mean(0) for i, (s, e) in enumerate(key_window)]).float()[:, None]
        index = torch.from_numpy(key_index).long()[:, None]
        device = getattr(self.model, "device", torch.device("cpu"))
        enc = EncodedVideos(torch.from_numpy(units).to(device), key.to(device), index.to(device),
                            padded.to(device), mask.to(device))
        _, alpha = self.model.attend(enc, torch.zeros(len(positions), 1, dtype=torch.long, device=device))
        return [alpha[i, 0, :n].float().cpu().numpy() for i, n in enumerate(lengths.tolist())]

