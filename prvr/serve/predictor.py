"""The one object the app talks to: search, uploads, sessions and what the app says about itself.

``prvr.serve.bootstrap.start(AppSettings.from_args())`` makes one: the app's parts started (the data dir
claimed, the model and extractor chosen, the shared gallery opened, restored, the demo gallery and an optional
folder indexed); this module knows nothing of how. Then:

    predictor.search(query, k, clip_weight, session, offset) -> SearchResponse   # Contract 4 dicts
    predictor.add_video(path, session, progress)     -> {status, video_id, message}   (prvr.serve.ingest)
    predictor.remove_upload(video_id, session)       -> a visitor's upload removed (QueryError: no such one)
    predictor.upload_outcome(video_id, session)      -> the same as of now, where its words follow the video
    predictor.ensure_session(session)                -> the session's private gallery (session uploads)
    predictor.describe(session)                      -> model, profile, video counts, gallery (, folder)
    predictor.close()                                -> waits for background work, releases the gallery
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from extract.pipeline import TextEncoder
from extract.profiles import get_profile
from prvr.index import Gallery, QueryError, SearchMode, Weights, search_mode
from prvr.results.confidence import Calibrator
from prvr.results.response import SearchResponse
from prvr.results.search import search_text
from prvr.serve.folder import FolderSync
from prvr.serve.ingest import IngestService
from prvr.serve.media import MediaStore
from prvr.serve.model_choice import ModelInfo
from prvr.serve.owner import DataDirLock
from prvr.serve.progress import Progress
from prvr.serve.sessions import SessionGallery, open_session
from prvr.serve.settings import AppSettings


def complement(share: float) -> float:
    """``1 - share`` as the person who gave ``share`` reads it: 0.3 for 0.7 (float arithmetic gives
    0.30000000000000004, which the API's ``weights`` would show)."""
    return float(Decimal(1) - Decimal(repr(float(share))))


class Serialised:
    """A callable that runs one call at a time (for objects that refuse concurrent calls)."""

    def __init__(self, fn: Callable) -> None:
        self.fn, self.lock = fn, threading.Lock()

    def __call__(self, *args: object, **kwargs: object) -> object:
        with self.lock:
            return self.fn(*args, **kwargs)

    def __getattr__(self, name: str) -> object:
        return getattr(self.fn, name)


@dataclass(eq=False)
class Predictor:
    """The app's face over its parts (made by ``prvr.serve.bootstrap.start``, which locks the data dir for it
    until ``close``); see the module docstring.
    Thread-safe: searches run in parallel, each gallery serves reads from an immutable view and serialises
    its own writes; nothing else here is shared mutable state."""

    settings: AppSettings
    model: object
    info: ModelInfo
    profile: str
    text: TextEncoder  # the profile's text backbone, on the search device
    calibrator: Calibrator  # the reference captions; ``confidence`` labels every search's hits from them
    index: Gallery  # the shared gallery
    media: MediaStore
    ingest: IngestService  # every way in (uploads, demo, folder, bucket)
    examples: list[str] = field(default_factory=list)  # demo captions offered as example queries
    owner: DataDirLock | None = None  # the lock on the data dir (one owner at a time), released by close
    tracing: threading.Thread | None = None  # the background trace of the text model, joined by close
    folder: FolderSync | None = None  # --gallery, indexed and watched in the background (stopped by close)
    closed: bool = False

    def __post_init__(self) -> None:
        self.confidence = self.calibrator.confidence()
        self.sessions_dir = self.settings.data_dir / "sessions"

    def close(self) -> None:
        """Wait for background work, release the shared gallery (a Qdrant client, its lock) and the data
        dir. Safe to call twice."""
        if self.folder is not None:  # first: it writes to the gallery
            self.folder.stop()
        if self.tracing is not None:
            self.tracing.join()
            self.tracing = None
        if not self.closed:
            self.closed = True
            self.ingest.close()  # no words join the gallery once it is closed
            self.index.close()
        if self.owner is not None:
            self.owner.release()
            self.owner = None

    # ------------------------------------------------------------------ searching
    @property
    def default_clip_weight(self) -> float:
        """The model's clip-scale share of the score (MS-SL: 0.7)."""
        cfg = self.model.cfg
        return cfg.clip_scale_w / (cfg.clip_scale_w + cfg.frame_scale_w)

    def search(self, query: str, k: int = 5, clip_weight: float | None = None,
               session: SessionGallery | None = None, offset: int = 0) -> SearchResponse:
        """Top-k videos (Contract 4 dicts) over the shared gallery and the session's uploads, after the first
        ``offset`` (a further page: ranks from ``offset + 1``). ``stats["total_ms"]`` is all of it: the
        text, every gallery, the results and what the app adds to them (``text_ms``, ``encode_ms``,
        ``rank_ms`` and ``results_ms`` are its steps)."""
        started = time.perf_counter()
        weight = self.default_clip_weight if clip_weight is None else float(clip_weight)
        if not 0.0 <= weight <= 1.0:
            raise QueryError(f"clip_weight must be between 0 and 1, got {weight}")
        galleries = [self.index] + ([session.index] if session is not None and len(session.index) else [])
        # cleaned and encoded once by the profile's text backbone, ranked in every gallery; one confidence
        # rule for all hits: each video's own cuts from its reference scores at these weights
        response = search_text(galleries, query, self.text.encode, k, Weights(weight, complement(weight)),
                               approximate=self.search_mode().approximate, confidence=self.confidence,
                               offset=offset)
        private = session.index.position if len(galleries) > 1 else {}
        located = [dict(r, path=str(self.media.locate(r["path"])),
                        **({"source": "session"} if r["video_id"] in private else {}))
                   for r in response.results]
        query = dict(response.query, **self.query_reading(response.query["text"]))
        stats = {**response.stats, "total_ms": 1e3 * (time.perf_counter() - started)}
        return dataclasses.replace(response, results=located, query=query, stats=stats)

    def search_mode(self) -> SearchMode:
        """How the shared gallery is searched now (``--search``; auto: by its size and store), and why."""
        return search_mode(self.settings.search, len(self.index), self.index.describe()["backend"])

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
                  progress: Progress | None = None, name: str | None = None,
                  subtitles: str | Path | None = None) -> dict:
        """One upload (``IngestService.upload``): ``{status, video_id, message}`` (and ``words``); ``name``:
        the file name the visitor knows (messages name it); ``subtitles``: a sidecar .srt / .vtt sent with
        it."""
        return self.ingest.upload(path, session, progress, name, subtitles).to_dict()

    def remove_upload(self, video_id: str, session: SessionGallery | None = None) -> None:
        """Remove a visitor's upload: from ``session``'s gallery (its playable copy deleted with it), or with
        shared uploads from the shared gallery (``IngestService.remove``: --persist records it). Which videos
        a visitor may remove is the caller's to decide (the page: those its session added); an id in neither
        is a QueryError naming it, and nothing changes."""
        if session is not None and session.index.record(video_id) is not None:
            path = self.media.locate(session.index.record(video_id).get("path") or "")
            session.index.remove([video_id])
            if path.resolve().is_relative_to(session.root.resolve()):  # never a file outside the session
                path.unlink(missing_ok=True)
        elif self.settings.uploads == "shared" and self.index.record(video_id) is not None:
            self.ingest.remove([video_id])
        else:
            raise QueryError(f"no upload of yours has the id {video_id!r}: it was removed already, or its "
                             "session has ended")

    def upload_outcome(self, video_id: str, session: SessionGallery | None = None) -> dict | None:
        """An upload's outcome as of now where its words follow the video (joined by its pictures first):
        ``{status, video_id, message, words: {state, percent...}}``; None where no words followed it."""
        outcome = self.ingest.outcome_now(video_id, self.galleries(session))
        return outcome.to_dict() if outcome is not None else None

    def words_following(self, session: SessionGallery | None = None) -> list[dict]:
        """The recent uploads of the shared gallery and the session's whose words followed them, oldest
        first (/info's ``words_follow``): each upload's outcome as of now (``upload_outcome``)."""
        return [f.outcome().to_dict() for f in self.ingest.follows(self.galleries(session))]

    def galleries(self, session: SessionGallery | None) -> list[Gallery]:
        """The shared gallery and the session's."""
        return [self.index] + ([session.index] if session is not None else [])

    def gpu_words(self) -> str:
        """What an upload asks of a visitor's GPU quota, in words ("" where uploads spend no quota): the
        frames' rule, and the speech's where Whisper runs in GPU slots."""
        frames = self.ingest.extractor.quota_words()
        if not frames or self.ingest.words is None:
            return frames
        from prvr.serve.zerogpu_speech import quota_words  # (imports gradio: only where there is a quota)

        return frames + quota_words(self.ingest.words.recognizer())

    def video_file(self, video_id: str, sessions: Sequence[SessionGallery] = ()) -> Path | None:
        """The playable file of a live video of the shared gallery or of one of ``sessions``, or None."""
        record = self.video_record(video_id, sessions)
        return self.media.locate(record["path"]) if record is not None else None

    def video_record(self, video_id: str, sessions: Sequence[SessionGallery] = ()) -> dict | None:
        """The stored record (id, title, path, duration) of a live video with a file, of the shared gallery
        or of one of ``sessions``, or None."""
        for gallery in [self.index] + [s.index for s in sessions]:
            record = gallery.record(video_id)
            if record is not None and record.get("path"):
                return record
        return None

    # ------------------------------------------------------------------ describing
    def gallery_words(self) -> str:
        """Where the shared gallery lives, in words without server paths (logs, /info)."""
        about = self.index.describe()
        kept = (f", kept across restarts in the folder {self.settings.persist.name!r}"
                if self.ingest.persist is not None else "")
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
                "uploads": uploads, "confidence": self.calibrator.describe(), "words": self.words_info(),
                "search": self.search_mode()._asdict(), "words_follow": self.words_following(session),
                **({"folder": self.folder.status()} if self.folder is not None else {})}

    def words_info(self) -> dict:
        """Which words every way in reads: ``WordsReader.describe`` (mode, sources, models in use)."""
        reader = self.ingest.words
        return reader.describe() if reader is not None else {"mode": "off"}

    def example_queries(self) -> list[str]:
        """Demo captions to offer as example queries."""
        return list(self.examples)
