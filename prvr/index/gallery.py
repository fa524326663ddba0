"""The gallery contract: what the app, search and evaluation need of a gallery of encoded videos, written
once.

Two backends implement it: ``prvr.index.video_index.VideoIndex`` (the built-in, on-disk index) and
``prvr.index.qdrant.QdrantIndex`` (a Qdrant collection); ``prvr.index.backends.open_gallery`` opens either
from a URL or a data directory. Everything both backends do alike lives here, on ``Gallery``: the catalogue
of live videos (ids, records, lookup by sha256), the identity an index records of its model and reference
bank, the checks of ``k`` and the score weights, and the final ``Evidence``. A backend supplies storage and
ranking: ``catalog``, ``add``, ``remove``, ``_top`` and its own ``describe`` / ``close``.

```python
gallery = open_gallery(model, references, url=url, data_dir=data_dir, profile=profile)
# url: "qdrant://HOST:PORT/NAME" or "qdrant+local://DIR"; without one, the built-in index in data_dir
len(gallery); gallery.ids; gallery.record(video_id); gallery.find_sha256(sha)
gallery.add([GalleryVideo(...)]); gallery.remove([video_id])
evidence = gallery.rank(q, k=10, weights=None)    # exact, best first (the same bits in both backends)
gallery.describe(); gallery.close()
```
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from prvr.index.evidence import Evidence, VideoEvidence
from prvr.index.ingest import CONTEXT_BETA, GalleryVideo, ReferenceQueries
from prvr.index.store import IndexStoreError
from prvr.models.branches import EncodedQueries

MAX_K = 1000  # more hits than a person reads; bounds the work of one rank


class IndexMismatchError(IndexStoreError):
    """The gallery was built for another model, feature profile, schema or reference bank."""


class QueryError(ValueError):
    """A query that cannot be searched; the message is meant for a person."""


class Weights(NamedTuple):
    """(clip_w, frame_w), checked: finite, non-negative, not both 0 (the bounds need it)."""

    clip: float
    frame: float


def check_weights(weights: Sequence[float] | None, default: tuple[float, float]) -> Weights:
    """The given pair (already checked ``Weights`` pass through) or the default, as ``Weights``."""
    if isinstance(weights, Weights):
        return weights
    if weights is None:
        return Weights(float(default[0]), float(default[1]))
    if len(weights) != 2:
        raise QueryError(f"weights must be a (clip_w, frame_w) pair, got {list(weights)}")
    w = (float(weights[0]), float(weights[1]))
    if not all(math.isfinite(x) and x >= 0 for x in w) or sum(w) == 0:
        raise QueryError(f"weights must be finite, non-negative and not both 0, got {w}")
    return Weights(*w)


def check_k(k: object, limit: int = MAX_K) -> int:
    """``k`` as an int in [1, limit], else a QueryError naming what was given."""
    if not isinstance(k, int | np.integer) or isinstance(k, bool) or not 1 <= k <= limit:
        raise QueryError(f"k must be a whole number from 1 to {limit}, got {k!r}")
    return int(k)


def model_identity(model) -> dict:
    """What a gallery records about its model and the recipe of what it stores: fingerprint, profile
    identity, geometry, and the propagation strength of the stored moments context."""
    return {"model_fingerprint": model.fingerprint(), "profile": getattr(model, "profile", None),
            "map_size": int(model.cfg.map_size), "max_ctx_l": int(model.cfg.max_ctx_l),
            "context_beta": CONTEXT_BETA}


def bank_identity(references: ReferenceQueries | None) -> dict | None:
    """What a gallery records of the reference bank whose scores every video stores."""
    return None if references is None else {"id": references.id, "count": len(references)}


class Catalog(NamedTuple):
    """The live videos as one read sees them: records by position, live id -> position, sha256 -> position."""

    videos: list[dict]  # every record by position (the built-in index keeps removed ones' places)
    position: dict[str, int]  # live video id -> position, in insertion order
    by_sha: dict[str, int]  # content hash -> position of a live video with those bytes

    @classmethod
    def of(cls, videos: list[dict], live: Sequence[int] | None = None) -> Catalog:
        """The catalogue of ``videos`` whose positions ``live`` are live (default: all)."""
        live = range(len(videos)) if live is None else live
        position = {videos[p]["id"]: int(p) for p in live}
        by_sha = {videos[p]["sha256"]: p for p in position.values() if videos[p].get("sha256")}
        return cls(videos, position, by_sha)


class Gallery(ABC):
    """A gallery of encoded videos for one two-branch model (see the module docstring)."""

    model: object
    references: ReferenceQueries | None

    # ------------------------------------------------------------------ what a backend supplies
    @property
    @abstractmethod
    def catalog(self) -> Catalog:
        """The live videos as of now (one consistent view)."""

    @abstractmethod
    def add(self, videos: Sequence[GalleryVideo]) -> None:
        """Encode and add videos in one update; a GalleryError (bad input, duplicate id) changes nothing."""

    @abstractmethod
    def remove(self, ids: Sequence[str]) -> None:
        """Remove videos by id in one update; an unknown id is a GalleryError and changes nothing."""

    @abstractmethod
    def _top(self, q: np.ndarray | EncodedQueries, k: int, w: Weights,
             approximate: bool) -> tuple[list[VideoEvidence], int, int]:
        """The k best live videos' evidence (best first), how many were scored exactly, how many live."""

    @abstractmethod
    def describe(self) -> dict:
        """Backend, mode, where it lives (no server path) and whether it persists: for logs and /info."""

    def close(self) -> None:  # noqa: B027 - a no-op where the backend holds nothing (the built-in index)
        """Release what the backend holds (a client, a lock); the built-in index holds nothing."""

    @abstractmethod
    def refresh(self) -> None:
        """See another process's writes (the built-in index re-reads its manifest; Qdrant its list)."""

    # ------------------------------------------------------------------ one implementation for both
    def __len__(self) -> int:
        return len(self.catalog.position)

    @property
    def position(self) -> dict[str, int]:
        """Live video id -> its position."""
        return self.catalog.position

    @property
    def ids(self) -> list[str]:
        """Live video ids in insertion order."""
        return list(self.catalog.position)

    def record(self, video_id: str) -> dict | None:
        """The stored record (id, title, path, duration, sha256) of a live video, or None."""
        cat = self.catalog
        position = cat.position.get(video_id)
        return None if position is None else cat.videos[position]

    def records(self) -> list[dict]:
        """The stored records of the live videos, in insertion order."""
        cat = self.catalog
        return [cat.videos[p] for p in cat.position.values()]

    def media_paths(self) -> set[str]:
        """The media paths (as stored: relative to the data dir, or absolute) of the videos this gallery
        names: what must not be deleted from under it."""
        return {r.get("path", "") for r in self.records()} - {""}

    def find_sha256(self, sha256: str) -> dict | None:
        """The record of a live video with these bytes, or None (a map lookup, not a scan)."""
        cat = self.catalog
        position = cat.by_sha.get(sha256)
        return None if position is None else cat.videos[position]

    def weights(self, weights: Sequence[float] | None = None) -> Weights:
        """(clip_w, frame_w): the given pair, checked, or the model's."""
        return check_weights(weights, (self.model.cfg.clip_scale_w, self.model.cfg.frame_scale_w))

    def rank(self, q: np.ndarray | torch.Tensor | EncodedQueries, k: int = 10,
             weights: Sequence[float] | None = None, approximate: bool = False) -> Evidence:
        """The k best live videos for the model's encoded query ``q`` (an (H,) vector; for a CSA model the
        model's ``EncodedQueries`` of one query), with exact scores and what results need; best first."""
        k, w = check_k(k), self.weights(weights)
        if isinstance(q, torch.Tensor):
            q = q.detach().cpu().numpy()
        hits, scored, live = self._top(q, k, w, approximate)
        cfg = self.model.cfg
        return Evidence(tuple(hits), w, scored, live, int(cfg.map_size), int(cfg.max_ctx_l), approximate)
