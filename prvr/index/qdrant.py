"""The Qdrant store: a gallery in a Qdrant collection (``QdrantStore``, the ``storage.GalleryStore`` of
``prvr.index.qdrant_store``'s layout), and ``QdrantIndex``, a ``Gallery`` over it.

```python
index = QdrantIndex.open_or_create("qdrant://localhost:6333/prvr", model)   # or "qdrant+local://DIR"
index.add([GalleryVideo(...)]); index.remove(["v1"])
evidence = index.rank(q, k=10, weights=None)     # the same Evidence as VideoIndex.rank, best first
```

``qdrant+local://DIR`` runs the Qdrant engine itself in this process (``qdrant-edge-py``), ``qdrant://`` a
server through qdrant-client; both hold the layout of ``prvr.index.qdrant_store``: a point per video (its id
its insertion number) with a float16 ``bounds`` multivector (an upper bound of its total, no graph); beside
them, in a second collection, its arrays in four points by what reads them (sketch, exact scores, evidence,
words), and in a third its approximate-search keys, a point each (float16, an HNSW graph over int8 copies).
The gallery's metadata (the model's identity, the mode, the insertion counter) is one more point; opening it
for another model, profile, reference bank or schema is refused, and so is a gallery of the layout before
the keys' collection (``python -m prvr.index move`` copies it into this one).

Exact ranking is the gallery's rank tail (``Gallery.rank``: ``rank.top_k``) fed by the engine
(``QdrantView``): pages of the points with the best ``bounds`` scores (exhaustive scans: the score of a
video's balls at the query's weights is an upper bound of its total; a page's last score bounds every point
it does not hold), refined by the sketch of the candidates that can still reach the k-th best (decoded once
per process into ``SketchTable``, then read in place), exact scores of those the sketch leaves (their
exact-score arrays fetched by id: the same kernels and the same bits as the built-in store), the next page
(``PAGE_GROWTH`` times as many) only while its bound can. Equal totals are broken by insertion order, as
the built-in index breaks them by position. ``approximate=True`` asks the engine's HNSW graph over the keys
(``scene_keys`` centres of each video's window directions, a point each) for the ``candidate_keys`` nearest
and takes the ``candidate_videos`` videos whose best key is among them (``approximate.best_videos``, as the
built-in index does with its faiss lists) as the one page, bounded by the same balls, refined and scored
exactly: how many points it reads does not grow with the gallery (below ``key_scan_videos`` the engine scans
the keys instead of walking the graph). CSA models are supported: their frame score comes from the stored
frames and the query's tokens, so the frame balls do not bound it and the bound takes frame <= 1.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from prvr.index.approximate import best_videos, window_keys
from prvr.index.encoding import ReferenceQueries
from prvr.index.gallery import Gallery, IndexMismatchError
from prvr.index.qdrant_store import (
    ARRAYS,
    BOUNDS,
    GROUPS,
    KEY,
    META_ID,
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
    key_ids,
    key_points,
    keys_spec,
    pack,
    payload_bytes,
    unpack,
    video_point,
)
from prvr.index.query import Weights
from prvr.index.rank import FIRST_CHUNK, SHORTLIST, Page, Stored
from prvr.index.schema import FIXED, RAGGED, RECORD, SCHEMA_VERSION, WORDS
from prvr.index.sketch import BoundQuery, frame_balls, quantize, window_factors
from prvr.index.storage import Catalog, DataFolder, Fixed, Ragged, Refine
from prvr.index.store import IndexStoreError
from prvr.index.words import Words, WordsTable
from prvr.models.preprocess import window_table

FORMAT = "prvr-qdrant"
PAGE_GROWTH = 8  # each page of an exact rank asks for this many times the points of the one before
KEYS = "windows"  # what the keys are centres of (``approximate.window_keys``), in the metadata
META = "prvr"  # the metadata point's payload key


@dataclass(frozen=True)
class QdrantConfig:
    mode: str = "exact"  # "exact": every proposal of the model; "compact": 32 MS-SL++ medoids per video
    encode_batch: int = 64  # videos encoded at once
    upsert_bytes: int = 8 << 20  # bytes per upsert request (a server takes 32 MB per request)
    timeout: float = 10.0  # seconds a server request may take (connecting included)
    candidate_videos: int = 128  # approximate search: videos (by their best key) bounded, refined, scored
    candidate_keys: int = 1024  # approximate search: nearest keys the engine finds (>= scene_keys x videos;
    # 100,000 videos, 40 queries: 1024, 1536 and 2048 keys (ef the same) all found 0.9775 of the exact top 10,
    # in 21.9, 24.2 and 27.0-29.1 ms: the 128 videos bind, not the keys)
    hnsw_ef: int = 1024  # approximate search: HNSW beam width (at least candidate_keys)
    key_scan_videos: int = 20_000  # approximate search below this many videos: the engine scans every key;
    # from it, the HNSW graph
    hnsw_m: int = 16  # edges per node of the keys' graph
    frame_balls: int = 16  # balls over each video's frame-scale features in the bounds multivector
    scene_keys: int = 8  # keys a video in the keys' collection: centres of its windows' directions
    sketch_cache_bytes: int = 3 << 30  # decoded sketches kept for refining, read at open (the built-in
    # keeps all, mapped): 22 KB a video at H = 384, so 140,000 videos; beyond, each rank fetches its
    # candidates' (20,000 videos: approximate rank() 22 -> 13.5 ms in memory; benchmarks/RESULTS.md)
    first_page: int = 512  # points of the first page of an exact rank (then PAGE_GROWTH times more, and the
    # whole gallery at once where that is next; 10,000 videos: a third of the queries needed more than 64)
    first_page_share: float = 0.02  # ... and at least this share of the gallery: the videos whose bounds
    # reach the k-th best total grow with it, and every page is a scan of every point (100,000 videos: with
    # 512, 12 queries of 30 needed a second scan of 128 ms; with 2,000 none of 40; a scan for 4,000 took
    # 10-19 ms more than for 2,000: the engine's cost grows with the points it returns)
    segments: int = 4  # segments of the videos' collection the engine keeps (a shard of a server: each);
    # a query searches them at once, a thread each, and the one being written counts (the engine's default
    # makes one of a gallery this small): at 10,000 videos the best 512 bounds took 17-23 ms on two cores,
    # 25-26 ms in one segment on one (benchmarks/RESULTS.md, session 23)
    shards: int = 1  # a server's shards per collection (docs/scale.md); the engine in-process has one
    replicas: int = 1  # a server's copies of each shard


class VideoPoints(NamedTuple):
    """The points one video is written as, in each collection."""

    video: PointData
    arrays: list[PointData]
    keys: list[PointData]


class Fetched:
    """Points fetched for one query, as one segment: ``scoring.VideoArrays`` over them, so that the built-in
    index's exact scores and evidence run on them unchanged. Positions are indices into ``videos``."""

    reads_ahead = False  # (in memory)

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


class SketchRows:
    """Rows of the table of decoded sketches (``SketchTable``) as ``scoring.VideoArrays``: positions are
    insertion numbers; what refining reads (``sketch.SKETCH``) is there, in place."""

    reads_ahead = False  # (in memory)

    def __init__(self, arrays: dict[str, np.ndarray], stored: Stored, table: np.ndarray,
                 compact: bool) -> None:
        self.arrays, self.stored, self.table, self.compact = arrays, stored, table, compact
        self.videos: list[dict] = []  # (refining reads no record)
        self.seg_start = np.array([0, len(next(iter(arrays.values())))], dtype=np.int64)

    @property
    def windows(self) -> np.ndarray | None:
        """None when the videos store all windows in window_table order, else the table for ``pidx``."""
        return self.table if self.compact else None

    def gather(self, key: str, positions: np.ndarray) -> np.ndarray:
        """Rows of the sketch array ``key``."""
        return self.arrays[key][positions]

    def ragged(self, key: str, position: int) -> np.ndarray:
        """The sketch holds no ragged array."""
        raise KeyError(f"{key!r} is not in a video's sketch")

    def prefetch(self, keys: Sequence[str], positions: np.ndarray) -> None:
        """The table is in memory: nothing to read ahead."""


class SketchTable:
    """Every video's decoded sketch (``GROUPS["sketch"]``), one row per insertion number, filled as ranks
    refine videos (read once per process, then in place like the built-in index's in-memory sketch), grown by
    doubling up to ``budget`` bytes; a removed video's row stays unused (its number is never given again)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.arrays: dict[str, np.ndarray] = {}
        self.have = np.zeros(0, dtype=bool)
        self.stored: Stored | None = None
        self.row_bytes = 0
        self.table, self.compact = np.zeros((0, 2), np.int64), False
        self._lock = threading.Lock()

    def missing(self, seqs: np.ndarray) -> np.ndarray:
        """Those of these insertion numbers whose sketch is not in the table."""
        have = self.have
        inside = seqs < len(have)
        return np.concatenate([seqs[inside][~have[seqs[inside]]], seqs[~inside]])

    def fits(self, seqs: int) -> bool:
        """Whether rows for this many insertion numbers fit the budget (before the first row: yes)."""
        return self.row_bytes * seqs <= self.budget

    def put(self, got: Mapping[int, Mapping[str, np.ndarray]]) -> SketchRows | None:
        """These videos' sketches written to their rows (grown as needed); the table as it is now (None: their
        rows would not fit the budget)."""
        with self._lock:
            if got:
                top = max(got) + 1
                first = next(iter(got.values()))
                if not self.arrays:
                    self.row_bytes = sum(a.nbytes for a in first.values())
                if not self.fits(top):
                    return None
                if top > len(self.have):
                    size = max(top, 2 * len(self.have), 64)
                    size = max(top, min(size, self.budget // max(self.row_bytes, 1)))
                    arrays = {n: np.zeros((size, *a.shape), a.dtype) for n, a in first.items()}
                    for n, a in self.arrays.items():
                        arrays[n][:len(a)] = a
                    have = np.zeros(size, dtype=bool)
                    have[:len(self.have)] = self.have
                    self.arrays, self.have, self.stored = arrays, have, None
                for s, video in got.items():
                    for n, a in video.items():
                        self.arrays[n][s] = a
                self.have[list(got)] = True
            if self.stored is None:
                self.stored = Stored.of([self.arrays])
            return SketchRows(self.arrays, self.stored, self.table, self.compact)


class QdrantStore:
    """A Qdrant collection pair (``prvr.index.storage.GalleryStore``); see the module docstring. Its config is
    the given one with the stored data's mode and frame balls."""

    def __init__(self, target: str | QdrantTarget, cfg: QdrantConfig | None = None,
                 stores: Stores | None = None) -> None:
        """Connected to ``target`` (``stores``: already connected)."""
        self.cfg = cfg or QdrantConfig()
        self.target = target if isinstance(target, QdrantTarget) else QdrantTarget.parse(target)
        self.where = self.target.where
        self.stores = stores or self.target.connect(self.cfg.timeout)
        self._writing = threading.Lock()
        self._reading = threading.Lock()  # one engine call at a time (its shard is not shared across threads)
        self._read: dict | None = None
        self.meta: dict = {}
        self._listing: tuple[Catalog, list[int]] = (Catalog.of([]), [])  # the catalogue, insertion numbers
        self._by_seq: tuple[tuple, dict[int, dict]] | None = None  # a listing, its records by number
        self._worded: set[int] = set()  # insertion numbers of the videos with words
        self._word_arrays: dict[int, dict[str, np.ndarray]] = {}  # their words arrays, read on first use
        self._words: Words | None = None  # the table of them all (rebuilt after a change)
        self._wording = threading.Lock()  # guards the three above (not the writer's lock: an add is long)
        # decoded sketches by insertion number: every rank refines candidates by their sketch (an exact rank
        # of a small gallery, most of it), and a point's arrays never change
        self._sketch_table = SketchTable(self.cfg.sketch_cache_bytes)

    @property
    def mode(self) -> str:
        """What the gallery stores of each video."""
        return self.cfg.mode

    @property
    def encode_batch(self) -> int:
        """Videos encoded at once."""
        return self.cfg.encode_batch

    @property
    def videos(self) -> PointStore:
        """The collection of the videos' points (``NAME``)."""
        return self.stores.videos

    # ------------------------------------------------------------------ opening
    def exists(self) -> bool:
        """Whether the videos' collection exists."""
        return self.videos.exists()

    def create(self, identity: dict) -> dict:
        """A new, empty gallery's metadata (refuses an existing one); the collections themselves, and the
        metadata point, are made with the first videos (their vector width is theirs)."""
        if self.cfg.mode not in ("exact", "compact"):
            self.stores.close()
            raise ValueError(f"index mode must be 'exact' or 'compact', got {self.cfg.mode!r}")
        if self.stores.exist():
            self.stores.close()
            raise IndexStoreError(f"{self.where} already exists; open it instead")
        meta = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "frame_balls": self.cfg.frame_balls,
                "scene_keys": self.cfg.scene_keys, "keys": KEYS,
                **identity, "next_seq": 0}
        self._start(meta)
        return meta

    def identity(self) -> dict:
        """The metadata point's (an error when the collection does not exist or is not prvr's)."""
        self._read = read_meta(self.videos)
        return self._read

    def load(self) -> None:
        """Read the list of videos (the config takes the stored mode and frame balls)."""
        meta = self._read if self._read is not None else read_meta(self.videos)
        if not self.stores.keys.exists():  # (the three are made together, with the first videos)
            raise IndexStoreError(f"{self.where} holds its approximate-search keys in its videos' points (an "
                                  "earlier layout), this release in a collection of their own: move it into "
                                  f"a new one (python -m prvr.index move {self.target.spec} NEW_TARGET) or "
                                  "rebuild the index")
        self.cfg = dataclasses.replace(self.cfg, mode=meta["mode"], frame_balls=meta["frame_balls"],
                                       scene_keys=int(meta["scene_keys"]))
        self._start(meta)
        self._read_sketches()

    def _read_sketches(self) -> None:
        """Every live video's sketch decoded into the table, where they fit its budget: ranks refine from
        memory from the first query on, as the built-in index's do (read as ranks go, they cost a fresh
        process's first ranks of 10,000 videos several milliseconds each; read here, about a second)."""
        _, seqs = self._listing
        table, top = self._sketch_table, int(self.meta["next_seq"])
        at, part = 0, 1  # (one video first: its row's size says whether they all fit)
        while at < len(seqs) and table.put(self.fetch(seqs[at:at + part], "sketch")) is not None \
                and table.fits(top):
            at, part = at + part, 1024

    def _start(self, meta: dict) -> None:
        """Ready for reads and writes with this metadata."""
        self.meta, self._read = meta, None
        self.table = window_table(int(meta["map_size"])).numpy()
        self._sketch_table.table, self._sketch_table.compact = self.table, self.cfg.mode == "compact"
        self._listing = self._load_listing()

    def close(self) -> None:
        """Release the collections (the engine's directory lock, a client)."""
        self.stores.close()

    def _load_listing(self) -> tuple[Catalog, list[int]]:
        """Every video's record and insertion number, read from the videos' points (no vectors, no
        arrays)."""
        with self._reading:
            found = [p for i, p in self.videos.scroll([*RECORD, "seq", "words"]) if i != META_ID]
        found.sort(key=lambda p: p["seq"])
        with self._wording:  # words another process replaced (``set_words``: a new count) are read again
            changed = {int(p["seq"]) for p in found if int(p["seq"]) in self._word_arrays
                       and len(self._word_arrays[int(p["seq"])]["words_start"]) != int(p.get("words", 0))}
            if changed:
                self._word_arrays = {s: a for s, a in self._word_arrays.items() if s not in changed}
                self._words = None
        self._set_worded({int(p["seq"]) for p in found if p.get("words")})
        records = [{k: p[k] for k in RECORD if k in p} for p in found]
        return Catalog.of(records), [int(p["seq"]) for p in found]

    def _set_worded(self, worded: set[int]) -> None:
        """The videos with words are now these (their arrays already read are kept)."""
        with self._wording:
            if worded == self._worded:
                return
            self._worded = worded
            self._word_arrays = {s: a for s, a in self._word_arrays.items() if s in worded}
            self._words = None

    def words(self) -> Words | None:
        """The live videos' word segments as one table (ids: insertion numbers), None when none has words;
        their words arrays are read on first use and kept (a gallery's words are matched in memory)."""
        with self._wording:
            if not self._worded:
                return None
            if self._words is None:
                missing = sorted(self._worded - set(self._word_arrays))
                for a in range(0, len(missing), 256):
                    self._word_arrays.update(self.fetch(missing[a:a + 256], "words"))
                seqs = sorted(self._worded)
                arrays = {k: np.concatenate([self._word_arrays[s][k] for s in seqs]) for k in WORDS}
                table = WordsTable.of_videos(arrays, [len(self._word_arrays[s]["words_start"]) for s in seqs])
                self._words = Words(((table, np.array(seqs, np.int64), np.ones(len(table), bool)),))
            return self._words

    def refresh(self) -> None:
        """Re-read the list of videos (another process may have changed the collection)."""
        self._listing = self._load_listing()
        if self.videos.exists():
            self.meta = read_meta(self.videos)

    # ------------------------------------------------------------------ what is in it
    @property
    def catalog(self) -> Catalog:
        """The live videos in insertion order, as this process last saw them (``refresh`` re-reads)."""
        return self._listing[0]

    def records(self) -> dict[int, dict]:
        """The live videos' records by insertion number (made once per listing: at 100,000 videos making it
        took 5 ms, which every rank paid)."""
        listing, made = self._listing, self._by_seq
        if made is None or made[0] is not listing:  # (a listing is replaced on change, never changed)
            made = self._by_seq = listing, dict(zip(listing[1], listing[0].videos, strict=True))
        return made[1]

    def describe(self) -> dict:
        """The Qdrant collection: its mode, and where (a server's address or "embedded")."""
        where = "embedded" if self.target.path is not None else self.target.url
        return {"backend": "qdrant", "mode": self.cfg.mode, "name": self.target.collection, "where": where,
                "videos": len(self.catalog.position)}

    def media_paths(self) -> set[str]:
        """The media paths the live videos' records name."""
        cat = self.catalog
        return {cat.videos[p].get("path", "") for p in cat.position.values()} - {""}

    def data_folder(self, data_dir: Path) -> DataFolder:
        """A folder named for the collection among the data dir's indexes (the media sweep's marker goes
        there: the built-in index of a later start cannot read the collection's records)."""
        return DataFolder(Path(data_dir) / "indexes" / f"qdrant-{self.target.collection}", False)

    def view(self) -> QdrantView:
        """The current list of videos, for one rank."""
        return QdrantView(self)

    # ------------------------------------------------------------------ writing
    def append(self, records: list[dict], fixed: Fixed, ragged: Ragged,
               check: Callable[[Catalog], None]) -> None:
        """Upsert these videos' points (``_upload``)."""
        with self._writing:
            check(self.catalog)
            self._upload(records, fixed, ragged)

    def points(self, records: list[dict], fixed: Fixed, ragged: Ragged,
               seq0: int) -> Iterator[VideoPoints]:
        """The points of these videos (insertion numbers from seq0), of their arrays and of their keys, made
        64 at a time."""
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
            keys = window_keys(units, spans, self.cfg.scene_keys)
            for i in range(len(units)):
                video = {**{k: fixed[k][a + i] for k in FIXED}, **{k: ragged[k][a + i] for k in RAGGED},
                         **{k: sketch[k][i] for k in SKETCH}}
                seq = seq0 + a + i
                yield VideoPoints(video_point(records[a + i], seq, bounds[i], len(video["words_start"])),
                                  array_points(seq, video), key_points(seq, keys[i]))

    def _upload(self, records: list[dict], fixed: Fixed, ragged: Ragged) -> None:
        """Upsert points in requests of at most ``upsert_bytes``, then advance the insertion counter; on any
        failure the points already written are deleted again. The collection is made with the first videos
        (their vector width), its metadata point with it."""
        seq0 = int(self.meta["next_seq"])
        written: list[int] = []
        try:
            with self._reading:
                if not self.videos.exists():
                    cfg, width = self.cfg, int(fixed["units"].shape[-1])
                    self.stores.arrays.create(arrays_spec(cfg.shards, cfg.replicas))
                    self.stores.keys.create(keys_spec(width, cfg.hnsw_m, segments=cfg.segments,
                                                      shards=cfg.shards, replicas=cfg.replicas))
                    self.videos.create(collection_spec(width, cfg.hnsw_m, segments=cfg.segments,
                                                       shards=cfg.shards, replicas=cfg.replicas))
                    self.videos.upsert([PointData(META_ID, {}, {META: self.meta})])
            part, size = [], 0
            for points in self.points(records, fixed, ragged, seq0):
                part.append(points)
                size += sum(payload_bytes(p) for p in (points.video, *points.arrays, *points.keys))
                if size >= self.cfg.upsert_bytes:
                    self._write(part, written)
                    part, size = [], 0
            if part:
                self._write(part, written)
            self._set_meta(next_seq=seq0 + len(records))
            with self._reading:
                self._settle()
        except BaseException:
            if written:
                with self._reading:
                    self._delete(written)
            raise
        added = [{k: r[k] for k in RECORD} for r in records]
        catalog, seqs = self._listing
        worded = {seq0 + i: {k: ragged[k][i] for k in WORDS} for i in range(len(records))
                  if len(ragged["words_start"][i])}
        with self._wording:
            self._word_arrays.update(worded)  # (what was just written: not read back)
        self._set_worded(self._worded | set(worded))
        self._listing = Catalog.of(catalog.videos + added), seqs + list(range(seq0, seq0 + len(records)))

    def _write(self, part: list[VideoPoints], written: list[int]) -> None:
        """Upsert one request's videos (their arrays and keys first, so that a video point always has them),
        noting them as written first (a failure part-way deletes what it wrote of them too)."""
        written.extend(points.video.id for points in part)
        with self._reading:
            self.stores.arrays.upsert([a for points in part for a in points.arrays])
            self.stores.keys.upsert([k for points in part for k in points.keys])
            self.videos.upsert([points.video for points in part])

    def _delete(self, seqs: Sequence[int]) -> None:
        """Delete videos' points and their arrays' and keys' points (under ``_reading``)."""
        self.videos.delete(list(seqs))
        self.stores.arrays.delete([array_id(s, g) for s in seqs for g in GROUPS])
        self.stores.keys.delete(key_ids(seqs, self.cfg.scene_keys))

    def _settle(self) -> None:
        """After a write (under ``_reading``): every collection durable and optimized, the videos' last."""
        self.stores.arrays.settle()
        self.stores.keys.settle()
        self.videos.settle()

    def _set_meta(self, **change: object) -> None:
        """Update the gallery's metadata point."""
        meta = {**self.meta, **change}
        with self._reading:
            self.videos.set_payload(META_ID, {META: meta})
        self.meta = meta

    def remove(self, ids: Sequence[str], check: Callable[[Catalog], None]) -> None:
        """Delete these videos' points and their arrays' points."""
        with self._writing:
            check(self.catalog)
            catalog, seqs = self._listing
            if ids:
                seq = dict(zip((v["id"] for v in catalog.videos), seqs, strict=True))
                with self._reading:
                    self._delete([seq[i] for i in ids])
                    self._settle()
            gone = set(ids)
            keep = [i for i, v in enumerate(catalog.videos) if v["id"] not in gone]
            self._listing = Catalog.of([catalog.videos[i] for i in keep]), [seqs[i] for i in keep]
            self._set_worded(self._worded & {seqs[i] for i in keep})

    def sketches(self, seqs: np.ndarray) -> SketchRows | None:
        """The sketch group of these videos (sorted insertion numbers) as rows of the table of decoded
        sketches, the ones not read yet fetched into it; None when the gallery's insertion numbers outgrow
        ``cfg.sketch_cache_bytes`` (the caller fetches them for the query alone)."""
        table = self._sketch_table
        missing = table.missing(seqs)
        if len(missing) and not table.fits(int(self.meta["next_seq"])):
            return None
        got = self.fetch([int(s) for s in missing], "sketch") if len(missing) else {}
        return table.put(got)

    def set_words(self, video_id: str, words: dict[str, np.ndarray],
                  check: Callable[[Catalog], None]) -> None:
        """Replace the video's words point (one upsert: the engine swaps a point whole) and its ``words``
        count: the count says whether the point is read, so with words it is set after the point, without
        words before it; either way one write makes the change visible."""
        with self._writing:
            check(self.catalog)
            catalog, seqs = self._listing
            seq, n = seqs[catalog.position[video_id]], len(words["words_start"])
            point = PointData(array_id(seq, "words"), {}, pack({k: words[k] for k in WORDS}))
            with self._reading:
                if not n:
                    self.videos.set_payload(seq, {"words": 0})
                self.stores.arrays.upsert([point])
                if n:
                    self.videos.set_payload(seq, {"words": n})
                self._settle()
            with self._wording:
                self._word_arrays.pop(seq, None)
                if n:
                    self._word_arrays[seq] = {k: words[k] for k in WORDS}  # (just written: not read back)
                self._words = None
            self._set_worded(self._worded | {seq} if n else self._worded - {seq})

    def fetch(self, seqs: Sequence[int], group: str) -> dict[int, dict[str, np.ndarray]]:
        """One group of arrays (``qdrant_store.GROUPS``) of videos by insertion number."""
        with self._reading:
            got = self.stores.arrays.retrieve([array_id(s, group) for s in seqs], list(ARRAYS))
        return {int(s): unpack(got[array_id(s, group)]) for s in seqs}


def covering(names: Sequence[str]) -> list[str]:
    """The groups of arrays (``GROUPS``) to read for these names: each group that alone holds one of them,
    and for a name two groups hold (``pidx``) the first of them only if no group chosen holds it (exact
    scores read no sketch)."""
    needed = [g for g, held in GROUPS.items()
              if any(n in held and sum(n in other for other in GROUPS.values()) == 1 for n in names)]
    for n in names:
        if not any(n in GROUPS[g] for g in needed):
            needed += [g for g, held in GROUPS.items() if n in held][:1]
    return [g for g in GROUPS if g in needed]


class QdrantView:
    """The list of videos as one rank sees it (``prvr.index.storage.StoreView``): ids are insertion numbers;
    the arrays a rank reads are fetched once for it."""

    def __init__(self, source: QdrantStore) -> None:
        catalog, _ = source._listing
        self.source, self.live = source, len(catalog.position)
        self.record = source.records()
        self.cache: dict[str, dict[int, dict[str, np.ndarray]]] = {g: {} for g in GROUPS}

    def shortlist(self, k: int) -> int:
        """As many as the built-in index refines while the sketches stay decoded in memory; where they do
        not fit (``cfg.sketch_cache_bytes``), refining costs a fetch: fewer."""
        if self.source._sketch_table.fits(int(self.source.meta.get("next_seq", 0))):
            return SHORTLIST
        return 4 * max(FIRST_CHUNK, 2 * k)

    def clip_known(self) -> None:
        """The engine's pages bound totals, not the full codes' clip scores: refine computes those."""
        return None

    def pages(self, bq: BoundQuery, k: int, w: Weights, approximate: bool, refine: Refine,
              frame_bounded: bool) -> Iterable[Page]:
        """The candidates of a rank, by the engine (see the module docstring)."""
        v, cfg, stores, reading = bq.vector, self.source.cfg, self.source.stores, self.source._reading
        unit = (v / max(float(np.linalg.norm(v.astype(np.float64))), 1e-12)).astype(np.float32)
        frame = w.frame > 0 and frame_bounded
        rows, extra = bound_query(unit, w, frame), (0.0 if frame else w.frame)
        eps = engine_eps(w)

        if approximate:
            limit = max(cfg.candidate_keys, cfg.scene_keys * cfg.candidate_videos)
            with reading:  # the keys' int8 scores pick candidates only: they are bounded and scored again
                near = stores.keys.query(KEY, unit.tolist(), limit, exact=self.live < cfg.key_scan_videos,
                                         hnsw_ef=max(cfg.hnsw_ef, limit), rescore=False)
                ids = best_videos(near.ids // cfg.scene_keys, near.scores, cfg.candidate_videos)
                if not len(ids):
                    return
                hits = stores.videos.query(BOUNDS, rows, len(ids), ids=ids.tolist())
            yield Page(hits.ids, hits.scores + extra + eps, -np.inf)
            return
        # each page asks for the best ``limit`` again, not for the next ones (an offset): the engine may order
        # equal scores differently in two scans, and a point tied at a page's edge would be skipped
        seen = np.zeros(0, np.int64)
        limit = max(FIRST_CHUNK, 2 * k, cfg.first_page, math.ceil(cfg.first_page_share * self.live))
        while True:
            if limit * PAGE_GROWTH >= self.live:  # the next page would be the whole gallery: this one is (one
                limit = self.live + 1  # more than there are: a page of them all is not full)
            with reading:
                hits = stores.videos.query(BOUNDS, rows, limit)
            full = len(hits.ids) == limit
            rest = hits.scores[-1] + extra + eps if full else -np.inf
            new = ~np.isin(hits.ids, seen)
            yield Page(hits.ids[new], hits.scores[new] + extra + eps, rest)
            seen = np.union1d(seen, hits.ids)
            if not full:
                return
            # every page is a scan of every point's bounds, whatever its limit: few, large pages (a candidate
            # bounded below tau costs only its hit; the sizes measured: benchmarks/RESULTS.md, session 22)
            limit *= PAGE_GROWTH

    def arrays(self, ids: np.ndarray, names: Sequence[str]) -> tuple[Fetched, np.ndarray]:
        """These videos with the groups of arrays that hold ``names`` (fetched once a rank)."""
        groups = covering(names)
        if groups == ["sketch"] and len(ids) and np.all(np.diff(ids) > 0):  # refining: the table's rows
            rows = self.source.sketches(np.asarray(ids, np.int64))
            if rows is not None:
                return rows, np.asarray(ids, np.int64)
        for g in groups:
            missing = [int(s) for s in ids if int(s) not in self.cache[g]]
            if missing:
                self.cache[g].update(self.source.fetch(missing, g))
        fetched = Fetched([self.record[int(s)] for s in ids],
                          [{n: a for g in groups for n, a in self.cache[g][int(s)].items()} for s in ids],
                          self.source.table, self.source.cfg.mode == "compact")
        return fetched, np.arange(len(ids))

    def prefetch(self, names: Sequence[str], ids: np.ndarray) -> None:
        """Fetched points are in memory: nothing to read ahead."""

    def words(self) -> Words | None:
        """The gallery's word segments (``QdrantStore.words``) of this view's videos (an add since may have
        brought more)."""
        words = self.source.words()
        if words is None:
            return None
        table, ids, _ = words.tables[0]
        listed = np.isin(ids, np.fromiter(self.record, np.int64, len(self.record)))
        return Words(((table, ids, listed[table.video]),))


class QdrantIndex(Gallery):
    """A ``Gallery`` over a Qdrant store; see the module docstring."""

    storage: QdrantStore

    @classmethod
    def create(cls, spec: str | QdrantTarget, model, cfg: QdrantConfig | None = None,
               references: ReferenceQueries | None = None, stores: Stores | None = None) -> QdrantIndex:
        """A new, empty gallery for this model (refuses an existing one); ``references`` as for
        ``VideoIndex.create``."""
        return cls.create_on(QdrantStore(spec, cfg, stores), model, references)

    @classmethod
    def open(cls, spec: str | QdrantTarget, model, cfg: QdrantConfig | None = None,
             references: ReferenceQueries | None = None, stores: Stores | None = None) -> QdrantIndex:
        """Open an existing gallery (``Gallery.open_on``); refuses one made for another model, profile,
        reference bank or schema, or not by prvr."""
        return cls.open_on(QdrantStore(spec, cfg, stores), model, references)

    @classmethod
    def open_or_create(cls, spec: str | QdrantTarget, model, cfg: QdrantConfig | None = None,
                       references: ReferenceQueries | None = None) -> QdrantIndex:
        """Open the gallery, or create it when there is none."""
        return cls.open_or_create_on(QdrantStore(spec, cfg), model, references)

    # ------------------------------------------------------------------ the Qdrant store's own
    @property
    def target(self) -> QdrantTarget:
        """Where the collections are."""
        return self.storage.target

    @property
    def stores(self) -> Stores:
        """The two collections."""
        return self.storage.stores

    @property
    def store(self) -> PointStore:
        """The collection of the videos' points (``NAME``)."""
        return self.storage.videos

    @property
    def cfg(self) -> QdrantConfig:
        """The store's config."""
        return self.storage.cfg

    @property
    def meta(self) -> dict:
        """The gallery's metadata point, as last read or written."""
        return self.storage.meta


def read_meta(store: PointStore) -> dict:
    """The gallery's metadata (its metadata point), or an error saying the collection is not prvr's."""
    if not store.exists():
        raise IndexStoreError(f"{store.target.where} does not exist; create it first")
    meta = store.retrieve([META_ID], [META]).get(META_ID, {}).get(META)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise IndexMismatchError(f"{store.target.where} was not made by prvr (no {META!r} metadata point)")
    return meta

