"""QdrantIndex: the gallery in a Qdrant collection, ranked exactly, behind the same interface as VideoIndex.

```python
index = QdrantIndex.open_or_create("qdrant://localhost:6333/prvr", model)   # or "qdrant+local://DIR"
index.add([GalleryVideo(...)]); index.remove(["v1"])
evidence = index.rank(q, k=10, weights=None)     # the same Evidence as VideoIndex.rank, best first
```

One point per video (``prvr.index.qdrant_store``): the multivector of its unit-normalised proposals (all
windows, or the 32 medoids in compact mode, from ``encode_for_index`` as the built-in index stores them), the
multivector of its frame balls, and a payload of its record, insertion order and per-video arrays. The
collection's metadata holds the model's identity (fingerprint, profile, geometry) and the mode; opening it
for another model is refused.

Exact ranking (Fagin's threshold algorithm over two of Qdrant's orders): Qdrant's MAX_SIM of the unit query
over a video's ``windows`` is its clip-scale score; over its ``frame_balls`` ([centre, radius] of balls
covering its zhat rows, queried with [q^, 1]) it is an upper bound of its frame score. Each round takes the
best L videos of both orders (exhaustive scans, ``exact=True``) and scores the new ones exactly with the
built-in index's own code (``exact_rows``: clip from the windows, key clip the first argmax, frame
q^.z_key). A video in neither list has total <= w_clip * (the last clip score) + w_frame * min(1, the last
ball bound) + BOUND_EPS; once that falls below the k-th best exact total no unseen video can reach it, else L
doubles. Equal totals are broken by insertion order, as the built-in index breaks them by position.
``approximate=True`` takes Qdrant's HNSW candidates instead (``candidate_videos`` of them), scored exactly.
CSA models are supported: their frame score, at most 1, comes from the stored frames and the query's
tokens, as in VideoIndex; the balls bound MS-SL's frame score only, so for CSA the frame bound is 1.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from prvr.index import qdrant_store as layout
from prvr.index.evidence import VideoEvidence, best_first
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
from prvr.index.qdrant_store import BALLS, RECORD, WINDOWS, QdrantTarget, guarded, point_id
from prvr.index.rank import BOUND_EPS, EXACT, FIRST_CHUNK, kth_largest, typed_list
from prvr.index.schema import FIXED, RAGGED
from prvr.index.scoring import evidence_of, exact_of, is_csa, query_vector
from prvr.index.sketch import BoundQuery
from prvr.index.store import IndexStoreError
from prvr.models.branches import EncodedQueries
from prvr.models.preprocess import window_table
from prvr.words import counted

log = logging.getLogger(__name__)

FORMAT = "prvr-qdrant"
SCHEMA_VERSION = 5  # 2: fine rows, segments and reference scores per video; 3: the moments' context;
# 4: the reference bank's statistics of the fine and context rows; 5: the moments context's beta recorded
META = "prvr"  # the key of this package's entry in the collection's metadata


@dataclass(frozen=True)
class QdrantConfig:
    mode: str = "exact"  # "exact": every proposal of the model; "compact": 32 MS-SL++ medoids per video
    encode_batch: int = 64  # videos encoded at once
    upsert_bytes: int = 8 << 20  # payload bytes per upsert request (a server takes 32 MB per request)
    timeout: float = 10.0  # seconds a server request may take (connecting included)
    candidate_videos: int = 256  # approximate search: HNSW candidates scored exactly
    hnsw_ef: int = 256  # approximate search: HNSW beam width (at least candidate_videos)
    frame_balls: int = 16  # balls over each video's zhat rows: the frame-score bound of the exact pages


class ExactLists(NamedTuple):
    """The arrays ``rank.exact_rows`` reads (``rank.EXACT``), as one-segment typed Lists."""

    units: object
    pnorm: object
    zhat: object
    pidx: object


class Candidates:
    """Videos fetched from Qdrant as one segment, read the way the built-in index reads a ``Snapshot``
    (stored, seg_start, windows, table, gather, frames, rows, videos), so that its exact scores and
    evidence code run on them unchanged."""

    def __init__(self, points: Sequence[dict], table: np.ndarray, keep: Sequence[str] | None = None) -> None:
        self.videos = [p["record"] for p in points]
        self.table = table
        self.arrays = {f: np.stack([p["arrays"][f] for p in points]) for f in EXACT}
        # each video's other stored arrays by name (``keep``: only these; the exact-score ones are above)
        others = [k for k in points[0]["arrays"] if k not in EXACT and (keep is None or k in keep)]
        self.per_video = [{k: p["arrays"][k] for k in others} for p in points]
        self.seg_start = np.array([0, len(points)], dtype=np.int64)
        self.stored = ExactLists(*(typed_list([self.arrays[f]]) for f in EXACT))

    @property
    def windows(self) -> np.ndarray | None:
        """None when the videos store all windows in window_table order, else the table for ``pidx``."""
        return None if self.arrays["pnorm"].shape[1] == len(self.table) else self.table

    def gather(self, key: str, positions: np.ndarray) -> np.ndarray:
        """Rows of per-video array ``key``."""
        if key in self.arrays:
            return self.arrays[key][positions]
        return np.stack([self.per_video[p][key] for p in positions])

    def ragged(self, key: str, position: int) -> np.ndarray:
        """One video's ragged array ``key`` (``schema.RAGGED``)."""
        return self.per_video[position][key]

    def frames(self, position: int) -> np.ndarray:
        """Encoded frames (L, H) of one video."""
        return self.per_video[position]["frames"]

    def rows(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw row start / end seconds of one video."""
        return self.per_video[position]["row_start"], self.per_video[position]["row_end"]


def _vector_size(model) -> int:
    """Width of the model's encoded vectors (MS-SL: hidden_size; the bridge: its class-text vectors)."""
    size = getattr(model.cfg, "hidden_size", None)
    if size is None and hasattr(model, "class_text"):
        size = model.class_text.shape[-1]
    if size is None:
        raise ValueError(f"cannot tell the vector width of {type(model).__name__} (no cfg.hidden_size)")
    return int(size)


class QdrantIndex(Gallery):
    """A Qdrant collection opened for one model; see the module docstring."""

    def __init__(self, target: QdrantTarget, client, model, cfg: QdrantConfig, meta: dict,
                 references: ReferenceQueries | None = None) -> None:
        self.target, self.client, self.model, self.cfg, self.meta = target, client, model, cfg, meta
        self.references = references
        self._csa = is_csa(model)
        self.table = window_table(int(model.cfg.map_size)).numpy()
        self._writing = threading.Lock()
        # the embedded client is plain Python over shared lists: one call at a time
        self._local = threading.Lock() if target.path is not None else nullcontext()
        self._catalog = self._load_catalog()

    # ------------------------------------------------------------------ opening
    @staticmethod
    def _target(spec: str | QdrantTarget) -> QdrantTarget:
        """The parsed target of a URL (or the target itself)."""
        return spec if isinstance(spec, QdrantTarget) else QdrantTarget.parse(spec)

    def _call(self, what: str, method: str, *args: object, **kw: object):
        """self.client.<method>(collection, ...), errors naming the target (see ``guarded``)."""
        with self._local:
            call = getattr(self.client, method)
            return guarded(self.target, what, call, self.target.collection, *args, **kw)

    @classmethod
    def create(cls, spec: str | QdrantTarget, model, cfg: QdrantConfig | None = None,
               references: ReferenceQueries | None = None) -> QdrantIndex:
        """Make a new, empty collection for this model (refuses an existing one); ``references`` as for
        ``VideoIndex.create``."""
        from qdrant_client import models

        cfg, target = cfg or QdrantConfig(), cls._target(spec)
        if cfg.mode not in ("exact", "compact"):
            raise ValueError(f"index mode must be 'exact' or 'compact', got {cfg.mode!r}")
        client = target.connect(cfg.timeout)
        if guarded(target, "check the collection", client.collection_exists, target.collection):
            client.close()
            raise IndexStoreError(f"{target.where} already exists; open it instead")
        meta = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "mode": cfg.mode,
                "frame_balls": cfg.frame_balls, **model_identity(model), "next_seq": 0,
                "references": bank_identity(references)}
        multi = models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)
        size = _vector_size(model)
        dot = models.Distance.DOT
        vectors = {WINDOWS: models.VectorParams(size=size, distance=dot, multivector_config=multi),
                   # the balls are read by exhaustive scans only: no HNSW graph
                   BALLS: models.VectorParams(size=size + 1, distance=dot, multivector_config=multi,
                                              hnsw_config=models.HnswConfigDiff(m=0))}
        guarded(target, "create the collection", client.create_collection, target.collection,
                vectors_config=vectors, metadata={META: meta})
        return cls(target, client, model, cfg, meta, references)

    @classmethod
    def open(cls, spec: str | QdrantTarget, model, cfg: QdrantConfig | None = None,
             references: ReferenceQueries | None = None) -> QdrantIndex:
        """Open an existing collection; refuses one made for another model, profile or reference bank, or
        not by prvr."""
        target = cls._target(spec)
        client = target.connect((cfg or QdrantConfig()).timeout)
        try:
            meta = cls._checked_meta(target, client, model)
            if references is not None and meta.get("references") != bank_identity(references):
                raise IndexMismatchError(f"{target.where} stores the scores of reference bank "
                                         f"{meta.get('references')}, not of the one in use; rebuild it")
        except BaseException:
            client.close()  # an embedded store's directory stays locked while a client is open
            raise
        cfg = dataclasses.replace(cfg or QdrantConfig(), mode=meta["mode"], frame_balls=meta["frame_balls"])
        return cls(target, client, model, cfg, meta, references)

    @staticmethod
    def _checked_meta(target: QdrantTarget, client, model) -> dict:
        """The collection's prvr metadata, refused when missing or made for another model or schema."""
        if not guarded(target, "check the collection", client.collection_exists, target.collection):
            raise IndexStoreError(f"{target.where} does not exist; create it first")
        info = guarded(target, "read the collection", client.get_collection, target.collection)
        meta = (info.config.metadata or {}).get(META)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise IndexMismatchError(f"{target.where} was not made by prvr (no {META!r} metadata)")
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise IndexMismatchError(f"{target.where} has schema {meta.get('schema_version')}, this code "
                                     f"reads {SCHEMA_VERSION}; rebuild the collection")
        for key, ours in model_identity(model).items():
            if meta.get(key) != ours:
                raise IndexMismatchError(f"{target.where} was built with {key} = {meta.get(key)!r}, but the "
                                         f"model in use has {key} = {ours!r}; rebuild the collection for it")
        return meta

    @classmethod
    def open_or_create(cls, spec: str | QdrantTarget, model, cfg: QdrantConfig | None = None,
                       references: ReferenceQueries | None = None) -> QdrantIndex:
        """Open the collection, or create it when there is none."""
        target = cls._target(spec)
        client = target.connect((cfg or QdrantConfig()).timeout)
        exists = guarded(target, "check the collection", client.collection_exists, target.collection)
        client.close()  # an embedded store admits one client at a time
        if exists:
            return cls.open(target, model, cfg, references)
        return cls.create(target, model, cfg, references)

    def close(self) -> None:
        """Release the client (an embedded store's directory lock)."""
        self.client.close()

    def _load_catalog(self) -> Catalog:
        """Every video's record and insertion number, read from the collection (no vectors, no arrays)."""
        found, offset = [], None
        while True:
            points, offset = self._call("list the videos", "scroll", limit=1024, offset=offset,
                                        with_payload=[*RECORD, "seq"], with_vectors=False)
            found.extend(p.payload for p in points)
            if offset is None:
                break
        found.sort(key=lambda p: p["seq"])
        return Catalog.of([{k: p[k] for k in RECORD if k in p} for p in found])

    def refresh(self) -> None:
        """Re-read the list of videos (another process may have changed the collection)."""
        self._catalog = self._load_catalog()

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
        (``schema.FIXED`` arrays, ``schema.RAGGED`` lists). For tests, benchmarks."""
        check_encoded(fixed, ragged, len(records))
        with self._writing:
            check_ids([r["id"] for r in records], self.position)
            self._upload(records, fixed, ragged)

    def _upload(self, records: list[dict], fixed: dict[str, np.ndarray],
                ragged: dict[str, list[np.ndarray]]) -> None:
        """Upsert points in requests of at most ``upsert_bytes``, then advance the insertion counter; on any
        failure the points already written are deleted again."""
        seq0, parts, part, size = int(self.meta["next_seq"]), [], [], 0
        zhat, n_balls = fixed["zhat"], self.cfg.frame_balls  # clustered 64 videos at a time (memory)
        balls = [b for a in range(0, len(zhat), 64) for b in layout.frame_balls(zhat[a:a + 64], n_balls)]
        for i, record in enumerate(records):
            video = {**{k: fixed[k][i] for k in FIXED}, **{k: ragged[k][i] for k in RAGGED}}
            part.append(self._point(record, seq0 + i, video, balls[i]))
            size += layout.payload_bytes(video) * 4 // 3 + 4 * (video["zhat"].size + balls[i].size)
            if size >= self.cfg.upsert_bytes or i == len(records) - 1:
                parts.append(part)
                part, size = [], 0
        written: list[str] = []
        try:
            for part in parts:
                self._call("upsert videos", "upsert", points=part, wait=True)
                written.extend(p.id for p in part)
            self._set_meta(next_seq=seq0 + len(records))
        except BaseException:
            if written:
                self._delete(written)
            raise
        added = [{k: r[k] for k in RECORD if k in r} for r in records]
        self._catalog = Catalog.of(self._catalog.videos + added)

    def _point(self, record: dict, seq: int, arrays: dict[str, np.ndarray], balls: np.ndarray):
        """The Qdrant point of one video (see ``prvr.index.qdrant_store``)."""
        from qdrant_client import models

        spans = self.table[arrays["pidx"].astype(np.int64)]
        identity = {k: self.meta[k] for k in ("profile", "model_fingerprint")}
        vectors = {WINDOWS: layout.windows(arrays["units"], arrays["pnorm"], spans).tolist(),
                   BALLS: balls.tolist()}
        return models.PointStruct(id=point_id(record["id"]), vector=vectors,
                                  payload={**record, "seq": seq, **identity, "arrays": layout.pack(arrays)})

    def _set_meta(self, **change: object) -> None:
        """Update this package's entry in the collection's metadata."""
        meta = {**self.meta, **change}
        self._call("update the collection's metadata", "update_collection", metadata={META: meta})
        self.meta = meta

    def _delete(self, point_ids: list[str]) -> None:
        """Delete points by point id (waits until applied)."""
        from qdrant_client import models

        selector = models.PointIdsList(points=point_ids)
        self._call("delete videos", "delete", points_selector=selector, wait=True)

    def remove(self, ids: Sequence[str]) -> None:
        """Remove videos by id; unknown ids are an error and nothing changes."""
        ids = list(dict.fromkeys(ids))
        with self._writing:
            unknown = [i for i in ids if i not in self.position]
            if unknown:
                raise GalleryError(f"no video with id {unknown[:5]} in {self.target.where}")
            if ids:
                self._delete([point_id(i) for i in ids])
            gone = set(ids)
            self._catalog = Catalog.of([v for v in self._catalog.videos if v["id"] not in gone])

    # ------------------------------------------------------------------ ranking
    # Exact scores and evidence come from prvr.index.scoring, run on ``Candidates``: the built-in index's
    # own arithmetic, so the same bits, key clips, attention and CSA frame scores.

    def _fetch(self, point_ids: list[str]) -> list[dict]:
        """Records, insertion numbers and arrays of points, in the order asked."""
        got = self._call("read videos", "retrieve", ids=point_ids, with_payload=True, with_vectors=False)
        by_id = {str(p.id): p.payload for p in got}
        return [{"record": {k: by_id[i][k] for k in RECORD if k in by_id[i]}, "seq": int(by_id[i]["seq"]),
                 "arrays": layout.unpack(by_id[i]["arrays"])} for i in point_ids if i in by_id]

    def _candidates(self, unit: np.ndarray, limit: int, exact: bool, using: str = WINDOWS) -> list:
        """Qdrant's best ``limit`` points by MAX_SIM of ``unit`` over the named multivector ``using`` (ids
        and scores), exhaustive or by HNSW."""
        from qdrant_client import models

        params = None
        if self.target.url is not None:  # the embedded store always scans (and warns when given params)
            params = models.SearchParams(exact=exact, hnsw_ef=None if exact else max(self.cfg.hnsw_ef, limit))
        return self._call("search", "query_points", query=[unit.tolist()], using=using, limit=limit,
                          search_params=params, with_payload=False, with_vectors=False).points

    def _score(self, found: list[dict], q: np.ndarray | EncodedQueries, w: tuple[float, float],
               bq: BoundQuery) -> np.ndarray:
        """Exact totals of fetched videos."""
        return exact_of(self.model, Candidates(found, self.table), np.arange(len(found)), q, w, bq).total

    def _top(self, q: np.ndarray | EncodedQueries, k: int, w: Weights,
             approximate: bool) -> tuple[list[VideoEvidence], int, int]:
        """The k best videos' evidence (Fagin's threshold algorithm, see the module docstring), how many
        were scored exactly, how many live."""
        live = len(self)
        v = query_vector(q)
        bq = BoundQuery.of(v)
        unit = (v / max(float(np.linalg.norm(v.astype(np.float64))), 1e-12)).astype(np.float32)
        eps = BOUND_EPS * (1 + w[0] + w[1])
        seen: dict[str, tuple[dict, float]] = {}
        limit = max(k, self.cfg.candidate_videos) if approximate else max(FIRST_CHUNK, 2 * k)
        ball_bound = not (approximate or self._csa)  # the balls bound MS-SL's frame score, not CSA's
        while live:
            points = self._candidates(unit, limit, exact=not approximate)
            balls = self._candidates(np.append(unit, 1.0).astype(np.float32), limit, exact=True,
                                     using=BALLS) if ball_bound else []
            ids = dict.fromkeys(str(p.id) for p in (*points, *balls) if str(p.id) not in seen)
            new = self._fetch(list(ids))
            for p, total in zip(new, self._score(new, q, w, bq) if new else [], strict=True):
                seen[point_id(p["record"]["id"])] = (p, float(total))
            if approximate or len(points) < limit or (ball_bound and len(balls) < limit):  # all seen
                break
            # a video in neither list has clip <= the last clip score and frame <= the last ball bound
            frame = min(1.0, balls[-1].score) if ball_bound else 1.0
            tau = kth_largest(np.array([t for _, t in seen.values()]), k)
            if w[0] * points[-1].score + w[1] * frame + eps < tau:
                break
            limit *= 2
        points = list(seen.values())
        best = best_first(np.array([t for _, t in points]), np.array([p["seq"] for p, _ in points]), k)
        found = [points[i][0] for i in best]
        hits = (evidence_of(self.model, Candidates(found, self.table), np.arange(len(found)), q, w)
                if found else [])
        return hits, len(seen), live
