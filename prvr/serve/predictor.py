"""The one object the app talks to: the model, its shared gallery, uploads and session galleries.

``Predictor.from_settings(AppSettings.from_args())`` picks the model (``prvr.serve.model_choice``), opens the
shared gallery (``prvr.index.backends.open_gallery``: the built-in index in the data dir, or ``--index``'s
Qdrant collection), indexes the demo gallery on first start and optionally a folder of the user's videos
(only new or changed files, by sha256). Then:

    predictor.search(query, k, clip_weight, session) -> SearchResponse    # a list of Contract 4 dicts
    predictor.add_video(path, session, progress)     -> {status, video_id, message}   (prvr.serve.uploads)
    predictor.describe(session)                      -> model, profile, video counts, gallery
    predictor.close()                                -> waits for background work, releases the gallery
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from extract import zerogpu
from extract.decode import MediaError, find_videos, sha256_file
from extract.pipeline import TextEncoder
from extract.profiles import ProfileMismatch, check_identity, get_profile
from extract.transcode import ensure_browser_playable
from prvr.demo.gallery import build_demo_gallery, interleaved
from prvr.index import GalleryVideo, VideoIndex
from prvr.index.backends import open_gallery
from prvr.index.gallery import QueryError, Weights
from prvr.results.confidence import Calibrator
from prvr.results.response import SearchResponse
from prvr.results.search import search_text
from prvr.serve.media import SHARED_MARKER, MediaStore, Progress
from prvr.serve.model_choice import ModelInfo, load_model, profile_weights, warm_search_kernels
from prvr.serve.owner import DataDirLock
from prvr.serve.persist import PersistentStore
from prvr.serve.sessions import SessionGallery, open_session
from prvr.serve.settings import AppSettings, on_spaces
from prvr.serve.startup import quiet_libraries
from prvr.serve.uploads import Uploads, distinct_title

log = logging.getLogger(__name__)



class Serialised:
    """A callable that runs one call at a time (for objects that refuse concurrent calls)."""

    def __init__(self, fn: Callable) -> None:
        self.fn, self.lock = fn, threading.Lock()

    def __call__(self, *args: object, **kwargs: object) -> object:
        with self.lock:
            return self.fn(*args, **kwargs)

    def __getattr__(self, name: str) -> object:
        return getattr(self.fn, name)


class Pending(NamedTuple):
    """A video to extract and index at start-up."""

    video_id: str
    path: Path
    title: str
    sha256: str


class Predictor:
    """Model + shared gallery + upload pipeline; see the module docstring. Thread-safe."""

    def __init__(self, settings: AppSettings, model: object, info: ModelInfo, profile: str) -> None:
        self.settings, self.model, self.info, self.profile = settings, model, info, profile
        weights = profile_weights(settings, profile) or None
        # the process's extractor: on ZeroGPU built now, in the main thread before launch, so its models are
        # moved to the GPU in each worker; queries are encoded on the CPU there (a search spends no quota)
        self.extractor = zerogpu.prepare(profile, weights)
        self.weights = weights
        self.text = TextEncoder(profile, weights, device=zerogpu.search_device())
        if getattr(model, "profile", None) is not None:  # features of other weights would be meaningless
            try:
                check_identity(self.extractor.profile.identity(), model.profile, "the model")
            except ProfileMismatch as err:
                raise ProfileMismatch(f"{err} Pass the weights the model was made with (--weights).") \
                    from None
        # HF's fast tokenizers refuse concurrent calls ("Already borrowed"): only the tokenizer is
        # serialised, the text model runs in parallel for concurrent searches
        self.text.backbone.tokenizer = Serialised(self.text.backbone.tokenizer)
        # confidence: the reference captions, encoded once per model (token features cached in the data
        # dir); every gallery stores each video's scores on them, every search labels hits from those
        self.calibrator = Calibrator.for_model(model, self.text, cache_dir=settings.data_dir / "confidence")
        self.confidence = self.calibrator.confidence()
        self.index = open_gallery(model, self.calibrator.reference_queries, url=settings.index,
                                  data_dir=settings.data_dir, profile=profile)
        self.media = MediaStore(settings.data_dir)
        # --persist: the shared gallery's write-once copy in a bucket folder, restored at start; every shared
        # add and removal is recorded there (session uploads and the demo gallery never are)
        self.persist = (PersistentStore(settings.persist, self.extractor.profile.identity())
                        if settings.persist is not None else None)
        self.uploads = Uploads(settings, profile, weights, self.index, self.media, self.persist)
        self.sessions_dir = settings.data_dir / "sessions"
        # Searches run in parallel: each gallery serves reads from an immutable view and serialises its
        # own writes; nothing else here is shared mutable state.
        self.examples: list[str] = []
        self.tracing: threading.Thread | None = None  # from_settings' background trace of the text model
        self.owner: DataDirLock | None = None  # from_settings' lock on the data dir (one owner at a time)
        self.closed = False

    @classmethod
    def from_settings(cls, settings: AppSettings) -> Predictor:
        """Load the model, open or build the shared gallery (demo gallery + optional folder).

        The data dir is locked for this predictor until ``close`` (or the process ends): a second one on
        the same dir raises ``prvr.serve.owner.DataDirBusy`` naming the owning process, before any loading.
        """
        t0 = time.perf_counter()
        owner = DataDirLock(settings.data_dir).acquire()
        try:
            return cls._load(settings, owner, t0)
        except BaseException:
            owner.release()
            raise

    @classmethod
    def _load(cls, settings: AppSettings, owner: DataDirLock, t0: float) -> Predictor:
        """``from_settings`` once the data dir is ours."""
        quiet_libraries()
        log.info("loading the model and its feature extractors")
        model, info, profile = load_model(settings)
        kernels = warm_search_kernels(model)  # compiles while the gallery renders and extracts
        log.info("loading the feature extractor and text encoder, and the confidence references")
        predictor = cls(settings, model, info, profile)
        predictor.owner = owner
        predictor.sweep_media()
        predictor.restore_persisted()
        if not len(predictor.index):
            log.info("first start with %s: rendering and indexing the demo gallery (about a minute on 2 "
                     "cores; later starts reuse it)", settings.data_dir)
        predictor.add_demo_gallery()
        if settings.gallery is not None:
            predictor.sync_folder(settings.gallery)
        shutil.rmtree(predictor.sessions_dir, ignore_errors=True)  # sessions of a previous run are gone
        if kernels.is_alive():
            log.info("waiting for the search kernels (still compiling)")
        kernels.join()
        if len(predictor.index):  # load the search kernels now (compiled above), not in a user's search
            predictor.search(predictor.examples[0] if predictor.examples else "a video", k=1)
        log.info("ready in %.1f s: %d videos in %s", time.perf_counter() - t0, len(predictor.index),
                 predictor.gallery_words())
        # searches run the text model eagerly until its TorchScript trace is ready and checked (seconds);
        # not a daemon: exit waits for it instead of killing it inside torch
        predictor.tracing = threading.Thread(target=predictor.text.backbone.trace, name="trace-text-model")
        predictor.tracing.start()
        return predictor

    def close(self) -> None:
        """Wait for background work, release the shared gallery (a Qdrant client, its lock) and the data
        dir. Safe to call twice."""
        if self.tracing is not None:
            self.tracing.join()
            self.tracing = None
        if not self.closed:
            self.closed = True
            self.index.close()
        if self.owner is not None:
            self.owner.release()
            self.owner = None

    # ------------------------------------------------------------------ leaving nothing behind
    def sweep_media(self) -> None:
        """Delete what a crash left in the media dir (``MediaStore.sweep``). A Qdrant gallery leaves a marker
        among the data dir's indexes, so that a later start with the built-in index, which cannot read the
        collection, keeps every file it may name instead of deleting them."""
        if isinstance(self.index, VideoIndex):
            own = self.index.root
        else:
            own = self.settings.data_dir / "indexes" / f"qdrant-{self.index.describe()['name']}"
            own.mkdir(parents=True, exist_ok=True)
            marker = own / SHARED_MARKER
            if not marker.exists():
                marker.write_text(f"{self.settings.index}\n")
        self.media.sweep(self.media.referenced([self.index], own))

    # ------------------------------------------------------------------ building the shared gallery
    def restore_persisted(self) -> None:
        """Add the videos kept in --persist that the shared gallery lacks (their features: no extraction) and
        log where the shared gallery lives and whether it persists."""
        if self.persist is None:
            (log.warning if on_spaces() else log.info)(
                "the shared gallery lives in %s on this machine's disk%s", self.settings.data_dir,
                ": a Space loses it at every restart; attach a Storage Bucket and set PRVR_PERSIST to its "
                "mount path to keep it" if on_spaces() else " (--persist DIR keeps it in a second place)")
            return
        t0 = time.perf_counter()
        kept = [v for v in self.persist.restore()
                if (self.index.record(v.id) or {}).get("sha256") != v.sha256]
        stale = [v.id for v in kept if self.index.record(v.id) is not None]
        if stale:
            self.index.remove(stale)
        if kept:
            self.index.add(kept)
        log.info("%s", self.persist.words(time.perf_counter() - t0))

    def add_demo_gallery(self) -> None:
        """Render the demo videos (first start only) and index those not indexed yet, in one update."""
        chosen = self.settings.demo_videos
        gallery = build_demo_gallery(self.settings.data_dir / "demo",
                                     video_ids=[v.strip() for v in chosen.split(",")] if chosen else None)
        # the recipe's measured examples (captions the offline default ranks first), else every caption
        self.examples = list(gallery.examples) or interleaved(gallery.captions, limit=24)
        missing = [Pending(v.id, v.path, v.title, sha256_file(v.path)) for v in gallery.videos
                   if self.index.record(v.id) is None]
        if missing:
            log.info("hashing and indexing %d demo videos", len(missing))
        self._index_files(missing, "demo gallery")

    def sync_folder(self, folder: Path) -> None:
        """Index new or changed videos of a folder (by sha256) and drop those that left it."""
        if not folder.is_dir():
            raise NotADirectoryError(f"--gallery {folder} is not a directory")
        wanted: list[Pending] = []
        present: set[str] = set()
        for path in find_videos([folder]):
            video_id = f"folder:{path.relative_to(folder).as_posix()}"
            present.add(video_id)
            try:
                sha = sha256_file(path)
            except OSError as err:
                log.warning("skipping %s: %s", path, err)
                continue
            known = self.index.record(video_id)
            if known is None or known.get("sha256") != sha:
                wanted.append(Pending(video_id, path, path.relative_to(folder).as_posix(), sha))
        changed = {p.video_id for p in wanted}
        stale = [i for i in self.index.ids if i.startswith("folder:") and (i not in present or i in changed)]
        if stale:
            shas = {i: self.index.record(i).get("sha256", "") for i in stale}
            self.index.remove(stale)
            if self.persist is not None:
                for video_id in stale:
                    self.persist.record_remove(video_id, shas[video_id])
        self._index_files(wanted, f"folder {folder}", make_playable=True, persist=True)

    def _index_files(self, items: list[Pending], what: str, make_playable: bool = False,
                     persist: bool = False) -> None:
        """Extract videos and add them in one update; unusable files are logged and skipped; with
        ``persist``, recorded in --persist (a re-encoded copy with them, an original by its path)."""
        t0, batch = time.perf_counter(), []
        taken = {r.get("title", "") for r in self.index.records() if r.get("id") not in
                 {i.video_id for i in items}}
        for n, item in enumerate(items, 1):
            log.info("indexing %s: video %d of %d, %s", what, n, len(items), item.path.name)
            try:
                # one folder per content hash: files with the same name in different folders never clash
                playable = (ensure_browser_playable(item.path, self.media.dir / item.sha256[:16])
                            if make_playable else item.path)
                features = zerogpu.extract_video(playable, self.profile, self.weights, sha256=item.sha256,
                                                 startup=True)
            except MediaError as err:
                log.warning("skipping %s: %s", item.path, err)
                continue
            # titles of different files never collide in a result list: a folder's clip.flv beside
            # clip.mpg keeps its extension, a/clip.mp4 beside b/clip.mp4 its folder
            rel = Path(item.title)
            title = distinct_title([rel.stem, rel.name, item.title] if item.video_id.startswith("folder:")
                                   else [item.title], taken)
            taken.add(title)
            batch.append(GalleryVideo.from_features(item.video_id, features, title,
                                                    self.media.portable(playable)))
        if batch:
            self.index.add(batch)
            log.info("indexed %d videos of the %s in %.1f s", len(batch), what, time.perf_counter() - t0)
            if persist and self.persist is not None:
                own = self.media.dir.resolve()
                for video in batch:
                    located = self.media.locate(video.path)
                    try:
                        self.persist.record_add(video, located if located.is_relative_to(own) else None)
                    except OSError:
                        log.exception("%s could not be saved to the persistent folder", video.id)

    # ------------------------------------------------------------------ searching
    @property
    def default_clip_weight(self) -> float:
        """The model's clip-scale share of the score (MS-SL: 0.7)."""
        cfg = self.model.cfg
        return cfg.clip_scale_w / (cfg.clip_scale_w + cfg.frame_scale_w)

    def search(self, query: str, k: int = 5, clip_weight: float | None = None,
               session: SessionGallery | None = None) -> SearchResponse:
        """Top-k videos (Contract 4 dicts) over the shared gallery and the session's uploads."""
        weight = self.default_clip_weight if clip_weight is None else float(clip_weight)
        if not 0.0 <= weight <= 1.0:
            raise QueryError(f"clip_weight must be between 0 and 1, got {weight}")
        galleries = [self.index] + ([session.index] if session is not None and len(session.index) else [])
        # cleaned and encoded once by the profile's text backbone, ranked in every gallery; one confidence
        # rule for all hits: each video's own cuts from its reference scores at these weights
        response = search_text(galleries, query, self.text.encode, k, Weights(weight, 1.0 - weight),
                               confidence=self.confidence)
        private = session.index.position if len(galleries) > 1 else {}
        located = [dict(r, path=str(self.media.locate(r["path"])),
                        **({"source": "session"} if r["video_id"] in private else {}))
                   for r in response.results]
        return dataclasses.replace(response, results=located,
                                   query=dict(response.query, **self.query_reading(response.query["text"])))

    def query_reading(self, text: str) -> dict:
        """How much of a (cleaned) query the text model reads: ``tokens`` (the tokenizer's count, special
        tokens included), ``tokens_read`` (the model's limit), and when the query is longer,
        ``words_read`` and ``read_until`` (the last words it read)."""
        limit = int(self.text.profile.max_tokens)
        tokenizer = self.text.backbone.tokenizer
        tokens = len(tokenizer([text])["input_ids"][0])
        reading: dict = {"tokens": tokens, "tokens_read": limit}
        if tokens > limit:
            try:
                spans = tokenizer([text], truncation=True, max_length=limit,
                                  return_offsets_mapping=True)["offset_mapping"][0]
            except (NotImplementedError, KeyError, TypeError, ValueError):  # a slow tokenizer: no offsets
                return reading
            read = text[: max(int(end) for _, end in spans)].split()
            reading.update(words_read=len(read), read_until=" ".join(read[-4:]))
        return reading

    # ------------------------------------------------------------------ uploads
    def ensure_session(self, session: SessionGallery | None) -> SessionGallery | None:
        """The session's private gallery, created on its first upload (None when uploads are shared)."""
        if self.settings.uploads == "shared" or session is not None:
            return session
        return open_session(self.sessions_dir, self.model, self.calibrator.reference_queries)

    def add_video(self, path: str | Path, session: SessionGallery | None = None,
                  progress: Progress | None = None, name: str | None = None) -> dict:
        """One upload (``prvr.serve.uploads.Uploads.add``): ``{status, video_id, message}``."""
        return self.uploads.add(path, session, progress, name)

    def video_file(self, video_id: str, sessions: Sequence[SessionGallery] = ()) -> Path | None:
        """The playable file of a live video of the shared gallery or of one of ``sessions``, or None."""
        for gallery in [self.index] + [s.index for s in sessions]:
            record = gallery.record(video_id)
            if record is not None and record.get("path"):
                return self.media.locate(record["path"])
        return None

    # ------------------------------------------------------------------ describing
    def gallery_words(self) -> str:
        """Where the shared gallery lives, in words without server paths (logs, /info)."""
        about = self.index.describe()
        kept = (f", kept across restarts in the folder {self.settings.persist.name!r}"
                if self.persist is not None else "")
        if about["backend"] == "qdrant":
            return f"the Qdrant collection {about['name']!r} ({about['where']}){kept}"
        return f"the data directory's index (indexes/{about['name']}){kept}"

    def describe(self, session: SessionGallery | None = None) -> dict:
        """Model, feature profile, gallery size and index mode, for the info panel and README."""
        shared, private = len(self.index), len(session.index) if session else 0
        uploads = ("session: private to each browser session, deleted when it ends"
                   if self.settings.uploads == "session" else "shared: added to the shared gallery")
        return {"model": {"name": self.info.name, "description": self.info.description, "why": self.info.why,
                          "metrics": self.info.metrics, "fingerprint": self.model.fingerprint()[:12]},
                "profile": {"name": self.profile, "description": get_profile(self.profile).description},
                "videos": shared + private, "shared_videos": shared, "session_videos": private,
                "index": f"{self.index.describe()['mode']} search over all proposals, persistent in "
                         f"{self.gallery_words()}",
                "uploads": uploads, "confidence": self.calibrator.describe()}

    def example_queries(self) -> list[str]:
        """Demo captions to offer as example queries."""
        return list(self.examples)

    def static_paths(self) -> list[str]:
        """Folders whose videos the app serves in place (never copied into Gradio's cache)."""
        owned = [self.settings.data_dir / "demo", self.media.dir, self.sessions_dir]
        for folder in owned:
            folder.mkdir(parents=True, exist_ok=True)
        kept = [self.persist.media_dir] if self.persist is not None else []  # restored videos play from there
        return [str(p) for p in owned + kept + ([self.settings.gallery] if self.settings.gallery else [])]
