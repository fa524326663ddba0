"""One way in for every video: validate -> playable copy -> features -> index -> persist.

Every video enters the app through ``IngestService``; each way in is a ``Way`` (its policy: limits, playable
copy, ``--persist``, extractor, declared once) and a method that hands the service ``Arrival``s:

    ingest.upload(path, session, progress, name, sidecar) -> Outcome   # the page, the API and MCP's add_video
    ingest.add_demo(videos)                      -> [Outcome]  # the demo gallery, at start
    ingest.prepare(arrival, way, taken) / ingest.commit(ready, way, replaced)   # one video extracted;
                                                 # extracted videos joined in one update (--gallery:
                                                 # prvr.serve.folder, in the background, in batches)
    ingest.restore() / ingest.save_unsaved()     -> int        # --persist: read back / write what it lacks
    with ingest.starting(): ...                  # start-up work on the extractor's start-up models

The contract: one outcome per arrival, in order: "added", "duplicate" (the existing video id), "rejected"
(``MediaError``, naming the file its owner knows) or "error" (ZeroGPU's words, or logged with an error id,
never a stack trace). A video not added changes no gallery and leaves no file. One call's added videos join
their gallery in one update, then, where the way persists and the gallery is the shared one, go to
``--persist``. Upload progress moves at least once a second (``prvr.serve.progress``).

Words (``extract.words.reader.WordsReader``, ``--words``): every arrival's words (subtitle tracks, a sidecar
.srt / .vtt, speech, text on screen) are read from its original file in a thread (``WordsRun``, at a lower CPU
priority), beside its visual extraction where the cores allow (``words_beside``), else once the pictures are
done. Pictures first: a video whose words are read when its pictures are joins its gallery with them
(``GalleryVideo.words``, embedded by the text encoder); else it joins by its pictures at once (searchable)
and its words join it when read (``Gallery.set_words``, one update; ``Follow``, its outcome as of now: "words:
40 %"). A source that cannot be read is one line of the outcome's message ("words skipped: ..."), never a
failure of the video. A restored video keeps the words --persist stored with it (nothing is read again).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from extract.decode import DecodeLimits, MediaError, probe, sha256_file
from extract.transcode import ensure_browser_playable
from prvr.index import Gallery, GalleryVideo
from prvr.plural import counted
from prvr.serve.extraction import Extractor, GpuUnavailable, seconds_words
from prvr.serve.media import MediaStore
from prvr.serve.persist import PersistentStore
from prvr.serve.progress import LiveProgress, Progress, Throttled
from prvr.serve.sessions import SessionGallery
from prvr.serve.settings import AppSettings, on_spaces

if TYPE_CHECKING:  # the reader is made by prvr.serve.bootstrap (words_reader)
    from extract.words.reader import WordsReader, WordsReport

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Way:
    """How one way in treats its videos; each is declared once below (``UPLOAD``, ``DEMO``, ``FOLDER``)."""

    name: str  # in logs: "upload", "demo", "folder"
    prefix: str | None  # of the video ids it makes (None: the ids it is given, e.g. the demo recipe's)
    limits: bool  # the app's upload limits apply (size, per-session count, --max-duration-s)
    copy: str  # "store": a whole copy in the gallery's media dir; "playable": re-encoded there only when
    # a browser cannot play it (else served in place); "none": served in place
    persist: bool  # its videos in the shared gallery are written to --persist
    at_start: bool  # extracted by the extractor's start-up models (no visitor's GPU quota)
    by_content: bool = False  # its id comes from its bytes: the same bytes again are a duplicate


UPLOAD = Way("upload", "upload:", limits=True, copy="store", persist=True, at_start=False, by_content=True)
DEMO = Way("demo", None, limits=False, copy="none", persist=False, at_start=True)
FOLDER = Way("folder", "folder:", limits=False, copy="playable", persist=True, at_start=True)
WAYS = (UPLOAD, DEMO, FOLDER)


@dataclass(frozen=True)
class Arrival:
    """One video handed to the service."""

    path: Path  # the file to read
    name: str  # the name its owner knows it by (messages name it, never a server copy)
    video_id: str | None = None  # None: the way's prefix and the first 12 hex digits of its sha256
    titles: tuple[str, ...] = ()  # title candidates, the first no listed video has wins (default: stem, name)
    sha256: str | None = None  # where the caller hashed it already
    sidecar: Path | None = None  # a subtitle file (.srt / .vtt) given with it (a folder's: beside it)


@dataclass(frozen=True)
class Outcome:
    """What became of one arrival (see the module docstring)."""

    status: str  # "added" | "duplicate" | "rejected" | "error"
    video_id: str | None
    message: str
    words: dict | None = None  # an added video's words: {sources, segments, skipped, seconds} (``WordsRun``)

    def to_dict(self) -> dict:
        """``{status, video_id, message}`` (and ``words`` for an added video): what the API and the page
        show."""
        out = {"status": self.status, "video_id": self.video_id, "message": self.message}
        return out if self.words is None else dict(out, words=self.words)


@dataclass
class _Ready:
    """An arrival extracted and ready to index."""

    video: GalleryVideo
    shown: str
    copy: Path | None  # a file this arrival made in a media dir (deleted if it is not indexed)
    playable: Path  # the file the gallery serves
    notes: str  # for the outcome's message (decoder warnings, GPU seconds asked, words skipped)
    words: dict | None = None  # its words' ``WordsRun.summary``
    run: WordsRun | None = None  # its words, read beside its pictures (``IngestService._index`` decides)
    follow: Follow | None = None  # its words, following it (joined by its pictures first)


# the words' threads run at this niceness (Linux: per thread, and the threads they start inherit it): where
# the cores are busy the pictures go first, so a video is searchable by them as soon as without words, and
# its words take the cores the pictures leave (benchmarks/RESULTS.md, issue #43 item 4)
WORDS_NICE = 10
# Where the words are read beside the pictures: with at least this many cores for the process. The reader's
# sources hold the GIL in steps (pocketsphinx's 20 ms calls, PyAV decoding, numpy), so on 2 cores the
# pictures beside them took 8x as long whatever the words' niceness (benchmarks/RESULTS.md, issue #43 item
# 4); there an upload's words are read once its pictures are done and the video is searchable.
BESIDE_MIN_CORES = 4


def words_beside() -> bool:
    """Whether the cores allow reading an upload's words beside its pictures (``BESIDE_MIN_CORES``)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores >= BESIDE_MIN_CORES


def lower_priority(nice: int = WORDS_NICE) -> None:
    """Lower the calling thread's CPU priority (a no-op where the platform has no per-thread niceness)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def kept_copy(path: Path, folder: Path) -> Path:
    """``path`` under the same name in ``folder``: a hard link where the file system allows, else a copy."""
    folder.mkdir(parents=True, exist_ok=True)
    kept = folder / Path(path).name
    try:
        os.link(path, kept)
    except OSError:
        shutil.copyfile(path, kept)
    return kept


Ready = _Ready  # a prepared arrival, as ``prepare`` answers it and ``commit`` takes it


class WordsAbandoned(Exception):
    """Raised into a words reader's progress to stop it: the video it reads for was not added."""


class WordsRun:
    """One video's words, read by ``WordsReader.read`` in a thread beside its visual extraction (a reader
    of None reads nothing). The reader never raises for bad words input; should it raise all the same (a
    bug), the video still goes in by its pictures, with one line saying so (its stack in the log only)."""

    def __init__(self, reader: WordsReader | None, path: Path, sidecar: Path | None, shown: str,
                 slots: threading.Semaphore | None = None, after: bool = False,
                 keep_in: Path | None = None) -> None:
        """``slots``: words readings at once (a reading waits for one: words that follow a video added by
        its pictures read on while the next upload's pictures are extracted, never more at a time);
        ``after``: the reading starts once the pictures are done (``detach``), not beside them; ``keep_in``:
        a folder to keep the files in while they are read (an upload's caller deletes its own once the
        upload returns, and the words may follow it): linked (else copied) into a work folder there, removed
        after."""
        if reader is not None and not reader.describe().get("sources"):
            reader = None  # (--words off: nothing to read, nothing to say about words)
        self.kept: Path | None = None
        if reader is not None and keep_in is not None:
            keep_in.mkdir(parents=True, exist_ok=True)
            self.kept = Path(tempfile.mkdtemp(prefix="work-", dir=keep_in))  # (swept after a crash)
            path = kept_copy(path, self.kept)
            sidecar = kept_copy(sidecar, self.kept / "sidecar") if sidecar is not None else None
        self.reader, self.shown, self.slots = reader, shown, slots
        self.waiting = slots is not None
        self.go = threading.Event()  # the reading may start
        if not after:
            self.go.set()
        self.fraction = 0.0  # of the reading done, as the reader reports it
        self.report: WordsReport | None = None
        self.failed: str | None = None  # the line for an unexpected failure of the reader
        self.abandoned = False  # the video failed meanwhile: the words are not wanted
        self.seconds = 0.0
        # the upload's progress while the pictures are extracted (``beside``): its latest stage, told again
        # with the words' share as the reader moves, in the upload's context (Gradio finds its bar there)
        self.sink: Progress | None = None
        self.latest: tuple[float, str] | None = None
        self.told = -1
        self.context = contextvars.copy_context()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        if reader is not None:
            self.thread = threading.Thread(target=self._read, args=(path, sidecar), daemon=True,
                                           name=f"words-{shown}")
            self.thread.start()

    def _read(self, path: Path, sidecar: Path | None) -> None:
        """The thread: ``WordsReader.read``, its report kept (or the one line of an unexpected failure)."""
        t0 = time.perf_counter()
        lower_priority()
        try:
            self.go.wait()
            with self.slots or contextlib.nullcontext():
                self.waiting = False
                t0 = time.perf_counter()  # (the reading's own time, not its wait)
                if self.abandoned:
                    return
                self.report = self.reader.read(path, sidecar, progress=self._progress)
        except Exception as error:
            if not self.abandoned:
                error_id = uuid.uuid4().hex[:8]
                log.error("reading the words of %s failed (error id %s)", self.shown, error_id,
                          exc_info=error)
                self.failed = (f"words: unexpected server error (error id {error_id}); the video is searched "
                               "by its pictures only")
        finally:
            self.seconds = time.perf_counter() - t0
            if self.kept is not None:
                shutil.rmtree(self.kept, ignore_errors=True)

    def _progress(self, fraction: float) -> None:
        """The reader's progress (its thread): the upload's latest stage is told again with the words' new
        percentage. Once the video failed it raises, which stops the reader at its next step (it frees the
        cores)."""
        if self.abandoned:
            raise WordsAbandoned(f"{self.shown} was not added: its words are not needed")
        with self.lock:
            self.fraction = min(max(float(fraction), 0.0), 1.0)
            percent, sink, latest = round(100 * self.fraction), self.sink, self.latest
            if sink is None or latest is None or percent == self.told:
                return
            self.told = percent
            self.context.copy().run(sink, latest[0], f"{latest[1]}; {self.words()}")

    def words(self) -> str:
        """The reading's progress in words: "words: 40 %" ("words: waiting" for another video's)."""
        if not self.go.is_set():
            return "words: after the pictures"
        return "words: waiting" if self.waiting else f"words: {100 * self.fraction:.0f} %"

    @property
    def done(self) -> bool:
        """Whether the reading has ended (or there is none)."""
        return self.thread is None or not self.thread.is_alive()

    def detach(self) -> None:
        """The pictures are done: the reading no longer tells the upload's progress (``words()`` still
        does), and starts now if it waited for them."""
        with self.lock:
            self.sink = None
        self.go.set()

    def beside(self, report: Progress) -> Progress:
        """``report`` (the upload's progress) with the words' share after each stage while they are read;
        the reader's own steps tell the latest stage again with theirs."""
        def both(fraction: float, stage: str) -> None:
            with self.lock:
                self.sink, self.latest = report, (fraction, stage)
                reading = self.thread is not None and self.thread.is_alive()
                report(fraction, f"{stage}; {self.words()}" if reading else stage)

        return both

    def wait(self, report: Progress) -> WordsRun:
        """Wait for the words once the pictures are done, telling ``report`` every quarter second."""
        with self.lock:
            self.sink = None  # from here on only this thread tells the upload
        while self.thread is not None and self.thread.is_alive():
            self.thread.join(0.25)
            if self.thread.is_alive():
                report(0.9, f"{self.words()} (the pictures are done)")
        return self

    def abandon(self) -> None:
        """The video failed: its words are not wanted (the thread ends on its own, reporting nothing) and
        the files kept for them go now (a failed upload leaves no file behind)."""
        self.abandoned = True
        self.go.set()
        if self.kept is not None:
            shutil.rmtree(self.kept, ignore_errors=True)

    @property
    def segments(self) -> tuple:
        """The words read (``WordSegment``s)."""
        return tuple(self.report.segments) if self.report is not None else ()

    @property
    def notes(self) -> tuple[str, ...]:
        """What the reading spent beyond this process (its speech's GPU seconds on ZeroGPU)."""
        return tuple(self.report.notes) if self.report is not None else ()

    @property
    def skipped(self) -> tuple[str, ...]:
        """One line per source that could not be read, saying why."""
        lines = tuple(self.report.skipped) if self.report is not None else ()
        return lines + ((self.failed,) if self.failed else ())

    def summary(self, state: str = "joined") -> dict | None:
        """``{state, sources, segments, skipped, seconds}`` for the outcome (None where no words are read);
        ``state``: "joined" (with the video), "following" (read on after it joined by its pictures; then
        ``percent`` says how far) or "failed" (read, but could not join it)."""
        if self.reader is None:
            return None
        if state == "following":
            return {"state": state, "percent": round(100 * self.fraction), "sources": [], "segments": 0,
                    "skipped": [], "seconds": 0.0}
        sources = list(self.report.sources) if self.report is not None else []
        return {"state": state, "sources": sources, "segments": len(self.segments),
                "skipped": list(self.skipped), "seconds": round(self.seconds, 2)}


def words_words(summary: dict | None) -> str:
    """What an added video's words are, for its outcome: " with 12 lines of words (subtitles, speech)"."""
    if summary is None:
        return ""
    if not summary["segments"]:
        return ", no words found"
    return f" with {counted(summary['segments'], 'line')} of words ({', '.join(summary['sources'])})"


def words_notes(run: WordsRun) -> str:
    """The outcome's sentences on how the words were read: each source not read (" Words skipped: speech: no
    audio stream.") and what the reading spent beyond this process (" Its speech asked ZeroGPU for ...")."""
    return ("".join(f" Words skipped: {line.rstrip('.')}." for line in run.skipped)
            + "".join(f" {note[:1].upper()}{note[1:]}." for note in run.notes))  # e.g. GPU seconds spent


@dataclass(eq=False)
class Follow:
    """A video added by its pictures whose words are still read: they join it when read
    (``IngestService._follow``); ``outcome()`` is its upload's outcome as of now."""

    video_id: str
    gallery: Gallery
    run: WordsRun
    added: str  # the outcome's message up to the words: "talk.mp4: added in ... as “talk” (130 s)"
    notes: str  # the outcome's notes (decoder warnings, GPU seconds asked)
    state: str = "following"  # "following" | "joined" | "failed"
    thread: threading.Thread | None = None

    def outcome(self) -> Outcome:
        """The upload's outcome now: searchable by its pictures and its words' progress, or what joined."""
        if self.state == "following":
            return Outcome("added", self.video_id, f"{self.added}; searchable now by its pictures, its words "
                                                   f"follow ({self.run.words()}).{self.notes}",
                           self.run.summary("following"))
        words = self.run.summary(self.state)
        if self.state == "failed":
            joined = "its words could not join it (it is searched by its pictures only)"
        else:
            joined = f"its words joined{words_words(words)}" if words["segments"] else "no words were found"
        return Outcome("added", self.video_id, f"{self.added}; searchable by its pictures, then {joined}."
                                               f"{self.notes}{words_notes(self.run)}", words)


class UploadRefused(MediaError):
    """An upload refused by the app's limits (size, count), before any decoding."""


def upload_limits(settings: AppSettings) -> DecodeLimits:
    """Decoder limits for uploads: the app's maximum duration, the decoder's other defaults."""
    return DecodeLimits(max_duration_s=settings.max_duration_s)


def _quiet(fraction: float, stage: str) -> None:
    """No one is watching (start-up work logs instead)."""


class IngestService:
    """Brings videos into the shared gallery or a session's (see the module docstring). Thread-safe: each
    gallery serialises its own updates; nothing else here is shared mutable state."""

    def __init__(self, shared: Gallery, media: MediaStore, extractor: Extractor, settings: AppSettings,
                 persist: PersistentStore | None = None, words: WordsReader | None = None,
                 text_encoder: Callable[[list[str]], list] | None = None) -> None:
        """``words``: reads each arrival's words (None: none are read); ``text_encoder``: embeds them for the
        gallery (``Gallery.add``'s: the profile's text encoder, ``TextEncoder.encode``)."""
        self.shared, self.media, self.extractor = shared, media, extractor
        self.settings, self.persist = settings, persist
        self.words, self.text_encoder = words, text_encoder
        self._start: Extractor | None = None  # the start-up extractor, while ``starting`` lasts
        # words read after their video joined by its pictures: one reading at a time (each reads its
        # sources in parallel threads already), the recent ones kept for their uploads' progress
        self._slots = threading.Semaphore(1)
        self._follows: list[Follow] = []
        self._joining = threading.Lock()  # a join, or ``close``: no words join a closed gallery
        self._closed = False

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Start-up work (demo, folder, bucket) runs on the extractor's start-up models for this block (on
        ZeroGPU: CPU models in this process, released at its end)."""
        with self.extractor.at_start() as extractor:
            self._start = extractor
            try:
                yield
            finally:
                self._start = None

    # ------------------------------------------------------------------ the ways in
    def upload(self, path: str | Path, session: SessionGallery | None = None,
               progress: Progress | None = None, name: str | None = None,
               sidecar: str | Path | None = None) -> Outcome:
        """A visitor's file (the page, the API, MCP): into ``session``'s gallery, or the shared one.
        ``name``: the file name the visitor knows (default: the path's); ``sidecar``: a subtitle file
        (.srt / .vtt) sent with it."""
        live = LiveProgress(progress) if progress is not None else None
        report = live or _quiet
        arrival = Arrival(Path(path), Path(name).name if name else Path(path).name,
                          sidecar=Path(sidecar) if sidecar else None)
        try:
            return self._add([arrival], UPLOAD, session, report)[0]
        finally:
            if live is not None:
                live.close()
            report(1.0, "done")

    def add_demo(self, videos: Sequence) -> list[Outcome]:
        """The demo gallery's videos (``prvr.demo.gallery`` records: id, path, title) not indexed yet."""
        missing = [Arrival(v.path, v.path.name, v.id, (v.title,), sha256_file(v.path)) for v in videos
                   if self.shared.record(v.id) is None]
        if missing:
            log.info("hashing and indexing %s", counted(len(missing), "demo video"))
        return self._add(missing, DEMO, None, _quiet, "demo gallery")

    def prepare(self, arrival: Arrival, way: Way, taken: set[str],
                report: Progress = _quiet) -> _Ready | Outcome:
        """One arrival for the shared gallery validated, copied and extracted but not indexed yet (``commit``
        indexes it), or its outcome where it failed (logged once); ``taken``: the titles in use. For a
        caller that chooses when videos join (``prvr.serve.folder``: batches). An exception that is not an
        ``Exception`` (a stop raised into ``report``) leaves no file and goes through."""
        try:
            return self._prepare(arrival, way, None, taken, report)
        except Exception as error:  # one place for every failure of one video
            return self._failed(arrival.name, way, error)

    def read_words(self, path: Path, sidecar: Path | None, shown: str) -> WordsRun:
        """A reading of one video's words alone, to follow it as its ``Ready.run``: for a video whose pictures
        were kept finished without its words (``prvr.serve.folder``'s spool, after a crash)."""
        return WordsRun(self.words, path, sidecar, shown, self._slots)

    def commit(self, ready: Sequence[_Ready], way: Way, replaced: Sequence[str] = ()) -> list[Outcome]:
        """Prepared arrivals into the shared gallery in one update, after their ``replaced`` entries (the
        same ids' earlier bytes) leave it, then to --persist where the way persists; their outcomes."""
        self.remove(replaced)
        try:
            self._index(list(ready), self.shared, way, _quiet)
        except Exception as error:  # nothing of this batch was added
            return [self._failed(r.shown, way, error) for r in ready]
        return [self._added(r, "in the shared gallery") for r in ready]

    def remove(self, ids: Sequence[str]) -> None:
        """Drop videos from the shared gallery, and from --persist (a tombstone each)."""
        if not ids:
            return
        shas = {i: (self.shared.record(i) or {}).get("sha256", "") for i in ids}
        self.shared.remove(list(ids))
        if self.persist is not None:
            for video_id in ids:
                self.persist.record_remove(video_id, shas[video_id])

    def restore(self) -> int:
        """Add the videos kept in --persist that the shared gallery lacks (their features: no extraction),
        and log where the shared gallery lives and whether it persists; the videos restored."""
        if self.persist is None:
            (log.warning if on_spaces() else log.info)(
                "the shared gallery lives in %s on this machine's disk%s", self.settings.data_dir,
                ": a Space loses it at every restart; attach a Storage Bucket and set PRVR_PERSIST to its "
                "mount path to keep it" if on_spaces() else " (--persist DIR keeps it in a second place)")
            return 0
        t0 = time.perf_counter()
        kept = [v for v in self.persist.restore()
                if (self.shared.record(v.id) or {}).get("sha256") != v.sha256]
        stale = [v.id for v in kept if self.shared.record(v.id) is not None]
        if stale:
            self.shared.remove(stale)
        if kept:
            self.shared.add(kept, text_encoder=self.text_encoder)  # their words as stored, embedded again
        log.info("%s", self.persist.words(time.perf_counter() - t0))
        return len(kept)

    def save_unsaved(self) -> int:
        """Write to --persist every shared video of a persisting way that it does not hold (videos added
        before --persist was given: their features are extracted again from their playable files, once);
        the videos saved."""
        if self.persist is None:
            return 0
        persisting = tuple(w.prefix for w in WAYS if w.persist and w.prefix)
        unsaved = [r for r in self.shared.records()
                   if r["id"].startswith(persisting) and r["id"] not in self.persist.live]
        if not unsaved:
            return 0
        is_, it, its = ("is", "it", "its") if len(unsaved) == 1 else ("are", "them", "their")
        log.info("%s %s not in the persistent folder %s yet (added before --persist was given): saving %s "
                 "now, extracting %s features again", counted(len(unsaved), "shared video"), is_,
                 self.persist.root, it, its)
        saved = 0
        for record in unsaved:
            path = self.media.locate(record["path"])
            try:
                words = WordsRun(self.words, path, None, record["id"])
                try:
                    with self.media.work() as work:  # at start: the start-up models while ``starting`` lasts
                        extractor = self._start or self.extractor
                        features = extractor.extract(path, None, record.get("sha256", ""), work, _quiet)
                except BaseException:
                    words.abandon()
                    raise
                video = GalleryVideo.from_features(record["id"], features, record.get("title", ""),
                                                   record["path"])
                video = dataclasses.replace(video, words=words.wait(_quiet).segments)
                self.persist.record_add(video, self._kept_media(path))
            except (MediaError, OSError) as err:
                log.warning("%s could not be saved to the persistent folder: %s", record["id"], err)
                continue
            saved += 1
        log.info("saved %d of the %s to the persistent folder", saved, counted(len(unsaved), "shared video"))
        return saved

    # ------------------------------------------------------------------ the one pipeline
    def _extractor(self, way: Way) -> Extractor:
        """The start-up models for start-up ways while ``starting`` lasts, else the request extractor."""
        return self._start if way.at_start and self._start is not None else self.extractor

    def _add(self, arrivals: Sequence[Arrival], way: Way, session: SessionGallery | None, report: Progress,
             what: str = "") -> list[Outcome]:
        """Validate, copy and extract each arrival, index those that made it in one update, persist them."""
        t0 = time.perf_counter()
        gallery = session.index if session is not None else self.shared
        galleries = [self.shared] + ([session.index] if session is not None else [])
        given = {a.video_id for a in arrivals}
        taken = {r.get("title", "") for g in galleries for r in g.records() if r.get("id") not in given}
        outcomes: list[Outcome | None] = []
        ready: list[_Ready] = []
        for n, arrival in enumerate(arrivals, 1):
            if what:
                log.info("indexing %s: video %d of %d, %s", what, n, len(arrivals), arrival.name)
            try:
                found = self._prepare(arrival, way, session, taken, report)
            except Exception as error:  # one place for every failure of one video
                outcomes.append(self._failed(arrival.name, way, error))
                continue
            if isinstance(found, Outcome):
                outcomes.append(found)
                continue
            taken.add(found.video.title)
            ready.append(found)
            outcomes.append(None)  # filled once indexed
        if not ready:
            return outcomes
        try:
            self._index(ready, gallery, way, report)
        except Exception as error:  # nothing of this call was added
            failed = iter(ready)
            return [o if o is not None else self._failed(next(failed).shown, way, error) for o in outcomes]
        if what:
            log.info("indexed %s of the %s in %.1f s", counted(len(ready), "video"), what,
                     time.perf_counter() - t0)
        if session is not None:
            session.uploads += len(ready)
        where = "in your session" if session is not None else "in the shared gallery"
        done = iter(ready)
        return [o if o is not None else self._added(next(done), where) for o in outcomes]

    def _prepare(self, arrival: Arrival, way: Way, session: SessionGallery | None, taken: set[str],
                 report: Progress) -> _Ready | Outcome:
        """Validate, copy and extract one arrival (raises on failure, leaving no file behind)."""
        path, shown = arrival.path, arrival.name
        report(0.0, "checking the file")
        if way.limits:
            self._check_limits(path, session)
        info = probe(path, upload_limits(self.settings) if way.limits else DecodeLimits())
        extractor = self._extractor(way)
        plan = extractor.cost(info)
        notes = ""
        if plan is not None:  # ZeroGPU: the visitor is told the GPU seconds before any is asked for
            # Whisper's model call in GPU slots (bootstrap.words_reader), else the words on the CPU: none
            from prvr.serve.zerogpu_speech import announced

            cpu = announced(self.words.recognizer(), info.duration) if self.words is not None else ""
            notes = f" It asked ZeroGPU for {plan.words()}{cpu}."
            report(0.02, f"checking the file: {info.duration / 60:.1f} minutes of video will ask ZeroGPU for "
                         f"{plan.words()}{cpu}")
        sha = arrival.sha256 or sha256_file(path)
        if way.by_content:
            duplicate = self._find_sha(sha, session)
            if duplicate is not None:
                return Outcome("duplicate", duplicate["id"],
                               f"{shown}: already in the gallery as “{duplicate['title']}”.")
        # the words from the original file (a re-encoded copy keeps no subtitle track), beside the copy and
        # the pictures
        words = WordsRun(self.words, path, arrival.sidecar, shown, self._slots, after=not words_beside(),
                         keep_in=self.media.dir if way.copy == "store" else None)
        both = words.beside(report)
        try:
            copy, playable, reencoded = self._playable(path, sha, way, session, both)
        except BaseException:
            words.abandon()
            raise
        try:
            both(0.3, seconds_words(0, info.duration))
            with self.media.work() as work:
                # the copy has the probed bytes unless it was re-encoded (then it is probed again)
                features = extractor.extract(playable, None if reencoded else info, sha, work,
                                             Throttled(both))
        except BaseException:
            words.abandon()
            if copy is not None:
                copy.unlink(missing_ok=True)  # nothing indexed: leave no orphan file behind
            raise
        video_id = arrival.video_id or f"{way.prefix}{sha[:12]}"
        title = distinct_title(arrival.titles, taken) if arrival.titles else unique_title(shown, taken)
        video = GalleryVideo.from_features(video_id, features, title, self.media.portable(playable))
        words.detach()  # the pictures are done: the video joins now, its words with it or after it (_index)
        notes = "".join(f" Note: {w}." for w in features.warnings) + notes
        return _Ready(video, shown, copy, playable, notes, run=words)

    def _playable(self, path: Path, sha: str, way: Way, session: SessionGallery | None,
                  report: Progress) -> tuple[Path | None, Path, bool]:
        """(the copy made or None, the file to extract and serve, whether it was re-encoded)."""
        if way.copy == "store":
            media_dir = session.media if session is not None else self.media.dir
            stored, reencoded = self.media.store_playable(path, sha, media_dir, report)
            return stored, stored, reencoded
        if way.copy == "playable":  # a folder per content hash: equal names in other folders never clash
            playable = ensure_browser_playable(path, self.media.dir / sha[:16])
            return (None if playable == path else playable), playable, playable != path
        return None, path, False

    def _index(self, ready: list[_Ready], gallery: Gallery, way: Way, report: Progress) -> None:
        """Add the ready videos in one update (raises, deleting their copies, when it fails), then persist
        them. A video whose words are read joins with them; one whose words are still being read joins by
        its pictures, searchable at once, and its words follow it (``_follow``)."""
        report(0.9, "indexing")
        for r in ready:
            if r.run is not None and r.run.done:
                r.video = dataclasses.replace(r.video, words=r.run.segments)
                r.notes, r.words, r.run = r.notes + words_notes(r.run), r.run.summary(), None
        try:
            gallery.add([r.video for r in ready], text_encoder=self.text_encoder)
        except BaseException:
            for r in ready:
                if r.run is not None:
                    r.run.abandon()
                if r.copy is not None:
                    r.copy.unlink(missing_ok=True)
            raise
        if way.persist and gallery is self.shared and self.persist is not None:
            for r in ready:
                try:
                    self.persist.record_add(r.video, self._kept_media(r.playable))
                except OSError:
                    log.exception("%s is in the shared gallery but could not be saved to the persistent "
                                  "folder: it will be gone after a restart", r.shown)
        for r in ready:
            if r.run is not None:
                self._follow(r, gallery, way)

    def _follow(self, ready: _Ready, gallery: Gallery, way: Way) -> None:
        """The words of a video that joined by its pictures join it once read (a thread waits for them)."""
        follow = Follow(ready.video.id, gallery, ready.run, "", ready.notes)
        ready.follow = follow
        follow.thread = threading.Thread(target=self._join, args=(follow, way, ready.shown), daemon=True,
                                         name=f"words-join-{ready.shown}")
        with self._joining:  # the readings under way, and the last 64 that ended
            ended = {id(f) for f in [f for f in self._follows if f.state != "following"][-64:]}
            self._follows = [f for f in self._follows if f.state == "following" or id(f) in ended]
            self._follows.append(follow)
        follow.thread.start()

    def _join(self, follow: Follow, way: Way, shown: str) -> None:
        """(A follow's thread.) Wait for the words, then give them to the video in one gallery update and
        to --persist; any failure is one logged line and the video stays, searched by its pictures."""
        run = follow.run
        if run.thread is not None:
            run.thread.join()
        words = run.segments
        with self._joining:
            if self._closed or run.abandoned:
                follow.state = "failed"
                return
            try:
                if words:  # (none read: the video has none already)
                    follow.gallery.set_words(follow.video_id, words, text_encoder=self.text_encoder)
                follow.state = "joined"
            except Exception as error:  # the video was removed meanwhile, its session closed, a store error
                follow.state = "failed"
                log.warning("the words of %s could not join it (it stays, searched by its pictures): %s",
                            shown, str(error).splitlines()[0] if str(error) else type(error).__name__)
                return
        log.info("the words of %s joined it after its pictures: %s in %.1f s", shown,
                 counted(len(words), "line"), run.seconds)
        if (words and way.persist and follow.gallery is self.shared and self.persist is not None):
            try:
                self.persist.record_words(follow.video_id, words)
            except OSError as error:
                log.warning("the words of %s could not be saved to the persistent folder: %s", shown, error)

    def follows(self, galleries: Sequence[Gallery]) -> list[Follow]:
        """The recent videos of these galleries whose words followed them, oldest first."""
        with self._joining:
            return [f for f in self._follows if any(f.gallery is g for g in galleries)]

    def outcome_now(self, video_id: str, galleries: Sequence[Gallery]) -> Outcome | None:
        """The outcome of the latest upload of this video into one of these galleries whose words followed
        it, as of now (None: no words followed it)."""
        found = [f for f in self.follows(galleries) if f.video_id == video_id]
        return found[-1].outcome() if found else None

    def close(self, wait_s: float = 2.0) -> None:
        """No more words join: readings still going are stopped, and a join under way is waited for (the
        galleries close after this)."""
        with self._joining:
            self._closed = True
            follows = list(self._follows)
        for f in follows:
            f.run.abandon()
        deadline = time.monotonic() + wait_s
        for f in follows:
            if f.thread is not None:
                f.thread.join(max(0.0, deadline - time.monotonic()))

    def _kept_media(self, playable: Path) -> Path | None:
        """The file --persist keeps with a video: the app's own copy; None for a file served in place (a
        folder's original: the entry keeps its path)."""
        return playable if playable.resolve().is_relative_to(self.media.dir.resolve()) else None

    def _added(self, ready: _Ready, where: str) -> Outcome:
        """The outcome of an indexed video (its words', where they follow it: as of now)."""
        video = ready.video
        added = f"{ready.shown}: added {where} as “{video.title}” ({video.duration:.0f} s)"
        if ready.follow is not None:
            ready.follow.added = added
            return ready.follow.outcome()
        return Outcome("added", video.id, f"{added}{words_words(ready.words)}; searchable now.{ready.notes}",
                       ready.words)

    def _failed(self, shown: str, way: Way, error: Exception) -> Outcome:
        """The outcome of a video that was not added, logged once: one line for a known cause, the stack
        for an unexpected one (never shown to the person)."""
        if isinstance(error, MediaError):
            log.warning("%s %s rejected: %s", way.name, shown, error.reason)
            return Outcome("rejected", None, f"{shown}: {error.reason}")
        if isinstance(error, GpuUnavailable):
            log.warning("%s %s not added: %s", way.name, shown, error)
            return Outcome("error", None, f"{shown}: {str(error).rstrip('.')}. Nothing was added.")
        error_id = uuid.uuid4().hex[:8]
        log.error("%s %s failed (error id %s)", way.name, shown, error_id, exc_info=error)
        return Outcome("error", None, f"{shown}: unexpected server error (error id {error_id}); nothing was "
                                      "added.")

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
            added = counted(session.uploads, "video")
            raise UploadRefused(path, f"this session already added {added}, the maximum per session.",
                                "Start a new session to add more (in a browser: reload the page; through the "
                                "API: connect a new client).")


def pair_sidecars(videos: Sequence[str], subtitles: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Subtitle files chosen with videos, matched by name: ({video name: subtitle file}, the subtitle files
    no video takes). A subtitle file goes with the video of its stem ("talk.srt", "talk.en.vtt" with
    "talk.mp4"); one video chosen with one subtitle file takes it whatever its name."""
    if len(videos) == 1 and len(subtitles) == 1:
        return {videos[0]: subtitles[0]}, []
    paired: dict[str, str] = {}
    for sub in subtitles:
        stem = Path(sub).name.rsplit(".", 1)[0]
        for video in videos:
            own = Path(video).stem
            if video not in paired and (stem == own or stem.startswith(own + ".")):
                paired[video] = sub
                break
    taken = set(paired.values())
    return paired, [s for s in subtitles if s not in taken]


def unique_title(name: str, taken: Sequence[str] | set[str]) -> str:
    """A title for a file named ``name`` that no listed video has: its stem, else its name with the
    extension (``clip.flv`` beside ``clip``), else the name with a number (``clip.flv (2)``)."""
    path = Path(name)
    return distinct_title([path.stem or name, path.name or name], taken)


def distinct_title(candidates: Sequence[str], taken: Sequence[str] | set[str]) -> str:
    """The first candidate title not ``taken``, else the last one with the first free number: "x (2)"."""
    taken = set(taken)
    for title in candidates:
        if title not in taken:
            return title
    n = 2
    while f"{candidates[-1]} ({n})" in taken:
        n += 1
    return f"{candidates[-1]} ({n})"
