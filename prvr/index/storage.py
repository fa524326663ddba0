"""The storage interface under ``prvr.index.gallery.Gallery``: what a store of encoded videos supplies,
declared once. The built-in store (``prvr.index.video_index.BuiltinStore``: segments + manifest in a
directory) and the Qdrant store (``prvr.index.qdrant.QdrantStore``: two collections) implement it;
everything else a gallery does (opening, identity and reference-bank checks, encoding, the catalogue's
lookups, the rank tail) is the ``Gallery``'s, once for both.

A store is generic over the per-video arrays ``prvr.index.schema`` declares (``FIXED`` / ``RAGGED`` by name):
it stores and returns them by name, so a new per-video field is a schema edit, not a store edit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np

from prvr.index.query import Weights
from prvr.index.rank import ClipBounds, Page
from prvr.index.scoring import VideoArrays
from prvr.index.sketch import BoundQuery
from prvr.index.words import Words

Fixed = dict[str, np.ndarray]  # schema.FIXED arrays, one row per video
Ragged = dict[str, list[np.ndarray]]  # schema.RAGGED arrays, one array per video
Refine = Callable[[np.ndarray, float], np.ndarray]  # rank.top_k's refine: (sorted ids, tau) -> bounds


class Catalog(NamedTuple):
    """The live videos as one read sees them: records by position, live id -> position, sha256 -> position."""

    videos: list[dict]  # every record by position (the built-in store keeps removed ones' places)
    position: dict[str, int]  # live video id -> position, in insertion order
    by_sha: dict[str, int]  # content hash -> position of a live video with those bytes

    @classmethod
    def of(cls, videos: list[dict], live: Sequence[int] | None = None) -> Catalog:
        """The catalogue of ``videos`` whose positions ``live`` are live (default: all)."""
        live = range(len(videos)) if live is None else live
        position = {videos[p]["id"]: int(p) for p in live}
        by_sha = {videos[p]["sha256"]: p for p in position.values() if videos[p].get("sha256")}
        return cls(videos, position, by_sha)


class DataFolder(NamedTuple):
    """The folder of a data dir that a gallery owns (what the media sweep must not read as another's)."""

    path: Path
    listed: bool  # True: the store's own directory, whose records list its media; False: one named for a
    # store elsewhere (a Qdrant collection), which holds only a marker


class StoreView(Protocol):
    """One consistent view of a store, for one rank. Videos are named by ids that order them as inserted
    (the built-in store's positions, Qdrant's insertion numbers): ``rank.top_k`` breaks ties by them."""

    live: int  # how many live videos the view holds

    def shortlist(self, k: int) -> int:
        """How many of the best first bounds ``rank.top_k`` refines before scoring (fewer where refining
        costs a fetch)."""

    def pages(self, bq: BoundQuery, k: int, w: Weights, approximate: bool, refine: Refine,
              frame_bounded: bool) -> Iterable[Page]:
        """Candidates with upper bounds of their totals (``rank.Page``); ``refine`` is the gallery's tighter
        bound (over ``arrays(ids, sketch.SKETCH)``); ``frame_bounded``: whether the stored frame-scale
        features bound the frame score (not for a CSA model)."""

    def clip_known(self) -> ClipBounds | None:
        """The full codes' clip bounds its pages computed (``rank.ClipBounds``, keyed by ids), which
        ``refine`` then takes rather than computing them again; None where the pages did not."""

    def arrays(self, ids: np.ndarray, names: Sequence[str]) -> tuple[VideoArrays, np.ndarray]:
        """These videos' arrays ``names`` (at least) as ``VideoArrays``, with the rows that hold them, in the
        order of ``ids``."""

    def prefetch(self, names: Sequence[str], ids: np.ndarray) -> None:
        """Start reading these arrays of these videos (sorted ids) at once, where a read costs a disk read."""

    def words(self) -> Words | None:
        """The live videos' word segments (``schema.WORDS``) as tables ready to match, keyed by the view's
        ids; None when no live video has words (then a rank costs what it did without the channel)."""


class GalleryStore(Protocol):
    """Where a gallery's identity, records and per-video arrays are kept (see the module docstring)."""

    where: str  # the store in messages: a directory, a collection's address
    mode: str  # what it stores of each video ("exact" / "compact": ``encoding.encode_for_index``'s mode)
    encode_batch: int  # videos encoded at once for it

    def exists(self) -> bool:
        """Whether a gallery is stored here (its identity written)."""

    def create(self, identity: dict) -> None:
        """Write the identity of a new, empty gallery (IndexStoreError when one exists); ready to use."""

    def identity(self) -> dict:
        """The identity read back (with the store's own keys: format, schema version...); IndexStoreError
        when there is none or it is not prvr's."""

    def load(self) -> None:
        """Ready the store whose identity the gallery accepted, for reads and writes."""

    @property
    def catalog(self) -> Catalog:
        """The live videos as of now (one consistent view)."""

    def append(self, records: list[dict], fixed: Fixed, ragged: Ragged,
               check: Callable[[Catalog], None]) -> None:
        """Append encoded videos in one atomic update; ``check(catalog)`` runs first, under the store's
        writer lock, against the catalogue the update applies to (another writer may have changed it)."""

    def remove(self, ids: Sequence[str], check: Callable[[Catalog], None]) -> None:
        """Remove live videos by id in one update; ``check(catalog)`` as for ``append``."""

    def set_words(self, video_id: str, words: dict[str, np.ndarray],
                  check: Callable[[Catalog], None]) -> None:
        """Replace one live video's words arrays (``schema.WORDS``, one video's: ``words.encode_words``; an
        empty ``words_vec`` may have any width) in one atomic, durable update: a read sees the old words or
        the new, never a mix; the video's other arrays, record and id in the view stay as they were.
        ``check(catalog)`` as for ``append``."""

    def view(self) -> StoreView:
        """A consistent view for one rank."""

    def describe(self) -> dict:
        """Backend, mode, where it lives (no server path), videos: for logs and /info."""

    def refresh(self) -> None:
        """See another process's writes."""

    def close(self) -> None:
        """Release what the store holds (a client, a directory lock)."""

    def media_paths(self) -> set[str]:
        """The media paths (as stored) that the store's records name, and must not be deleted."""

    def data_folder(self, data_dir: Path) -> DataFolder:
        """The folder of ``data_dir`` this store owns."""
