"""Where a Qdrant gallery lives and how its points are laid out: the URL, the layout (declared once), and the
two stores that hold it: the Qdrant engine in this process (``qdrant-edge-py``) and a Qdrant server
(``qdrant-client``).

```python
target = QdrantTarget.parse("qdrant://localhost:6333/prvr")   # a server (qdrants:// for https)
target = QdrantTarget.parse("qdrant+local://runs/qdrant")     # the engine in this process, in a directory
stores = target.connect(timeout=5.0)                          # QdrantConnectionError names URL and cause
```

The layout, the same on both (``collection_spec``, ``keys_spec``, ``video_point``, ``key_points``,
``array_points``), in three collections:

``NAME`` (the engine: ``DIR/shard``): a point per video, its id the video's insertion number ``seq`` (which
breaks equal totals, as the built-in index's position does), its payload the record (``schema.RECORD``),
``seq`` and ``words`` (how many word segments it has), and one named multivector, not in full precision:

- ``bounds`` (float16, DOT + MAX_SIM, no HNSW graph: read by exhaustive scans): ``WINDOW_BALLS`` rows
  [c, r, 1, 0] of balls covering the directions of the video's proposals and ``frame_balls`` rows
  [c, r, 0, 1] of balls covering its frame-scale features (``bound_rows``). MAX_SIM sums, over the query's
  rows, each row's best dot product, so the two query rows [w_clip q^, w_clip, 0, -BIG] and [w_frame q^,
  w_frame, -BIG, 0] (``bound_query``) score a video at w_clip max(q^.c + r) + w_frame max(q^.c' + r'), an
  upper bound of its total (Cauchy-Schwarz: q^.x <= q^.c + |x - c| for every row x of a ball); the radii are
  measured from the float16 centres, and ``engine_eps`` covers the float16 query and the sums' rounding.

One more point of ``NAME``, with no vectors, holds the gallery's metadata (``META_ID``).

``NAME-keys`` (the engine: ``DIR/keys``): what approximate search asks the engine for, a point per key of a
video: ``scene_keys`` unit centres of the directions of its windows (``approximate.window_keys``), each one
vector ``key`` (float16, DOT, an HNSW graph over int8 scalar-quantized copies kept in RAM), id ``scene_keys
seq + j``, no payload. A query asks the graph for its nearest keys and groups them per video by id (a video
ranks by its best key, as in the built-in index's faiss lists). Until session 29 the keys were one MAX_SIM
multivector of the video's point, and a graph over multivectors missed a twentieth of the exact top 10 at
100,000 videos with a beam of 2,048 (``benchmarks/RESULTS.md``).

``NAME-arrays`` (the engine: ``DIR/arrays``): the per-video arrays, no vectors, four points per video by
what reads them (``GROUPS``; id ``4 seq + group``): the sketch (the full 8-bit codes, window factors and
frame balls: what ``refine`` reads of a candidate), the exact-score arrays (of a candidate the sketch leaves),
the evidence arrays (of a hit) and the words (``schema.WORDS``: read once per process for the videos whose
point says they have words, its payload's ``words`` count, and matched in memory: ``prvr.index.words``). A
point's arrays are one run of bytes (``pack``): a short JSON header of each one's name, dtype and shape, then
their raw little-endian bytes one after another. In the engine the run is in one file beside the shards
(``DIR/arrays.bin``, ``ArrayFile``, appended to) and the point's payload names it (``at``, ``size``): read
back with one ``pread`` each, and the engine converts no payload of arrays to Python objects; on a server,
whose payloads are JSON, it travels as the payload's ``data`` (base64, 4/3 of raw). A query
reads of each video only what its step needs, and listing the gallery reads no array at all. The collections
are made with the first videos (their vector width is theirs).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import struct
import tempfile
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar

import numpy as np

from prvr.index.schema import ENCODED, RECORD, SCHEMA_VERSION, WORDS
from prvr.index.sketch import BALLS, CLIP, NORM_EPS, frame_balls
from prvr.index.store import IndexStoreError

BOUNDS = "bounds"  # the named multivector of clip and frame balls (an upper bound of the total: MAX_SIM)
KEY = "key"  # the named vector of a key point (approximate candidates: HNSW)
WINDOW_BALLS = 16  # balls over each video's proposal directions
BIG = 16.0  # a query row's weight against the other kind of ball rows: never their max (exact in float16)
ARRAYS = ("data",)  # the field of a point of arrays (``pack``; the engine: its bytes in ``ArrayFile``)
ARRAY_FILE = "arrays.bin"  # the engine's arrays' bytes, in its directory (``ArrayFile``)
SCHEMES = {"qdrant": "http", "qdrants": "https"}
LOCAL = "qdrant+local://"
DEFAULT_PORT = 6333
DEFAULT_COLLECTION = "prvr"  # the collection of an embedded store (a directory holds one gallery)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
META_ID = 2**53 - 1  # the metadata point's id (no seq reaches it; ids stay exact in JSON numbers)
ARRAYS_SUFFIX = "-arrays"  # the arrays' collection is NAME-arrays (the engine: DIR/arrays)
KEYS_SUFFIX = "-keys"  # the keys' collection is NAME-keys (the engine: DIR/keys)

T = TypeVar("T")


class QdrantConnectionError(IndexStoreError):
    """Qdrant could not be reached or refused a request; the message names the URL and the cause."""


# ---------------------------------------------------------------------------------------------- the layout
def collection_spec(width: int, hnsw_m: int = 16, ef_construct: int = 100, segments: int = 4,
                    shards: int = 1, replicas: int = 1) -> dict:
    """The videos' collection both stores make, declared once: per named vector its row width, storage type,
    comparison (a multivector's: MAX_SIM), HNSW graph (m = 0: none) and quantization; the segments the engine
    keeps per shard (a query searches them at once, a thread each; the one being written counts); on a
    server, its shards and their replicas (the engine in-process is one shard)."""
    return {BOUNDS: {"size": width + 3, "datatype": "float16", "distance": "dot", "multivector": "max_sim",
                     "hnsw_m": 0, "quantization": None},
            "hnsw": {"m": hnsw_m, "ef_construct": ef_construct, "full_scan_threshold": 10000},
            "optimizers": {"default_segment_number": segments},
            "cluster": {"shard_number": shards, "replication_factor": replicas}}


def keys_spec(width: int, hnsw_m: int = 16, ef_construct: int = 100, segments: int = 4,
              shards: int = 1, replicas: int = 1) -> dict:
    """The keys' collection (``collection_spec``'s form): one float16 vector a point, an HNSW graph over its
    int8 copies."""
    spec = collection_spec(width, hnsw_m, ef_construct, segments, shards, replicas)
    del spec[BOUNDS]
    return {KEY: {"size": width, "datatype": "float16", "distance": "dot", "multivector": None,
                  "hnsw_m": hnsw_m, "quantization": "int8"}, **spec}


def arrays_spec(shards: int = 1, replicas: int = 1) -> dict:
    """The arrays' collection: payload only, sharded as the videos' collection."""
    return {"hnsw": {"m": 0, "ef_construct": 100, "full_scan_threshold": 10000},
            "cluster": {"shard_number": shards, "replication_factor": replicas}}


def _f16_up(x: np.ndarray) -> np.ndarray:
    """float16 never below x."""
    h = np.asarray(x, np.float64).astype(np.float16)
    return np.where(h.astype(np.float64) < x, np.nextafter(h, np.float16(np.inf)), h)


def bound_rows(units: np.ndarray, pnorm: np.ndarray, spans: np.ndarray, frames: Mapping[str, np.ndarray]
               ) -> list[np.ndarray]:
    """The ``bounds`` multivector (B, H + 3) float16 of each of a batch of videos: units (n, M, H), proposal
    norms (n, P), their unit spans (n, P, 2), the frame balls of their frame-scale features
    (``sketch.frame_balls``); see the module docstring.

    A window's direction d_p (the mean of its units over its norm: what a clip cosine dots) lies in the span
    of the video's M units, so its balls are made as the frame-scale features' are: ``sketch.frame_balls``
    over its coefficients in an orthonormal basis B of that span (rows), with how far they may miss it added
    to every radius. A window's coefficients are its units' (x_t B^T) averaged over |p| (M per window, not
    H), and d_p - coef_p B = sum_t w_pt (x_t - x_t B^T B) / |p| + (exact - float32 coef_p) B, so its norm
    is at most sum_t w_pt |x_t - x_t B^T B| / |p| + 1.01 |exact - float32 coef_p| (B's rows orthonormal in
    float32), each computed in float64 (its rounding, and the float32 arithmetic around it: 1e-5 more)."""
    import torch

    n, M, H = units.shape
    x = torch.from_numpy(np.asarray(units, np.float32))
    basis = torch.linalg.qr(x.transpose(1, 2)).Q.transpose(1, 2)  # (n, M, H): orthonormal rows spanning units
    table = torch.zeros(n, spans.shape[1], M, dtype=torch.float64)  # each window's mean over its units
    s, e = torch.from_numpy(spans[..., :1]), torch.from_numpy(spans[..., 1:])
    t = torch.arange(M)
    table += ((t >= s) & (t < e)) / (e - s)
    inv = 1.0 / torch.from_numpy(np.maximum(pnorm.astype(np.float32), NORM_EPS)).double()[..., None]
    x64, b64 = x.double(), basis.double()
    own = x64 @ b64.transpose(1, 2)  # (n, M, M): each unit's coefficients
    exact = table @ own * inv  # (n, P, M)
    coef = exact.float()
    outside = torch.linalg.vector_norm(x64 - own @ b64, dim=-1)[..., None]  # (n, M, 1): |x_t - x_t B^T B|
    missed = ((table @ outside * inv).squeeze(-1)
              + 1.01 * torch.linalg.vector_norm(exact - coef.double(), dim=-1)).amax(-1).numpy() + 1e-5
    windows = frame_balls(list(basis.numpy()), [c.reshape(-1) for c in coef.numpy()], WINDOW_BALLS)
    out = []
    for i in range(n):
        rows = []
        for balls, selector, extra in ((windows, (1.0, 0.0), missed[i]), (frames, (0.0, 1.0), 0.0)):
            kept = np.isfinite(balls["ball_radius"][i])
            centres = balls["ball_codes"][i][kept] * balls["ball_scale"][i][kept, None].astype(np.float64)
            c16 = centres.astype(np.float16)  # radii were measured from the 8-bit centres: add the move
            moved = np.linalg.norm(c16.astype(np.float64) - centres, axis=1)
            radius = balls["ball_radius"][i][kept].astype(np.float64) + moved + extra
            flags = np.broadcast_to(np.array(selector, np.float16), (len(c16), 2))
            rows.append(np.concatenate([c16, _f16_up(radius)[:, None], flags], axis=1))
        out.append(np.concatenate(rows).astype(np.float16))
    return out


def bound_query(unit: np.ndarray, weights: tuple[float, float], frame: bool) -> list[list[float]]:
    """The query rows of ``bounds`` for a unit query vector: their MAX_SIM is an upper bound of the total at
    these weights (``frame`` False: the clip row only; the caller adds w_frame, the frame score's bound 1)."""
    w0, w1 = float(weights[0]), float(weights[1])
    rows = [np.concatenate([w0 * unit, [w0, 0.0, -BIG]])]
    if frame:
        rows.append(np.concatenate([w1 * unit, [w1, -BIG, 0.0]]))
    return [r.astype(np.float32).tolist() for r in rows]


def engine_eps(weights: tuple[float, float]) -> float:
    """How far the engine's score of ``bound_query`` may fall below the bound it computes: the query rows are
    rounded to float16 (relative 2^-11 per element; each row's unweighted part has norm <= sqrt(2) and the
    ball rows norm <= 4), its sums to float32 (far less)."""
    return 2.0**-11 * np.sqrt(2.0) * 4.0 * (weights[0] + weights[1]) * 1.01 + 1e-6


SKETCH = (*CLIP, "pinv", "pinv_scale", *BALLS)  # the sketch of a video (what ``refine`` reads)
GROUPS = {"sketch": (*SKETCH, "pidx"),  # the arrays' points of a video, by what reads them (id 4 seq + group)
          "exact": ("units", "pnorm", "pidx", "zbasis", "zcoef"),
          "evidence": tuple(n for n in ENCODED
                            if n not in ("units", "pnorm", "pidx", "zbasis", "zcoef", *WORDS)),
          "words": WORDS}  # (read once per process for the videos with words: ``QdrantStore.words``)


def pack(arrays: Mapping[str, np.ndarray]) -> dict:
    """Per-video arrays -> one self-describing run of bytes (``data``): a 4-byte little-endian length, a JSON
    header of each array's name, dtype and shape, then their raw little-endian bytes one after another. Each
    store keeps it in its own form (``EdgeStore``: a file the point names; ``ClientStore``: base64 in the
    payload)."""
    layout, parts = [], []
    for name in arrays:
        a = np.asarray(arrays[name])
        a = a if a.flags.c_contiguous else a.copy(order="C")  # (ascontiguousarray makes a scalar 1-d)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        layout.append([name, a.dtype.str, list(a.shape)])
        parts.append(a.tobytes())
    header = json.dumps(layout, separators=(",", ":")).encode()
    return {"data": b"".join([struct.pack("<I", len(header)), header, *parts])}


_DTYPES: dict[str, tuple[np.dtype, np.dtype]] = {}  # a header's dtype string -> (stored, native)


def unpack(payload: Mapping) -> dict[str, np.ndarray]:
    """A payload of ``pack`` (as a store's ``retrieve`` gives it back) -> its arrays in native byte order:
    read-only views of the payload's bytes where they are stored in it (little-endian machines), no copy."""
    data = payload["data"]
    (length,) = struct.unpack_from("<I", data)
    out, at = {}, 4 + length
    for name, dtype, shape in json.loads(bytes(data[4:at])):
        if dtype not in _DTYPES:
            dt = np.dtype(dtype)
            _DTYPES[dtype] = dt, dt.newbyteorder("=")
        dt, native = _DTYPES[dtype]
        count = math.prod(shape)
        a = np.frombuffer(data, dtype=dt, count=count, offset=at)
        out[name] = a.reshape(shape).astype(native, copy=False)
        at += count * dt.itemsize
    return out


class PointData(NamedTuple):
    """One point as both stores write it."""

    id: int
    vectors: dict[str, list[list[float]]]
    payload: dict


def video_point(record: Mapping, seq: int, bounds: np.ndarray, words: int = 0) -> PointData:
    """The point of one video in ``NAME`` (see the module docstring); ``words``: how many word segments its
    arrays hold (the videos whose words group is read)."""
    payload = {**{k: record[k] for k in RECORD}, "seq": int(seq), "words": int(words)}
    return PointData(int(seq), {BOUNDS: np.asarray(bounds, np.float32).tolist()}, payload)


def key_points(seq: int, keys: np.ndarray) -> list[PointData]:
    """The points of one video's keys (K, H) in ``NAME-keys``: ids K seq + j (``key_ids``)."""
    rows = np.asarray(keys, np.float32)
    ids = key_ids([seq], len(rows))
    return [PointData(i, {KEY: row.tolist()}, {}) for i, row in zip(ids, rows, strict=True)]


def key_ids(seqs: Sequence[int], per: int) -> list[int]:
    """The ids of these videos' key points (``per`` keys a video)."""
    return [per * int(s) + j for s in seqs for j in range(per)]


def array_id(seq: int, group: str) -> int:
    """The id of a video's point of one group of arrays in ``NAME-arrays``."""
    return len(GROUPS) * int(seq) + list(GROUPS).index(group)


def array_points(seq: int, arrays: Mapping[str, np.ndarray]) -> list[PointData]:
    """The points of one video's arrays in ``NAME-arrays``, one per group."""
    return [PointData(array_id(seq, g), {}, pack({n: arrays[n] for n in names}))
            for g, names in GROUPS.items()]


def payload_bytes(p: PointData) -> int:
    """About how many bytes a point's request carries (its arrays as a server's base64 and its vectors as
    floats)."""
    floats = sum(len(r) * (len(r[0]) if isinstance(r[0], list) else 1) for r in p.vectors.values() if r)
    return len(p.payload.get("data", b"")) * 4 // 3 + 12 * floats + 200


# ------------------------------------------------------------------------------------------------ targets
@dataclass(frozen=True)
class QdrantTarget:
    """A collection on a Qdrant server (``url``), or the engine in this process over a directory (``path``;
    ":memory:": a temporary directory removed on close)."""

    collection: str
    url: str | None = None
    path: str | None = None

    @classmethod
    def parse(cls, spec: str) -> QdrantTarget:
        """``qdrant://HOST[:PORT]/COLLECTION``, ``qdrants://...`` (https) or ``qdrant+local://DIR``."""
        text = str(spec).strip()
        if text.startswith(LOCAL):
            path = text[len(LOCAL):]
            if not path:
                raise ValueError(f"index {spec!r}: qdrant+local:// needs a directory, e.g. qdrant+local://runs/q")
            return cls(DEFAULT_COLLECTION, path=path)
        scheme, sep, rest = text.partition("://")
        if not sep or scheme not in SCHEMES:
            raise ValueError(f"index {spec!r} is not a Qdrant URL: use qdrant://HOST:PORT/COLLECTION, "
                             f"qdrants://HOST:PORT/COLLECTION or qdrant+local://DIR")
        hostport, _, collection = rest.partition("/")
        host, colon, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "")
        if not host or (colon and not port.isdigit()) or (port and not 0 < int(port) < 65536):
            raise ValueError(f"index {spec!r}: expected HOST:PORT before the collection, got {hostport!r}")
        if not _NAME.match(collection):
            raise ValueError(f"index {spec!r}: the collection name {collection!r} must be 1-255 letters, "
                             "digits, '_' or '-' (qdrant://HOST:PORT/COLLECTION)")
        return cls(collection, url=f"{SCHEMES[scheme]}://{host}:{int(port) if port else DEFAULT_PORT}")

    @property
    def spec(self) -> str:
        """The target as ``parse`` reads it."""
        if self.path is not None:
            return LOCAL + self.path
        scheme = next(s for s, http in SCHEMES.items() if self.url.startswith(http + "://"))
        return f"{scheme}://{self.url.split('://', 1)[1]}/{self.collection}"

    @property
    def where(self) -> str:
        """The store in words, for messages: the server URL with the collection, or the directory."""
        return f"{self.url}/collections/{self.collection}" if self.url else f"qdrant+local://{self.path}"

    def connect(self, timeout: float) -> Stores:
        """The stores of this target: the engine's two shards in the directory (locked for this process), or
        a client of the server, asked for its collections once so that an unreachable one fails here (within
        ``timeout`` seconds) with its URL and the cause."""
        if self.path is not None:
            directory = EdgeDirectory(self)
            opened: list[EdgeStore] = []
            try:
                for name, file in (("shard", None), ("arrays", ARRAY_FILE), ("keys", None)):
                    opened.append(EdgeStore(directory, name, file))
                return Stores(*opened, directory.close)
            except BaseException:  # (an older layout refused: the directory is released again)
                for store in opened:
                    store.close()
                directory.close()
                raise
        client = connect_client(self, timeout)
        return Stores(*(ClientStore(self, client, self.collection + suffix)
                        for suffix in ("", ARRAYS_SUFFIX, KEYS_SUFFIX)), client.close)


def guarded(target: QdrantTarget, what: str, call: Callable[..., T], *args: object, **kw: object) -> T:
    """call(*args, **kw), with any transport, server or engine error raised as QdrantConnectionError naming
    the target, what was being done and the cause."""
    try:
        return call(*args, **kw)
    except (IndexStoreError, KeyError):
        raise
    except Exception as err:  # httpx, grpc, qdrant_client and the engine's errors share no base class
        cause = f"{type(err).__name__}: {err}".strip().rstrip(":")
        raise QdrantConnectionError(f"Qdrant at {target.where}: could not {what} ({cause})") from err


@dataclass(frozen=True)
class Hits:
    """The points a query found, best first: their ids (int64) and scores (float64), as arrays (a page of an
    exact rank holds thousands: one object a point cost 1.1-1.9 ms a page of 2,000, arrays 0.25 ms)."""

    ids: np.ndarray
    scores: np.ndarray

    def __len__(self) -> int:
        """How many points (a tuple of the two arrays would say 2)."""
        return len(self.ids)

    @classmethod
    def of(cls, points: Sequence) -> Hits:
        """The ids and scores of a store's answer (the engine's points or qdrant-client's ``ScoredPoint``)."""
        n = len(points)
        return cls(np.fromiter((p.id for p in points), np.int64, n),
                   np.fromiter((p.score for p in points), np.float64, n))


class PointStore(Protocol):
    """What ``QdrantIndex`` asks of a collection; ``EdgeStore`` and ``ClientStore`` answer alike."""

    target: QdrantTarget

    def exists(self) -> bool:
        """Whether the collection has been made."""

    def create(self, spec: dict) -> None:
        """Make the collection of ``collection_spec``."""

    def upsert(self, points: Sequence[PointData]) -> None:
        """Write points (waits until applied)."""

    def set_payload(self, point: int, payload: dict) -> None:
        """Set payload fields of one point (waits until applied)."""

    def delete(self, ids: Sequence[int]) -> None:
        """Delete points (waits until applied)."""

    def query(self, using: str, query: list, limit: int, exact: bool = True, hnsw_ef: int | None = None,
              ids: Sequence[int] | None = None, rescore: bool = True) -> Hits:
        """The best points (ids and scores) of the named vector by DOT with ``query`` (a multivector: MAX_SIM
        of its rows; exhaustive, or the HNSW graph), among ``ids`` if given; ``rescore`` False: a quantized
        vector's scores are its int8 copies', its float16 values are not read."""

    def retrieve(self, ids: Sequence[int], fields: Sequence[str] | None) -> dict[int, dict]:
        """Payloads (these fields; None: all) of points by id."""

    def scroll(self, fields: Sequence[str], page: int = 1024) -> Iterator[tuple[int, dict]]:
        """Every point's id and payload fields, in pages."""

    def count(self) -> int:
        """How many points there are."""

    def settle(self) -> None:
        """After a write: durable, segments merged, graph built."""

    def close(self) -> None:
        """Release the collection (the engine's shard; a client is released by ``Stores.close``)."""


class Stores(NamedTuple):
    """A gallery's three collections (``NAME``, ``NAME-arrays``, ``NAME-keys``) and what releases them."""

    videos: PointStore
    arrays: PointStore
    keys: PointStore
    release: Callable[[], None]

    def exist(self) -> list[str]:
        """Which of the collections exist (their names in the layout: videos, arrays, keys)."""
        return [name for name in ("videos", "arrays", "keys") if getattr(self, name).exists()]

    def close(self) -> None:
        """Release the collections, then the engine's directory or the client."""
        self.videos.close()
        self.arrays.close()
        self.keys.close()
        self.release()


def _spec_vectors(spec: dict) -> dict:
    """The named vectors of a ``collection_spec``."""
    return {k: v for k, v in spec.items() if k not in ("hnsw", "optimizers", "cluster")}


class EdgeDirectory:
    """A directory of the engine's shards, held by this process: ``DIR/lock`` is flocked while it is open,
    so that one process at a time uses it (":memory:": a temporary directory, removed on close)."""

    def __init__(self, target: QdrantTarget) -> None:
        self.target = target
        self._temp = target.path == ":memory:"
        self.root = Path(tempfile.mkdtemp(prefix="qdrant-edge-")) if self._temp else Path(target.path)
        # a temporary store is removed when closed, collected or at exit, whichever comes first: an index
        # that is dropped without close() leaves nothing behind
        self._removal = weakref.finalize(self, shutil.rmtree, self.root, True) if self._temp else None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._lock: int | None = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise QdrantConnectionError(f"cannot open the embedded Qdrant store {target.where}: "
                                        f"{err}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise QdrantConnectionError(f"cannot open the embedded Qdrant store {target.where}: another "
                                        "process has it open (one process at a time)") from None
        if (self.root / "meta.json").is_file() or (self.root / "collection").is_dir():  # qdrant-client's
            self.close()
            raise IndexStoreError(f"{target.where} holds a gallery of an older release (qdrant-client's "
                                  f"embedded store, schema 5 or older); this release runs the Qdrant engine "
                                  f"itself and reads schema {SCHEMA_VERSION}: rebuild the index (in another "
                                  "directory, or delete this one)")

    def close(self) -> None:
        """Release the directory (its shards closed first, by ``Stores.close``)."""
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None
        if self._removal is not None:
            self._removal()


class ArrayFile:
    """The engine's arrays' bytes: one file, appended to (a point names its bytes by offset and size) and
    read with ``pread`` (no decoding, the page cache holds what queries read often). The bytes of a removed
    video stay until the gallery is moved (``python -m prvr.index move`` copies only the live ones)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, data: bytes) -> int:
        """Write these bytes at the end; their offset."""
        at = os.fstat(self.fd).st_size
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        return at

    def will_read(self, spans: Sequence[tuple[int, int]]) -> None:
        """Ask the kernel to read these (offset, size) runs now, all at once: the reads that follow wait on
        the device once, not once per run (100,000 videos, files not in the page cache: an approximate
        query's ~100 runs of exact-score arrays, one by one, were 38 ms of its 76)."""
        for at, size in spans:
            os.posix_fadvise(self.fd, at, size, os.POSIX_FADV_WILLNEED)

    def read(self, at: int, size: int) -> bytes:
        """``size`` bytes from offset ``at`` (an error if the file is shorter: cut or replaced)."""
        data = os.pread(self.fd, size, at)
        if len(data) != size:
            raise IndexStoreError(f"{self.path} holds {len(data)} bytes at {at}, its point names {size}: the "
                                  "file was cut or replaced; rebuild the index")
        return data

    def sync(self) -> None:
        """Make what was written durable."""
        os.fsync(self.fd)

    def close(self) -> None:
        """Release the file."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class EdgeStore:
    """A shard of the Qdrant engine in this process (``qdrant_edge.EdgeShard``) in ``DIR/<name>``; with
    ``array_file``, its points' ``data`` bytes are kept in ``DIR/<array_file>`` (``ArrayFile``) and the
    points name them."""

    def __init__(self, directory: EdgeDirectory, name: str, array_file: str | None = None) -> None:
        self.target, self.path = directory.target, directory.root / name
        self.shard = None
        self.file: ArrayFile | None = None
        file = directory.root / array_file if array_file else None
        if self.path.is_dir() and any(self.path.iterdir()):
            import qdrant_edge

            if file is not None and not file.is_file():
                raise IndexStoreError(f"{self.target.where} holds its arrays in payloads (an earlier layout "
                                      f"of schema {SCHEMA_VERSION}), this release in {file.name}: rebuild "
                                      "the index (in another directory, or delete this one)")
            self.shard = self._call("open the shard", qdrant_edge.EdgeShard.load, str(self.path))
        self._file_path = file
        if file is not None and file.is_file():
            self.file = ArrayFile(file)

    def _call(self, what: str, call: Callable[..., T], *args: object, **kw: object) -> T:
        return guarded(self.target, what, call, *args, **kw)

    def exists(self) -> bool:
        return self.shard is not None

    def create(self, spec: dict) -> None:
        import qdrant_edge

        if self._file_path is not None and self.file is None:
            self.file = ArrayFile(self._file_path)
        self.shard = self._call("create the shard", qdrant_edge.EdgeShard.create, str(self.path),
                                edge_config(spec))

    def _stored(self, payload: dict) -> dict:
        """A payload as the shard keeps it: ``data`` bytes written to the array file and named by it."""
        if self.file is None or "data" not in payload:
            return payload
        data = payload["data"]
        return {**{k: v for k, v in payload.items() if k != "data"}, "at": self.file.append(data),
                "size": len(data)}

    def upsert(self, points: Sequence[PointData]) -> None:
        import qdrant_edge as qe

        ops = qe.UpdateOperation.upsert_points([qe.Point(p.id, p.vectors, self._stored(p.payload))
                                                for p in points])
        self._call("upsert videos", self.shard.update, ops)

    def set_payload(self, point: int, payload: dict) -> None:
        import qdrant_edge as qe

        self._call("update the metadata", self.shard.update, qe.UpdateOperation.set_payload([point], payload))

    def delete(self, ids: Sequence[int]) -> None:
        import qdrant_edge as qe

        self._call("delete videos", self.shard.update, qe.UpdateOperation.delete_points(list(ids)))

    def query(self, using: str, query: list, limit: int, exact: bool = True, hnsw_ef: int | None = None,
              ids: Sequence[int] | None = None, rescore: bool = True) -> Hits:
        import qdrant_edge as qe

        flt = qe.Filter(must=[qe.HasIdCondition(set(ids))]) if ids is not None else None
        params = qe.SearchParams(hnsw_ef=hnsw_ef, exact=exact,
                                 quantization=None if rescore else qe.QuantizationSearchParams(rescore=False))
        request = qe.QueryRequest(limit=limit, query=qe.Query.Nearest(query, using=using), filter=flt,
                                  with_payload=False, params=params)
        return Hits.of(self._call("search", self.shard.query, request))

    def retrieve(self, ids: Sequence[int], fields: Sequence[str] | None) -> dict[int, dict]:
        import qdrant_edge as qe

        filed = self.file is not None and (fields is None or "data" in fields)
        named = ["at", "size"] if filed else []
        asked = None if fields is None else [f for f in fields if f != "data"] + named
        selector = True if asked is None else qe.PayloadSelector.Include(asked)
        got = self._call("read videos", self.shard.retrieve, list(ids), selector, False)
        out = {int(r.id): dict(r.payload or {}) for r in got}
        if filed:
            self.file.will_read([(int(p["at"]), int(p["size"])) for p in out.values() if "at" in p])
            for payload in out.values():
                if "at" in payload:
                    payload["data"] = self.file.read(int(payload.pop("at")), int(payload.pop("size")))
        return out

    def scroll(self, fields: Sequence[str], page: int = 1024) -> Iterator[tuple[int, dict]]:
        import qdrant_edge as qe

        offset = None
        while self.shard is not None:
            payload = qe.PayloadSelector.Include(list(fields))
            request = qe.ScrollRequest(offset=offset, limit=page, with_payload=payload, with_vector=False)
            records, offset = self._call("list the videos", self.shard.scroll, request)
            yield from ((int(r.id), dict(r.payload or {})) for r in records)
            if offset is None:
                break

    def count(self) -> int:
        import qdrant_edge as qe

        if self.shard is None:
            return 0
        return int(self._call("count", self.shard.count, qe.CountRequest(exact=True)))

    def settle(self) -> None:
        """After a write: make it durable and let the engine merge segments and build the graph (a server
        does both on its own)."""
        if self.file is not None:
            self.file.sync()
        if self.shard is not None:
            self._call("flush", self.shard.flush)
            self._call("optimize the shard", self.shard.optimize)

    def disk_bytes(self) -> int:
        """Bytes of every file of the shard (and of its array file)."""
        files = sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())
        return files + (self.file.path.stat().st_size if self.file is not None else 0)

    def close(self) -> None:
        if self.shard is not None:
            with contextlib.suppress(Exception):
                self.shard.flush()
            self.shard.close()
            self.shard = None
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.sync()
            self.file.close()
            self.file = None


def edge_config(spec: dict):
    """The engine's shard configuration of a ``collection_spec``."""
    import qdrant_edge as qe

    hnsw = spec["hnsw"]
    vectors = {}
    for name, v in _spec_vectors(spec).items():
        quantization = (qe.ScalarQuantizationConfig(qe.ScalarType.Int8, memory=qe.Memory.Pinned)
                        if v["quantization"] == "int8" else None)
        vectors[name] = qe.EdgeVectorParams(
            size=v["size"], distance=qe.Distance.Dot,
            multivector_config=(qe.MultiVectorConfig(qe.MultiVectorComparator.MaxSim) if v["multivector"]
                                else None),
            datatype=qe.VectorStorageDatatype.Float16, quantization_config=quantization,
            hnsw_config=qe.HnswIndexConfig(m=v["hnsw_m"], ef_construct=hnsw["ef_construct"],
                                           full_scan_threshold=hnsw["full_scan_threshold"]))
    # no write-ahead log: an add flushes when done (``EdgeStore.settle``), and the log would hold a second
    # copy of every payload until then
    if not vectors:  # a payload-only collection: the engine wants a vector, which no point has
        vectors = {"none": qe.EdgeVectorParams(size=1, distance=qe.Distance.Dot)}
    optimizers = qe.EdgeOptimizersConfig(**spec["optimizers"]) if "optimizers" in spec else None
    return qe.EdgeConfig(vectors=vectors, hnsw_config=qe.HnswIndexConfig(
        m=hnsw["m"], ef_construct=hnsw["ef_construct"], full_scan_threshold=hnsw["full_scan_threshold"]),
        optimizers=optimizers, wal_enabled=False)


def client_vectors(spec: dict) -> dict:
    """qdrant-client's ``vectors_config`` of a ``collection_spec`` (what a server is asked to make)."""
    from qdrant_client import models

    hnsw = spec["hnsw"]
    vectors = {}
    for name, v in _spec_vectors(spec).items():
        quantization = (models.ScalarQuantization(scalar=models.ScalarQuantizationConfig(
            type=models.ScalarType.INT8, always_ram=True)) if v["quantization"] == "int8" else None)
        vectors[name] = models.VectorParams(
            size=v["size"], distance=models.Distance.DOT, datatype=models.Datatype.FLOAT16,
            multivector_config=(models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)
                                if v["multivector"] else None),
            hnsw_config=models.HnswConfigDiff(m=v["hnsw_m"], ef_construct=hnsw["ef_construct"],
                                              full_scan_threshold=hnsw["full_scan_threshold"]),
            quantization_config=quantization)
    return vectors


def connect_client(target: QdrantTarget, timeout: float):  # a QdrantClient
    """A client of the server, asked for its collections once (an unreachable one fails here)."""
    from qdrant_client import QdrantClient

    client = QdrantClient(url=target.url, timeout=max(1, int(timeout)), check_compatibility=False)
    guarded(target, "list the collections", client.get_collections)
    return client


def client_payload(payload: dict) -> dict:
    """A payload as a server keeps it (JSON): ``data`` bytes as base64."""
    if isinstance(payload.get("data"), bytes):
        return {**payload, "data": base64.b64encode(payload["data"]).decode()}
    return payload


class ClientStore:
    """A collection on a Qdrant server, through qdrant-client (the layout and requests of ``EdgeStore``)."""

    def __init__(self, target: QdrantTarget, client, name: str) -> None:
        self.target, self.client, self.name = target, client, name

    def _call(self, what: str, method: str, *args: object, **kw: object):
        return guarded(self.target, what, getattr(self.client, method), self.name, *args, **kw)

    def exists(self) -> bool:
        return bool(self._call("check the collection", "collection_exists"))

    def create(self, spec: dict) -> None:
        from qdrant_client import models

        optimizers = models.OptimizersConfigDiff(**spec["optimizers"]) if "optimizers" in spec else None
        self._call("create the collection", "create_collection", vectors_config=client_vectors(spec),
                   optimizers_config=optimizers, **spec["cluster"])

    def upsert(self, points: Sequence[PointData]) -> None:
        from qdrant_client import models

        structs = [models.PointStruct(id=p.id, vector=p.vectors, payload=client_payload(p.payload))
                   for p in points]
        self._call("upsert videos", "upsert", points=structs, wait=True)

    def set_payload(self, point: int, payload: dict) -> None:
        self._call("update the metadata", "set_payload", payload=payload, points=[point], wait=True)

    def delete(self, ids: Sequence[int]) -> None:
        from qdrant_client import models

        selector = models.PointIdsList(points=list(ids))
        self._call("delete videos", "delete", points_selector=selector, wait=True)

    def query(self, using: str, query: list, limit: int, exact: bool = True, hnsw_ef: int | None = None,
              ids: Sequence[int] | None = None, rescore: bool = True) -> Hits:
        from qdrant_client import models

        flt = models.Filter(must=[models.HasIdCondition(has_id=list(ids))]) if ids is not None else None
        params = models.SearchParams(exact=exact, hnsw_ef=hnsw_ef, quantization=None if rescore else
                                     models.QuantizationSearchParams(rescore=False))
        found = self._call("search", "query_points", query=query, using=using, limit=limit, query_filter=flt,
                           search_params=params, with_payload=False, with_vectors=False).points
        return Hits.of(found)

    def retrieve(self, ids: Sequence[int], fields: Sequence[str] | None) -> dict[int, dict]:
        got = self._call("read videos", "retrieve", ids=list(ids),
                         with_payload=True if fields is None else list(fields), with_vectors=False)
        out = {int(p.id): dict(p.payload or {}) for p in got}
        for payload in out.values():
            if isinstance(payload.get("data"), str):
                payload["data"] = base64.b64decode(payload["data"])
        return out

    def scroll(self, fields: Sequence[str], page: int = 1024) -> Iterator[tuple[int, dict]]:
        offset = None
        while self.exists():
            points, offset = self._call("list the videos", "scroll", limit=page, offset=offset,
                                        with_payload=list(fields), with_vectors=False)
            yield from ((int(p.id), dict(p.payload or {})) for p in points)
            if offset is None:
                break

    def count(self) -> int:
        return int(self._call("count", "count", exact=True).count) if self.exists() else 0

    def settle(self) -> None:
        """A server makes its writes durable (``wait=True``) and optimizes its segments itself."""

    def close(self) -> None:
        """The client is released by ``Stores.close``."""
