"""End to end through the app's named API: a real server process, the real model, real videos.

One ``python app.py`` server serves this module and tests/test_browser.py (``app_url`` in conftest.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.clips import write_clip
from tests.servers import client, free_port

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="module")
def demo_gallery() -> tuple[dict, dict]:
    """({video id: its scenes on the time axis}, the gallery recipe), straight from the recipe."""
    from prvr.demo.gallery import RenderConfig, load_spec, timeline

    spec = load_spec()
    return {v["id"]: timeline(v, RenderConfig().transition_s) for v in spec["videos"]}, spec


CAPTIONS = ["a clear glass flower figurine seen up close", "a small white rabbit figurine on a wooden table"]


@pytest.mark.parametrize("caption", CAPTIONS)
def test_demo_caption_finds_its_video_first(app_url: str, demo_gallery: tuple, caption: str) -> None:
    from prvr.demo.gallery import RenderConfig

    scenes, spec = demo_gallery
    clip = next(name for name, c in spec["clips"].items() if caption in c["captions"])
    relevant = {vid for vid, video_scenes in scenes.items() if any(s.clip == clip for s in video_scenes)}
    response = client(app_url).predict(caption, 5, 0.7, api_name="/search")
    results = response["results"]
    assert results[0]["video_id"] in relevant, [r["video_id"] for r in results]
    top = results[0]
    assert response["no_strong_match"] == all(r["confidence"] != "high" for r in results)
    # the key moment overlaps a scene playing the clip, or the cross-fades where it is half visible
    fade = RenderConfig().transition_s
    spans = [(s.start - fade, s.end + fade) for s in scenes[top["video_id"]] if s.clip == clip]
    key = top["key_moment"]
    assert any(max(a, key["start"]) < min(b, key["end"]) for a, b in spans), (key, spans)
    assert [r["rank"] for r in results] == list(range(1, len(results) + 1))
    heat = top["heatmap"]  # one cell per second of these short videos, covering the whole video
    assert len(heat["score"]) == len(heat["start"]) == len(heat["end"]) == round(top["duration"])
    assert heat["start"][0] == 0.0 and heat["end"][-1] == pytest.approx(top["duration"], abs=1.0)
    assert 1 <= len(top["moments"]) <= 3 and top["moments"][0] == key
    assert set(top["key_clip"]) == {"start", "end", "proposal", "score"}
    assert top["video_url"] == f"/prvr/video/{top['video_id']}"


def test_every_example_the_page_offers_finds_its_video_in_the_top_3(app_url: str,
                                                                    demo_gallery: tuple) -> None:
    """The page's example queries (its "Try a demo caption" list, read from the page's own config) each
    find a video that shows what they describe among the first three of the 8 demo videos."""
    import httpx

    scenes, spec = demo_gallery
    config = httpx.get(app_url + "config", timeout=30).json()
    offered = next(c["props"]["samples"] for c in config["components"]
                   if c.get("props", {}).get("label") == "Try a demo caption")
    examples = [sample[0] for sample in offered]
    assert examples == spec["examples"]  # all of them: the whole demo gallery is served
    session, missed = client(app_url), []
    for caption in examples:
        clip = next(name for name, c in spec["clips"].items() if caption in c["captions"])
        relevant = {vid for vid, video_scenes in scenes.items() if any(s.clip == clip for s in video_scenes)}
        top3 = [r["video_id"] for r in session.predict(caption, 3, 0.7, api_name="/search")["results"]]
        if not relevant & set(top3):
            missed.append((caption, top3, sorted(relevant)))
    assert not missed, missed


def test_bad_query_is_a_clear_error(app_url: str) -> None:
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="query is empty"):
        client(app_url).predict("   ", 5, 0.7, api_name="/search")


def test_uploaded_clip_becomes_searchable_in_its_session_only(app_url: str) -> None:
    from gradio_client import handle_file

    clip = SHARED / "videos" / "mmaction2__tools_data_skeleton_S001C001P001R001A001_rgb.avi"
    if not clip.exists():
        pytest.skip(f"{clip} is absent (the shared test videos are not part of the repository)")
    mine, other = client(app_url), client(app_url)
    before = mine.predict(api_name="/info")
    t0 = time.perf_counter()
    added = mine.predict(handle_file(str(clip)), api_name="/add_video")
    upload_s = time.perf_counter() - t0
    assert added["status"] == "added", added
    after = mine.predict(api_name="/info")
    assert after["videos"] == before["videos"] + 1 and after["session_videos"] == 1
    results = mine.predict("a person drinks water from a cup", 10, 0.7, api_name="/search")["results"]
    hit = next(r for r in results if r["video_id"] == added["video_id"])
    import httpx

    video = httpx.get(app_url.rstrip("/") + hit["video_url"], timeout=30)
    assert video.content[4:8] == b"ftyp"  # the AVI was re-encoded to a browser-playable mp4
    assert "path" not in hit and "video_file" not in hit  # no server paths in API results
    assert hit["duration"] == pytest.approx(3.43, abs=0.1)
    # another browser session does not see it, and the same bytes again are a recognised duplicate
    seen_by_other = other.predict("a person drinks water", 10, 0.7, api_name="/search")["results"]
    assert added["video_id"] not in {r["video_id"] for r in seen_by_other}
    assert other.predict(api_name="/info")["videos"] == before["videos"]
    again = mine.predict(handle_file(str(clip)), api_name="/add_video")
    assert again["status"] == "duplicate" and again["video_id"] == added["video_id"]
    assert "already in the gallery" in again["message"]
    print(f"upload-to-searchable: {upload_s:.1f} s")


def truncated_copy(tmp: Path) -> Path:
    """The first third of a real mp4 (its index is at the end: nothing playable remains)."""
    src = SHARED / "videos" / "univtg_charades.mp4"
    if not src.exists():
        pytest.skip(f"{src} is absent (the shared test videos are not part of the repository)")
    data = src.read_bytes()
    out = tmp / "cut.mp4"
    out.write_bytes(data[: len(data) // 3])
    return out


@pytest.mark.parametrize("kind, message", [
    ("empty", "empty (0 bytes)"),
    ("text", "not a video file"),
    ("truncated", "damaged"),
])
def test_bad_upload_is_rejected_with_its_reason(app_url: str, tmp_path: Path, kind: str, message: str,
                                                ) -> None:
    from gradio_client import handle_file

    if kind == "empty":
        path = tmp_path / "empty.mp4"
        path.write_bytes(b"")
    elif kind == "text":
        path = tmp_path / "notes.mp4"
        path.write_text("this is a shopping list, not a video\n" * 20)
    else:
        path = truncated_copy(tmp_path)
    session = client(app_url)
    before = session.predict(api_name="/info")["videos"]
    outcome = session.predict(handle_file(str(path)), api_name="/add_video")
    assert outcome["status"] == "rejected" and outcome["video_id"] is None, outcome
    assert outcome["message"].startswith(path.name) and message in outcome["message"], outcome
    assert "Traceback" not in outcome["message"]
    assert session.predict(api_name="/info")["videos"] == before


# ------------------------------------------------------------------ fast checks of the app's own pieces


def test_avi_clip_is_reencoded_to_a_playable_mp4(tmp_path: Path) -> None:
    from extract.decode import probe
    from extract.transcode import ensure_browser_playable, unplayable_reason

    clip = SHARED / "videos" / "mmaction2__tools_data_skeleton_S001C001P001R001A001_rgb.avi"
    if not clip.exists():
        pytest.skip(f"{clip} is absent (the shared test videos are not part of the repository)")
    assert unplayable_reason(clip) == "container 'avi' is not mp4"
    out = ensure_browser_playable(clip, tmp_path)
    assert out.parent == tmp_path and out.suffix == ".mp4" and unplayable_reason(out) is None
    src, dst = probe(clip), probe(out)
    assert dst.duration == pytest.approx(src.duration, abs=0.1)
    assert (dst.width, dst.height) == (1280, 720)  # 1080p is scaled to 720p, aspect kept


def test_odd_sized_mpeg4_becomes_even_sized_h264(tmp_path: Path) -> None:
    from extract.decode import probe
    from extract.transcode import ensure_browser_playable, unplayable_reason

    src = write_clip(tmp_path / "odd.mp4", 12, codec="mpeg4", size=(321, 241))
    assert unplayable_reason(src) == "video codec 'mpeg4' is not H.264"
    out = ensure_browser_playable(src, tmp_path / "out")
    info = probe(out)
    assert (info.codec, info.width, info.height) == ("h264", 320, 240)
    assert info.num_frames == 12


def test_playable_mp4_is_kept_and_garbage_is_a_media_error(tmp_path: Path) -> None:
    from extract.decode import MediaError
    from extract.transcode import ensure_browser_playable

    good = write_clip(tmp_path / "good.mp4", 12, size=(320, 240))
    assert ensure_browser_playable(good, tmp_path / "out") == good
    assert not (tmp_path / "out").exists()
    junk = tmp_path / "junk.mp4"
    junk.write_text("not a video")
    with pytest.raises(MediaError, match="junk.mp4: cannot be opened as a video"):
        ensure_browser_playable(junk, tmp_path / "out")


def test_settings_come_from_flags_then_environment_then_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from prvr.serve.settings import AppSettings

    for name in ("PRVR_UPLOADS", "PRVR_HOST", "PRVR_PORT", "PRVR_MAX_UPLOAD_MB", "SPACE_ID", "PRVR_MCP"):
        monkeypatch.delenv(name, raising=False)
    local = AppSettings.from_args([])
    assert (local.host, local.port, local.uploads) == ("127.0.0.1", 7860, "shared")
    monkeypatch.setenv("SPACE_ID", "someone/prvr")
    space = AppSettings.from_args([])
    assert (space.host, space.uploads) == ("0.0.0.0", "session")  # public host: private uploads
    monkeypatch.setenv("PRVR_PORT", "9000")
    monkeypatch.setenv("PRVR_UPLOADS", "shared")
    assert AppSettings.from_args([]).port == 9000 and AppSettings.from_args([]).uploads == "shared"
    assert AppSettings.from_args(["--port", "9100", "--data-dir", "~/x"]).port == 9100  # flags win
    assert AppSettings.from_args(["--data-dir", "~/x"]).data_dir == Path.home() / "x"
    with pytest.raises(SystemExit):
        AppSettings.from_args(["--uploads", "everyone"])
    assert not local.mcp and AppSettings.from_args(["--mcp"]).mcp
    assert not AppSettings.from_args(["--mcp", "no"]).mcp
    monkeypatch.setenv("PRVR_MCP", "1")
    assert AppSettings.from_args([]).mcp and not AppSettings.from_args(["--mcp", "0"]).mcp
    with pytest.raises(SystemExit):
        AppSettings.from_args(["--mcp", "maybe"])
    assert local.mcp_allow_paths is None
    assert AppSettings.from_args(["--mcp-allow-paths", "/srv/a,/srv/b"]).mcp_allow_paths == "/srv/a,/srv/b"
    monkeypatch.setenv("PRVR_MAX_UPLOAD_MB", "0")
    with pytest.raises(SystemExit):
        AppSettings.from_args([])


def test_the_app_launches_where_its_first_page_is_slow(tmp_path: Path, make_predictor,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a busy machine the first page can take longer than Gradio's reachability probe waits (one HEAD,
    3 s): the app still starts and serves (it failed the launch with "localhost is not accessible" before)."""
    import httpx

    import app

    def slow_head(url: str, **kwargs: object) -> httpx.Response:
        raise httpx.ReadTimeout(f"no answer from {url} within 3 s")  # what a loaded machine gives the probe

    predictor = make_predictor(tmp_path / "data")
    sessions = app.ClosedSessions()
    demo = app.build_ui(predictor, sessions)
    demo.queue()
    monkeypatch.setattr(httpx, "head", slow_head)
    try:
        app.launch(demo, predictor, sessions, "127.0.0.1", free_port(), quiet=True)
        monkeypatch.undo()
        info = httpx.get(f"{demo.local_url}info", timeout=30).json()
        assert info["videos"] == 0 and demo.is_running
    finally:
        demo.close()
        predictor.close()
