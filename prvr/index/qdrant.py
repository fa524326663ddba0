"""QdrantIndex: the gallery in a Qdrant collection, ranked exactly, behind the same contract as VideoIndex.

```python
index = QdrantIndex.open_or_create("qdrant://localhost:6333/prvr", model)   # or "qdrant+local://DIR"
index.add([GalleryVideo(...)]); index.remove(["v1"])
evidence = index.rank(q, k=10, weights=None)     # the same Evidence as VideoIndex.rank, best first
```

``qdrant+local://DIR`` runs the Qdrant engine itself in this process (``qdrant-edge-py``), ``qdrant://`` a
server through qdrant-client; both hold the layout of ``prvr.index.qdrant_store``: a point per video (its id
its insertion number) with a float16 ``bounds`` multivector (an upper bound of its total, no graph) and a
float16 ``scenes`` multivector (HNSW, int8-quantized), and beside them, in a second collection, its arrays in
three points by what reads them (sketch, exact scores, evidence). The gallery's metadata (the model's
identity, the mode, the insertion counter) is one more point; opening it for another model, profile,
reference bank or schema is refused.

Exact ranking is the built-in index's rank tail (``rank.top_k``) fed by the engine: pages of the points with
the best ``bounds`` scores (exhaustive scans: the score of a video's balls at the query's weights is an upper
bound of its total; a page's last score bounds every point it does not hold), refined by the sketch in the
payloads of the candidates that can still reach the k-th best (the built-in index's own kernels), exact
scores of those the sketch leaves (their exact-score arrays fetched by id, scored by the built-in index's
own code: the same bits), the next page (twice as many) only while its bound can. Equal totals are broken by
insertion order, as the built-in index breaks them by position. ``approximate=True`` takes the
``candidate_videos`` best videos of the HNSW graph over ``scenes`` as the one page, bounded by the same balls
and scored exactly. CSA models are supported: their frame score comes from the stored frames and the query's
tokens, so the frame balls do not bound it and the bound takes frame <= 1.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from prvr.index import approximate as scenes_of
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
)
from prvr.index.qdrant_store import (
    ARRAYS,
    BOUNDS,
    GROUPS,
    META_ID,
    SCENES,
    SKETCH,
    PointData,
    PointStore,
    QdrantTarget,
    Stores,
    array_id,
    array_points,
    arrays_spec,
    bound_query,
    bound_rows,
    collection_spec,
    engine_eps,
    payload_bytes,
    unpack,
    video_point,
)
from prvr.index.rank import BOUND_EPS, FIRST_CHUNK, Page, Stored, top_k
from prvr.index.schema import FIXED, RAGGED, RECORD, SCHEMA_VERSION
from prvr.index.scoring import evidence_of, exact_of, is_csa, query_vector, refined_bounds
from prvr.index.sketch import BoundQuery, frame_balls, quantize, window_factors
from prvr.index.store import IndexStoreError
from prvr.models.branches import EncodedQueries
from prvr.models.preprocess import window_table
from prvr.words import counted

log = logging.getLogger(__name__)

FORMAT = "prvr-qdrant"
META = "prvr"  # the metadata point's payload key


@dataclass(frozen=True)
class QdrantConfig:
    mode: str = "exact"  # "exact": every proposal of the model; "compact": 32 MS-SL++ medoids per video
    encode_batch: int = 64  # videos encoded at once
    upsert_bytes: int = 8 << 20  # bytes per upsert request (a server takes 32 MB per request)
    timeout: float = 10.0  # seconds a server request may take (connecting included)
    candidate_videos: int = 256  # approximate search: HNSW candidates scored exactly
    hnsw_ef: int = 256  # approximate search: HNSW beam width (at least candidate_videos)
    hnsw_m: int = 16  # edges per node of the scenes' graph
    frame_balls: int = 16  # balls over each video's frame-scale features in the bounds multivector
    first_page: int = 64  # points of the first page of an exact rank (then doubling)
    shards: int = 1  # a server's shards per collection (docs/scale.md); the engine in-process has one
    replicas: int = 1  # a server's copies of each shard


class Fetched:
    """Points fetched for one query, as one segment: ``scoring.VideoArrays`` over them, so that the built-in
    index's exact scores and evidence run on them unchanged. Positions are indices into ``videos``."""

    def __init__(self, records: list[dict], arrays: list[Mapping[str, np.ndarray]], table: np.ndarray,
                 compact: bool) -> None:
        self.videos, self.table, self.per_video, self.compact = records, table, arrays, compact
        self.seg_start = np.array([0, len(records)], dtype=np.int64)
        segment: dict[str, np.ndarray] = {}
        for name in arrays[0]:
            if name not in RAGGED:  # one row per video: the schema's fixed arrays and the sketch
                segment[name] = np.stack([a[name] for a in arrays])
        if "zbasis" in arrays[0]:
            for name in ("zbasis", "zcoef"):
                segment[name] = np.concatenate([a[name] for a in arrays])
            segment["n_zrank"] = np.array([len(a["zbasis"]) for a in arrays], dtype=np.int64)
            segment["n_zcoef"] = np.array([len(a["zcoef"]) for a in arrays], dtype=np.int64)
        self.segment = segment
        self.stored = Stored.of([segment])

    @property
    def windows(self) -> np.ndarray | None:
        """None when the videos store all windows in window_table order, else the table for ``pidx``."""
        return self.table if self.compact else None

    def gather(self, key: str, positions: np.ndarray) -> np.ndarray:
        """Rows of the one-row-per-video array ``key``."""
        if key in self.segment:
            return self.segment[key][positions]
        return np.stack([self.per_video[p][key] for p in positions])

    def ragged(self, key: str, position: int) -> np.ndarray:
        """One video's ragged array ``key`` (``schema.RAGGED``)."""
        return self.per_video[position][key]

    def prefetch(self, keys: Sequence[str], positions: np.ndarray) -> None:
        """Fetched points are in memory: nothing to read ahead."""

    def release(self, keys: Sequence[str], positions: np.ndarray) -> None:
        """Fetched points go with the query."""


class QdrantIndex(Gallery):
    """A Qdrant collection opened for one model; see the module docstring."""

    def __init__(self, target: QdrantTarget, stores: Stores, model, cfg: QdrantConfig, meta: dict,
                 references: ReferenceQueries | None = None) -> None:
        self.target, self.stores, self.model, self.cfg, self.meta = target, stores, model, cfg, meta
        self.references = references
        self._csa = model is not None and is_csa(model)  # (no model: a gallery opened to be written, moved)
        self.table = window_table(int(meta["map_size"])).numpy()
        self._writing = threading.Lock()
        self._reading = threading.Lock()  # one engine call at a time (its shard is not shared across threads)
        self._catalog, self._seqs = self._load_catalog()

    @property
    def store(self):
        """The collection of the videos' points (``NAME``)."""
        return self.stores.videos

    # ------------------------------------------------------------------ opening
    @staticmethod
    def _target(spec: str | QdrantTarget) -> QdrantTarget:
        """The parsed target of a URL (or the target itself)."""
        return spec if isinstance(spec, QdrantTarget) else QdrantTarget.parse(spec)

    @staticmethod
    def new_meta(cfg: QdrantConfig, identity: dict, references: dict | None) -> dict:
        """The metadata of a new gallery."""
        return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "mode": cfg.mode,
                "frame_balls": cfg.frame_balls, **identity, "next_seq": 0, "references": references}

    @classmethod
    def create(cls, spec: str | QdrantTarget, model, cfg: QdrantConfig | None = None,
               references: ReferenceQueries | None = None, stores: Stores | None = None) -> QdrantIndex:
        """A new, empty gallery for this model (refuses an existing one); ``references`` as for
        ``VideoIndex.create``. The collections themselves are made with the first videos."""
        cfg, target = cfg or QdrantConfig(), cls._target(spec)
        if cfg.mode not in ("exact", "compact"):
            raise ValueError(f"index mode must be 'exact' or 'compact', got {cfg.mode!r}")
        stores = stores or target.connect(cfg.timeout)
        if stores.videos.exists() or stores.arrays.exists():
            stores.close()
            raise IndexStoreError(f"{target.where} already exists; open it instead")
        meta = cls.new_meta(cfg, model_identity(model), bank_identity(references))
        return cls(target, stores, model, cfg, meta, references)

    @classmethod
    def open(cls, spec: str | QdrantTarget, model, cfg: QdrantConfig | None = None,
             references: ReferenceQueries | None = None, stores: Stores | None = None) -> QdrantIndex:
        """Open an existing gallery; refuses one made for another model, profile, reference bank or schema,
        or not by prvr."""
        target = cls._target(spec)
        stores = stores or target.connect((cfg or QdrantConfig()).timeout)
        try:
            meta = read_meta(stores.videos)
            check_meta(target, meta, model_identity(model))
            if references is not None and meta.get("references") != bank_identity(references):
                raise IndexMismatchError(f"{target.where} stores the scores of reference bank "
                                         f"{meta.get('references')}, not of the one in use; rebuild it")
        except BaseException:
            stores.close()  # the engine's directory stays locked while it is open
            raise
        cfg = dataclasses.replace(cfg or QdrantConfig(), mode=meta["mode"], frame_balls=meta["frame_balls"])
        return cls(target, stores, model, cfg, meta, references)

    @classmethod
    def open_or_create(cls, spec: str | QdrantTarget, model, cfg: QdrantConfig | None = None,
                       references: ReferenceQueries | None = None) -> QdrantIndex:
        """Open the gallery, or create it when there is none."""
        target = cls._target(spec)
        stores = target.connect((cfg or QdrantConfig()).timeout)
        if stores.videos.exists():
            return cls.open(target, model, cfg, references, stores)
        return cls.create(target, model, cfg, references, stores)

    def close(self) -> None:
        """Release the collections (the engine's directory lock, a client)."""
        self.stores.close()

    def _load_catalog(self) -> tuple[Catalog, list[int]]:
        """Every video's record and insertion number, read from the videos' points (no vectors, no
        arrays)."""
        with self._reading:
            found = [p for i, p in self.store.scroll([*RECORD, "seq"]) if i != META_ID]
        found.sort(key=lambda p: p["seq"])
        records = [{k: p[k] for k in RECORD if k in p} for p in found]
        return Catalog.of(records), [int(p["seq"]) for p in found]

    def refresh(self) -> None:
        """Re-read the list of videos (another process may have changed the collection)."""
        self._catalog, self._seqs = self._load_catalog()
        if self.store.exists():
            self.meta = read_meta(self.store)

    # ------------------------------------------------------------------ what is in it
    @property
    def catalog(self) -> Catalog:
        """The live videos in insertion order, as this process last saw them (``refresh`` re-reads)."""
        return self._catalog

    def describe(self) -> dict:
        """The Qdrant collection: its mode, and where (a server's address or "embedded")."""
        where = "embedded" if self.target.path is not None else self.target.url
        return {"backend": "qdrant", "mode": self.cfg.mode, "name": self.target.collection, "where": where,
                "videos": len(self)}

    # ------------------------------------------------------------------ writing
    def add(self, videos: Sequence[GalleryVideo]) -> None:
        """Encode and upsert videos; GalleryError (bad input) leaves the collection untouched, and a failed
        upload removes the points it had written."""
        videos = list(videos)
        if not videos:
            return
        with self._writing:
            check_videos(videos, set(self.position))  # before encoding: bad input costs nothing
            if self.meta.get("references") != bank_identity(self.references):
                raise GalleryError(f"{self.target.where} stores reference scores of bank "
                                   f"{self.meta.get('references')}; open it with that bank to add videos")
            fixed, ragged = encode_for_index(self.model, videos, self.cfg.mode, self.cfg.encode_batch,
                                             self.references)
            self._upload([v.record() for v in videos], fixed, ragged)
        log.info("indexed %s in %s (%d there)", counted(len(videos), "video"), self.target.where, len(self))

    def add_encoded(self, records: list[dict], fixed: dict[str, np.ndarray],
                    ragged: dict[str, list[np.ndarray]]) -> None:
        """Upsert videos whose model outputs were computed elsewhere, in ``VideoIndex.add_encoded``'s layout
        (``schema.FIXED`` arrays, ``schema.RAGGED`` lists): benchmarks, moving a gallery."""
        check_encoded(fixed, ragged, len(records))
        bank = (self.meta.get("references") or {}).get("count", 0)
        if fixed["ref_clip"].shape[1:] != (bank,) or fixed["ref_frame"].shape[1:] != (bank,):
            raise GalleryError(f"add_encoded: this gallery stores {bank} reference scores per video, got "
                               f"{fixed['ref_clip'].shape[1:]}")
        with self._writing:
            check_ids([r["id"] for r in records], self.position)
            self._upload(records, fixed, ragged)

    def points(self, records: list[dict], fixed: dict[str, np.ndarray], ragged: dict[str, list[np.ndarray]],
               seq0: int) -> Iterator[tuple[PointData, list[PointData]]]:
        """The points of these videos (insertion numbers from seq0) and of their arrays, made 64 at a time."""
        for a in range(0, len(records), 64):
            part = slice(a, a + 64)
            units, pnorm = fixed["units"][part], fixed["pnorm"][part]
            spans = self.table[fixed["pidx"][part].astype(np.int64)]
            balls = frame_balls(ragged["zbasis"][part], ragged["zcoef"][part], self.cfg.frame_balls)
            codes, scale, err, norm = quantize(units)
            pinv, pinv_scale = window_factors(pnorm, spans, units.shape[1])
            sketch = {"codes": codes, "scale": scale, "err": err, "norm": norm, "pinv": pinv,
                      "pinv_scale": pinv_scale, **balls}
            bounds = bound_rows(units, pnorm, spans, balls)
            scenes = scenes_of.scene_centres(units)
            for i in range(len(units)):
                video = {**{k: fixed[k][a + i] for k in FIXED}, **{k: ragged[k][a + i] for k in RAGGED},
                         **{k: sketch[k][i] for k in SKETCH}}
                seq = seq0 + a + i
                yield video_point(records[a + i], seq, bounds[i], scenes[i]), array_points(seq, video)

    def _upload(self, records: list[dict], fixed: dict[str, np.ndarray],
                ragged: dict[str, list[np.ndarray]]) -> None:
        """Upsert points in requests of at most ``upsert_bytes``, then advance the insertion counter; on any
        failure the points already written are deleted again. The collection is made with the first videos
        (their vector width), its metadata point with it."""
        seq0 = int(self.meta["next_seq"])
        written: list[str] = []
        try:
            with self._reading:
                if not self.store.exists():
                    cfg = self.cfg
                    self.stores.arrays.create(arrays_spec(cfg.shards, cfg.replicas))
                    self.store.create(collection_spec(int(fixed["units"].shape[-1]), cfg.hnsw_m,
                                                      shards=cfg.shards, replicas=cfg.replicas))
                    self.store.upsert([PointData(META_ID, {}, {META: self.meta})])
            part, size = [], 0
            for video, arrays in self.points(records, fixed, ragged, seq0):
                part.append((video, arrays))
                size += sum(payload_bytes(p) for p in (video, *arrays))
                if size >= self.cfg.upsert_bytes:
                    self._write(part, written)
                    part, size = [], 0
            if part:
                self._write(part, written)
            self._set_meta(next_seq=seq0 + len(records))
            with self._reading:
                self.stores.arrays.settle()
                self.store.settle()
        except BaseException:
            if written:
                with self._reading:
                    self._delete(written)
            raise
        added = [{k: r[k] for k in RECORD} for r in records]
        self._catalog = Catalog.of(self._catalog.videos + added)
        self._seqs = self._seqs + list(range(seq0, seq0 + len(records)))

    def _write(self, part: list[tuple[PointData, list[PointData]]], written: list[int]) -> None:
        """Upsert one request's videos (their arrays first, so that a video point always has them), noting
        them as written."""
        with self._reading:
            self.stores.arrays.upsert([a for _, arrays in part for a in arrays])
            self.store.upsert([video for video, _ in part])
        written.extend(video.id for video, _ in part)

    def _delete(self, seqs: Sequence[int]) -> None:
        """Delete videos' points and their arrays' points (under ``_reading``)."""
        self.store.delete(list(seqs))
        self.stores.arrays.delete([array_id(s, g) for s in seqs for g in GROUPS])

    def _set_meta(self, **change: object) -> None:
        """Update the gallery's metadata point."""
        meta = {**self.meta, **change}
        with self._reading:
            self.store.set_payload(META_ID, {META: meta})
        self.meta = meta

    def remove(self, ids: Sequence[str]) -> None:
        """Remove videos by id; unknown ids are an error and nothing changes (an id given twice is removed
        once)."""
        ids = list(dict.fromkeys(ids))
        with self._writing:
            unknown = [i for i in ids if i not in self.position]
            if unknown:
                raise GalleryError(f"no video with id {unknown[:5]} in {self.target.where}")
            if ids:
                seq = dict(zip((v["id"] for v in self._catalog.videos), self._seqs, strict=True))
                with self._reading:
                    self._delete([seq[i] for i in ids])
                    self.stores.arrays.settle()
                    self.store.settle()
            gone = set(ids)
            keep = [i for i, v in enumerate(self._catalog.videos) if v["id"] not in gone]
            self._catalog = Catalog.of([self._catalog.videos[i] for i in keep])
            self._seqs = [self._seqs[i] for i in keep]

    # ------------------------------------------------------------------ ranking
    def _fetch(self, seqs: Sequence[int], group: str) -> dict[int, dict[str, np.ndarray]]:
        """One group of arrays (``qdrant_store.GROUPS``) of videos by insertion number."""
        with self._reading:
            got = self.stores.arrays.retrieve([array_id(s, group) for s in seqs], list(ARRAYS))
        return {int(s): unpack(got[array_id(s, group)]) for s in seqs}

    def _pages(self, unit: np.ndarray, k: int, w: Weights, approximate: bool) -> Iterator[Page]:
        """The candidates of a rank, by the engine (see the module docstring)."""
        frame = w.frame > 0 and not self._csa
        rows, extra = bound_query(unit, w, frame), (0.0 if frame else w.frame)
        eps = engine_eps(w)

        def page(hits: list, rest: float) -> Page:
            return Page(np.array([h.id for h in hits], dtype=np.int64),
                        np.array([h.score for h in hits]) + extra + eps, rest)

        if approximate:
            with self._reading:
                near = self.store.query(SCENES, [unit.tolist()], self.cfg.candidate_videos, exact=False,
                                        hnsw_ef=max(self.cfg.hnsw_ef, self.cfg.candidate_videos))
                hits = self.store.query(BOUNDS, rows, len(near), ids=[h.id for h in near]) if near else []
            yield page(hits, -np.inf)
            return
        # each page asks for the best ``limit`` again, not for the next ones (an offset): the engine may order
        # equal scores differently in two scans, and a point tied at a page's edge would be skipped
        seen: set[int] = set()
        limit = max(FIRST_CHUNK, 2 * k, self.cfg.first_page)
        while True:
            with self._reading:
                hits = self.store.query(BOUNDS, rows, limit)
            full = len(hits) == limit
            rest = hits[-1].score + extra + eps if full else -np.inf
            yield page([h for h in hits if h.id not in seen], rest)
            seen.update(h.id for h in hits)
            if not full:
                return
            limit *= 2

    def _top(self, q: np.ndarray | EncodedQueries, k: int, w: Weights,
             approximate: bool) -> tuple[list[VideoEvidence], int, int]:
        """The k best videos' evidence (``rank.top_k`` over the engine's pages, refined by the videos'
        sketches), how many were scored exactly, how many live."""
        live = len(self)
        if not live:
            return [], 0, 0
        v = query_vector(q)
        bq = BoundQuery.of(v)
        unit = (v / max(float(np.linalg.norm(v.astype(np.float64))), 1e-12)).astype(np.float32)
        record = dict(zip(self._seqs, self._catalog.videos, strict=True))
        compact = self.cfg.mode == "compact"
        cache: dict[str, dict[int, dict[str, np.ndarray]]] = {g: {} for g in GROUPS}  # fetched once a query

        def arrays(seqs: np.ndarray, *groups: str) -> Fetched:
            """These videos with these groups of arrays."""
            for g in groups:
                missing = [int(s) for s in seqs if int(s) not in cache[g]]
                if missing:
                    cache[g].update(self._fetch(missing, g))
            return Fetched([record[int(s)] for s in seqs],
                           [{n: a for g in groups for n, a in cache[g][int(s)].items()} for s in seqs],
                           self.table, compact)

        def refine(seqs: np.ndarray, tau: float) -> np.ndarray:
            return refined_bounds(self.model, arrays(seqs, "sketch"), np.arange(len(seqs)), bq, w, tau,
                                  torch.get_num_threads())

        def score(seqs: np.ndarray) -> np.ndarray:
            groups = ("exact", "evidence") if self._csa else ("exact",)  # (CSA scores frames)
            return exact_of(self.model, arrays(seqs, *groups), np.arange(len(seqs)), q, w, bq).total

        seqs, _, n = top_k(self._pages(unit, k, w, approximate), k, score, refine,
                           BOUND_EPS * (1 + w.clip + w.frame), shortlist=4 * max(FIRST_CHUNK, 2 * k))
        if not len(seqs):
            return [], n, live
        hits = arrays(seqs, "exact", "evidence")
        return list(evidence_of(self.model, hits, np.arange(len(seqs)), q, w)), n, live


def read_meta(store: PointStore) -> dict:
    """The gallery's metadata (its metadata point), or an error saying the collection is not prvr's."""
    if not store.exists():
        raise IndexStoreError(f"{store.target.where} does not exist; create it first")
    meta = store.retrieve([META_ID], [META]).get(META_ID, {}).get(META)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise IndexMismatchError(f"{store.target.where} was not made by prvr (no {META!r} metadata point)")
    return meta


def check_meta(target: QdrantTarget, meta: dict, identity: dict) -> None:
    """IndexMismatchError unless the gallery has this code's schema and was made for this model identity."""
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise IndexMismatchError(f"{target.where} has schema {meta.get('schema_version')}, this code reads "
                                 f"{SCHEMA_VERSION}; rebuild the index")
    for key, ours in identity.items():
        if meta.get(key) != ours:
            raise IndexMismatchError(f"{target.where} was built with {key} = {meta.get(key)!r}, but the "
                                     f"model in use has {key} = {ours!r}; rebuild the collection for it")
