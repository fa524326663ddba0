"""Where a Qdrant gallery lives and how its points are laid out: the URL, the client, per-video arrays.

```python
target = QdrantTarget.parse("qdrant://localhost:6333/prvr")   # a server (qdrants:// for https)
target = QdrantTarget.parse("qdrant+local://runs/qdrant")     # embedded, a directory (":memory:": in RAM)
client = target.connect(timeout=5.0)                          # QdrantConnectionError names URL and cause
```

A video is one point: the named multivectors ``windows`` (its unit-normalised proposals: MAX_SIM with the
unit query is the clip score) and ``frame_balls`` ([centre, radius] of balls over its zhat rows: MAX_SIM
with [q, 1] bounds the frame score), and a payload of its record, its ``seq`` (insertion order: the built-in
index's position, which breaks equal totals) and ``arrays``, the per-video arrays the exact scores and the
results layer read, each as ``{"dtype", "shape", "b64"}`` (raw little-endian bytes, base64).
``schema.ENCODED`` names them: a new per-video array is one more name there and one more key in what
``QdrantIndex`` packs.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from prvr.index.schema import ENCODED
from prvr.index.sketch import NORM_EPS, cover_balls, nearest_ball
from prvr.index.store import IndexStoreError

RECORD = ("id", "title", "path", "duration", "sha256")  # the video's record, as the built-in index stores it
WINDOWS = "windows"  # the named multivector of unit proposals (clip-scale score: MAX_SIM)
BALLS = "frame_balls"  # the named multivector of [centre, radius] of balls over zhat (frame-score bound)
SCHEMES = {"qdrant": "http", "qdrants": "https"}
LOCAL = "qdrant+local://"
DEFAULT_PORT = 6333
DEFAULT_COLLECTION = "prvr"  # the collection of an embedded store (a directory holds one gallery)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_ID_SPACE = uuid.UUID("6f1d0c1e-5b3a-4f7e-9d1c-2a8e4b7c9f30")  # video id -> point id (uuid5 in this space)

T = TypeVar("T")


class QdrantConnectionError(IndexStoreError):
    """Qdrant could not be reached or refused a request; the message names the URL and the cause."""


@dataclass(frozen=True)
class QdrantTarget:
    """A collection on a Qdrant server (``url``) or in an embedded store (``path``; ":memory:" in RAM)."""

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
    def where(self) -> str:
        """The store in words, for messages: the server URL with the collection, or the directory."""
        return f"{self.url}/collections/{self.collection}" if self.url else f"qdrant+local://{self.path}"

    def connect(self, timeout: float):  # a QdrantClient
        """A client for this target; a server is asked for its collections once, so that an unreachable
        one fails here (within ``timeout`` seconds) with its URL and the cause."""
        from qdrant_client import QdrantClient

        if self.path is not None:
            try:
                if self.path == ":memory:":
                    return QdrantClient(location=":memory:")
                return QdrantClient(path=self.path)
            except (RuntimeError, OSError) as err:  # e.g. the directory is open in another process
                raise QdrantConnectionError(f"cannot open the embedded Qdrant store {self.where}: "
                                            f"{err}") from None
        client = QdrantClient(url=self.url, timeout=max(1, int(timeout)), check_compatibility=False)
        guarded(self, "list the collections", client.get_collections)
        return client


def guarded(target: QdrantTarget, what: str, call: Callable[..., T], *args: object, **kw: object) -> T:
    """call(*args, **kw), with any transport or server error raised as QdrantConnectionError naming the
    target, what was being done and the cause."""
    try:
        return call(*args, **kw)
    except (IndexStoreError, ValueError, KeyError):
        raise
    except Exception as err:  # httpx, grpc and qdrant_client errors share no base class
        cause = f"{type(err).__name__}: {err}".strip().rstrip(":")
        raise QdrantConnectionError(f"Qdrant at {target.where}: could not {what} ({cause})") from err


def point_id(video_id: str) -> str:
    """The point id of a video id (Qdrant ids are integers or UUIDs)."""
    return str(uuid.uuid5(_ID_SPACE, video_id))


def pack(arrays: Mapping[str, np.ndarray]) -> dict[str, dict]:
    """Per-video arrays -> the payload's ``arrays`` (dtype, shape and base64 of the raw bytes, exact)."""
    out = {}
    for name in ENCODED:
        a = np.asarray(arrays[name])
        a = a if a.flags.c_contiguous else a.copy(order="C")  # (ascontiguousarray makes a scalar 1-d)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        data = base64.b64encode(a.tobytes()).decode()
        out[name] = {"dtype": a.dtype.str, "shape": list(a.shape), "b64": data}
    return out


def unpack(payload: Mapping[str, Mapping]) -> dict[str, np.ndarray]:
    """The payload's ``arrays`` -> per-video arrays (native byte order)."""
    out = {}
    for name in ENCODED:
        entry = payload[name]
        a = np.frombuffer(base64.b64decode(entry["b64"]), dtype=np.dtype(entry["dtype"]))
        out[name] = a.reshape(entry["shape"]).astype(a.dtype.newbyteorder("="))
    return out


def payload_bytes(arrays: Mapping[str, np.ndarray]) -> int:
    """Bytes of the arrays' raw data in a payload (before base64, which adds a third)."""
    return sum(int(np.asarray(arrays[name]).nbytes) for name in ENCODED)


def windows(units: np.ndarray, pnorm: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """(P, H) float32 multivector of one video: each stored proposal (the mean of its clip units
    [start, end)) over its norm, as the exact clip score divides by it: Qdrant's dot product with the unit
    query is then the proposal's clip-scale cosine."""
    csum = np.concatenate([np.zeros((1, units.shape[1])), np.cumsum(units.astype(np.float64), axis=0)])
    s, e = spans[:, 0], spans[:, 1]
    mean = (csum[e] - csum[s]) / (e - s)[:, None]
    return (mean / np.maximum(pnorm.astype(np.float64), NORM_EPS)[:, None]).astype(np.float32)


def frame_balls(zhat: np.ndarray, n_balls: int) -> list[np.ndarray]:
    """Per video of zhat (n, P, H): (B, H + 1) float32 [centre, radius] of balls covering its rows, empty
    balls dropped. For a unit query q, [q, 1] . [c, r] = q.c + r >= q.z for every row z of the ball
    (Cauchy-Schwarz), so Qdrant's MAX_SIM of [q, 1] over them bounds the video's frame score from above."""
    centres = cover_balls(zhat, n_balls)  # (n, B, H) float32: the stored values
    ball_of, dist = nearest_ball(zhat, centres.astype(np.float64))
    radius = np.full(centres.shape[:2], -np.inf)
    np.maximum.at(radius, (np.arange(len(radius))[:, None], ball_of), dist)
    out = []
    for c, r in zip(centres, radius, strict=True):
        used = np.isfinite(r)
        r = np.nextafter((r[used] * (1 + 1e-6) + 1e-6).astype(np.float32), np.float32(np.inf))
        out.append(np.concatenate([c[used], r[:, None]], axis=1).astype(np.float32))
    return out
