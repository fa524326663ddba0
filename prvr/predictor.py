"""The one object the app talks to: a model, its shared index, per-session upload indexes and uploads.

``Predictor.from_settings(AppSettings.from_args())`` picks the model (``prvr.model_choice.load_model``: a
trained MS-SL checkpoint, else a training-free one), opens the shared index in the data directory (building
it from the generated demo gallery on first start) and optionally indexes a folder of the user's videos
(only new or changed files, by sha256). Then:

    predictor.search(query, k, clip_weight, session) -> SearchResponse    # a list of Contract 4 dicts
    predictor.add_video(path, session, progress)     -> {status, video_id, message}
    predictor.describe(session)                      -> model, profile, video counts, index mode

Uploads go validate -> make browser-playable -> extract -> index; every bad upload gets a specific message
and leaves the index exactly as it was. On a public host (``uploads="session"``) an upload lands in a
small index of its own browser session, searched together with the shared one and deleted with the
session; locally (``uploads="shared"``) it joins the shared gallery.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from extract.decode import DecodeLimits, MediaError, find_videos, probe, sha256_file
from extract.transcode import ensure_browser_playable, unplayable_reason
from prvr.model_choice import ModelInfo, load_model, profile_weights, warm_search_kernels
from prvr.query import QueryError
from prvr.results import SearchResponse
from prvr.search import search_text
from prvr.settings import AppSettings

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]  # (fraction of this video done, stage in words)


class UploadRefused(MediaError):
    """An upload refused by the app's limits (size, count), before any decoding."""


@dataclass
class SessionGallery:
    """One browser session's private uploads: a small index in a temp dir, deleted with the session."""

    root: Path
    index: object  # VideoIndex over the same model as the shared index
    uploads: int = 0  # uploads accepted so far (the per-session limit counts these)

    def close(self) -> None:
        """Delete the session's videos and index."""
        log.info("deleting session gallery %s (%d uploads)", self.root, self.uploads)
        shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def close_if_any(session: SessionGallery | None) -> None:
        """``gr.State`` delete callback: the state may never have been set."""
        if session is not None:
            session.close()


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


def upload_limits(settings: AppSettings) -> DecodeLimits:
    """Decoder limits for uploads: the app's maximum duration, the decoder's other defaults."""
    return DecodeLimits(max_duration_s=settings.max_duration_s)


def caption_examples(captions: Sequence[object], limit: int = 24) -> list[str]:
    """Demo captions, interleaved so the first page shows one caption of each photograph."""
    by_photo: dict[str, list[str]] = {}
    for c in captions:
        by_photo.setdefault(c.photo, []).append(c.text)
    rounds = max((len(v) for v in by_photo.values()), default=0)
    ordered = [texts[i] for i in range(rounds) for texts in by_photo.values() if i < len(texts)]
    return list(dict.fromkeys(ordered))[:limit]


class Predictor:
    """Model + shared index + upload pipeline; see the module docstring. Thread-safe."""

    def __init__(self, settings: AppSettings, model: object, info: ModelInfo, profile: str) -> None:
        from extract.pipeline import TextEncoder, VideoExtractor
        from extract.profiles import ProfileMismatch, check_identity
        from prvr.index import IndexConfig, VideoIndex
        from prvr.index.store import SCHEMA_VERSION

        self.settings, self.model, self.info, self.profile = settings, model, info, profile
        weights = profile_weights(settings, profile) or None
        self.extractor = VideoExtractor(profile, weights)
        self.text = TextEncoder(profile, weights)
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
        # dir); every index stores each video's scores on them, every search labels hits from those
        from prvr.confidence import Calibrator

        self.calibrator = Calibrator.for_model(model, self.text, cache_dir=settings.data_dir / "confidence")
        self.confidence = self.calibrator.confidence()
        references = self.calibrator.reference_queries
        # one directory per model and index schema: an index written by an older release is left alone
        name = f"{profile}-{model.fingerprint()[:12]}-v{SCHEMA_VERSION}"
        self.index_dir = settings.data_dir / "indexes" / name
        if settings.index:  # a Qdrant collection, not the built-in index (session galleries stay built-in)
            from prvr.index.qdrant import QdrantIndex

            self.index_dir = settings.index
            self.index = QdrantIndex.open_or_create(settings.index, model, references=references)
        else:
            self.index = VideoIndex.open_or_create(self.index_dir, model, IndexConfig(), references)
        self.media_dir = settings.data_dir / "media"  # playable copies of uploads and folder videos
        self.sessions_dir = settings.data_dir / "sessions"
        # Searches run in parallel: each index serves reads from an immutable snapshot and serialises its
        # own writes; nothing else here is shared mutable state.
        self.examples: list[str] = []
        self.tracing: threading.Thread | None = None  # from_settings' background trace of the text model

    @classmethod
    def from_settings(cls, settings: AppSettings) -> Predictor:
        """Load the model, open or build the shared index (demo gallery + optional folder)."""
        t0 = time.perf_counter()
        log.info("loading the model and its feature extractors")
        model, info, profile = load_model(settings)
        kernels = warm_search_kernels(model, profile)  # compiles while the gallery renders and extracts
        predictor = cls(settings, model, info, profile)
        predictor.sweep_media()
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
                 predictor.index_dir)
        # searches run the text model eagerly until its TorchScript trace is ready and checked (seconds)
        predictor.tracing = threading.Thread(target=predictor.text.backbone.trace, name="trace-text-model",
                                             daemon=True)
        predictor.tracing.start()
        return predictor

    # ------------------------------------------------------------------ leaving nothing behind
    def referenced_media(self) -> set[Path]:
        """Every file in the media dir that an index names: this index's live videos, and (conservatively)
        any video record of the other models' indexes in the data dir, which may share the media dir."""
        paths = [self.index.videos[p].get("path", "") for p in self.index.position.values()]
        indexes = (self.settings.data_dir / "indexes").glob("*")
        others = [d for d in indexes if d.is_dir() and d != self.index_dir]
        for other in others:
            files = list(other.glob("*/videos.json"))
            if not files and any(p.is_dir() or p.suffix not in (".json", "") for p in other.iterdir()):
                log.info("index %s has a layout this release does not read; keeping all media", other)
                return {Path("/")}  # cannot tell what it names: delete nothing
            for records in files:
                try:
                    paths += [v.get("path", "") for v in json.loads(records.read_text())]
                except (OSError, ValueError):
                    log.warning("cannot read %s; keeping all media", records)
                    return {Path("/")}  # an unreadable record: delete nothing
        return {(self.settings.data_dir / p).resolve() for p in paths if p}

    def sweep_media(self) -> None:
        """Delete what a crash left in the media dir: ``upload-*`` work dirs, half-written copies, and
        stored files no index names (an upload killed between storing and indexing)."""
        if not self.media_dir.is_dir():
            return
        keep = self.referenced_media()
        if Path("/") in keep:
            return
        removed = 0
        for work in self.media_dir.glob("upload-*"):
            shutil.rmtree(work, ignore_errors=True)
            removed += 1
        for path in sorted(self.media_dir.rglob("*"), key=lambda p: -len(p.parts)):  # files before dirs
            if path.is_file() and path.resolve() not in keep:
                path.unlink(missing_ok=True)
                removed += 1
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        if removed:
            log.info("removed %d leftovers of interrupted uploads from %s", removed, self.media_dir)

    # ------------------------------------------------------------------ building the shared gallery
    def _encode_text(self, texts: list[str]) -> list:
        """The profile's text backbone: token features of each text."""
        return self.text.encode(texts)

    def add_demo_gallery(self) -> None:
        """Render the demo videos (first start only) and index those not indexed yet, in one update."""
        from prvr.demo import build_demo_gallery

        chosen = self.settings.demo_videos
        gallery = build_demo_gallery(self.settings.data_dir / "demo",
                                     video_ids=[v.strip() for v in chosen.split(",")] if chosen else None)
        self.examples = caption_examples(gallery.captions)
        missing = [Pending(v.id, v.path, v.title, sha256_file(v.path)) for v in gallery.videos
                   if v.id not in self.index.position]
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
            known = self._record(video_id)
            if known is None or known.get("sha256") != sha:
                wanted.append(Pending(video_id, path, path.stem, sha))
        changed = {p.video_id for p in wanted}
        stale = [i for i in self.index.ids if i.startswith("folder:") and (i not in present or i in changed)]
        if stale:
            self.index.remove(stale)
        self._index_files(wanted, f"folder {folder}", make_playable=True)

    def _index_files(self, items: list[Pending], what: str, make_playable: bool = False) -> None:
        """Extract videos and add them in one atomic update; unusable files are logged and skipped."""
        from tqdm.auto import tqdm

        from prvr.index import GalleryVideo

        t0, batch = time.perf_counter(), []
        for item in tqdm(items, desc=f"indexing {what}", unit="video", disable=not items):
            try:
                # one folder per content hash: files with the same name in different folders never clash
                playable = (ensure_browser_playable(item.path, self.media_dir / item.sha256[:16])
                            if make_playable else item.path)
                features = self.extractor.extract(playable, sha256=item.sha256)
            except MediaError as err:
                log.warning("skipping %s: %s", item.path, err)
                continue
            stored = self._portable(playable)
            batch.append(GalleryVideo.from_features(item.video_id, features, item.title, stored))
        if batch:
            self.index.add(batch)
            log.info("indexed %d videos of the %s in %.1f s", len(batch), what, time.perf_counter() - t0)

    def _portable(self, path: Path) -> str:
        """The path an index stores: relative to the data dir when inside it, so the dir can move."""
        path = Path(path).resolve()
        data_dir = self.settings.data_dir.resolve()
        return path.relative_to(data_dir).as_posix() if path.is_relative_to(data_dir) else str(path)

    def _located(self, result: dict) -> dict:
        """A result whose ``path`` is absolute again (see ``_portable``)."""
        return dict(result, path=str(self.settings.data_dir.resolve() / result["path"]))

    def _record(self, video_id: str, index: object | None = None) -> dict | None:
        """The stored record (id, title, path, sha256...) of a live video, or None."""
        return (index or self.index).record(video_id)

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
        weights = (weight, 1.0 - weight)
        indexes = [self.index] + ([session.index] if session is not None and len(session.index) else [])
        # encoded once, ranked in every index; one confidence rule for all hits: each video's own cuts from
        # its reference scores at these weights, whatever gallery it is in
        response = search_text(indexes, query, self._encode_text, k, weights, confidence=self.confidence)
        private = session.index.position if len(indexes) > 1 else {}
        located = [dict(self._located(r), **({"source": "session"} if r["video_id"] in private else {}))
                   for r in response.results]
        return dataclasses.replace(response, results=located)

    # ------------------------------------------------------------------ uploads
    def ensure_session(self, session: SessionGallery | None) -> SessionGallery | None:
        """The session's private gallery, created on its first upload (None when uploads are shared)."""
        if self.settings.uploads == "shared" or session is not None:
            return session
        from prvr.index import IndexConfig, VideoIndex

        self.sessions_dir.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="session-", dir=self.sessions_dir))
        references = self.calibrator.reference_queries
        index = VideoIndex.create(root / "index", self.model, IndexConfig(), references)
        return SessionGallery(root, index)

    def add_video(self, path: str | Path, session: SessionGallery | None = None,
                  progress: Progress | None = None, name: str | None = None) -> dict:
        """Validate, make playable, extract and index one video: ``{status, video_id, message}``.

        status: "added", "duplicate" (already indexed; video_id is the existing one), "rejected" (the
        message says what is wrong with the file) or "error" (unexpected; logged with the error id).
        ``name``: the file name the user knows (default: the path's); every message names it, never the
        server's temporary or stored copy.
        """
        path, report = Path(path), progress or (lambda fraction, stage: None)
        shown = Path(name).name if name else path.name
        try:
            return self._add(path, session, report, shown)
        except MediaError as err:
            log.warning("upload %s rejected: %s", shown, err.reason)
            return {"status": "rejected", "video_id": None, "message": f"{shown}: {err.reason}"}
        except Exception:  # the UI must never show a stack trace; the log keeps it
            error_id = uuid.uuid4().hex[:8]
            log.exception("upload %s failed (error id %s)", shown, error_id)
            return {"status": "error", "video_id": None,
                    "message": f"{shown}: unexpected server error (error id {error_id}); nothing was "
                               "added."}
        finally:
            report(1.0, "done")

    def _add(self, path: Path, session: SessionGallery | None, report: Progress, shown: str) -> dict:
        """The upload stages; raises MediaError for bad files, leaving every index unchanged."""
        from prvr.index import GalleryVideo

        report(0.0, "checking the file")
        self._check_limits(path, session)
        info = probe(path, upload_limits(self.settings))
        sha = sha256_file(path)
        duplicate = self._find_sha(sha, session)
        if duplicate is not None:
            return {"status": "duplicate", "video_id": duplicate["id"],
                    "message": f"{shown}: already in the gallery as “{duplicate['title']}”."}
        index, media = (session.index, session.root / "media") if session else (self.index, self.media_dir)
        stored = self._store_playable(path, sha, media, report)
        try:
            report(0.3, f"extracting features ({info.duration:.0f} s of video)")
            features = self.extractor.extract(stored, sha256=sha)
            report(0.9, "indexing")
            video_id = f"upload:{sha[:12]}"
            title = Path(shown).stem
            index.add([GalleryVideo.from_features(video_id, features, title, self._portable(stored))])
        except BaseException:
            stored.unlink(missing_ok=True)  # nothing indexed: leave no orphan file behind
            raise
        if session is not None:
            session.uploads += 1
        notes = "".join(f" Note: {w}." for w in features.warnings)
        where = "in your session" if session is not None else "in the shared gallery"
        return {"status": "added", "video_id": video_id,
                "message": f"{shown}: added {where} as “{title}” ({features.duration:.0f} s); "
                           f"searchable now.{notes}"}

    def _store_playable(self, path: Path, sha: str, target_dir: Path, report: Progress) -> Path:
        """Copy (or re-encode) an upload into ``target_dir`` as ``<sha>.mp4``: Gradio deletes its own copy."""
        reason = unplayable_reason(path)
        report(0.1, f"re-encoding to H.264 ({reason})" if reason else "storing")
        target_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="upload-", dir=target_dir))
        try:
            playable = ensure_browser_playable(path, work)
            stored = target_dir / f"{sha[:16]}{playable.suffix.lower()}"
            if playable.parent != work:  # already playable: copy it in, then rename (whole or absent)
                playable = Path(shutil.copyfile(playable, work / f"copy{playable.suffix.lower()}"))
            os.replace(playable, stored)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return stored

    def _check_limits(self, path: Path, session: SessionGallery | None) -> None:
        """Refuse too-large files and sessions over their upload count, before any decoding."""
        limit = self.settings.max_upload_mb
        if path.is_file() and path.stat().st_size > limit * 1024 * 1024:
            size_mb = path.stat().st_size / 2**20
            raise UploadRefused(path, f"{size_mb:.0f} MB is more than the {limit} MB limit.",
                                "Trim or compress the video first.")
        if session is not None and session.uploads >= self.settings.max_uploads_per_session:
            raise UploadRefused(path, f"this session already added {session.uploads} videos, the maximum "
                                      "per session.", "Start a new session to add more (in a browser: reload "
                                      "the page; through the API: connect a new client).")

    def video_file(self, video_id: str, sessions: Sequence[SessionGallery] = ()) -> Path | None:
        """The playable file of a live video of the shared gallery or of one of ``sessions``, or None."""
        for index in [self.index] + [s.index for s in sessions]:
            record = self._record(video_id, index)
            if record is not None and record.get("path"):
                return self.settings.data_dir / record["path"]  # joins a relative path, keeps an absolute
        return None

    def _find_sha(self, sha: str, session: SessionGallery | None) -> dict | None:
        """The record of an indexed video with these bytes, in the shared or the session index."""
        for index in (self.index, session.index if session else None):
            if index is None:
                continue
            for record in index.records():
                if record.get("sha256") == sha:
                    return record
        return None

    # ------------------------------------------------------------------ describing
    def describe(self, session: SessionGallery | None = None) -> dict:
        """Model, feature profile, gallery size and index mode, for the info panel and README."""
        from extract.profiles import get_profile

        shared, private = len(self.index), len(session.index) if session else 0
        uploads = ("session: private to each browser session, deleted when it ends"
                   if self.settings.uploads == "session" else "shared: added to the shared gallery")
        return {"model": {"name": self.info.name, "description": self.info.description, "why": self.info.why,
                          "metrics": self.info.metrics, "fingerprint": self.model.fingerprint()[:12]},
                "profile": {"name": self.profile, "description": get_profile(self.profile).description},
                "videos": shared + private, "shared_videos": shared, "session_videos": private,
                "index": f"{self.index.cfg.mode} search over all proposals, persistent in the data "
                         f"directory (indexes/{self.index_dir.name})",  # no server paths in the API
                "uploads": uploads}

    def example_queries(self) -> list[str]:
        """Demo captions to offer as example queries."""
        return list(self.examples)

    def static_paths(self) -> list[str]:
        """Folders whose videos the app serves in place (never copied into Gradio's cache)."""
        owned = [self.settings.data_dir / "demo", self.media_dir, self.sessions_dir]
        for folder in owned:
            folder.mkdir(parents=True, exist_ok=True)
        return [str(p) for p in owned + ([self.settings.gallery] if self.settings.gallery else [])]
