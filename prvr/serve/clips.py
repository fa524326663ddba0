"""A moment taken away: an MP4 of one span of a gallery video, cut where the span starts (issue #45, item 3).

    GET /prvr/clip/<video id>?start=S&end=E   the clip as an attachment, made for this request in the data
                                              dir's work area (``MediaStore.work``) and removed once sent
    /clip(video_id, start, end)               the API endpoint (app.py: the MP4 itself) and the MCP tool
                                              ``clip`` (JSON with ``clip_url``, the route above)

``clip_request`` checks a span once for every way in (a one-line ``ClipRefused`` for each bad input: an
unknown id, a number that is not one, an empty or inverted span, one beyond the video or longer than
``MAX_CLIP_S``); ``make_clip`` cuts it with ``extract.transcode.cut``: decoded from the keyframe before
``start`` and re-encoded (H.264/yuv420p, AAC when the video has sound), so its first frame is the frame
showing at ``start``, never a frozen head. At most ``CLIP_SLOTS`` clips are encoded at once (the CPU's
other work goes on). A work folder a crash leaves is swept at the next start (``MediaStore.sweep``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from extract.decode import MediaError
from extract.transcode import EncodeSettings, cut
from prvr.serve.predictor import Predictor
from prvr.serve.sessions import SessionGallery

if TYPE_CHECKING:  # only a type here
    from prvr.serve.visits import ClosedSessions

log = logging.getLogger(__name__)

CLIP_ROUTE = "/prvr/clip/"  # + a video id, ?start=&end= in seconds: the clip of that span
MAX_CLIP_S = 600.0  # a longer span is refused: the whole video is the API's video_url
END_SLACK_S = 0.002  # an end this far past the stored duration is the video's end (rounded seconds)
CLIP_SLOTS = threading.BoundedSemaphore(2)  # clips encoded at once (each takes a core while it runs)
CLIP_ENCODING = EncodeSettings(crf=20, max_height=1080)  # a clip to keep: a little finer than uploads'


class ClipRefused(ValueError):
    """A clip (or a poster, ``prvr.serve.posters``) that will not be made; the message is one line for the
    person who asked."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status  # the route's HTTP status: 404 for an unknown video, else 400


@dataclass(frozen=True)
class ClipRequest:
    """A checked span of a live video: what ``make_clip`` cuts."""

    video_id: str
    title: str
    source: Path  # the video's playable file
    start: float
    end: float

    @property
    def file_name(self) -> str:
        """The clip's file name: the video's title and the span, e.g. ``beach_walk_12.00-18.50s.mp4``."""
        slug = re.sub(r"[^\w-]+", "_", self.title, flags=re.ASCII).strip("_")[:60] or "clip"
        return f"{slug}_{self.start:.2f}-{self.end:.2f}s.mp4"

    def to_dict(self, root: str = "") -> dict:
        """The MCP tool's answer: the span, its length and ``clip_url`` (on this app's clip route)."""
        return {"video_id": self.video_id, "title": self.title, "start": self.start, "end": self.end,
                "duration": round(self.end - self.start, 3),
                "clip_url": root.rstrip("/") + clip_url(self.video_id, self.start, self.end)}


def clip_url(video_id: str, start: float, end: float) -> str:
    """The path of a span's clip on this app's clip route (the page's download links, MCP's ``clip_url``)."""
    return f"{CLIP_ROUTE}{quote(video_id)}?start={start:.3f}&end={end:.3f}"


def seconds(value: object, name: str) -> float:
    """``value`` as a finite number of seconds, else ``ClipRefused`` naming ``name`` and what was given."""
    if isinstance(value, bool):
        value = repr(value)  # True is no number of seconds
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ClipRefused(f"{name} must be a number of seconds, got {value!r}.") from None
    if not math.isfinite(number):
        raise ClipRefused(f"{name} must be a finite number of seconds, got {value!r}.")
    return number


def clip_request(predictor: Predictor, video_id: object, start: object, end: object,
                 sessions: Sequence[SessionGallery] = ()) -> ClipRequest:
    """The span ``start``-``end`` seconds of the live video ``video_id`` (of the shared gallery or one of
    ``sessions``), checked; ``ClipRefused`` with one line saying what is wrong otherwise."""
    if not isinstance(video_id, str) or not video_id.strip():
        raise ClipRefused(f"video_id must be the id of a video (a search result's video_id), got "
                          f"{video_id!r}.")
    begin, finish = seconds(start, "start"), seconds(end, "end")
    if begin < 0:
        raise ClipRefused(f"start must be 0 or more seconds, got {begin:g}.")
    if finish == begin:
        raise ClipRefused(f"The span {begin:g}-{finish:g} s is empty: end must be after start.")
    if finish < begin:
        raise ClipRefused(f"The span {begin:g}-{finish:g} s is inverted: end must be after start.")
    if finish - begin > MAX_CLIP_S:
        raise ClipRefused(f"The span {begin:g}-{finish:g} s is {finish - begin:g} s long; a clip is at most "
                          f"{MAX_CLIP_S:g} s (the whole video is the search result's video_url).")
    record = predictor.video_record(video_id, sessions)
    if record is None:
        raise ClipRefused(f"No video has the id {video_id!r} here (a session's upload is clipped only in "
                          "its own session).", status=404)
    duration = float(record.get("duration") or 0.0)
    if begin >= duration:
        raise ClipRefused(f"The span {begin:g}-{finish:g} s starts after the video ends: "
                          f"{record.get('title') or video_id!r} is {duration:.3f} s long.")
    if finish > duration + END_SLACK_S:
        raise ClipRefused(f"The span {begin:g}-{finish:g} s ends after the video does: "
                          f"{record.get('title') or video_id!r} is {duration:.3f} s long.")
    return ClipRequest(video_id, str(record.get("title") or video_id), predictor.media.locate(record["path"]),
                       begin, min(finish, duration))


def make_clip(wanted: ClipRequest, folder: Path) -> Path:
    """Cut ``wanted`` into ``folder`` (a work folder the caller removes); the clip's path. A source that
    cannot be cut raises ``extract.decode.MediaError`` (its message names the file)."""
    with CLIP_SLOTS:
        path = folder / wanted.file_name
        cut(wanted.source, path, wanted.start, wanted.end, CLIP_ENCODING)
    log.info("clip of %s, %.3f-%.3f s: %.1f MB", wanted.video_id, wanted.start, wanted.end,
             path.stat().st_size / 1e6)
    return path


def clip_route(predictor: Predictor, sessions: ClosedSessions) -> Route:
    """``GET /prvr/clip/<video id>?start=&end=``: the span's clip as an attachment, made in a work folder
    that is removed once the response is sent (or the client goes away). A live session upload is clipped
    by id as ``/prvr/video/<id>`` serves it."""
    async def serve(request: Request) -> Response:
        query = request.query_params
        try:
            wanted = await run_in_threadpool(clip_request, predictor, request.path_params["video_id"],
                                             query.get("start"), query.get("end"), sessions.galleries())
        except ClipRefused as refused:
            log.warning("clip refused: %s", refused)
            return PlainTextResponse(str(refused), status_code=refused.status)
        work = contextlib.ExitStack()
        folder = work.enter_context(predictor.media.work())
        try:
            path = await run_in_threadpool(make_clip, wanted, folder)
        except MediaError as problem:
            work.close()
            log.warning("clip failed: %s", problem)
            return PlainTextResponse(f"The clip could not be made: {problem}", status_code=500)
        except BaseException:
            work.close()
            raise
        return SentThenRemoved(work, path, media_type="video/mp4", filename=path.name)

    return Route(CLIP_ROUTE + "{video_id:path}", serve, methods=["GET"])


class SentThenRemoved(FileResponse):
    """A file response whose work folder is removed once it is sent, or once sending fails (the client went
    away midway): a background task would not run then."""

    def __init__(self, work: contextlib.ExitStack, path: Path, **options: object) -> None:
        super().__init__(path, **options)
        self.work = work

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.work.close()
