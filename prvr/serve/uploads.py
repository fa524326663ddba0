"""Uploads: validate -> make browser-playable -> extract -> index, one video at a time.

Every bad upload gets a specific message naming the file the user knows and leaves every gallery exactly as
it was; an unexpected failure is logged with an error id and reported as such, never as a stack trace. On a
public host (``uploads="session"``) an upload lands in its browser session's private gallery; locally
(``uploads="shared"``) it joins the shared one.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from extract import zerogpu
from extract.decode import DecodeLimits, MediaError, probe, sha256_file
from prvr.index import Gallery, GalleryVideo
from prvr.serve.media import MediaStore, Progress
from prvr.serve.persist import PersistentStore
from prvr.serve.sessions import SessionGallery
from prvr.serve.settings import AppSettings

log = logging.getLogger(__name__)


class UploadRefused(MediaError):
    """An upload refused by the app's limits (size, count), before any decoding."""


def upload_limits(settings: AppSettings) -> DecodeLimits:
    """Decoder limits for uploads: the app's maximum duration, the decoder's other defaults."""
    return DecodeLimits(max_duration_s=settings.max_duration_s)


class Uploads:
    """Adds uploaded videos to the shared gallery or a session's (see the module docstring)."""

    def __init__(self, settings: AppSettings, profile: str, weights: dict[str, str] | None, shared: Gallery,
                 media: MediaStore, persist: PersistentStore | None = None) -> None:
        self.settings, self.profile, self.weights = settings, profile, weights  # what extract_video reads
        self.shared, self.media = shared, media
        self.persist = persist  # --persist: the shared gallery's adds are recorded there

    def add(self, path: str | Path, session: SessionGallery | None = None, progress: Progress | None = None,
            name: str | None = None) -> dict:
        """Validate, make playable, extract and index one video: ``{status, video_id, message}``.

        status: "added", "duplicate" (already indexed; video_id is the existing one), "rejected" (the
        message says what is wrong with the file) or "error" (unexpected; logged with the error id).
        ``name``: the file name the user knows (default: the path's); every message names it, never the
        server's temporary or stored copy.
        """
        path = Path(path)
        live = LiveProgress(progress) if progress is not None else None
        report = live or (lambda fraction, stage: None)
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
            if live is not None:
                live.close()
            report(1.0, "done")

    def _add(self, path: Path, session: SessionGallery | None, report: Progress, shown: str) -> dict:
        """The upload stages; raises MediaError for bad files, leaving every gallery unchanged."""
        report(0.0, "checking the file")
        self._check_limits(path, session)
        info = probe(path, upload_limits(self.settings))
        if zerogpu.on_zerogpu():  # before any work: a video longer than one GPU slot is refused now
            zerogpu.check_gpu_slot(path, info.duration, self.profile)
        sha = sha256_file(path)
        duplicate = self._find_sha(sha, session)
        if duplicate is not None:
            return {"status": "duplicate", "video_id": duplicate["id"],
                    "message": f"{shown}: already in the gallery as “{duplicate['title']}”."}
        gallery, media_dir = (session.index, session.media) if session else (self.shared, self.media.dir)
        stored, reencoded = self.media.store_playable(path, sha, media_dir, report)
        try:
            report(0.3, f"extracting features: 0 of {info.duration:.0f} s of video")
            # the stored copy has the probed bytes unless it was re-encoded (then it is probed again)
            features = zerogpu.extract_video(stored, self.profile, self.weights, sha256=sha,
                                             info=None if reencoded else info,
                                             progress=extraction_progress(report))
            report(0.9, "indexing")
            video_id = f"upload:{sha[:12]}"
            title = unique_title(shown, self._titles(session))
            video = GalleryVideo.from_features(video_id, features, title, self.media.portable(stored))
            gallery.add([video])
        except BaseException:
            stored.unlink(missing_ok=True)  # nothing indexed: leave no orphan file behind
            raise
        if session is None and self.persist is not None:  # shared only: session uploads never persist
            try:
                self.persist.record_add(video, stored)
            except OSError:
                log.exception("upload %s is in the shared gallery but could not be saved to the persistent "
                              "folder: it will be gone after a restart", shown)
        if session is not None:
            session.uploads += 1
        notes = "".join(f" Note: {w}." for w in features.warnings)
        where = "in your session" if session is not None else "in the shared gallery"
        return {"status": "added", "video_id": video_id,
                "message": f"{shown}: added {where} as “{title}” ({features.duration:.0f} s); "
                           f"searchable now.{notes}"}

    def _titles(self, session: SessionGallery | None) -> set[str]:
        """The titles a new upload's results could be listed with (shared and this session's)."""
        galleries = [self.shared] + ([session.index] if session is not None else [])
        return {r.get("title", "") for g in galleries for r in g.records()}

    def _find_sha(self, sha: str, session: SessionGallery | None) -> dict | None:
        """The record of an indexed video with these bytes, in the shared or the session gallery."""
        found = self.shared.find_sha256(sha)
        return found if found is not None or session is None else session.index.find_sha256(sha)

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


class LiveProgress:
    """An upload's progress callback that never goes quiet: whenever ``every`` seconds pass without news
    (a slow batch on a busy machine), the latest stage is reported again with the seconds it has taken, so
    the bar's text moves at least once a second while the seconds of video done move per batch.

    The repeat runs in a thread, in the caller's context (Gradio finds the event's progress bar there).
    """

    def __init__(self, report: Progress, every: float = 1.0) -> None:
        self.report, self.every = report, every
        self.lock = threading.Lock()
        self.latest: tuple[float, str] | None = None
        self.sent = self.stage_t0 = time.monotonic()
        self.context = contextvars.copy_context()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._repeat, name="upload-progress", daemon=True)
        self.thread.start()

    def __call__(self, fraction: float, stage: str) -> None:
        with self.lock:
            now = time.monotonic()
            if self.latest is None or stage.split(":")[0] != self.latest[1].split(":")[0]:
                self.stage_t0 = now  # a new stage (not the same stage's next numbers)
            self.latest, self.sent = (fraction, stage), now
            self.report(fraction, stage)

    def _repeat(self) -> None:
        while not self.stopped.wait(0.2):
            with self.lock:
                now = time.monotonic()
                if self.latest is None or now - self.sent < self.every or self.stopped.is_set():
                    continue
                fraction, stage = self.latest
                self.sent = now
                self.context.run(self.report, fraction, f"{stage} (working: {now - self.stage_t0:.0f} s)")

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


def extraction_progress(report: Progress, start: float = 0.3,
                        end: float = 0.9) -> Callable[[float, float], None]:
    """``VideoExtractor.extract``'s ``progress(done_s, total_s)`` as the upload's stage progress (``start``
    to ``end`` of the bar), with the seconds of video done in words; at most four reports a second."""
    last = [0.0]

    def on_batch(done_s: float, total_s: float) -> None:
        now = time.monotonic()
        if now - last[0] < 0.25 and done_s < total_s:
            return
        last[0] = now
        report(min(end, start + (end - start) * done_s / max(total_s, 1e-9)),
               f"extracting features: {done_s:.0f} of {total_s:.0f} s of video")

    return on_batch


def unique_title(name: str, taken: Iterable[str]) -> str:
    """A title for a file named ``name`` that no listed video has: its stem, else its name with the
    extension (``clip.flv`` beside ``clip``), else the name with a number (``clip.flv (2)``)."""
    path = Path(name)
    return distinct_title([path.stem or name, path.name or name], taken)


def distinct_title(candidates: Sequence[str], taken: Iterable[str]) -> str:
    """The first candidate title not ``taken``, else the last one with the first free number: "x (2)"."""
    taken = set(taken)
    for title in candidates:
        if title not in taken:
            return title
    n = 2
    while f"{candidates[-1]} ({n})" in taken:
        n += 1
    return f"{candidates[-1]} ({n})"
