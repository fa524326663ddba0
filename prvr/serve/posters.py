"""A result's poster: the frame its player starts on, a small JPEG the page shows until the player is made.

    GET /prvr/poster/<video id>?t=S   the frame showing at S seconds, POSTER_WIDTH pixels wide

A card holds no ``<video>`` until asked (``prvr.serve.page.player_html``), so without a poster its stand-in is
a black box. The frame is decoded on request (``extract.decode.FrameReader``: the one frame, at the
poster's size) by one request at a time (``POSTER_SLOTS``: searches keep the other core), and kept in a small
cache of encoded images keyed by the file and its modification time, so a card shown again costs nothing.
The page asks lazily (``loading="lazy"``): only the cards a visitor scrolls to are decoded.
"""

from __future__ import annotations

import io
import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import numpy as np
from PIL import Image
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from extract.decode import FrameReader, MediaError, probe
from prvr.serve.clips import ClipRefused, seconds
from prvr.serve.predictor import Predictor
from prvr.serve.sessions import SessionGallery

if TYPE_CHECKING:  # only a type here
    from prvr.serve.visits import ClosedSessions

log = logging.getLogger(__name__)

POSTER_ROUTE = "/prvr/poster/"  # + a video id, ?t= seconds: the frame there as a JPEG
POSTER_WIDTH = 480  # pixels: a card's player is at most about this wide on a desktop page
POSTER_QUALITY = 80
POSTER_SLOTS = threading.BoundedSemaphore(1)  # posters decoded at once
CACHE_BYTES = 16 << 20  # encoded posters kept (about 1,000 of ~15 KB)


def poster_url(video_id: str, t: float) -> str:
    """The path of a video's poster at ``t`` seconds on this app's poster route (the page's stand-ins)."""
    return f"{POSTER_ROUTE}{quote(video_id)}?t={t:.2f}"


class PosterCache:
    """Encoded posters by (file, its modification time, t), least recently used out past ``limit`` bytes."""

    def __init__(self, limit: int = CACHE_BYTES) -> None:
        self.limit, self.size = limit, 0
        self._items: OrderedDict[tuple, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> bytes | None:
        """The poster stored under ``key``, or None."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
            return self._items.get(key)

    def put(self, key: tuple, image: bytes) -> None:
        """Keep ``image`` under ``key``, dropping the least recently used past the limit."""
        with self._lock:
            if key in self._items:
                return
            self._items[key] = image
            self.size += len(image)
            while self.size > self.limit and len(self._items) > 1:
                self.size -= len(self._items.popitem(last=False)[1])


def poster_request(predictor: Predictor, video_id: str, t: object,
                   sessions: list[SessionGallery]) -> tuple[Path, float]:
    """The file of live video ``video_id`` (of the shared gallery or one of ``sessions``) and ``t`` checked
    against its duration; ``ClipRefused`` with one line saying what is wrong otherwise."""
    at = seconds(t, "t")
    record = predictor.video_record(video_id, sessions)
    if record is None:
        raise ClipRefused(f"No video has the id {video_id!r} here.", status=404)
    duration = float(record.get("duration") or 0.0)
    if not 0 <= at <= duration:
        raise ClipRefused(f"t must be from 0 to {duration:.3f} s (the video's length), got {at:g}.")
    return predictor.media.locate(record["path"]), at


def poster_jpeg(path: Path, t: float, width: int = POSTER_WIDTH) -> bytes:
    """The frame showing at ``t`` seconds of the video at ``path``, ``width`` pixels wide (never wider than
    the video), as a JPEG."""
    with POSTER_SLOTS:
        info = probe(path)
        shown_width, shown_height = info.display_size
        scale = min(1.0, width / max(shown_width, 1))
        size = (max(2, round(shown_width * scale / 2) * 2), max(2, round(shown_height * scale / 2) * 2))
        frame = next(iter(FrameReader(str(path), np.array([t]), size, batch_size=1, info=info))).frames[0]
    out = io.BytesIO()
    Image.fromarray(frame).save(out, format="JPEG", quality=POSTER_QUALITY)
    return out.getvalue()


def poster_route(predictor: Predictor, sessions: ClosedSessions) -> Route:
    """``GET /prvr/poster/<video id>?t=``: the frame at t seconds as a JPEG (cached; see the module
    docstring). A live session upload's poster is served by id as ``/prvr/video/<id>`` serves it."""
    cache = PosterCache()

    def make(video_id: str, t: object) -> bytes:
        path, at = poster_request(predictor, video_id, t, sessions.galleries())
        key = (str(path), path.stat().st_mtime_ns, round(at, 2))
        image = cache.get(key)
        if image is None:
            image = poster_jpeg(path, at)
            cache.put(key, image)
        return image

    async def serve(request: Request) -> Response:
        try:
            image = await run_in_threadpool(make, request.path_params["video_id"],
                                            request.query_params.get("t"))
        except ClipRefused as refused:
            log.warning("poster refused: %s", refused)
            return PlainTextResponse(str(refused), status_code=refused.status)
        except (MediaError, OSError) as problem:
            log.warning("poster failed: %s", problem)
            return PlainTextResponse(f"The poster could not be made: {problem}", status_code=500)
        return Response(image, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=600"})

    return Route(POSTER_ROUTE + "{video_id:path}", serve, methods=["GET"])
