"""The gallery: what the app, search and evaluation need of a gallery of encoded videos, written once above a
store (``prvr.index.storage.GalleryStore``).

``Gallery`` does everything both stores do alike: opening (create / open / open_or_create over a store), the
identity a gallery records of its model and reference bank and the checks of it (``IndexMismatchError``),
the checks and encoding of added videos (``prvr.index.encoding``), the catalogue (ids, records, lookup by
sha256), the checks of ``k`` and the weights (``prvr.index.query``), and the rank tail: ``rank.top_k`` over
the store's pages, refined by the sketch and scored exactly (``prvr.index.scoring``), then the ``Evidence``.
A store keeps the identity, the records and the per-video arrays, and gives pages of bounded candidates and
``VideoArrays`` to score: the built-in store (``prvr.index.video_index``) and Qdrant (``prvr.index.qdrant``);
``prvr.index.backends.open_gallery`` opens either from a URL or a data directory.

```python
gallery = open_gallery(model, references, url=url, data_dir=data_dir, profile=profile)
# url: "qdrant://HOST:PORT/NAME" or "qdrant+local://DIR"; without one, the built-in index in data_dir
gallery = private_gallery(model, references, directory)    # a new built-in one of its own (sessions, warm-up)
len(gallery); gallery.ids; gallery.record(video_id); gallery.find_sha256(sha)
gallery.add([GalleryVideo(..., words=segments)], text_encoder=encode); gallery.remove([video_id])
gallery.set_words(video_id, segments, text_encoder=encode)   # a video's words, after it (one update)
evidence = gallery.rank(q, k=10, weights=None, text=None)   # exact, best first (the same bits over both
                                                  # stores); text: the query's, for the words' lexical match
gallery.describe(); gallery.data_folder(data_dir); gallery.media_paths(); gallery.close()
```
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from extract.words.segment import WordSegment
from prvr.index.encoding import (
    CONTEXT_BETA,
    GalleryError,
    GalleryVideo,
    ReferenceQueries,
    bank_vectors,
    check_encoded,
    check_ids,
    check_segments,
    check_videos,
    encode_for_index,
)
from prvr.index.evidence import Evidence, VideoEvidence, best_first
from prvr.index.query import Weights, check_k, check_weights
from prvr.index.rank import BOUND_EPS, Exact, top_k
from prvr.index.schema import EVIDENCE, EXACT, SCHEMA_VERSION
from prvr.index.scoring import evidence_of, exact_of, is_csa, query_vector, refined_bounds
from prvr.index.sketch import SKETCH, BoundQuery
from prvr.index.storage import Catalog, DataFolder, Fixed, GalleryStore, Ragged, StoreView
from prvr.index.store import IndexStoreError
from prvr.index.words import TextEncoder, encode_words, match_words
from prvr.models.branches import EncodedQueries
from prvr.plural import counted

log = logging.getLogger(__name__)

SCORED = ("units", "pnorm", "zbasis", "zcoef")  # the arrays an exact score reads (a CSA model's: and frames)


class IndexMismatchError(IndexStoreError):
    """The gallery was built for another model, feature profile, schema or reference bank."""


def model_identity(model) -> dict:
    """What a gallery records about its model and the recipe of what it stores: fingerprint, profile
    identity, geometry, and the propagation strength of the stored moments context."""
    return {"model_fingerprint": model.fingerprint(), "profile": getattr(model, "profile", None),
            "map_size": int(model.cfg.map_size), "max_ctx_l": int(model.cfg.max_ctx_l),
            "context_beta": CONTEXT_BETA}


def bank_identity(references: ReferenceQueries | None) -> dict | None:
    """What a gallery records of the reference bank whose scores every video stores."""
    return None if references is None else {"id": references.id, "count": len(references)}


def bank_words(bank: dict | None) -> str:
    """A recorded bank identity in words, the same whatever order a store keeps its keys in."""
    return "none" if bank is None else f"{bank.get('id')!r} of {bank.get('count')} queries"


def gallery_identity(model, references: ReferenceQueries | None, mode: str) -> dict:
    """The identity a new gallery records: its model's, its reference bank's, and what it stores (mode)."""
    return {**model_identity(model), "references": bank_identity(references), "mode": mode}


def check_identity(where: str, stored: dict, model, references: ReferenceQueries | None) -> None:
    """IndexMismatchError unless the stored identity has this code's schema, this model's identity and (when
    ``references`` are given) this reference bank: the one check of both stores."""
    if stored.get("schema_version") != SCHEMA_VERSION:
        raise IndexMismatchError(f"{where} has schema {stored.get('schema_version')}, this code reads "
                                 f"{SCHEMA_VERSION}; rebuild the index")
    for key, ours in model_identity(model).items():
        if stored.get(key) != ours:
            raise IndexMismatchError(f"{where} was built with {key} = {stored.get(key)!r}, but the model in "
                                     f"use has {key} = {ours!r}; rebuild the index for it")
    if references is not None and stored.get("references") != bank_identity(references):
        raise IndexMismatchError(f"{where} stores the scores of reference bank "
                                 f"{bank_words(stored.get('references'))}, not of the one in use "
                                 f"{bank_words(bank_identity(references))}; rebuild the index")


class Gallery:
    """A gallery of encoded videos for one two-branch model over one store (see the module docstring)."""

    def __init__(self, storage: GalleryStore, model, references: ReferenceQueries | None,
                 identity: dict) -> None:
        """Over a store whose identity (``identity``, as stored) was written or accepted for this model;
        ``model`` None: a gallery opened only to be written (moving one: ``add_encoded``)."""
        self.storage, self.model, self.references, self.identity = storage, model, references, identity
        self._csa = model is not None and is_csa(model)

    # ------------------------------------------------------------------ opening
    @classmethod
    def create_on(cls, storage: GalleryStore, model, references: ReferenceQueries | None = None,
                  identity: dict | None = None) -> Gallery:
        """A new, empty gallery in ``storage`` for this model (refuses an existing one); ``references``: the
        encoded reference queries whose scores each video stores (confidence), None for none. ``identity``:
        the one to record instead of the model's (a moved gallery's, written without a model)."""
        if identity is None:
            identity = gallery_identity(model, references, storage.mode)
        return cls(storage, model, references, storage.create(identity))

    @classmethod
    def open_on(cls, storage: GalleryStore, model, references: ReferenceQueries | None = None) -> Gallery:
        """The gallery in ``storage``; refuses one made for another model, profile, schema or reference bank
        (without ``references`` it opens for reading; adding then needs the bank it was built with), and
        then releases the store."""
        try:
            stored = storage.identity()
            check_identity(storage.where, stored, model, references)
            storage.load()
        except BaseException:
            storage.close()  # (Qdrant's engine keeps its directory locked while open)
            raise
        return cls(storage, model, references, stored)

    @classmethod
    def open_or_create_on(cls, storage: GalleryStore, model,
                          references: ReferenceQueries | None = None) -> Gallery:
        """Open the gallery in ``storage``, or create it when there is none."""
        if storage.exists():
            return cls.open_on(storage, model, references)
        return cls.create_on(storage, model, references)

    # ------------------------------------------------------------------ what is in it
    @property
    def catalog(self) -> Catalog:
        """The live videos as of now (one consistent view)."""
        return self.storage.catalog

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

    def find_sha256(self, sha256: str) -> dict | None:
        """The record of a live video with these bytes, or None (a map lookup, not a scan)."""
        cat = self.catalog
        position = cat.by_sha.get(sha256)
        return None if position is None else cat.videos[position]

    def media_paths(self) -> set[str]:
        """The media paths (as stored: relative to the data dir, or absolute) this gallery's records name:
        what must not be deleted from under it (the built-in store's removed videos' included: a reader of
        an older generation may still serve them)."""
        return self.storage.media_paths()

    def data_folder(self, data_dir: Path) -> DataFolder:
        """The folder of ``data_dir`` this gallery owns (the media sweep reads every other one's records)."""
        return self.storage.data_folder(Path(data_dir))

    def describe(self) -> dict:
        """Backend, mode, where it lives (no server path) and how many videos: for logs and /info."""
        return self.storage.describe()

    def refresh(self) -> None:
        """See another process's writes (the built-in store re-reads its manifest; Qdrant its list)."""
        self.storage.refresh()

    def close(self) -> None:
        """Release what the store holds (a client, a directory lock); the built-in store holds nothing."""
        self.storage.close()

    # ------------------------------------------------------------------ writing
    def add(self, videos: Sequence[GalleryVideo], text_encoder: TextEncoder | None = None) -> None:
        """Encode and add videos in one update; a GalleryError (bad input, duplicate id) changes nothing.
        ``text_encoder`` (the profile's: texts -> token features each) embeds the videos' words; a video
        with words and no text encoder is refused."""
        videos = list(videos)
        if not videos:
            return
        check_videos(videos, set(self.position))  # before encoding: bad input costs nothing
        worded = [v.id for v in videos if v.words]
        if worded and text_encoder is None:
            raise GalleryError(f"video {worded[0]!r} has words but no text_encoder was given to embed them "
                               "(Gallery.add(videos, text_encoder=...))")
        if self.identity.get("references") != bank_identity(self.references):
            raise GalleryError(f"{self.storage.where} stores reference scores of bank "
                               f"{bank_words(self.identity.get('references'))}; open it with that bank "
                               "(references=...) to add videos")
        fixed, ragged = encode_for_index(self.model, videos, self.storage.mode, self.storage.encode_batch,
                                         self.references, text_encoder)
        ids = [v.id for v in videos]
        # again, under the store's writer lock: another writer may have added them meanwhile
        self.storage.append([v.record() for v in videos], fixed, ragged,
                            lambda cat: check_ids(ids, cat.position))
        log.info("indexed %s (%d in the gallery)", counted(len(videos), "video"), len(self))

    def add_encoded(self, records: list[dict], fixed: Fixed, ragged: Ragged) -> None:
        """Add videos whose model outputs were computed elsewhere (benchmarks, moving or upgrading a gallery),
        in ``encode_for_index``'s layout (``schema.FIXED`` arrays, one row per video; ``schema.RAGGED``
        lists, one array per video)."""
        check_encoded(fixed, ragged, len(records))
        bank = (self.identity.get("references") or {}).get("count", 0)
        if fixed["ref_clip"].shape[1:] != (bank,) or fixed["ref_frame"].shape[1:] != (bank,):
            raise GalleryError(f"add_encoded: this gallery stores {bank} reference scores per video, got "
                               f"{fixed['ref_clip'].shape[1:]}")
        ids = [r["id"] for r in records]
        self.storage.append(records, fixed, ragged, lambda cat: check_ids(ids, cat.position))

    def set_words(self, video_id: str, words: Sequence[WordSegment],
                  text_encoder: TextEncoder | None = None) -> None:
        """Give a live video these words (``WordSegment``s, replacing any it had) in one atomic update of its
        store: a video added by its pictures first gains its words when they are read, and a search sees it
        with the old words or the new, never half of them. An unknown id, bad words, or words without a
        ``text_encoder`` (the profile's, as for ``add``) are a GalleryError and change nothing."""
        check_segments(video_id, words)
        words = tuple(words)
        if words and text_encoder is None:
            raise GalleryError(f"video {video_id!r}: words but no text_encoder was given to embed them "
                               "(Gallery.set_words(video_id, words, text_encoder=...))")

        def check(cat: Catalog) -> None:
            if video_id not in cat.position:
                raise GalleryError(f"no video with id {video_id!r} in {self.storage.where}")

        check(self.catalog)  # before encoding: an unknown id costs nothing
        # (an empty words_vec's width is the store's: a video without words stores none)
        arrays = encode_words(self.model, words, text_encoder, 0, bank_vectors(self.references))
        self.storage.set_words(video_id, arrays, check)  # checked again under the store's writer lock
        log.info("the words of %s joined it: %s", video_id, counted(len(words), "line"))

    def remove(self, ids: Sequence[str]) -> None:
        """Remove videos by id in one update; an unknown id is a GalleryError and changes nothing (an id
        given twice is removed once)."""
        ids = list(dict.fromkeys(ids))

        def check(cat: Catalog) -> None:
            unknown = [i for i in ids if i not in cat.position]
            if unknown:
                raise GalleryError(f"no video with id {unknown[:5]} in {self.storage.where}")

        self.storage.remove(ids, check)

    # ------------------------------------------------------------------ ranking
    def weights(self, weights: Sequence[float] | None = None) -> Weights:
        """(clip_w, frame_w): the given pair, checked, or the model's."""
        return check_weights(weights, (self.model.cfg.clip_scale_w, self.model.cfg.frame_scale_w))

    def rank(self, q: np.ndarray | torch.Tensor | EncodedQueries, k: int = 10,
             weights: Sequence[float] | None = None, approximate: bool = False,
             text: str | None = None) -> Evidence:
        """The k best live videos for the model's encoded query ``q`` (an (H,) vector; for a CSA model the
        model's ``EncodedQueries`` of one query), with exact scores and what results need; best first.
        ``text``: the query's (cleaned) text, which the videos' words are also matched with lexically
        (None: their dense match only); videos whose words match rank first (``prvr.index.words``)."""
        k, w = check_k(k), self.weights(weights)
        if isinstance(q, torch.Tensor):
            q = q.detach().cpu().numpy()
        view = self.storage.view()
        hits, ids, scored = self._top(view, q, k, w, approximate)
        words = view.words() if view.live else None
        if words is not None:
            hits, scored = self._by_words(view, words, q, k, w, text, hits, ids, scored)
        cfg = self.model.cfg
        return Evidence(tuple(hits), w, scored, view.live, int(cfg.map_size), int(cfg.max_ctx_l), approximate)

    def _by_words(self, view: StoreView, words, q: np.ndarray | EncodedQueries, k: int, w: Weights,
                  text: str | None, hits: list[VideoEvidence], ids: np.ndarray,
                  scored: int) -> tuple[list[VideoEvidence], int]:
        """The pictures' k best (``hits`` at view ``ids``) with the videos whose words match the query: the
        best k of those not among them scored exactly (the same exact path), each hit given its matched
        segments, all in ``best_first`` order (words first); and how many were scored exactly."""
        found = match_words(words, query_vector(q), text)
        if not found:
            return hits, scored
        have = {int(i) for i in ids}
        best = sorted(found, key=lambda v: (-found[v].score, v))
        extra = np.array([v for v in best if v not in have][:k], dtype=np.int64)
        if len(extra):
            reads = (*EXACT, *EVIDENCE)
            view.prefetch(reads, np.sort(extra))
            arrays, rows = view.arrays(extra, reads)
            hits = hits + list(evidence_of(self.model, arrays, rows, q, w))
            ids = np.concatenate([np.asarray(ids, np.int64), extra])
        hits = [dataclasses.replace(h, words=found[int(i)].lines, words_score=found[int(i)].score)
                if int(i) in found else h for h, i in zip(hits, ids, strict=True)]
        order = best_first(np.array([h.total for h in hits]), ids, k, np.array([h.words_score for h in hits]))
        return [hits[i] for i in order], scored + len(extra)

    def _top(self, view: StoreView, q: np.ndarray | EncodedQueries, k: int, w: Weights,
             approximate: bool) -> tuple[list[VideoEvidence], np.ndarray, int]:
        """The k best live videos' evidence (best first) from one view, their view ids, and how many were
        scored exactly:
        ``rank.top_k`` over the store's pages, refined by the sketch, scored exactly; the winners' exact
        scores are reused for their evidence."""
        if not view.live:
            return [], np.zeros(0, np.int64), 0
        bq, threads = BoundQuery.of(query_vector(q)), torch.get_num_threads()

        def refine(ids: np.ndarray, tau: float) -> np.ndarray:
            arrays, rows = view.arrays(ids, SKETCH)
            return refined_bounds(self.model, arrays, rows, bq, w, tau, threads, view.clip_known())

        reads = SCORED + (("frames",) if self._csa else ())
        scored: list[tuple[np.ndarray, Exact]] = []  # what top_k scored: evidence reuses the winners' rows

        def score(ids: np.ndarray) -> np.ndarray:
            view.prefetch(reads, ids)
            arrays, rows = view.arrays(ids, reads)
            scored.append((ids, exact_of(self.model, arrays, rows, q, w, bq)))
            return scored[-1][1].total

        pages = view.pages(bq, k, w, approximate, refine, not self._csa)
        ids, _, n = top_k(pages, k, score, refine, BOUND_EPS * (1 + w.clip + w.frame), view.shortlist(k))
        if not scored:
            return [], np.zeros(0, np.int64), n
        every = np.concatenate([p for p, _ in scored])  # distinct ids
        order = np.argsort(every)
        exact = Exact.concat([ex for _, ex in scored]).take(order[np.searchsorted(every, ids, sorter=order)])
        winners = np.sort(ids)
        view.prefetch(EVIDENCE, winners)
        arrays, rows = view.arrays(ids, (*EXACT, *EVIDENCE))
        hits = evidence_of(self.model, arrays, rows, q, w, exact)
        return list(hits), np.asarray(ids, np.int64), n
