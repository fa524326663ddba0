"""``--gallery DIR``: a folder of videos indexed in the background while the app serves, and kept up with.

    folder = FolderSync(ingest, DIR, rescan_s=30, batch_s=60).start()   # prvr.serve.bootstrap, after start
    folder.status()   -> {state, done, to_do, current, seconds_left, failed, ...}   # /info's "folder"
    folder.stop()                               # Predictor.close: the thread ends (an extraction cut short)
    sync_folder(ingest, DIR) -> [Outcome]          # one pass in the caller's thread (scripts, tests)

A pass looks at every video file of the folder, subfolders included (``VIDEO_SUFFIXES``), by its size and
modification time and those of the subtitle files that may be its sidecar (``<stem>.srt`` / ``.vtt``
beside it): a video that left the folder leaves the gallery (and --persist) at once; a new or changed one
is hashed (sha256) and, unless the gallery holds these bytes under its id already, extracted by the one
ingest pipeline (``IngestService.prepare``: the start-up models, its words read beside its pictures) and
joins the gallery with the others finished since the last batch (``IngestService.commit``: one atomic,
durable update of the gallery; a changed file's earlier entry is replaced in it) once ``BATCH_VIDEOS`` are
ready or ``batch_s`` has passed since the first of them finished, checked between videos and during an
extraction. A finished video is written at once to the data dir's ``folder-spool`` (``PersistentStore``'s
write-once, self-verifying entries: its features; its words follow it once it joins) and deleted from it once
its batch joined, so a ``kill -9`` loses only the video in progress: the next start joins the spooled ones
with its first batch without extracting them again, their words read again (unless the file changed, or its
re-encoded playable copy was swept: then it is extracted again), and
extracts none of the joined ones again either: their sha256 is in the gallery's catalogue. What each file
was when it joined (size, time, sha256) is kept in the data dir's ``folder-state.json``, written atomically
after each batch, so that a restart does not hash a large folder again; it is only a cache (a file it does
not know is hashed and compared with the catalogue).

A file that fails is logged once by the pipeline (one line for a file that cannot be read as a video),
listed in ``status()["failures"]`` with its reason and skipped until its size or time changes (a restart
tries it again). The background thread looks again every ``rescan_s`` seconds; searches go on meanwhile (no
lock is held across an extraction); ``stop`` ends an extraction at its next progress report and the thread
soon after, committing what was finished. A folder that cannot be read (an unmounted drive) removes nothing.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from extract.decode import VIDEO_SUFFIXES, sha256_file
from extract.words.subtitles import SIDECAR_SUFFIXES, find_sidecar
from prvr.index import GalleryVideo
from prvr.plural import counted
from prvr.serve.ingest import FOLDER, Arrival, IngestService, Outcome, Ready
from prvr.serve.persist import PersistentStore

log = logging.getLogger(__name__)

BATCH_VIDEOS = 10  # finished videos join the gallery at least this many at a time (fewer segments to rank)
STATE_FILE = "folder-state.json"  # in the data dir: what each file was when it joined (a cache)
SPOOL_DIR = "folder-spool"  # in the data dir: finished videos waiting for their batch (persist's format)
FAILURES_SHOWN = 20  # /info lists at most this many failed files (their count is always whole)


class Stopping(BaseException):
    """Raised into an extraction's progress report when the app stops: the video is dropped, leaving no file
    (a ``BaseException``: the pipeline reports ``Exception``s as the file's failure, and this is none)."""


@dataclass(frozen=True)
class Seen:
    """What a file looked like in a pass: a change to any of it means its bytes or its words may differ."""

    size: int
    mtime_ns: int
    sidecars: tuple[tuple[str, int, int], ...] = ()  # (name, size, mtime_ns) of each possible sidecar


@dataclass
class Found:
    """A video file of the folder in one pass."""

    rel: str  # its path in the folder, "/"-separated: its video id is "folder:" + rel
    where: str  # its path on this machine
    seen: Seen

    @property
    def path(self) -> Path:
        """Its path on this machine (made when needed: a look at a large folder makes none)."""
        return Path(self.where)

    @property
    def video_id(self) -> str:
        """Its id in the gallery."""
        return f"{FOLDER.prefix}{self.rel}"


@dataclass
class Finished:
    """A video extracted and waiting for its batch (``IngestService.prepare``'s ready arrival)."""

    found: Found
    ready: Ready
    sha256: str


@dataclass
class Progress:
    """What the folder's indexing is doing, for ``status`` (guarded by ``FolderSync.lock``)."""

    state: str = "starting"  # starting | indexing | watching | unreadable | stopped
    files: int = 0  # video files found by the last look
    left: deque[Found] = field(default_factory=deque)  # not handled yet in this pass (the current one first)
    current: str | None = None
    current_done: float = 0.0  # of the current video's pipeline, 0 to 1
    extracted: int = 0  # extractions started since this process began
    extracted_bytes: int = 0  # size of the videos extracted in this process, and the seconds they took
    extracted_s: float = 0.0
    last_look: float | None = None  # time.time() of the last look at the folder


class FolderSync:
    """One folder kept indexed in the shared gallery (see the module docstring). ``rescan_s``: seconds
    between looks at the folder; ``batch_s``: finished videos wait at most this long for their batch
    (0: each joins alone); ``batch_videos``: a batch is committed once this many are finished."""

    def __init__(self, ingest: IngestService, folder: Path, rescan_s: float = 30.0, batch_s: float = 60.0,
                 batch_videos: int = BATCH_VIDEOS) -> None:
        self.ingest, self.folder = ingest, Path(folder)
        self.rescan_s, self.batch_s, self.batch_videos = float(rescan_s), float(batch_s), int(batch_videos)
        self.state_path = ingest.settings.data_dir / STATE_FILE
        self.known: dict[str, tuple[Seen, str]] = self._load()  # rel -> (as it was, sha256) when it joined
        self.failed: dict[str, tuple[Seen, str]] = {}  # rel -> (as it was, why) for files that failed
        self.batch: list[Finished] = []
        # finished videos are written here as they finish, and deleted once their batch joined: a crash
        # before that loses none of them (the next pass joins them without extracting them again)
        self.spool = PersistentStore(ingest.settings.data_dir / SPOOL_DIR,
                                     ingest.extractor.profile.identity(), verify_media=False)
        self.spooled: dict[str, GalleryVideo] | None = None  # read by the first look
        self.batch_since = 0.0  # time.monotonic() when the batch's first video finished
        self.progress = Progress()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.worker: int | None = None  # the ident of the thread running a pass (progress comes from others)
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the thread
    def start(self) -> FolderSync:
        """Index and watch the folder in a background thread (a daemon: a stop never waits on it alone)."""
        log.info("indexing the folder %s in the background; searches cover what is indexed so far, and it is "
                 "looked at again every %g s", self.folder, self.rescan_s)
        self.thread = threading.Thread(target=self._run, name="folder-sync", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        """Passes until stopped, ``rescan_s`` apart."""
        while not self.stopping.is_set():
            try:
                if self.look():
                    with self.ingest.starting():  # the start-up models (CPU ones on ZeroGPU) for this pass
                        self.index()
            except Stopping:
                break
            except Exception:  # a bug, not a file's failure (those are outcomes): logged, tried again later
                log.exception("indexing the folder %s failed; it is tried again in %g s", self.folder,
                              self.rescan_s)
            self.stopping.wait(self.rescan_s)
        with self.lock:
            self.progress.state, self.progress.current = "stopped", None

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread: an extraction in progress stops at its next progress report (its video is
        dropped, leaving no file), the finished ones are committed. Safe to call twice."""
        self.stopping.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)
            if self.thread.is_alive():
                log.warning("the folder's indexing did not stop within %g s", timeout)

    # ------------------------------------------------------------------ a pass
    def sync(self) -> list[Outcome]:
        """One pass in this thread: look at the folder, then index what is new or changed; the outcomes of
        the videos extracted (removals have none)."""
        return self.index() if self.look() else []

    def look(self) -> list[Found]:
        """Look at the folder: videos gone from it leave the gallery; the ones to index (new, changed, not
        failed as they are) become the pass's work, and are returned."""
        if not self.folder.is_dir():
            with self.lock:
                first, self.progress.state = self.progress.state != "unreadable", "unreadable"
            if first:
                log.warning("the folder %s cannot be read now: its videos stay in the gallery, and it is "
                            "looked at again every %g s", self.folder, self.rescan_s)
            return []
        try:
            present = {f.rel: f for f in sorted(self._files(), key=lambda f: f.rel)}
        except OSError as err:  # a folder that vanished while it was listed: as if unreadable, this time
            log.warning("the folder %s could not be listed (%s): looked at again in %g s", self.folder, err,
                        self.rescan_s)
            return []
        gone = [i for i in self.ingest.shared.ids
                if i.startswith(FOLDER.prefix) and i[len(FOLDER.prefix):] not in present]
        if gone:
            self.ingest.remove(gone)
            log.info("%s left the folder %s: removed from the gallery", counted(len(gone), "video"),
                     self.folder)
        with self.lock:
            for table in (self.known, self.failed):
                for rel in [r for r in table if r not in present]:
                    del table[rel]
        if self.spooled is None:  # what a crash left finished but not joined
            self.spooled = {v.id: v for v in self.spool.restore()}
        for video_id in [i for i in self.spooled if i[len(FOLDER.prefix):] not in present]:
            del self.spooled[video_id]
            self._unspool(video_id)
        work = [f for f in present.values() if not self._current(f)]
        with self.lock:
            self.progress.files, self.progress.left = len(present), deque(work)
            self.progress.last_look = time.time()
            self.progress.state = "indexing" if work else "watching"
        if gone:
            self._save()
        return work

    def index(self) -> list[Outcome]:
        """Index the pass's work (``look``), committing batches as they fill or age; the outcomes."""
        self.worker = threading.get_ident()
        with self.lock:
            work = list(self.progress.left)
        total, outcomes = len(work), []
        redone = {f.video_id for f in work}  # their own entries' titles are theirs to keep
        taken = {r.get("title", "") for r in self.ingest.shared.records() if r.get("id") not in redone}
        try:
            for n, found in enumerate(work, 1):
                if self.stopping.is_set():
                    raise Stopping
                outcome = self._one(found, n, total, taken)
                if outcome is not None:
                    outcomes.append(outcome)
                with self.lock:
                    self.progress.left.popleft()
                    self.progress.current = None
                if self._due(finished=True):
                    outcomes += self._commit()
        finally:
            outcomes += self._commit()  # what is finished joins, also when the pass is cut short
            self._save()
            self.worker = None
            with self.lock:
                self.progress.current, self.progress.left = None, deque()
                if self.progress.state == "indexing":
                    self.progress.state = "watching"
        log.info("the folder %s is indexed: %s searchable%s", self.folder,
                 counted(self.searchable(), "video"),
                 f", {counted(len(self.failed), 'file')} failed (see /info)" if self.failed else "")
        return outcomes

    def _one(self, found: Found, n: int, total: int, taken: set[str]) -> Outcome | None:
        """Hash one file and, unless the gallery has these bytes under its id, extract it into the batch; its
        outcome where it failed (None otherwise: its outcome comes with its batch)."""
        with self.lock:
            self.progress.current, self.progress.current_done = found.rel, 0.0
        try:
            sha = sha256_file(found.path)
        except OSError as err:
            reason = f"cannot be read: {err.strerror or err}"
            log.warning("folder video %s skipped: %s", found.rel, reason)
            return self._fail(found, Outcome("rejected", None, f"{found.rel}: {reason}"))
        record = self.ingest.shared.record(found.video_id)
        known = self.known.get(found.rel)
        if (record is not None and record.get("sha256") == sha
                and (known is None or known[0].sidecars == found.seen.sidecars)):
            self._joined(found, sha)  # indexed already (touched, or a restart): not extracted again
            if self.spooled.pop(found.video_id, None) is not None:  # a crash after it joined
                self._unspool(found.video_id)
            return None
        spooled = self.spooled.pop(found.video_id, None)
        playable = self.ingest.media.locate(spooled.path) if spooled is not None else None
        if spooled is not None and spooled.sha256 == sha and playable.is_file():
            # finished before a crash, not joined yet: it joins with this batch, not extracted again (a
            # re-encoded copy is swept at start, though: then it is extracted again)
            taken.add(spooled.title)
            # kept with its pictures only (its words follow a video once it joins): they are read again
            words = self.ingest.read_words(found.path, find_sidecar(found.path), found.rel)
            self._add_to_batch(found, Ready(spooled, found.rel, None, playable, "", run=words), sha,
                               spooled=True)
            return None
        if spooled is not None:
            self._unspool(found.video_id)
        log.info("indexing the folder %s: video %d of %d, %s", self.folder, n, total, found.rel)
        rel = Path(found.rel)
        # titles of different files never collide in a result list: a folder's clip.flv beside clip.mpg keeps
        # its extension, a/clip.mp4 beside b/clip.mp4 its folder
        arrival = Arrival(found.path, found.rel, found.video_id, (rel.stem, rel.name, found.rel), sha,
                          find_sidecar(found.path))
        with self.lock:
            self.progress.extracted += 1
        t0 = time.perf_counter()
        ready = self.ingest.prepare(arrival, FOLDER, taken, self._report)
        if isinstance(ready, Outcome):  # logged once by the pipeline
            if record is not None:  # its earlier bytes are gone: so is their entry
                self.ingest.remove([found.video_id])
            return self._fail(found, ready)
        with self.lock:
            self.progress.extracted_bytes += found.seen.size
            self.progress.extracted_s += time.perf_counter() - t0
        taken.add(ready.video.title)
        self._add_to_batch(found, ready, sha)
        return None

    def _add_to_batch(self, found: Found, ready: Ready, sha: str, spooled: bool = False) -> None:
        """A finished video into the batch, and (unless it is there already) into the spool."""
        if not spooled:
            try:
                self.spool.record_add(ready.video, None)
            except OSError as err:  # it still joins with its batch; only a crash before that loses it
                log.warning("could not keep %s finished in %s: %s", found.rel, self.spool.root, err)
        if not self.batch:
            self.batch_since = time.monotonic()
        self.batch.append(Finished(found, ready, sha))

    def _unspool(self, video_id: str) -> None:
        """Delete a video's spool entries (it joined, failed, or its file changed)."""
        for name in self.spool.live.pop(video_id, []):
            (self.spool.entries_dir / name).unlink(missing_ok=True)

    def _fail(self, found: Found, outcome: Outcome) -> Outcome:
        """Remember a failed file as it is (skipped until it changes); its outcome."""
        with self.lock:
            self.failed[found.rel] = (found.seen, outcome.message.removeprefix(f"{found.rel}: "))
        return outcome

    def _joined(self, found: Found, sha: str) -> None:
        """Remember a file as it is in the gallery now."""
        with self.lock:
            self.known[found.rel] = (found.seen, sha)
            self.failed.pop(found.rel, None)

    def _report(self, fraction: float, stage: str) -> None:
        """The pipeline's progress of the current video: kept for ``status``; in the pass's own thread, a
        stop ends the extraction here and an aged batch is committed (the words' reader reports from its
        thread too: only the fraction is kept then)."""
        with self.lock:
            self.progress.current_done = min(max(float(fraction), 0.0), 1.0)
        if threading.get_ident() != self.worker:
            return
        if self.stopping.is_set():
            raise Stopping
        if self._due(finished=False):
            self._commit()

    def _due(self, finished: bool) -> bool:
        """Whether the batch should join now: ``batch_videos`` finished (checked as one finishes), or its
        first finished ``batch_s`` ago."""
        if not self.batch:
            return False
        full = finished and len(self.batch) >= self.batch_videos
        return full or time.monotonic() - self.batch_since >= self.batch_s

    def _commit(self) -> list[Outcome]:
        """The finished videos into the gallery in one update (a changed file's entry replaced); their
        outcomes; the state file written."""
        batch, self.batch = self.batch, []
        if not batch:
            return []
        ids = {f.found.video_id for f in batch}
        replaced = [i for i in ids if self.ingest.shared.record(i) is not None]
        outcomes = self.ingest.commit([f.ready for f in batch], FOLDER, replaced)
        for finished in batch:  # joined or failed: no longer waiting
            self._unspool(finished.found.video_id)
        for finished, outcome in zip(batch, outcomes, strict=True):
            if outcome.status == "added":
                self._joined(finished.found, finished.sha256)
            else:
                self._fail(finished.found, outcome)
        joined = [f.found.rel for f, o in zip(batch, outcomes, strict=True) if o.status == "added"]
        if joined:
            log.info("folder videos joined the gallery: %s (%s of the folder searchable)", ", ".join(joined),
                     counted(self.searchable(), "video"))
        self._save()
        return outcomes

    def _current(self, found: Found) -> bool:
        """Whether a file needs nothing: it joined as it is now, or failed as it is now."""
        failed = self.failed.get(found.rel)
        if failed is not None and failed[0] == found.seen:
            return True
        known = self.known.get(found.rel)
        if known is None or known[0] != found.seen:
            return False
        record = self.ingest.shared.record(found.video_id)
        return record is not None and record.get("sha256") == known[1]

    def _files(self) -> Iterator[Found]:
        """The folder's video files (``VIDEO_SUFFIXES``, subfolders included, sorted) as they are now, each
        with its possible sidecars: one listing per folder and one stat per file (a look at a large folder
        every ``rescan_s`` costs little)."""
        pending = [(str(self.folder), "")]  # (a folder on this machine, its path in the folder + "/")
        while pending:
            directory, prefix = pending.pop()
            videos: list[tuple[os.DirEntry, os.stat_result]] = []
            sidecars: dict[str, list[tuple[str, int, int]]] = {}
            with os.scandir(directory) as listing:  # an unreadable folder raises: the look says so
                entries = sorted(listing, key=lambda e: e.name)
            for entry in entries:
                try:
                    if entry.is_dir():
                        pending.append((entry.path, f"{prefix}{entry.name}/"))
                        continue
                    if not entry.is_file():
                        continue
                    stem, dot, suffix = entry.name.rpartition(".")
                    suffix = f".{suffix.lower()}"
                    if dot and suffix in VIDEO_SUFFIXES:
                        videos.append((entry, entry.stat()))
                    elif dot and suffix in SIDECAR_SUFFIXES:
                        st = entry.stat()
                        sidecars.setdefault(stem, []).append((entry.name, st.st_size, st.st_mtime_ns))
                except OSError:  # gone since it was listed: the next look says so
                    continue
            for entry, st in videos:
                near = tuple(sorted(sidecars.get(entry.name.rpartition(".")[0], ())))
                yield Found(prefix + entry.name, entry.path, Seen(st.st_size, st.st_mtime_ns, near))

    # ------------------------------------------------------------------ the state file (a cache)
    def _load(self) -> dict[str, tuple[Seen, str]]:
        """What the state file says of this folder's files (nothing when it is missing, unreadable or of
        another folder)."""
        try:
            state = json.loads(self.state_path.read_text())
            if state.get("folder") != str(self.folder.resolve()):
                return {}
            return {rel: (Seen(e["size"], e["mtime_ns"], tuple(tuple(s) for s in e["sidecars"])), e["sha256"])
                    for rel, e in state["files"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def _save(self) -> None:
        """Write the state file atomically (a temporary file renamed over it)."""
        with self.lock:
            known = sorted(self.known.items())
        state = {"folder": str(self.folder.resolve()),
                 "files": {rel: {"size": seen.size, "mtime_ns": seen.mtime_ns,
                                 "sidecars": [list(s) for s in seen.sidecars], "sha256": sha}
                           for rel, (seen, sha) in known}}
        tmp = self.state_path.with_name(f".{STATE_FILE}.tmp")  # one writer: the data dir has one owner
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.state_path)
        except OSError as err:  # only a cache: the next start hashes the files instead
            log.warning("could not write %s: %s", self.state_path, err)
            tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------------ what it says
    def searchable(self) -> int:
        """The folder's videos in the gallery now."""
        return sum(1 for i in self.ingest.shared.ids if i.startswith(FOLDER.prefix))

    def status(self) -> dict:
        """The indexing's progress for /info and the page: ``state`` (indexing, watching, unreadable,
        stopped), ``done`` (searchable), ``to_do`` (the current one included), ``waiting`` (finished, joining
        with their batch), ``current`` and ``current_done`` (0 to 1), ``seconds_left`` (None until a video
        was extracted), ``failed`` and ``failures`` ({file, reason}), ``extracted`` (extractions since the
        process started)."""
        with self.lock:
            p = self.progress
            left = list(p.left)
            rate = p.extracted_bytes / p.extracted_s if p.extracted_s > 0 else None
            current, current_done = p.current, p.current_done
            out = {"folder": self.folder.name, "state": p.state, "files": p.files, "to_do": len(left),
                   "waiting": len(self.batch), "current": current, "current_done": round(current_done, 2),
                   "extracted": p.extracted, "rescan_s": self.rescan_s, "batch_s": self.batch_s,
                   "last_look": p.last_look}
            failures = [{"file": rel, "reason": why} for rel, (_, why) in sorted(self.failed.items())]
        remaining = sum(f.seen.size for f in left)
        if left and left[0].rel == current:
            remaining -= current_done * left[0].seen.size
        out["seconds_left"] = round(remaining / rate, 1) if rate and left else (0.0 if not left else None)
        out.update(done=self.searchable(), failed=len(failures), failures=failures[:FAILURES_SHOWN])
        return out


def sync_folder(ingest: IngestService, folder: Path) -> list[Outcome]:
    """One pass over ``folder`` in this thread (``FolderSync.sync``): its removals, and the outcomes of the
    videos it extracted."""
    return FolderSync(ingest, folder).sync()
