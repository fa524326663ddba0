"""The MCP tools as a client sees them (``python app.py --mcp``: tools at ``/gradio_api/mcp/``).

Gradio turns the named endpoints /search, /add_video and /info into MCP tools; this module fixes what a
client gets from them, on the running Gradio MCP server (``install``):

- results are JSON: the tool's text is ``json.dumps`` of the API's dict (Gradio writes Python's repr) and
  the same dict is the result's ``structuredContent``; result URLs are absolute (``video_url``,
  ``moment_url``), so a client can fetch or open them as they are;
- ``add_video`` takes the file as base64 data (``data:video/mp4;base64,...``, what Gradio's MCP server
  accepts for a file), an http(s) URL on a public host (Gradio downloads it), the app's own
  ``/prvr/video/<id>`` URL (answered "duplicate": it is in the gallery already) or, where the operator
  allows it (``--mcp-allow-paths DIR[,DIR]``), a path on the server under one of those dirs. Anything
  else is refused with one sentence, logged as a one-line warning, never a traceback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)

DATA_URL = re.compile(r"^data:[\w.+-]+/[\w.+-]+(;[\w.+-]+=[\w.+-]+)*;base64,", re.IGNORECASE)
URL_FIELDS = ("video_url", "moment_url")


class Refused(ValueError):
    """An MCP input the app will not take; the message is one sentence for the client."""


def allowed_roots(setting: str | None) -> list[Path]:
    """``--mcp-allow-paths``: comma-separated dirs whose files add_video may read (none by default)."""
    return [Path(p.strip()).expanduser().resolve() for p in (setting or "").split(",") if p.strip()]


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


def video_argument(video: object, roots: Sequence[Path], own_host: str | None,
                   video_route: str) -> tuple[str, str | Path | None]:
    """What ``add_video``'s ``video`` argument is: ("gradio", None) to let Gradio take it (base64 data, a
    public URL), ("path", file) for an allowed server path, ("own", video id) for this app's own video URL.
    Raises ``Refused`` with one sentence otherwise."""
    how = ("send the file itself as base64 data (data:video/mp4;base64,...)"
           + (" or a path under " + ", ".join(map(str, roots)) if roots else ""))
    if not isinstance(video, str) or not video.strip():
        raise Refused(f"No video was given: {how}.")
    video = video.strip()
    if video.startswith("data:"):
        if not DATA_URL.match(video):
            raise Refused(f"The video's data URL is malformed: {how}.")
        return "gradio", None
    parsed = urlparse(video)
    if parsed.scheme in ("http", "https"):
        if own_host and parsed.netloc == own_host and parsed.path.startswith(video_route):
            return "own", unquote(parsed.path[len(video_route):])
        if not parsed.hostname or not is_public_host(parsed.hostname):
            raise Refused(f"The app does not download from {parsed.hostname or 'that URL'} (not a public "
                          f"host): {how}.")
        return "gradio", None
    if parsed.scheme not in ("", "file"):
        raise Refused(f"{parsed.scheme}: URLs are not read: {how}.")
    path = Path(unquote(parsed.path) if parsed.scheme == "file" else video).expanduser()
    if not roots:
        raise Refused("Server paths are not accepted here (the operator can allow some with "
                      f"--mcp-allow-paths DIR): {how}.")
    resolved = path.resolve()
    if not any(resolved.is_relative_to(root) for root in roots):
        raise Refused(f"{path} is outside the allowed dirs: {how}.")
    if not resolved.is_file():
        raise Refused(f"There is no file {path} on the server: {how}.")
    return "path", resolved


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


def install(demo, predictor, video_route: str, add_file: Callable[[Path], dict]) -> bool:
    """Fix the MCP tools of a launched ``demo`` (see the module docstring); False when MCP is off.

    ``add_file(path)``: adds an allowed server file like the /add_video endpoint does (returns its dict).
    """
    server = getattr(demo, "mcp_server_obj", None)
    if server is None:
        return False
    from mcp import types

    server.postprocess_output_data = json_output(server.postprocess_output_data)
    server.pop_returned_state = state_already_dropped(server.pop_returned_state)
    lowlevel = server.mcp_server
    gradio_call = lowlevel.request_handlers[types.CallToolRequest]
    roots = allowed_roots(predictor.settings.mcp_allow_paths)

    def answer(data: dict, error: bool = False) -> types.ServerResult:
        text = data["message"] if error else json.dumps(data)
        return types.ServerResult(types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structuredContent=None if error else data, isError=error))

    async def call_tool(request: types.CallToolRequest) -> types.ServerResult:
        endpoint = server.tool_to_endpoint.get(request.params.name)
        if endpoint == "/add_video":
            arguments = request.params.arguments or {}
            context = lowlevel.request_context.request
            host = context.headers.get("host") if context is not None else None
            try:
                kind, value = video_argument(arguments.get("video"), roots, host, video_route)
            except Refused as refused:
                log.warning("MCP add_video refused: %s", refused)
                return answer({"message": str(refused)}, error=True)
            if kind == "path":
                log.info("MCP add_video: reading %s from the server (--mcp-allow-paths)", value)
                return answer(await asyncio.to_thread(add_file, value))
            if kind == "own":
                record = predictor.index.record(value)
                if record is None:
                    gone = (f"This app has no video {value!r} any more (a session upload lives only in "
                            "its session): send the file itself.")
                    return answer({"message": gone}, error=True)
                return answer({"status": "duplicate", "video_id": value,
                               "message": f"already in the gallery as “{record.get('title', value)}”."})
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

    lowlevel.request_handlers[types.CallToolRequest] = call_tool
    log.info("MCP tools at /gradio_api/mcp/: search, add_video, info (add_video reads server paths: %s)",
             ", ".join(map(str, roots)) if roots else "no")
    return True

