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
import re
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.clips import write_clip
from tests.servers import call_mcp as call


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
    data = json.loads(result.content[0].text)  # JSON, not Python's repr, on one line (the README prints it)
    assert "\n" not in result.content[0].text
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


def test_refused_inputs_get_one_sentence_each_and_no_traceback(served, caplog: pytest.LogCaptureFixture,
                                                               capfd: pytest.CaptureFixture) -> None:
    """Issue #38 item 3: each kind of bad input is answered with its own reason (a garbage string was told
    "Server paths are not accepted here")."""
    url, predictor, _ = served
    own_id = predictor.index.ids[0]
    own_url = url + "prvr/video/" + quote(own_id)
    reasons = {  # what is sent -> words of its own sentence
        "garbage!!": "is neither a data URL, an http(s) URL nor a server path",
        "data:video/mp4;base64": "is not a data URL of base64 data",
        "data:video/mp4;base64,": "holds no data",
        "data:video/mp4;base64,AAAA!!!!": "is not base64",
        "ftp://example.com/a.mp4": "is not an http(s) URL (ftp: URLs are not read)",
        "http:///movie.mp4": "names no host",
        "http://10.1.2.3/movie.mp4": "not a public host",
        "": "No video was given",
    }
    cases = [("add_video", {"video": own_url})] + [("add_video", {"video": v}) for v in reasons] + \
        [("add_video", {"video": "data:video/mp4;base64,AAAA", "name": 7})]
    with caplog.at_level(logging.WARNING):
        own, *refused, bad_name = call(url, *cases)
    assert not own.isError and own.structuredContent["status"] == "duplicate"  # the app's own video URL
    assert own.structuredContent["video_id"] == own_id
    texts = []
    for result, words in zip(refused, reasons.values(), strict=True):
        text = result.content[0].text
        assert result.isError and words in text and "base64" in text and "\n" not in text, (words, text)
        assert text.count(". ") == 0 and text.endswith("."), text  # one sentence
        texts.append(text.split(":")[0])
    assert len(set(texts)) == len(texts)  # a reason of its own for each
    assert bad_name.isError and "name must be text" in bad_name.content[0].text
    refusals = [r for r in caplog.records if r.getMessage().startswith("MCP add_video refused")]
    assert len(refusals) == len(reasons) + 1 and not any(r.exc_info for r in refusals)
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "Traceback" not in out


def test_a_server_path_is_refused_as_one_where_none_is_allowed(tmp_path: Path) -> None:
    """What install() answers with no --mcp-allow-paths (the served app allows one dir)."""
    from prvr.serve.mcp_tools import Refused, video_argument

    clip = write_clip(tmp_path / "clip.mp4")
    for path in (str(clip), f"file://{clip}", "~/clip.mp4"):
        with pytest.raises(Refused, match=r"is a path on the server, and this app reads none \(the "
                                          r"operator can allow some with --mcp-allow-paths DIR\): send the "
                                          r"file itself as base64 data"):
            video_argument(path, [], None, "/prvr/video/")


def test_add_video_declares_exactly_what_it_takes(served) -> None:
    """Issue #38 item 3: the input schema is a string ``video`` (no FileData "required: path", no "url"
    format) and an optional string ``name``, in the same words as the description; item 1: the examples in
    the tools' descriptions are captions the demo gallery really shows."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    from prvr.demo.gallery import load_spec

    async def tools() -> list:
        async with streamablehttp_client(served[0] + "gradio_api/mcp/") as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()
            return (await session.list_tools()).tools

    listed = {t.name: t for t in asyncio.run(asyncio.wait_for(tools(), 60))}
    add = listed["add_video"]
    allowed = str(Path(served[1].settings.mcp_allow_paths).resolve())
    assert add.inputSchema["required"] == ["video"] and add.inputSchema["additionalProperties"] is False
    assert set(add.inputSchema["properties"]) == {"video", "name", "subtitles"}  # subtitles: issue #43
    assert f"a path on the server under {allowed}" in add.inputSchema["properties"]["subtitles"][
        "description"]
    video, name = add.inputSchema["properties"]["video"], add.inputSchema["properties"]["name"]
    assert video == {"type": "string", "description": video["description"]}  # no required/format/title
    assert name == {"type": "string", "description": name["description"]}
    for words in ("base64", "data:video/mp4;base64,", "name=", "http(s) URL", f"a path on the server under "
                  f"{allowed}"):
        assert words in video["description"], (words, video["description"])
    assert "upload_file_to_gradio" not in add.description and "URL" not in add.description.split("Returns")[0]
    examples = set(load_spec()["examples"])
    described = json.dumps({n: (t.description, t.inputSchema) for n, t in listed.items()})
    quoted = re.findall(r'e\.g\. \\"([^\\"]+)\\"', described)
    assert quoted and all(q in examples for q in quoted), quoted
    assert not re.search(r"\bcats?\b", described), described  # no demo video shows a cat


def test_a_base64_upload_is_titled_by_its_name(served, tmp_path: Path) -> None:
    """Issue #38 item 3: a data URL's name= parameter, else the name argument, titles the video; with
    neither it is "MCP upload <date time>", never "file"."""
    def data_url(clip: Path, params: str = "") -> str:
        return f"data:video/mp4{params};base64," + base64.b64encode(clip.read_bytes()).decode()

    named = write_clip(tmp_path / "a.mp4", frames=30, size=(80, 48))
    argued = write_clip(tmp_path / "b.mp4", frames=32, size=(88, 48))
    plain = write_clip(tmp_path / "c.mp4", frames=26, size=(96, 48))
    by_param, by_argument, unnamed = call(
        served[0], ("add_video", {"video": data_url(named, ";name=beach%20walk.mp4")}),
        ("add_video", {"video": data_url(argued), "name": "sunset over the bay.mov"}),
        ("add_video", {"video": data_url(plain)}))
    messages = [r.structuredContent["message"] for r in (by_param, by_argument, unnamed)]
    assert messages[0].startswith("beach walk.mp4: added") and "as “beach walk”" in messages[0], messages
    assert messages[1].startswith("sunset over the bay.mov: added") and "“sunset over the bay”" in messages[1]
    assert re.search(r"as “MCP upload \d{4}-\d\d-\d\d \d\d:\d\d:\d\d( \(\d+\))?”", messages[2]), messages[2]
    assert "“file" not in messages[2]  # (its words' report may say "the file has no audio")


def test_add_video_reports_progress_and_keeps_no_copy_of_the_data(served, tmp_path: Path) -> None:
    """A client that asks for progress (a progress token) hears the call's state as MCP progress
    notifications; the data URL's bytes, written to a file for the endpoint, are deleted after the call."""
    import tempfile

    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    clip = write_clip(tmp_path / "heard.mp4", frames=38, size=(104, 48))
    data = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    heard: list[str | None] = []

    async def talk():
        async def progress(value: float, total: float | None, message: str | None) -> None:
            heard.append(message)

        async with streamablehttp_client(served[0] + "gradio_api/mcp/") as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()
            return await session.call_tool("add_video", {"video": data, "name": "heard.mp4"},
                                           progress_callback=progress)

    copies = set(Path(tempfile.gettempdir()).glob("prvr-mcp-*"))
    result = asyncio.run(asyncio.wait_for(talk(), 180))
    assert result.structuredContent["status"] == "added", result.content
    assert heard and heard[0] == "Joined the queue." and all(isinstance(m, str) for m in heard), heard
    assert set(Path(tempfile.gettempdir()).glob("prvr-mcp-*")) <= copies


def test_progress_words_say_the_apps_own_stage() -> None:
    from gradio_client.utils import ProgressUnit, Status, StatusUpdate

    from prvr.serve.mcp_tools import progress_words

    def status(code: Status, progress: list | None = None, rank: int | None = None) -> StatusUpdate:
        return StatusUpdate(code=code, rank=rank, queue_size=3, eta=None, success=None, time=None,
                            progress_data=progress)

    stage = ProgressUnit(index=None, length=None, unit="steps", progress=0.25, desc="a.mp4 (1/1): extracting")
    assert progress_words(status(Status.PROGRESS, [stage])) == "a.mp4 (1/1): extracting (25%)"
    assert progress_words(status(Status.IN_QUEUE, rank=0)) == "In queue: position 1 of 3."
    assert progress_words(status(Status.PROCESSING)) == "Processing."
    assert progress_words(status(Status.FINISHED)) is None


def test_the_gradio_internals_install_reads_are_there(tmp_path: Path) -> None:
    """``gradio_mcp_server`` is the one place that reads Gradio's internals (the mcp Server it launched, its
    tool names' endpoints): this fails, naming the Gradio release, when a Gradio upgrade changes them."""
    import gradio as gr
    from mcp import types
    from mcp.server.lowlevel import Server

    from prvr.serve.mcp_tools import GRADIO_READ, gradio_mcp_server
    from tests.servers import free_port

    def echo(text: str) -> str:
        """Say ``text`` back."""
        return text

    with gr.Blocks() as demo:
        gr.api(echo, api_name="echo")
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, mcp_server=True,
                quiet=True)
    try:
        found = gradio_mcp_server(demo)
        url, root = demo.local_url, demo.root_path
    except AttributeError as gone:
        found, url, root = gone, None, None
    finally:
        demo.close()
    changed = (f"gradio {gr.__version__} changed what prvr.serve.mcp_tools.gradio_mcp_server reads "
               f"(Blocks.mcp_server_obj, its .mcp_server and .tool_to_endpoint, written against gradio "
               f"{GRADIO_READ}): {found!r}")
    assert isinstance(found, tuple) and isinstance(found[0], Server), changed
    assert found[1] == {"echo": "/echo"}, changed
    assert types.ListToolsRequest in found[0].request_handlers, changed  # Gradio's listing, install wraps it
    assert isinstance(url, str) and url.startswith("http") and isinstance(root, str), changed


def outside_forms(allowed: Path, secret: Path, tag: str = "") -> dict[str, str]:
    """Every way of naming ``secret`` (a video outside ``allowed``) or a path that escapes ``allowed``, by
    the form it takes (the symlinks it makes in ``allowed`` are named with ``tag`` first)."""
    import os

    link, folder = allowed / f"{tag}link.mp4", allowed / f"{tag}folder"
    link.symlink_to(secret)  # a symlink inside to a file outside
    folder.symlink_to(secret.parent, target_is_directory=True)  # ... to a folder outside
    up = f"{allowed}/../{secret.name}"
    return {
        "absolute": str(secret),
        "dot-dot": up,
        "dot-dot inside a sub-folder": f"{allowed}/sub/../../{secret.name}",
        "symlink to a file": str(link),
        "symlink to a folder": str(folder / secret.name),
        "home": "~/" + os.path.relpath(secret, Path.home()),
        "file: URL": f"file://{secret}",
        "FILE: URL, upper case": f"FILE://{secret}",
        "file: URL of localhost": f"file://localhost{secret}",
        "file: URL with one slash": f"file:{secret}",
        "file: URL with ..": f"file://{up}",
        "file: URL, percent-encoded ..": f"file://{allowed}/%2e%2e/{secret.name}",
        "file: URL, percent-encoded slashes": f"file://{allowed}%2F..%2F{secret.name}",
        "file: URL, all percent-encoded": "file://" + quote(up, safe=""),
        "file: URL through a symlink": f"file://{link}",
        "file: URL of another host": f"file://elsewhere{allowed}/inside.mp4",
        "relative file: URL": f"file:{os.path.relpath(secret)}",
        "path with percent-encoded ..": f"{allowed}/%2e%2e/{secret.name}",
        "a NUL character": f"{allowed}/inside.mp4\x00/../../{secret.name}",
    }


def test_a_path_outside_the_allowed_dirs_is_refused_in_every_form(tmp_path: Path) -> None:
    """``..``, symlinks, absolute paths, ~, file: URLs and percent-encoding, alone and combined: the file
    that is checked is the one that would be read (every form decoded and resolved first)."""
    from prvr.serve.mcp_tools import Refused, allowed_roots, video_argument

    allowed = tmp_path / "allowed"
    inside = write_clip(allowed / "inside.mp4")
    write_clip(allowed / "sub" / "other.mp4")
    secret = write_clip(tmp_path / "secret.mp4")
    roots = allowed_roots(f" {allowed} ,")
    for form, video in outside_forms(allowed, secret).items():
        with pytest.raises(Refused) as refused:
            video_argument(video, roots, None, "/prvr/video/")
        said = str(refused.value)
        assert "\n" not in said and said.endswith("."), (form, said)
        assert any(words in said for words in ("outside the allowed dirs", "There is no file", "another host",
                                               "not an absolute path")), (form, said)
    for video in (str(inside), f"file://{inside}", f"file://{allowed}/sub/..%2Finside.mp4",
                  f"{allowed}/sub/../inside.mp4", f"file://localhost{allowed}/in%73ide.mp4"):
        assert video_argument(video, roots, None, "/prvr/video/") == ("path", inside.resolve()), video
    with pytest.raises(Refused, match="is neither a data URL"):
        video_argument(f"allowed/../{secret.name}", roots, None, "/prvr/video/")  # relative: no path at all


def test_base64_of_a_length_that_is_not_a_multiple_of_4_is_refused() -> None:
    from prvr.serve.mcp_tools import Refused, video_argument

    for data in ("AAAAA", "AAAAAA", "AAA", "AAAA AAA"):
        with pytest.raises(Refused, match="is not base64"):
            video_argument("data:video/mp4;base64," + data, [], None, "/prvr/video/")
    assert video_argument("data:video/mp4;name=a.mp4;base64,AAAA\nAAAA", [], None, "/prvr/video/") == \
        ("data", "a.mp4")  # wrapped base64 of whole groups of 4


def test_mcp_refuses_every_form_of_a_path_outside_and_reads_nothing(served, tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    url, predictor, _ = served
    allowed = Path(predictor.settings.mcp_allow_paths)
    allowed.mkdir(parents=True, exist_ok=True)
    secret = write_clip(tmp_path / "secret.mp4", frames=22, size=(72, 56))
    forms = outside_forms(allowed, secret, tag=f"{tmp_path.name}-")
    before = len(predictor.index)
    with caplog.at_level(logging.INFO):
        results = call(url, *[("add_video", {"video": v}) for v in forms.values()])
    for form, result in zip(forms, results, strict=True):
        assert result.isError and result.structuredContent is None, (form, result.content[0].text)
    assert len(predictor.index) == before
    assert not any(r.get("title") == "secret" for r in predictor.index.records())
    assert not any("reading" in r.getMessage() for r in caplog.records)  # never read from the server
