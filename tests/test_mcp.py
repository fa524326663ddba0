"""The MCP tools through the ``mcp`` package's own client over streamable HTTP (issue #31, item 1).

``search`` answers JSON (text and structured content: the API's /search dict, absolute URLs);
``add_video`` takes the file's bytes as base64 data, a server path only under a dir the operator allowed
(--mcp-allow-paths), and refuses anything else with one sentence and no traceback in the log.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.clips import write_clip


def call(url: str, *calls: tuple[str, dict]) -> list:
    """Call MCP tools in order over one streamable-HTTP session; their CallToolResults."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def talk() -> list:
        async with streamablehttp_client(url + "gradio_api/mcp/") as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()
            return [await session.call_tool(name, arguments) for name, arguments in calls]

    return asyncio.run(asyncio.wait_for(talk(), 180))


def kept(predictor) -> set[str]:
    """The video ids the served app's --persist folder would restore."""
    from prvr.serve.persist import PersistentStore

    store = PersistentStore(predictor.settings.persist, predictor.ingest.extractor.profile.identity())
    return {v.id for v in store.restore()}


def test_search_returns_the_api_json_as_text_and_structured_content(served) -> None:
    import httpx
    from gradio_client import Client

    url = served[0]
    (result,) = call(url, ("search", {"query": "a colourful gradient", "top_k": 3}))
    assert not result.isError
    data = json.loads(result.content[0].text)  # JSON, not Python's repr
    assert result.structuredContent == data
    api = Client(url, verbose=False).predict("a colourful gradient", 3, 0.7, api_name="/search")
    assert set(data) == set(api) and set(data["results"][0]) == set(api["results"][0])
    hit = data["results"][0]
    assert hit["video_url"] == url.rstrip("/") + api["results"][0]["video_url"]  # absolute: usable as is
    assert httpx.get(hit["video_url"], timeout=30).content[4:8] == b"ftyp"
    (info,) = call(url, ("info", {}))
    assert info.structuredContent["model"]["name"] == json.loads(info.content[0].text)["model"]["name"]


def test_add_video_takes_the_file_as_base64_data(served, tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "sent by a client.mp4", frames=28, size=(72, 48))
    data = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    (result,) = call(served[0], ("add_video", {"video": data}))
    assert not result.isError, result.content[0].text
    assert (result.structuredContent or {}).get("status") == "added", result.content
    assert result.structuredContent == json.loads(result.content[0].text)
    assert result.structuredContent["video_id"] not in kept(served[1])  # a session's: never persisted


def test_server_paths_only_under_the_allowed_dirs(served, tmp_path: Path) -> None:
    url, predictor, _ = served
    allowed = Path(predictor.settings.mcp_allow_paths)
    inside = write_clip(allowed / "operator clip.mp4", frames=34, size=(96, 64))
    outside = write_clip(tmp_path / "private.mp4", frames=20)
    added, refused, missing, found = call(
        url, ("add_video", {"video": str(inside)}), ("add_video", {"video": str(outside)}),
        ("add_video", {"video": str(allowed / "nothing.mp4")}),
        ("search", {"query": "a colourful gradient", "top_k": 10}))
    assert added.structuredContent["status"] == "added", added.content[0].text
    assert inside.exists()  # the operator's file is read, never moved or deleted
    assert refused.isError and "outside the allowed dirs" in refused.content[0].text
    assert missing.isError and "There is no file" in missing.content[0].text
    ids = [r["video_id"] for r in found.structuredContent["results"]]
    assert added.structuredContent["video_id"] in ids  # joined the shared gallery: any session finds it
    assert added.structuredContent["video_id"] in kept(predictor)  # ... and --persist keeps it


def test_refused_inputs_get_one_sentence_and_no_traceback(served, caplog: pytest.LogCaptureFixture,
                                                          capfd: pytest.CaptureFixture) -> None:
    url, predictor, _ = served
    own_id = predictor.index.ids[0]
    own_url = url + "prvr/video/" + quote(own_id)
    cases = [{"video": own_url}, {"video": "http://10.1.2.3/movie.mp4"}, {"video": "ftp://example.com/a.mp4"},
             {"video": "data:video/mp4;base64"}, {"video": ""}]
    with caplog.at_level(logging.WARNING):
        own, private, ftp, bad_data, empty = call(url, *[("add_video", c) for c in cases])
    assert not own.isError and own.structuredContent["status"] == "duplicate"  # the app's own video URL
    assert own.structuredContent["video_id"] == own_id
    for result, words in ((private, "not a public host"), (ftp, "URLs are not read"),
                          (bad_data, "malformed"), (empty, "No video was given")):
        text = result.content[0].text
        assert result.isError and words in text and "base64" in text and "\n" not in text, text
    refusals = [r for r in caplog.records if r.getMessage().startswith("MCP add_video refused")]
    assert len(refusals) == 4 and not any(r.exc_info for r in refusals)
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
