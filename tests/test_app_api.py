"""The app in process: what the page says about a query, clean errors and API results, MCP tools.

One in-process server (``served``) over a small index of one synthetic clip keeps this module fast; the
full server over the demo gallery is tests/test_app.py's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from urllib.parse import quote

import pytest

import app
from prvr.results.query import clean_query
from prvr.results.response import SearchResponse
from prvr.serve.page import CARD_HELP
from tests.clips import write_clip
from tests.servers import PATIENCE_MS, choose_file
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, chromium_or_skip


def response_for(query: str | bytes, confidence: str = "low") -> SearchResponse:
    """A one-result response for ``query`` as the predictor would clean it."""
    result = {"confidence": confidence, "score": 0.3}
    return SearchResponse([result], clean_query(query).to_dict(), confidence != "high", (0.7, 0.3), False)


def test_summary_shows_the_searched_text_not_the_input() -> None:
    long_query = "a cat looks at the camera " * 400  # 10,400 characters
    page = app.summary_html(long_query, response_for(long_query))
    assert len(page.replace(CARD_HELP, "")) < 1500 and "shortened" in page and "10,400-character" in page
    assert "a cat looks at the camera" in page
    weird = "a cat\x00 on\x1b[31m a <b>mat</b>\u202e"
    page = app.summary_html(weird, response_for(weird, "high"))
    assert "\x00" not in page and "\x1b" not in page and "\u202e" not in page and "<b>mat" not in page
    assert "&lt;b&gt;mat&lt;/b&gt;" in page and "3 control characters became spaces" in page
    assert "shortened" not in app.summary_html("a cat", response_for("a cat"))


def test_gradio_copy_of_an_upload_is_removed_but_nothing_else(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    copy = tmp_path / "gradio" / "abc123" / "clip.mp4"
    copy.parent.mkdir(parents=True)
    copy.write_bytes(b"x")
    outside = tmp_path / "mine.mp4"
    outside.write_bytes(b"x")
    app.discard_upload_copy(str(copy))
    app.discard_upload_copy(str(outside))
    assert not copy.parent.exists() and outside.exists()


def test_user_errors_are_one_line_warnings(served: tuple, caplog: pytest.LogCaptureFixture,
                                           capfd: pytest.CaptureFixture) -> None:
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    client = Client(served[0], verbose=False)
    cases = [(("   ", 5, 0.7), "query is empty"), (("a cat", 0, 0.7), "k must be a whole number"),
             (("a cat", 5, 1.5), "clip_weight must be between 0 and 1"),
             (("a cat", 1000, 0.7), "top_k must be a whole number from 1 to 100, got 1000"),
             (("a cat", -3, 0.7), "top_k must be a whole number from 1 to 100")]
    with caplog.at_level(logging.WARNING):
        for args, message in cases:
            with pytest.raises(AppError, match=message):
                client.predict(*args, api_name="/search")
    refused = [r for r in caplog.records if r.getMessage().startswith("search refused")]
    assert len(refused) == 5 and all(r.levelno == logging.WARNING and not r.exc_info for r in refused)
    assert "Traceback" not in capfd.readouterr().err


def test_api_results_carry_urls_not_server_paths(served: tuple) -> None:
    import httpx
    from gradio_client import Client

    url, predictor, _ = served
    client = Client(url, verbose=False)
    response = client.predict("a colourful gradient", 5, 0.7, api_name="/search")
    hit = response["results"][0]
    server_dirs = [str(predictor.settings.data_dir), str(predictor.settings.data_dir.resolve())]
    for text in (json.dumps(response), json.dumps(client.predict(api_name="/info"))):
        assert not any(d in text for d in server_dirs), text
    assert hit["video_url"] == "/prvr/video/" + hit["video_id"].replace(":", "%3A")
    key = hit["key_moment"]  # the moment plays from its first row's frame (a 1 s row: its middle)
    assert key["play_from"] == key["start"] + 0.5
    assert hit["moment_url"] == hit["video_url"] + f"#t={key['play_from']:.2f}"
    video = httpx.get(url.rstrip("/") + hit["video_url"], timeout=30)
    assert video.status_code == 200 and video.content[4:8] == b"ftyp"  # the mp4 itself
    part = httpx.get(url.rstrip("/") + hit["video_url"], headers={"Range": "bytes=0-99"}, timeout=30)
    assert part.status_code == 206 and part.content == video.content[:100]  # players seek with ranges
    assert httpx.get(url + "prvr/video/upload%3Anothere", timeout=30).status_code == 404


def test_the_weights_read_as_given(served: tuple) -> None:
    """Issue #38 item 8: ``weights`` read [0.7, 0.30000000000000004]; the frame share is 1 - clip_weight as a
    person computes it."""
    from gradio_client import Client

    client = Client(served[0], verbose=False)
    for clip_weight, weights in ((0.7, [0.7, 0.3]), (0.35, [0.35, 0.65]), (0.1, [0.1, 0.9]), (1, [1.0, 0.0])):
        response = client.predict("a colourful gradient", 1, clip_weight, api_name="/search")
        assert response["weights"] == weights, (clip_weight, response["weights"])


def test_mcp_lists_search_and_add_video_and_searches(served: tuple) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def talk() -> tuple[dict, str]:
        async with streamablehttp_client(served[0] + "gradio_api/mcp/") as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            result = await session.call_tool("search", {"query": "a colourful gradient", "top_k": 3})
            return tools, result.content[0].text

    tools, text = asyncio.run(asyncio.wait_for(talk(), 120))
    assert {"search", "add_video", "info"} <= set(tools)
    search, add = tools["search"], tools["add_video"]
    assert "moment" in search.description and search.inputSchema["required"] == ["query"]
    assert "Add a video" in add.description and "video" in add.inputSchema["properties"]
    assert "upload:" in text and "key_moment" in text  # the indexed clip, found through MCP


def test_a_closed_tab_private_uploads_are_deleted_after_the_grace(tmp_path: Path) -> None:
    import time
    from types import SimpleNamespace

    from prvr.serve.sessions import SessionGallery

    sessions = app.ClosedSessions(grace_s=0.2)
    mine, other = tmp_path / "session-a", tmp_path / "session-b"
    for root in (mine, other):
        (root / "media").mkdir(parents=True)
    sessions.track(SimpleNamespace(session_hash="a"), SessionGallery(mine, index=None))
    sessions.track(SimpleNamespace(session_hash="b"), SessionGallery(other, index=None))
    assert sessions.track(SimpleNamespace(session_hash="c"), None) is None  # shared uploads: nothing
    sessions.close_later(SimpleNamespace(session_hash="a"))
    sessions.close_later(SimpleNamespace(session_hash="never-uploaded"))
    assert mine.exists()  # a grace period, not at once
    deadline = time.monotonic() + 60  # a grace of 1 s: generous for a busy machine, ends once gone
    while mine.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not mine.exists() and other.exists()


def test_a_session_upload_is_served_and_gradio_keeps_no_copy(served: tuple, tmp_path: Path) -> None:
    import gradio as gr
    import httpx
    from gradio_client import Client, handle_file

    url = served[0]
    clip = write_clip(tmp_path / "my holiday clip.mp4", frames=30, size=(80, 48))
    client = Client(url, verbose=False)
    added = client.predict(handle_file(str(clip)), api_name="/add_video")
    assert added["status"] == "added", added
    assert added["message"].startswith("my holiday clip.mp4: added in your session")
    assert not list(Path(gr.utils.get_upload_folder()).rglob("my holiday clip.mp4"))  # Gradio's copy is gone
    hits = client.predict("a colourful gradient", 10, 0.7, api_name="/search")["results"]
    mine = next(h for h in hits if h["video_id"] == added["video_id"])
    video = httpx.get(url.rstrip("/") + mine["video_url"], timeout=30)
    assert video.status_code == 200 and video.content == clip.read_bytes()


def test_the_api_add_video_reports_moving_progress(served: tuple, tmp_path: Path) -> None:
    """Issue #38 item 5: a gradio_client job of /add_video shows the upload's stages as they happen (the
    page's handler did; the API endpoint reported one status for the whole run)."""
    import time

    from gradio_client import Client, handle_file

    clip = write_clip(tmp_path / "a minute.mp4", frames=600, fps=10, size=(96, 64))
    job = Client(served[0], verbose=False).submit(handle_file(str(clip)), api_name="/add_video")
    seen: list[tuple[float, str]] = []
    deadline = time.monotonic() + 300
    while not job.done() and time.monotonic() < deadline:
        for unit in job.status().progress_data or []:
            if unit.desc and (not seen or seen[-1] != (unit.progress, unit.desc)):
                seen.append((unit.progress, unit.desc))
        time.sleep(0.05)
    assert job.result(timeout=60)["status"] == "added"
    descriptions = [desc for _, desc in seen]
    assert any("extracting features" in d for d in descriptions), descriptions
    assert len(set(descriptions)) >= 3, descriptions  # it moved: stages and seconds of video done
    assert all(d.startswith("a minute.mp4") for d in descriptions), descriptions  # the client's file name
    fractions = [f for f, _ in seen if f is not None]
    assert fractions == sorted(fractions), seen


def test_closing_the_tab_deletes_its_uploads_within_seconds(served: tuple, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's unload clean-up runs when Gradio notices the closed tab, at its next heartbeat: 15 s by
    default, 1 s here (``GRADIO_HEARTBEAT_INTERVAL``, read when the page connects)."""
    sync_api = chromium_or_skip()
    monkeypatch.setenv("GRADIO_HEARTBEAT_INTERVAL", "1")
    url, predictor, sessions = served
    clip = write_clip(tmp_path / "tab clip.mp4", frames=26, size=(96, 48))
    before = {g.root for g in sessions.galleries()}  # other tests' sessions
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(PATIENCE_MS)  # every action and wait: a busy machine is slow, not broken
        page.goto(url)
        page.get_by_role("tab", name="Add videos").click()
        page.locator("#remove-upload").wait_for()  # the tab drawn whole: a file chosen earlier may be lost
        choose_file(page, "#upload-files", clip)
        page.get_by_role("button", name="Add to gallery").click()
        page.wait_for_selector("text=added in your session")
        roots = [g.root for g in sessions.galleries() if g.root not in before]
        assert len(roots) == 1 and any(roots[0].rglob("*.mp4"))
        page.close()
        browser.close()
    deadline = time.monotonic() + 90  # Gradio notices the closed tab at its next heartbeat
    while roots[0].exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not roots[0].exists(), "the closed tab's private uploads are still on disk"


def test_the_page_shows_the_last_search_asked_for(served: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """A search asked while another still runs is run after it, so the page ends on the last one asked for:
    here a top-k change's re-rank of the old text is slow, and a new text is searched meanwhile (as two
    events, the new text's search ran and answered first, and the re-rank's answer put the old text back)."""
    from tests.test_browser import until

    sync_api = chromium_or_skip()
    url, predictor, _ = served
    search, calls = predictor.search, []

    def slow_at_seven(text: str, k: int, *args, **kwargs):
        """The predictor's search, noting when each starts and ends; 3 s long for top-k 7 (the re-rank)."""
        calls.append(("start", text))
        if k == 7:
            time.sleep(3.0)
        try:
            return search(text, k, *args, **kwargs)
        finally:
            calls.append(("end", text))

    monkeypatch.setattr(predictor, "search", slow_at_seven)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(PATIENCE_MS)
        page.goto(url)
        summary, box = page.locator(".summary"), page.get_by_label("What happens in the moment")
        box.fill("an old text")
        page.get_by_role("button", name="Search", exact=True).click()
        assert until(lambda: "an old text" in summary.inner_text())
        number = page.locator("#top-k input")
        number.fill("7")
        number.press("Enter")  # the re-rank of "an old text", 3 s long
        assert until(lambda: calls.count(("start", "an old text")) == 2)
        box.fill("the new text")
        page.get_by_role("button", name="Search", exact=True).click()
        assert until(lambda: ("end", "the new text") in calls), calls
        assert until(lambda: "the new text" in summary.inner_text()), summary.inner_text()
        browser.close()
    # the new text's search started only once the re-rank had ended: no answer of it can land after
    assert calls[2:] == [("start", "an old text"), ("end", "an old text"), ("start", "the new text"),
                         ("end", "the new text")], calls


def test_top_k_outside_1_to_100_is_refused_in_words() -> None:
    assert app.top_k_value(5.0) == 5 and app.top_k_value(100) == 100
    assert app.top_k_value(3, app.MAX_CARDS) == 3
    for bad in (0, 101, 1000, 2.5, "many", None):
        with pytest.raises(app.QueryError, match=r"top_k must be a whole number from 1 to 100"):
            app.top_k_value(bad)
    with pytest.raises(app.QueryError, match=r"from 1 to 10, got 11"):  # the UI's slider range
        app.top_k_value(11, app.MAX_CARDS)


def test_get_info_is_json_naming_the_model(served: tuple) -> None:
    import httpx

    url, predictor, _ = served
    reply = httpx.get(url + "info", timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("application/json")
    info = reply.json()
    assert info["model"]["name"] == predictor.info.name and info["profile"]["name"] == "lite"
    assert info["shared_videos"] == len(predictor.index)


def test_a_long_query_note_says_how_much_the_text_model_read(served: tuple) -> None:
    predictor = served[1]
    long_query = "a cat looks at the camera " * 400  # 10,400 characters
    response = predictor.search(long_query, k=1)
    query = response.query
    assert query["tokens_read"] == predictor.text.profile.max_tokens == 64 and query["tokens"] > 64
    assert 30 <= query["words_read"] <= 64 and query["read_until"]
    page = app.summary_html(long_query, response)
    assert "reads at most 64 tokens" in page and f"about its first {query['words_read']} words" in page
    assert "10,400-character" in page and "496 characters" not in page
    short = predictor.search("a cat", k=1)
    assert short.query["tokens"] <= 64 and "Note" not in app.summary_html("a cat", short)


def test_the_api_reads_no_server_file_outside_the_allowed_folders(served: tuple, tmp_path: Path,
                                                                  request: pytest.FixtureRequest) -> None:
    """A client of the HTTP API can name a server file three ways: a FileData ``path`` (or ``url``) in a
    call of /add_video, gradio's ``/gradio_api/file=`` route and the app's ``/prvr/video/<id>``. A file
    outside gradio's upload folder (MCP's --mcp-allow-paths dir is MCP's, not the API's) is refused in every
    form: the call ends in an error event, the routes answer 403/404, and nothing is read or indexed."""
    import uuid

    import gradio as gr
    import httpx

    url, predictor, sessions = served
    secret = write_clip(tmp_path / "secret.mp4", frames=22, size=(72, 56))
    upload = Path(gr.utils.get_upload_folder())
    upload.mkdir(parents=True, exist_ok=True)
    link = upload / f"link-{uuid.uuid4().hex}.mp4"  # a symlink in gradio's own folder to the file outside
    link.symlink_to(secret)
    request.addfinalizer(link.unlink)
    operator = write_clip(Path(predictor.settings.mcp_allow_paths) / f"{tmp_path.name}.mp4")
    up = f"{upload}/../{'../' * len(upload.parts)}{str(secret).lstrip('/')}"
    named = {"absolute": str(secret), "dot-dot": up, "percent-encoded dot-dot": up.replace("..", "%2e%2e"),
             "file: URL": f"file://{secret}", "symlink": str(link), "MCP's allowed dir": str(operator)}
    before = (len(predictor.index), {g.root: len(g.index) for g in sessions.galleries()})

    def call(data: dict) -> str:
        """The add_video call's event stream for a FileData ``data``."""
        posted = httpx.post(url + "gradio_api/call/add_video", timeout=60,
                            json={"data": [{**data, "meta": {"_type": "gradio.FileData"}}, ""]})
        assert posted.status_code == 200, posted.text
        return httpx.get(url + f"gradio_api/call/add_video/{posted.json()['event_id']}", timeout=120).text

    def refused(answer: str) -> bool:
        """Gradio's refusal (an error event), or the app's: a literal %2e%2e folder in gradio's folder
        passes gradio's check and names no file."""
        return answer.startswith("event: error") or '"status": "rejected"' in answer and "not found" in answer

    for form, path in named.items():
        answer = call({"path": path})
        assert refused(answer), (form, answer)
        answer = call({"path": "video.mp4", "url": f"file://{path}"})
        assert refused(answer), (form, answer)
        got = httpx.get(url + "gradio_api/file=" + path, timeout=30)  # (httpx resolves a plain ..: 404)
        assert got.status_code in (403, 404) and b"ftyp" not in got.content, (form, got.status_code, got.text)
        got = httpx.get(url + "gradio_api/file=" + quote(path, safe=""), timeout=30)
        assert got.status_code == 403 and "File not allowed" in got.text, (form, got.status_code, got.text)
    own = quote(predictor.index.ids[0])
    for video_id in (quote(str(secret), safe=""), quote(str(secret)).lstrip("/"),
                     f"{own}%2F..%2F..%2Fsecret.mp4", "%2e%2e%2f%2e%2e%2f" + secret.name,
                     quote(f"file://{secret}", safe=""), quote(up, safe="")):
        got = httpx.get(url + "prvr/video/" + video_id, timeout=30)
        assert got.status_code == 404 and got.text == "no video with this id", (video_id, got.text)
    after = (len(predictor.index), {g.root: len(g.index) for g in sessions.galleries()})
    # no session got a video (an earlier test's session may have been closed meanwhile: it is just gone)
    assert after[0] == before[0] and all(n == before[1].get(root, 0) for root, n in after[1].items())


def test_search_reports_the_servers_own_time(served: tuple) -> None:
    """/search's ``stats`` say where the server's time went (text, query encoding, ranking, results) and
    the total of it, the figure a client's round trip is measured against (benchmarks.concurrency --api)."""
    from gradio_client import Client

    client = Client(served[0], verbose=False)
    stats = client.predict("a colourful gradient", 3, 0.7, 0, api_name="/search")["stats"]
    steps = ("text_ms", "encode_ms", "rank_ms", "results_ms")
    assert all(stats[s] >= 0 for s in steps) and stats["text_ms"] > 0
    assert stats["total_ms"] >= sum(stats[s] for s in steps)
    assert stats["videos"] >= 1


def test_a_search_pays_for_no_event_summary_nor_a_failed_import(served: tuple,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #45 item 1, serving's own cost: Gradio redid a pandas summary of its last 10,000 events after
    every event, for /monitoring (11 ms of CPU a search after 10,000 searches), and tried ``import
    matplotlib`` twice an event on its event loop, where each failed try searched sys.path again. Searches
    through gradio_client now make no summary and search no path for matplotlib, and /monitoring is off."""
    import importlib.machinery

    import httpx
    from gradio.queueing import Queue
    from gradio_client import Client

    summaries, searched = [], []
    get_df, find_spec = Queue._get_df, importlib.machinery.PathFinder.find_spec

    def counted_df(records: list) -> object:
        summaries.append(len(records))
        return get_df(records)

    def counted_spec(name: str, *args: object, **kwargs: object) -> object:
        searched.append(name)
        return find_spec(name, *args, **kwargs)

    monkeypatch.setattr(Queue, "_get_df", staticmethod(counted_df))
    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", staticmethod(counted_spec))
    client = Client(served[0], verbose=False)
    for query in ("a colourful gradient", "a red square", "colours change"):
        assert client.predict(query, 3, 0.7, 0, api_name="/search")["results"]
    assert summaries == [] and "matplotlib" not in searched
    assert httpx.get(served[0] + "monitoring/summary", timeout=30).status_code == 403


def test_search_answers_one_plain_http_request(served: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """/search also answers a plain HTTP POST (``/gradio_api/run/search``: the event runs outside the queue,
    one request, no event stream), the same answer gradio_client gets; a refusal is its one-line message.
    The README's request names its session: Gradio builds that session once, where a request without a name
    gets a throwaway one each time (a copy of every component's configuration: ~10 ms of the server's CPU)."""
    import httpx
    from gradio.state_holder import SessionState
    from gradio_client import Client

    url = served[0]
    args = ["a colourful gradient", 3, 0.7, 0]
    built: list[int] = []
    original = SessionState.__init__

    def counted(self: SessionState, blocks: object) -> None:
        built.append(1)
        original(self, blocks)

    monkeypatch.setattr(SessionState, "__init__", counted)
    named = {"data": [*args, None], "session_hash": "readme-plain-http"}  # as the README's example
    replies = [httpx.post(url + "gradio_api/run/search", json=named, timeout=120) for _ in range(3)]
    assert [r.status_code for r in replies] == [200] * 3 and len(built) == 1, built
    unnamed = [httpx.post(url + "gradio_api/run/search", json={"data": [*args, None]}, timeout=120)
               for _ in range(2)]
    assert [r.status_code for r in unnamed] == [200] * 2 and len(built) == 3, built
    direct = replies[0].json()["data"][0]
    assert all(r.json()["data"][0]["results"] == direct["results"] for r in replies + unnamed)
    queued = Client(url, verbose=False).predict(*args, api_name="/search")
    direct.pop("stats"), queued.pop("stats")  # timings differ from call to call
    assert direct == queued
    refused = httpx.post(url + "gradio_api/run/search", json={"data": ["   ", 3, 0.7, 0, None]}, timeout=120)
    assert refused.status_code == 500 and "query is empty" in refused.json()["error"]


def test_the_api_says_when_the_text_model_cannot_read_the_query(served: tuple) -> None:
    """Issue #45 item 5: "!!!" or "un perro en la playa" got ordinary-looking results with no word that the
    text model reads English only; the API's ``notice`` (and MCP's, the same answer) says it."""
    from gradio_client import Client

    client = Client(served[0], verbose=False)
    signs = client.predict("!!!", 5, 0.7, api_name="/search")
    assert signs["results"] and signs["notice"]["kind"] == "no_words", signs["notice"]
    spanish = client.predict("un perro en la playa", 5, 0.7, api_name="/search")["notice"]
    assert spanish["kind"] == "unknown_words" and spanish["words"] == ["perro", "playa"], spanish
    assert "English" in spanish["message"]
    assert client.predict("a colourful gradient", 5, 0.7, api_name="/search")["notice"] is None


def test_a_visitor_removes_an_upload_of_theirs_and_nothing_else(served: tuple, tmp_path: Path) -> None:
    """Issue #45 item 5: an upload could not be removed on the page; ``Predictor.remove_upload`` takes it out
    of the session's gallery with its playable copy, and refuses, changing nothing, any other id."""
    predictor = served[1]
    session = predictor.ensure_session(None)
    added = predictor.add_video(write_clip(tmp_path / "mine.mp4", frames=30, size=(80, 48)), session)
    assert added["status"] == "added", added
    copy = predictor.media.locate(session.index.record(added["video_id"])["path"])
    assert copy.is_file() and copy.is_relative_to(session.root.resolve())
    shared = list(predictor.index.ids)
    with pytest.raises(app.QueryError, match=f"no upload of yours has the id {shared[0]!r}"):
        predictor.remove_upload(shared[0], session)  # a shared video, in session mode: not the visitor's
    predictor.remove_upload(added["video_id"], session)
    assert session.index.record(added["video_id"]) is None and not copy.exists()
    assert list(predictor.index.ids) == shared  # the shared gallery is as it was
    with pytest.raises(app.QueryError, match="removed already"):
        predictor.remove_upload(added["video_id"], session)
    session.close()


def test_an_upload_title_is_the_name_it_is_known_by() -> None:
    assert app.titled_name("clip.final.mp4", "Our day v2.0") == "Our day v2.0.mp4"
    assert app.titled_name("a.mkv", "a/b") == "a-b.mkv"  # a separator would cut the title
