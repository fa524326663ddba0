"""The MCP tools as a client sees them (``python app.py --mcp``: tools at ``/gradio_api/mcp/``).

Gradio turns the named endpoints /search, /add_video and /info into MCP tools; this module fixes what a
client gets from them, on the running Gradio MCP server (``install``):

- results are JSON: the tool's text is ``json.dumps`` of the API's dict (Gradio writes Python's repr) and
  the same dict is the result's ``structuredContent``; result URLs are absolute (``video_url``,
  ``moment_url``), so a client can fetch or open them as they are;
- ``add_video`` declares exactly what it takes (``add_video_schema``; Gradio's own declaration of a file
  input says "an http or https url" with a ``required: ["path"]`` on a string): ``video``, the file as
  base64 data in a data URL (``data:video/mp4;base64,...``, what Gradio's MCP server accepts for a file),
  an http(s) URL on a public host (Gradio downloads it), the app's own ``/prvr/video/<id>`` URL (answered
  "duplicate": it is in the gallery already) or, where the operator allows it (``--mcp-allow-paths
  DIR[,DIR]``), a path on the server under one of those dirs; and ``name``, the file name the video is
  known by (its title; default: a data URL's ``name=`` parameter, else the URL's or path's file name, else
  "MCP upload <date time>"). Each kind of bad input is refused with its own sentence (not a data URL, not
  base64, not an http(s) URL, a server path that is not allowed, none of these), logged as a one-line
  warning, never a traceback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)

# data:<type>/<subtype>[;key=value]...;base64,<data>  (RFC 2397; a name=FILE parameter names the file)
DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)(?P<params>(?:;[\w.+-]+=[^;,]*)*);base64,",
                      re.IGNORECASE)
BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # a URL's scheme (a Windows drive letter is 1 letter)
URL_FIELDS = ("video_url", "moment_url")
VIDEO_FORMATS = "MP4, MKV, MOV, WebM or AVI"


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
    return {"type": "object", "required": ["video"], "additionalProperties": False, "properties": {
        "video": {"type": "string",
                  "description": f"The video ({VIDEO_FORMATS}): " + ", or ".join(forms) + "."},
        "name": {"type": "string",
                 "description": "The file name the video is known by, e.g. holiday.mp4: results title it by "
                                "its stem (default: the data URL's name parameter, else the URL's or path's "
                                "file name, else \"MCP upload\" with the date and time)."}}}


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
                   video_route: str) -> tuple[str, str | Path | None]:
    """What ``add_video``'s ``video`` argument is: ("data", the data URL's file name or None) and ("url",
    None) to let Gradio take it, ("path", file) for an allowed server path, ("own", video id) for this app's
    own video URL. Raises ``Refused`` with one sentence naming what is wrong otherwise."""
    how = ("send the file itself as base64 data (data:video/mp4;base64,...)"
           + (" or a path under " + ", ".join(map(str, roots)) if roots else ""))
    if not isinstance(video, str) or not video.strip():
        raise Refused(f"No video was given: {how}.")
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


def json_output(original: Callable) -> Callable:
    """Gradio's ``postprocess_output_data`` with dicts and lists as JSON text (absolute result URLs)."""
    from mcp import types

    def postprocess(data: list, root_url: str) -> list:
        content = []
        for item in data:
            if isinstance(item, dict | list) and not (isinstance(item, dict) and "path" in item):
                content.append(types.TextContent(type="text", text=json.dumps(absolute(item, root_url))))
            else:
                content += original([item], root_url)
        return content

    return postprocess


def state_already_dropped(original: Callable) -> Callable:
    """Gradio's ``pop_returned_state`` for the queued path too: there the API client returns all outputs as
    one tuple, which gradio 6.31 pops from as if it were the list of outputs ("pop index out of range" for
    add_video, whose outputs are its status and the session State)."""
    def pop(components: Sequence, data: list) -> list:
        if len(data) == 1 < len(components) and isinstance(data[0], tuple | list) \
                and len(data[0]) == len(components):
            data = list(data[0])
        return original(components, data) if len(data) >= len(components) else data

    return pop


def absolute(value: object, root_url: str) -> object:
    """``value`` with every ``video_url`` / ``moment_url`` made absolute against ``root_url``."""
    if isinstance(value, dict):
        return {k: (root_url.rstrip("/") + v if k in URL_FIELDS and isinstance(v, str) and v.startswith("/")
                    else absolute(v, root_url)) for k, v in value.items()}
    if isinstance(value, list):
        return [absolute(v, root_url) for v in value]
    return value


def install(demo, predictor, video_route: str, add_file: Callable[[Path, str | None], dict]) -> bool:
    """Fix the MCP tools of a launched ``demo`` (see the module docstring); False when MCP is off.

    ``add_file(path, name)``: adds an allowed server file like the /add_video endpoint does (``name``: the
    client's name for it, None: the file's own), returning its dict.
    """
    server = getattr(demo, "mcp_server_obj", None)
    if server is None:
        return False
    from mcp import types

    server.postprocess_output_data = json_output(server.postprocess_output_data)
    server.pop_returned_state = state_already_dropped(server.pop_returned_state)
    lowlevel = server.mcp_server
    gradio_call = lowlevel.request_handlers[types.CallToolRequest]
    gradio_list = lowlevel.request_handlers[types.ListToolsRequest]
    roots = allowed_roots(predictor.settings.mcp_allow_paths)
    # Gradio tells agents to upload a file with its upload_file_to_gradio tool and pass the returned server
    # path: this app has no such tool, and refuses server paths it was not allowed
    upload_hint = getattr(server, "_file_data_tool_description", "")

    def answer(data: dict, error: bool = False) -> types.ServerResult:
        text = data["message"] if error else json.dumps(data)
        return types.ServerResult(types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structuredContent=None if error else data, isError=error))

    def refuse(refused: Refused) -> types.ServerResult:
        log.warning("MCP add_video refused: %s", refused)
        return answer({"message": str(refused)}, error=True)

    async def list_tools(request: types.ListToolsRequest) -> types.ServerResult:
        result = await gradio_list(request)
        for tool in result.root.tools:  # the same objects the server validates calls against
            if server.tool_to_endpoint.get(tool.name) == "/add_video":
                tool.inputSchema = add_video_schema(roots)
                tool.description = (tool.description or "").replace(upload_hint, "")
        return result

    async def call_tool(request: types.CallToolRequest) -> types.ServerResult:
        endpoint = server.tool_to_endpoint.get(request.params.name)
        if endpoint == "/add_video":
            arguments = request.params.arguments = dict(request.params.arguments or {})
            context = lowlevel.request_context.request
            host = context.headers.get("host") if context is not None else None
            try:
                if arguments.get("name") is not None and not isinstance(arguments["name"], str):
                    raise Refused(f"name must be text, e.g. holiday.mp4, not {arguments['name']!r}.")
                # a data URL's base64 is checked and a host resolved: off the event loop
                kind, value = await asyncio.to_thread(video_argument, arguments.get("video"), roots, host,
                                                      video_route)
            except Refused as refused:
                return refuse(refused)
            name = upload_name(kind, value, arguments.get("name"))
            if kind == "path":
                log.info("MCP add_video: reading %s from the server (--mcp-allow-paths)", value)
                return answer(await asyncio.to_thread(add_file, value, name))
            if kind == "own":
                record = predictor.index.record(value)
                if record is None:
                    gone = (f"This app has no video {value!r} any more (a session upload lives only in "
                            "its session): send the file itself.")
                    return answer({"message": gone}, error=True)
                return answer({"status": "duplicate", "video_id": value,
                               "message": f"already in the gallery as “{record.get('title', value)}”."})
            video = arguments["video"].strip()
            arguments["video"] = "data:" + video[5:] if kind == "data" else video  # Gradio reads "data:" only
            arguments.pop("name", None)
            if name is not None:
                arguments["name"] = name
        result = await gradio_call(request)
        call = result.root
        if isinstance(call, types.CallToolResult) and not call.isError and call.structuredContent is None \
                and len(call.content) == 1 and isinstance(call.content[0], types.TextContent):
            try:
                data = json.loads(call.content[0].text)
            except ValueError:
                data = None
            if isinstance(data, dict):
                call.structuredContent = data
        return result

    lowlevel.request_handlers[types.ListToolsRequest] = list_tools
    lowlevel.request_handlers[types.CallToolRequest] = call_tool
    log.info("MCP tools at /gradio_api/mcp/: search, add_video, info (add_video reads server paths: %s)",
             ", ".join(map(str, roots)) if roots else "no")
    return True
