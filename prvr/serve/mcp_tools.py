"""The MCP tools as a client sees them (``python app.py --mcp``: tools at ``/gradio_api/mcp/``).

Gradio serves MCP and lists the named endpoints /search, /add_video and /info as tools (their functions'
names and docstrings); ``install`` answers their calls with the ``mcp`` package's public Server API, each run
as any API client runs the endpoint (gradio_client: the queue, its limits, a session per call). Results are
JSON (the text is ``json.dumps`` of the API's dict, which is also ``structuredContent``) with absolute URLs;
a call that waits sends progress notifications to a client that asks for them.
The tool of /clip, ``clip``, answers the span's ``clip_url`` (``prvr.serve.clips``: the MP4 is made when
that URL is fetched, and removed once sent) after the API's checks, without making the file (JSON carries no
video).
``add_video`` declares exactly what it takes (``add_video_schema``, where Gradio's own declaration says "an
http or https url"): ``video``, a base64 data URL, an http(s) URL on a public host, the app's own
``/prvr/video/<id>`` URL ("duplicate") or, only under ``--mcp-allow-paths DIR[,DIR]``, a server path inside
one of those dirs; and ``name``, the title (default: a data URL's ``name=``, else the file name, else "MCP
upload <date time>"). Each kind of bad input is refused with its own sentence and a one-line warning, never a
traceback. Gradio's internals are read in one place, ``gradio_mcp_server`` (the Server it launched, its tools'
endpoints): nothing of Gradio is replaced at run time.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
import mimetypes
import re
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx
import jsonschema
from gradio import route_utils
from gradio_client import Client, handle_file
from gradio_client.utils import Status, StatusUpdate
from mcp import types
from mcp.server.lowlevel import Server
from mcp.shared.context import RequestContext
from starlette.requests import Request

from prvr.serve.clips import ClipRefused, clip_request
from prvr.serve.predictor import Predictor
from prvr.serve.routes import VIDEO_ROUTE

log = logging.getLogger(__name__)

# data:<type>/<subtype>[;key=value]...;base64,<data>  (RFC 2397; a name=FILE parameter names the file)
DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)(?P<params>(?:;[\w.+-]+=[^;,]*)*);base64,",
                      re.IGNORECASE)
BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # a URL's scheme (a Windows drive letter is 1 letter)
URL_FIELDS = ("video_url", "moment_url", "clip_url")
MCP_PATH = "/gradio_api/mcp"  # where Gradio serves MCP (streamable HTTP, and SSE under it)
PROGRESS_EVERY_S = 0.5  # how often a call's state is looked at for progress notifications
GRADIO_READ = "6.31.0"  # the Gradio release whose MCP server gradio_mcp_server was written against
VIDEO_FORMATS = "MP4, MKV, MOV, WebM or AVI"
DATA_EXAMPLE = {"video": "video/mp4", "subtitles": "text/plain"}  # a data URL's type in refusals' examples
SUBTITLE_SUFFIXES = (".srt", ".vtt")
MAX_SUBTITLES_MB = 10  # a subtitle file add_video fetches from a URL may be this large


class Refused(ValueError):
    """An MCP input the app will not take; the message is one sentence for the client."""


def allowed_roots(setting: str | None) -> list[Path]:
    """``--mcp-allow-paths``: comma-separated dirs whose files add_video may read (none by default)."""
    return [Path(p.strip()).expanduser().resolve() for p in (setting or "").split(",") if p.strip()]


def add_video_schema(roots: Sequence[Path]) -> dict:
    """``add_video``'s input schema as MCP clients see it: exactly what ``video_argument`` takes."""
    forms = ["the file's bytes as base64 in a data URL (data:video/mp4;base64,...; a name=FILE parameter "
             "before ;base64 names it)", "an http(s) URL of the file on a public host"]
    if roots:
        forms.append("a path on the server under " + " or ".join(map(str, roots)))
    paths = " or a path on the server under " + " or ".join(map(str, roots)) if roots else ""
    subtitles = ("Optional: a subtitle file of the video (.srt or .vtt; its lines are searched with their "
                 "times), in the same forms as video: base64 data (data:text/plain;name=talk.srt;base64,"
                 f"...), an http(s) URL on a public host{paths}.")
    return {"type": "object", "required": ["video"], "additionalProperties": False, "properties": {
        "video": {"type": "string",
                  "description": f"The video ({VIDEO_FORMATS}): " + ", or ".join(forms) + "."},
        "name": {"type": "string",
                 "description": "The file name the video is known by, e.g. holiday.mp4: results title it by "
                                "its stem (default: the data URL's name parameter, else the URL's or path's "
                                "file name, else \"MCP upload\" with the date and time)."},
        "subtitles": {"type": "string", "description": subtitles}}}


def is_public_host(host: str) -> bool:
    """True when every address ``host`` resolves to is a public one (Gradio downloads only from those)."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        if ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved:
            return False
    return bool(addresses)


def shown(text: str, limit: int = 40) -> str:
    """What the client sent, quoted and cut short for a message (a data URL may be megabytes)."""
    return f"“{text[:limit]}…”" if len(text) > limit else f"“{text}”"


def video_argument(video: object, roots: Sequence[Path], own_host: str | None,
                   video_route: str, what: str = "video") -> tuple[str, str | Path | None]:
    """What ``add_video``'s ``video`` argument (or its ``subtitles``: ``what``) is: ("data", the data URL's
    file name or None) and ("url", None) to let Gradio take it, ("path", file) for an allowed server path,
    ("own", video id) for this app's own video URL. Raises ``Refused`` with one sentence naming what is wrong
    otherwise."""
    how = (f"send the file itself as base64 data (data:{DATA_EXAMPLE[what]};base64,...)"
           + (" or a path under " + ", ".join(map(str, roots)) if roots else ""))
    if not isinstance(video, str) or not video.strip():
        raise Refused(f"No {what} was given: {how}.")
    video = video.strip()
    if video[:5].lower() == "data:":
        return "data", data_url_name(video, how)
    if SCHEME.match(video) and not video.lower().startswith("file:"):
        return web_url(video, own_host, video_route, how)
    path = server_path(video, roots, how)
    if path is None:
        raise Refused(f"{shown(video)} is neither a data URL, an http(s) URL nor a server path: {how}.")
    return "path", path


def data_url_name(video: str, how: str) -> str | None:
    """A data URL's ``name=`` parameter (None without one), once its form and its base64 are checked."""
    head = DATA_URL.match(video)
    if head is None:
        raise Refused(f"{shown(video)} is not a data URL of base64 data (it must read data:<type>/<subtype>;"
                      f"base64,<data>): {how}.")
    data = "".join(video[head.end():].split())  # line breaks in wrapped base64 are allowed
    if not data:
        raise Refused(f"The data URL holds no data after “base64,”: {how}.")
    if len(data) % 4 or BASE64.fullmatch(data) is None:
        raise Refused(f"The data URL's data is not base64 (only A-Z, a-z, 0-9, +, / and = padding, in groups "
                      f"of 4 characters): {how}.")
    params = dict(p.split("=", 1) for p in head["params"].split(";")[1:])
    name = unquote(params.get("name", "")).strip()
    return name or None


def web_url(video: str, own_host: str | None, video_route: str, how: str) -> tuple[str, str | None]:
    """("url", None) for an http(s) URL on a public host, ("own", video id) for this app's own video URL."""
    parsed = urlparse(video)
    if parsed.scheme.lower() not in ("http", "https"):
        raise Refused(f"{shown(video)} is not an http(s) URL ({parsed.scheme}: URLs are not read): {how}.")
    if not parsed.hostname:
        raise Refused(f"{shown(video)} is not an http(s) URL of a file (it names no host): {how}.")
    if own_host and parsed.netloc == own_host and parsed.path.startswith(video_route):
        return "own", unquote(parsed.path[len(video_route):])
    if not is_public_host(parsed.hostname):
        raise Refused(f"The app does not download from {parsed.hostname} (not a public host): {how}.")
    return "url", None


def server_path(video: str, roots: Sequence[Path], how: str) -> Path | None:
    """The allowed server file ``video`` names, resolved; None when it names no server path (an absolute
    path, ~/... or a file: URL of this host). The one check of every form: the name is decoded once (a
    file: URL's percent-escapes), then ``..`` and symlinks are resolved, and only then is the real file
    compared with the allowed dirs (``roots``, resolved too); anything else raises ``Refused``."""
    if video.lower().startswith("file:"):
        url = urlparse(video)
        if url.netloc not in ("", "localhost"):
            raise Refused(f"{shown(video)} names a file on another host ({url.netloc}): {how}.")
        named = unquote(url.path)
    elif video.startswith(("/", "~")):
        named = video
    else:
        return None
    if not roots:
        raise Refused(f"{shown(video)} is a path on the server, and this app reads none (the operator can "
                      f"allow some with --mcp-allow-paths DIR): {how}.")
    path = Path(named).expanduser()
    if "\x00" in named or not path.is_absolute():
        raise Refused(f"{shown(video)} is not an absolute path on the server: {how}.")
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise Refused(f"{path} cannot be resolved ({e.__class__.__name__}): {how}.") from None
    if not any(resolved.is_relative_to(root) for root in roots):
        raise Refused(f"{path} is outside the allowed dirs: {how}.")
    if not resolved.is_file():
        raise Refused(f"There is no file {path} on the server: {how}.")
    return resolved


def upload_name(kind: str, found: object, given: object) -> str | None:
    """The name an MCP upload is known by: the ``name`` argument, else a data URL's own name, else (base64
    data without one) "MCP upload <date time>.<type's extension>"; None: the URL's or path's file name."""
    if isinstance(given, str) and given.strip():
        return given.strip()
    if kind != "data":
        return None
    return found or f"MCP upload {time.strftime('%Y-%m-%d %H:%M:%S')}"


def absolute(value: object, root_url: str) -> object:
    """``value`` with every ``video_url`` / ``moment_url`` made absolute against ``root_url``."""
    if isinstance(value, dict):
        return {k: (root_url.rstrip("/") + v if k in URL_FIELDS and isinstance(v, str) and v.startswith("/")
                    else absolute(v, root_url)) for k, v in value.items()}
    if isinstance(value, list):
        return [absolute(v, root_url) for v in value]
    return value


def gradio_mcp_server(demo: object) -> tuple[Server, dict[str, str]] | None:
    """The ``mcp`` package's Server that Gradio launched for ``demo`` (``launch(mcp_server=True)``) and the
    endpoint of each tool it lists; None when MCP is off.

    The one place that reads Gradio's internals (``GRADIO_READ``): Gradio has no public way to answer its MCP
    tools' calls with one's own code, and this app must (JSON answers, add_video's inputs). Everything else
    here goes through the ``mcp`` package's public Server API and gradio_client.
    ``tests/test_mcp.py::test_the_gradio_internals_install_reads_are_there`` fails when Gradio changes them.
    """
    server = getattr(demo, "mcp_server_obj", None)
    if server is None:
        return None
    return server.mcp_server, dict(server.tool_to_endpoint)


def progress_words(status: StatusUpdate) -> str | None:
    """A queued call's state in words for an MCP progress notification (None: nothing to say yet)."""
    for unit in reversed(status.progress_data or []):
        if unit.desc:  # the app's own words, e.g. "clip.mp4 (1/1): extracting features"
            share = f" ({unit.progress:.0%})" if unit.progress is not None else ""
            return f"{unit.desc}{share}"
    if status.code in (Status.STARTING, Status.JOINING_QUEUE):
        return "Joined the queue."
    if status.code == Status.IN_QUEUE and status.rank is not None:
        return f"In queue: position {status.rank + 1} of {status.queue_size}."
    if status.code in (Status.PROCESSING, Status.PROGRESS, Status.ITERATING):
        return "Processing."
    return None


class AppEndpoints:
    """The app's named endpoints called as any API client calls them (gradio_client on the app's own URL):
    through its queue and concurrency limits, with the MCP request's headers (on ZeroGPU they say whose GPU
    quota an upload spends), each call a session of its own."""

    def __init__(self, url: str) -> None:
        self.url, self._client, self._lock = url, None, threading.Lock()

    def client(self) -> Client:
        """The one client of this app (made at the first call: the app must be serving)."""
        with self._lock:
            if self._client is None:
                self._client = Client(self.url, verbose=False, download_files=False, ssl_verify=False,
                                      analytics_enabled=False)
            return self._client

    def description(self, endpoint: str) -> str:
        """The endpoint's description as the API documents it (its function's docstring, arguments apart)."""
        return self.client().view_api(print_info=False, return_format="dict")["named_endpoints"][endpoint][
            "description"]

    async def call(self, endpoint: str, arguments: dict, headers: dict[str, str],
                   progress: Callable[[str], Awaitable[None]] | None = None) -> object:
        """The endpoint's answer to ``arguments`` (by parameter name); ``progress(words)`` hears each change
        of its state. A ``gr.Error`` of the endpoint raises ``gradio_client.exceptions.AppError``."""
        client = await asyncio.to_thread(self.client)
        job = await asyncio.to_thread(client.submit, api_name=endpoint, headers=headers, **arguments)
        result = asyncio.ensure_future(asyncio.to_thread(job.result))
        said = None
        while progress is not None and not result.done():  # said from the start: the queue is joined
            words = progress_words(job.status())
            if words is not None and words != said:
                said = words
                await progress(words)
            await asyncio.wait({result}, timeout=PROGRESS_EVERY_S)
        return await result


def data_file(video: str, folder: Path, stem: str = "upload", suffix: str | None = None) -> Path:
    """A data URL's bytes (checked by ``video_argument``) as a file ``stem`` in ``folder``, its suffix
    ``suffix`` or else from the MIME type (the name it is known by travels beside it)."""
    head = DATA_URL.match(video)
    suffix = suffix if suffix is not None else mimetypes.guess_extension(head["type"].lower()) or ""
    path = folder / f"{stem}{suffix}"
    path.write_bytes(base64.b64decode("".join(video[head.end():].split())))
    return path


def subtitle_file(kind: str, value: str | Path, named: object, folder: Path) -> Path:
    """add_video's ``subtitles`` (checked by ``video_argument``) as a local file: an allowed server path as
    it is, a data URL's bytes or a public URL's (at most ``MAX_SUBTITLES_MB``, no redirect followed)
    written in ``folder`` as ``subtitles.srt`` / ``.vtt`` (from the name it gives, else its type, else .srt).
    ``Refused`` when a URL cannot be fetched."""
    if kind == "path":
        return Path(value)
    if kind == "data":
        head = DATA_URL.match(str(value))
        return data_file(str(value), folder, "subtitles", subtitle_suffix(named, head["type"]))
    try:
        with httpx.stream("GET", str(value), timeout=30, follow_redirects=False) as response:
            if response.status_code != 200:
                raise Refused(f"The subtitles at {shown(str(value))} could not be fetched (HTTP "
                              f"{response.status_code}).")
            data = b""
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > MAX_SUBTITLES_MB * 2**20:
                    raise Refused(f"The subtitles at {shown(str(value))} are larger than {MAX_SUBTITLES_MB} "
                                  "MB.")
            kind_of = response.headers.get("content-type", "").split(";")[0]
    except httpx.HTTPError as problem:
        raise Refused(f"The subtitles at {shown(str(value))} could not be fetched "
                      f"({problem.__class__.__name__}).") from None
    path = folder / f"subtitles{subtitle_suffix(urlparse(str(value)).path, kind_of)}"
    path.write_bytes(data)
    return path


def subtitle_suffix(named: object, mime: str) -> str:
    """.srt or .vtt for a subtitle file: its name's, else its MIME type's (text/vtt), else .srt."""
    suffix = Path(named).suffix.lower() if isinstance(named, str) else ""
    if suffix in SUBTITLE_SUFFIXES:
        return suffix
    return ".vtt" if mime.lower() == "text/vtt" else ".srt"


def install(demo: object, predictor: Predictor) -> bool:
    """Answer the MCP tools of a launched ``demo`` (see the module docstring); False when MCP is off. A server
    path allowed with --mcp-allow-paths joins the shared gallery (it is the operator's file)."""
    found = gradio_mcp_server(demo)
    if found is None:
        return False
    lowlevel, endpoints = found
    roots = allowed_roots(predictor.settings.mcp_allow_paths)
    app = AppEndpoints(demo.local_url)
    gradio_list = lowlevel.request_handlers[types.ListToolsRequest]  # Gradio's catalogue of the endpoints
    schemas: dict[str, dict] = {}

    @lowlevel.list_tools()
    async def list_tools() -> list[types.Tool]:
        """Gradio's tools, add_video's inputs declared as ``video_argument`` takes them: Gradio's file input
        asks for "an http or https url" and tells agents to upload with a tool this app has not."""
        tools = (await gradio_list(None)).root.tools
        for tool in tools:
            if endpoints.get(tool.name) == "/add_video":
                tool.inputSchema = add_video_schema(roots)
                tool.description = await asyncio.to_thread(app.description, "/add_video")
            schemas[tool.name] = tool.inputSchema
        return tools

    @lowlevel.call_tool(validate_input=False)  # add_video's own refusals come first, then the schema's
    async def call_tool(name: str, arguments: dict) -> tuple[list, dict | None] | types.CallToolResult:
        """One tool call: the endpoint's dict, its URLs absolute, as one line of JSON text and as structured
        content; a refused input as one sentence."""
        context = lowlevel.request_context
        endpoint = endpoints.get(name)
        if endpoint is None:
            raise ValueError(f"Unknown tool for this app: {name}")
        if name not in schemas:
            await list_tools()
        try:
            video = await add_video_input(arguments, context.request) if endpoint == "/add_video" else None
        except Refused as refused:
            log.warning("MCP add_video refused: %s", refused)
            return error(str(refused))
        try:
            jsonschema.validate(instance=arguments, schema=schemas[name])
        except jsonschema.ValidationError as problem:
            return error(f"Input validation error: {problem.message}")
        if endpoint == "/clip":  # its clip's URL (the MP4 is made when it is fetched): JSON has no files
            try:
                data = (await asyncio.to_thread(clip_request, predictor, arguments.get("video_id"),
                                                arguments.get("start"), arguments.get("end"))).to_dict()
            except ClipRefused as refused:
                log.warning("MCP clip refused: %s", refused)
                return error(str(refused))
        elif video is None:
            data = await app.call(endpoint, arguments, forwarded(context.request), progress_to(context))
        else:
            try:
                data = await add_video(*video, context)
            except Refused as refused:  # the subtitles' URL could not be fetched
                log.warning("MCP add_video refused: %s", refused)
                return error(str(refused))
        data = absolute(data, root_url(context.request, demo.root_path))
        text = [types.TextContent(type="text", text=json.dumps(data))]
        return text, data if isinstance(data, dict) else None

    async def add_video_input(arguments: dict, request: Request | None
                              ) -> tuple[str, object, str | None, tuple | None]:
        """add_video's arguments as (kind, value: ``video_argument``'s, the name the video is known by or
        None, the subtitles as (kind, value, data URL's name) or None); ``Refused`` with one sentence when
        they are not what it takes."""
        if arguments.get("name") is not None and not isinstance(arguments["name"], str):
            raise Refused(f"name must be text, e.g. holiday.mp4, not {arguments['name']!r}.")
        host = request.headers.get("host") if request is not None else None
        # a data URL's base64 is checked and a host resolved: off the event loop
        kind, value = await asyncio.to_thread(video_argument, arguments.get("video"), roots, host,
                                              VIDEO_ROUTE)
        subtitles = None
        if arguments.get("subtitles") is not None:  # the same forms and the same checks as the video
            given = arguments["subtitles"]
            sub_kind, sub_value = await asyncio.to_thread(video_argument, given, roots, host, VIDEO_ROUTE,
                                                          "subtitles")
            if sub_kind == "own":
                raise Refused(f"{shown(given)} is a video of this app, not a subtitle file (.srt or .vtt).")
            subtitles = (sub_kind, given.strip() if sub_kind in ("data", "url") else sub_value, sub_value)
        return kind, (arguments["video"].strip() if kind in ("data", "url") else value), \
            upload_name(kind, value, arguments.get("name")), subtitles

    async def add_video(kind: str, value: object, name: str | None, subtitles: tuple | None,
                        context: RequestContext) -> dict:
        """add_video's answer: an allowed server path joins the shared gallery (the operator's file), this
        app's own video URL is a duplicate, a data URL's bytes or a URL go to the /add_video endpoint; the
        subtitles go with the video as a local file (``subtitle_file``)."""
        if kind == "own":
            record = predictor.index.record(value)
            if record is None:
                raise ValueError(f"This app has no video {value!r} any more (a session upload lives only in "
                                 "its session): send the file itself.")
            return {"status": "duplicate", "video_id": value,
                    "message": f"already in the gallery as “{record.get('title', value)}”."}
        # the endpoint takes a file: a data URL's bytes written here (deleted after the call), a URL as it
        # is (Gradio downloads it, from public hosts only)
        with tempfile.TemporaryDirectory(prefix="prvr-mcp-") as folder:
            sub = await asyncio.to_thread(subtitle_file, *subtitles, Path(folder)) if subtitles else None
            if kind == "path":
                log.info("MCP add_video: reading %s from the server (--mcp-allow-paths)", value)
                return await asyncio.to_thread(predictor.add_video, value, None, name=name or value.name,
                                               subtitles=sub)
            path = await asyncio.to_thread(data_file, value, Path(folder)) if kind == "data" else value
            arguments = {"video": handle_file(str(path)), **({"name": name} if name is not None else {}),
                         **({"subtitles": handle_file(str(sub))} if sub is not None else {})}
            return await app.call("/add_video", arguments, forwarded(context.request), progress_to(context))

    log.info("MCP tools at /gradio_api/mcp/: search, add_video, info, clip (add_video reads server paths: "
             "%s)",
             ", ".join(map(str, roots)) if roots else "no")
    return True


def error(message: str) -> types.CallToolResult:
    """A tool call's refusal: the message alone, flagged as an error (no structured content)."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], isError=True)


def forwarded(request: Request | None) -> dict[str, str]:
    """The MCP request's headers for the endpoint's call, as Gradio's own MCP server passes them on."""
    headers = dict(request.headers.items()) if request is not None else {}
    headers.pop("content-length", None)
    return headers


def progress_to(context: RequestContext) -> Callable[[str], Awaitable[None]] | None:
    """Sends a call's progress to the client as MCP progress notifications; None when it asked for none."""
    token = context.meta.progressToken if context.meta is not None else None
    if token is None:
        return None
    step = 0

    async def notify(words: str) -> None:
        nonlocal step
        step += 1
        await context.session.send_progress_notification(progress_token=token, progress=step, message=words,
                                                         related_request_id=str(context.request_id))

    return notify


def root_url(request: Request | None, root_path: str) -> str:
    """This app's URL as the MCP client reaches it (a proxy's forwarded host and scheme included), computed
    as Gradio computes its own URLs."""
    if request is None:
        return ""
    path = request.url.path
    return route_utils.get_root_url(request=request, route_path=path[max(path.find(MCP_PATH), 0):],
                                    root_path=root_path)
