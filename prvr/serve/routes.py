"""The app's own HTTP routes beside Gradio's, and the API's shapes: what its endpoints take and answer.

    GET /prvr/video/<video id>   a gallery video (or a live session upload) by id, with HTTP ranges
    GET /info                    ``Predictor.describe()`` of the shared gallery, as JSON
    GET /prvr/clip/<video id>    an MP4 of one span, ?start=&end= in seconds (``prvr.serve.clips``)
    GET /prvr/poster/<video id>  the frame at ?t= seconds as a JPEG, a card's poster (``prvr.serve.posters``)

A result leaves the app (API, MCP, the page's players) with no server path: ``api_result`` gives it a
``video_url`` on the video route and a ``moment_url`` that starts at its key moment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from prvr.index import check_k
from prvr.results.moments import play_from
from prvr.results.query import QueryError
from prvr.results.response import SearchResponse
from prvr.serve.clips import clip_route
from prvr.serve.posters import poster_route
from prvr.serve.predictor import Predictor

if TYPE_CHECKING:  # only a type here: the page's HTML (prvr.serve.page) reads video_url without Gradio
    from prvr.serve.visits import ClosedSessions

VIDEO_ROUTE = "/prvr/video/"  # + a video id: the video file, for API clients (no server paths)
INFO_ROUTE = "/info"  # which model runs and why, the profile, video counts, the index: JSON
MAX_TOP_K = 100  # the API's top_k range is 1-100 (the UI shows at most app.MAX_CARDS)


def routes(predictor: Predictor, sessions: ClosedSessions) -> list[Route]:
    """The app's own HTTP routes beside Gradio's: the videos by id, ``GET /info``, the clips and posters."""
    return [video_route(predictor, sessions), info_route(predictor), clip_route(predictor, sessions),
            poster_route(predictor, sessions)]


def info_route(predictor: Predictor) -> Route:
    """``GET /info``: ``Predictor.describe()`` of the shared gallery as JSON (the /info API endpoint and
    the MCP tool add the caller's session uploads)."""
    async def serve(request: Request) -> Response:
        # off the event loop: describing may wait on the store (a Qdrant engine call), and a wait here would
        # hold every other request of the app, uploads included
        return JSONResponse(await run_in_threadpool(predictor.describe))

    return Route(INFO_ROUTE, serve, methods=["GET"])


def video_route(predictor: Predictor, sessions: ClosedSessions) -> Route:
    """``GET /prvr/video/<video id>``: a gallery video (or a live session upload) by id, with HTTP ranges."""
    async def serve(request: Request) -> Response:
        path = await run_in_threadpool(predictor.video_file, request.path_params["video_id"],
                                       sessions.galleries())
        if path is None or not path.is_file():
            return PlainTextResponse("no video with this id", status_code=404)
        return FileResponse(path, media_type="video/mp4" if path.suffix == ".mp4" else None)

    return Route(VIDEO_ROUTE + "{video_id:path}", serve, methods=["GET", "HEAD"])


def video_url(video_id: str) -> str:
    """The path of a video on this app's video route (the API's ``video_url``, the page's players)."""
    return VIDEO_ROUTE + quote(video_id)


def api_result(result: dict) -> dict:
    """A result for API clients: no server path, but a ``video_url`` to fetch the video from this app
    and a ``moment_url`` that starts playback at the key moment's ``play_from`` (a media fragment,
    ``#t=<seconds>``).

    gradio_client treats any dict with a string "path" as a file to download, which would replace the
    whole result by a downloaded video; the server path is no use to a remote client anyway.
    """
    out = {k: v for k, v in result.items() if k != "path"}
    out["video_url"] = video_url(result["video_id"])
    out["moment_url"] = f"{out['video_url']}#t={play_from(result['key_moment']):.2f}"
    return out


def api_response(response: SearchResponse) -> dict:
    """The /search endpoint's answer (and the MCP tool's): the response's dict, each result ``api_result``."""
    return dict(response.to_dict(), results=[api_result(r) for r in response.results])


def top_k_value(top_k: object, limit: int = MAX_TOP_K) -> int:
    """``top_k`` as a whole number from 1 to ``limit``, else a QueryError saying the range."""
    try:
        value = float(top_k)
    except (TypeError, ValueError):
        value = None
    k = int(value) if value is not None and value.is_integer() else top_k
    try:
        return check_k(k, limit)
    except QueryError:
        # a whole number as one: "got 500", not "got 500.0"
        raise QueryError(f"top_k must be a whole number from 1 to {limit}, got {k!r}") from None


def offset_value(offset: object, top_k: int, limit: int = MAX_TOP_K) -> int:
    """``offset`` (results skipped, for a further page) as a whole number from 0 with ``offset + top_k`` at
    most ``limit``, else a QueryError saying the range."""
    try:
        value = float(offset)
    except (TypeError, ValueError):
        value = None
    if value is None or not value.is_integer() or not 0 <= value <= limit - top_k:
        raise QueryError(f"offset must be a whole number from 0 with offset + top_k at most {limit} (results "
                         f"1-{limit} can be asked for), got offset {offset!r} with top_k {top_k}")
    return int(value)
