"""Issue #43 at the serving layer: every way in reads a video's words, the page, the API and MCP show them
(``prvr.serve.ingest.WordsRun``, ``prvr.serve.page.words_html``, ``--words``)."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

import pytest

from tests.clips import write_clip

REPO = Path(__file__).resolve().parents[1]


def a_result(words: list[dict], key_from: str = "pictures") -> dict:
    """A result dict as ``prvr.results`` makes it, with the words it matched."""
    return {"rank": 1, "title": "talk", "video_id": "upload:abc", "duration": 120.0, "confidence": "high",
            "confidence_label": "strong match", "score": 0.9, "clip_score": 0.8, "frame_score": 0.7,
            "key_moment": {"start": 30.0, "end": 36.0, "play_from": 30.5, "contrast": 4.0, "from": key_from},
            "moments": [{"start": 30.0, "end": 36.0, "play_from": 30.5, "contrast": 4.0}],
            "heatmap": {"start": [0.0, 60.0], "end": [60.0, 120.0], "score": [0.2, 0.4]},
            "attention": {"time": [], "weight": []}, "words": words}


SAID = {"source": "speech", "start": 65.0, "end": 69.5, "text": "the reactor is <overheating>", "score": 0.8}
SUBTITLE = {"source": "subtitles", "start": 31.0, "end": 34.0, "text": "Q3 revenue", "score": 1.0}


# ------------------------------------------------------------------------------- item 3: what a person sees
def test_a_card_shows_its_matched_lines_with_source_and_time_and_a_click_plays_there() -> None:
    from prvr.serve.page import CARD_HELP, card_html, words_html

    card = card_html(a_result([SUBTITLE, SAID], key_from="words"), 0.7, (0.0, 1.0))
    lines = re.findall(r'<button class="line" data-t="([\d.]+)"[^>]*>(.*?)</button>', card)
    assert [t for t, _ in lines] == ["31.00", "65.00"]  # best first; each seeks its start (SEEK_JS: data-t)
    assert "“Q3 revenue”" in lines[0][1] and "subtitles 0:31-0:34" in lines[0][1]
    assert "said 1:05-1:10" in lines[1][1] and "&lt;overheating&gt;" in lines[1][1]  # escaped, never markup
    assert "<overheating>" not in card
    # the strip marks each line's time (a click seeks there too); the key moment says it came from the words
    marks = re.findall(r'<rect class="word" data-t="([\d.]+)" x="([\d.]+)"', card)
    assert marks == [("31.00", "258.3"), ("65.00", "541.7")]
    assert "★ key moment (words)" in card and "teal marks" in CARD_HELP  # the help is said once, above
    assert words_html(a_result([])) == "" and words_html({"rank": 1}) == ""
    plain = card_html(a_result([]), 0.7, (0.0, 1.0))
    assert 'class="word"' not in plain and 'class="words"' not in plain and "teal" not in plain
    many = words_html(a_result([dict(SAID, start=float(t), end=t + 1.0) for t in range(6)]))
    assert many.count('class="line"') == 3  # the best few, not a transcript


def test_the_info_panel_says_which_words_are_read() -> None:
    from prvr.serve.page import words_info_words

    on = words_info_words({"mode": "all", "sources": ["subtitles", "speech", "screen"],
                           "models": {"speech": "pocketsphinx 5.1.1 (en-us)", "screen": "RapidOCR"}})
    assert "subtitles, speech, screen" in on and "pocketsphinx 5.1.1 (en-us)" in on and "RapidOCR" in on
    assert "off" in words_info_words({"mode": "off", "sources": []})


def test_subtitle_files_chosen_on_the_page_go_with_the_video_of_their_name() -> None:
    from prvr.serve.ingest import pair_sidecars

    assert pair_sidecars(["holiday.mp4"], ["/x/anything.srt"]) == ({"holiday.mp4": "/x/anything.srt"}, [])
    paired, unused = pair_sidecars(["talk.mp4", "walk.mkv", "x.mp4"],
                                   ["/g/1/walk.vtt", "/g/2/talk.en.srt", "/g/3/other.srt"])
    assert paired == {"talk.mp4": "/g/2/talk.en.srt", "walk.mkv": "/g/1/walk.vtt"}
    assert unused == ["/g/3/other.srt"]
    assert pair_sidecars(["a.mp4", "b.mp4"], []) == ({}, [])


# ------------------------------------------------------------------------------------ item 1: the settings
def test_words_and_speech_weights_are_flags_and_variables(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    from extract.words.reader import MODES
    from prvr.serve.settings import WORDS_MODES, AppSettings

    assert WORDS_MODES == MODES  # the flag's choices are the reader's modes (settings imports no torch)
    assert AppSettings().words == "all" and AppSettings().speech_weights is None
    given = AppSettings.from_args(["--words", "subtitles", "--speech-weights", "/models/whisper-small"])
    assert (given.words, given.speech_weights) == ("subtitles", "/models/whisper-small")
    monkeypatch.setenv("PRVR_WORDS", "off")
    monkeypatch.setenv("PRVR_SPEECH_WEIGHTS", "pocketsphinx")
    from_env = AppSettings.from_args([])
    assert (from_env.words, from_env.speech_weights) == ("off", "pocketsphinx")
    with pytest.raises(SystemExit):
        AppSettings.from_args(["--words", "everything"])
    assert "invalid choice: 'everything'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="words must be one of off, subtitles, all, got 'some'"):
        AppSettings(words="some")


# ----------------------------------------------------------------------- item 2: every way in reads words
class ScriptedReader:
    """A words reader (``extract.words.reader.WordsReader``'s interface) that answers one line of words and
    one skipped source for every video, records what it was asked and when, and reads for ``seconds``."""

    def __init__(self, text: str = "a purple giraffe sings opera", seconds: float = 0.0,
                 fail: bool = False, gate: threading.Event | None = None) -> None:
        """``gate``: the reading ends once it is set (instead of after ``seconds``)."""
        self.text, self.seconds, self.fail, self.gate = text, seconds, fail, gate
        self.calls: list[dict] = []
        self.told = threading.Event()  # set once the reading told its progress

    def describe(self) -> dict:
        return {"mode": "all", "sources": ["subtitles"], "models": {}}

    def read(self, video_path, sidecar=None, progress=None):
        from extract.words.reader import WordsReport
        from extract.words.segment import WordSegment

        call = {"path": Path(video_path), "sidecar": sidecar, "thread": threading.current_thread().name,
                "t0": time.monotonic()}
        self.calls.append(call)
        if progress is not None:
            progress(0.4)
        self.told.set()
        if self.gate is not None:
            assert self.gate.wait(60)
        time.sleep(self.seconds)
        call["t1"] = time.monotonic()
        if self.fail:
            raise RuntimeError("a bug in a words source")
        return WordsReport(segments=(WordSegment("subtitles", 0.5, 1.5, self.text),),
                           skipped=("speech: the file has no audio stream",), sources=("subtitles",))


def joined(predictor, out: dict, session=None, within_s: float = 60.0) -> dict:
    """The upload's outcome once its words no longer follow the video (asked again as the page does)."""
    deadline = time.monotonic() + within_s
    while (out.get("words") or {}).get("state") == "following":
        assert time.monotonic() < deadline, out
        time.sleep(0.05)
        out = predictor.upload_outcome(out["video_id"], session) or out
    return out


def joined_api(client, out: dict, within_s: float = 60.0) -> dict:
    """An API caller's wait for an upload's words: /info's ``words_follow`` until they joined; the upload's
    ``words`` then."""
    deadline = time.monotonic() + within_s
    while (out.get("words") or {}).get("state") == "following":
        assert time.monotonic() < deadline, out
        time.sleep(0.1)
        info = client.predict(api_name="/info")
        now = [o for o in info["words_follow"] if o["video_id"] == out["video_id"]]
        out = now[-1] if now else out
    return out


def timed_extractor(predictor) -> list[tuple[float, float]]:
    """Record when each visual extraction of ``predictor``'s request extractor runs."""
    spans: list[tuple[float, float]] = []
    extract = predictor.ingest.extractor.extract

    def timed(*args, **kwargs):
        t0 = time.monotonic()
        try:
            return extract(*args, **kwargs)
        finally:
            spans.append((t0, time.monotonic()))

    predictor.ingest.extractor.extract = timed
    return spans


def test_an_upload_reads_its_words_beside_its_pictures_and_is_found_by_them(
        tmp_path: Path, make_predictor, monkeypatch: pytest.MonkeyPatch) -> None:
    from prvr.serve import ingest

    monkeypatch.setattr(ingest, "BESIDE_MIN_CORES", 1)  # cores that allow it (this machine has 2)
    predictor = make_predictor(tmp_path / "data", uploads="shared")
    try:
        reader = predictor.ingest.words = ScriptedReader(seconds=1.5)
        spans = timed_extractor(predictor)
        srt = tmp_path / "talk.srt"
        srt.write_text("1\n00:00:00,500 --> 00:00:01,500\na purple giraffe sings opera\n")
        stages: list[str] = []
        clip = write_clip(tmp_path / "inbox" / "talk.mp4", frames=36)
        out = predictor.add_video(clip, progress=lambda _, stage: stages.append(stage), name="talk.mp4",
                                  subtitles=srt)
        assert out["status"] == "added", out
        out = joined(predictor, out)  # (with it, or after it when the pictures were done first)
        (call,) = reader.calls
        # the original file (its tracks) and the sidecar, kept as links while read (the caller deletes its)
        assert (call["path"].name, call["sidecar"].name) == (clip.name, srt.name)
        assert call["path"].parent.name.startswith("work-") and not call["path"].exists()  # removed after
        assert call["thread"] != threading.current_thread().name
        (span,) = spans
        assert call["t0"] < span[1] and span[0] < call["t1"]  # read while the pictures were extracted
        assert any("words: 40 %" in s for s in stages), stages  # the upload says what it is doing
        assert "with 1 line of words (subtitles)" in out["message"]
        assert out["message"].count("Words skipped: ") == 1  # one line per skipped source, saying why
        assert "Words skipped: speech: the file has no audio stream." in out["message"]
        assert out["words"]["segments"] == 1 and out["words"]["skipped"] == ["speech: the file has no audio "
                                                                             "stream"]
        hit = predictor.search("purple giraffe sings opera", k=5).results[0]
        assert hit["video_id"] == out["video_id"]
        assert hit["words"][0]["text"] == "a purple giraffe sings opera"
        assert hit["words"][0]["source"] == "subtitles"
    finally:
        predictor.close()


def test_a_video_is_searchable_by_its_pictures_first_and_its_words_join_it(
        tmp_path: Path, make_predictor, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #43 item 4: an upload whose words take longer than its pictures is added at once, searchable by
    its pictures, and says "words: 40 %" (its outcome, /info's words_follow); once read, the words join it
    in one gallery update and rank it first, and --persist keeps them (a restore has them). A reading that
    fails after the video joined is one skipped line; a video removed meanwhile is one log line. Where the
    cores do not allow reading beside the pictures (2 here), the words are read once they are done."""
    from prvr.serve import ingest

    monkeypatch.setattr(ingest, "BESIDE_MIN_CORES", 10**6)
    bucket = tmp_path / "bucket"
    predictor = make_predictor(tmp_path / "data", uploads="shared", persist=bucket)
    try:
        predictor.ingest.words = None  # a video without words beside it
        plain = predictor.add_video(write_clip(tmp_path / "plain.mp4", frames=30), name="plain.mp4")
        gate = threading.Event()
        reader = predictor.ingest.words = ScriptedReader(gate=gate)
        spans = timed_extractor(predictor)
        talk = write_clip(tmp_path / "talk.mp4", frames=36, size=(80, 48))
        out = predictor.add_video(talk, name="talk.mp4")
        assert out["status"] == "added" and out["words"]["state"] == "following", out
        assert re.search(r"searchable now by its pictures, its words follow \(words: (waiting|\d+ %)\)\.",
                         out["message"]), out["message"]
        assert reader.told.wait(30)  # (its reading may not have begun when the pictures were done)
        assert reader.calls[0]["t0"] >= spans[0][1]  # after the pictures
        out = predictor.upload_outcome(out["video_id"])
        assert out["words"]["percent"] == 40
        assert "searchable now by its pictures, its words follow (words: 40 %)." in out["message"]
        query = "purple giraffe sings opera"
        hits = predictor.search(query, k=5).results
        assert {h["video_id"] for h in hits} == {plain["video_id"], out["video_id"]}
        assert all(h["words"] == [] for h in hits)  # meanwhile: its pictures' evidence only
        assert predictor.describe()["words_follow"] == [out]
        gate.set()
        done = joined(predictor, out)
        assert done["words"]["state"] == "joined" and done["words"]["segments"] == 1, done
        assert "then its words joined with 1 line of words (subtitles)." in done["message"]
        assert done["message"].endswith(" Words skipped: speech: the file has no audio stream.")
        assert predictor.describe()["words_follow"] == [done]
        hit = predictor.search(query, k=5).results[0]
        assert hit["video_id"] == out["video_id"] and hit["words"][0]["text"] == ScriptedReader().text
        # a reading that fails after the video joined, and a video removed before its words joined
        failing = threading.Event()
        predictor.ingest.words = ScriptedReader(gate=failing, fail=True)
        broken = predictor.add_video(write_clip(tmp_path / "x.mp4", frames=26, size=(64, 48)), name="x.mp4")
        failing.set()
        broken = joined(predictor, broken)
        assert broken["words"]["state"] == "joined" and broken["video_id"] in predictor.index.ids
        assert "no words were found" in broken["message"]
        assert "Words skipped: words: unexpected server error (error id " in broken["message"]
        late = threading.Event()
        predictor.ingest.words = ScriptedReader(gate=late)
        gone = write_clip(tmp_path / "gone.mp4", frames=28, size=(48, 48))
        gone = predictor.add_video(gone, name="gone.mp4")
        predictor.ingest.remove([gone["video_id"]])
        with caplog.at_level(logging.INFO):
            late.set()
            gone = joined(predictor, gone)
        assert gone["words"]["state"] == "failed" and "its words could not join it" in gone["message"]
        assert [r.levelno for r in caplog.records if "gone.mp4 could not join" in r.getMessage()] == [
            logging.WARNING]
        profile = predictor.ingest.persist.profile
    finally:
        predictor.close()
    from prvr.serve.persist import PersistentStore

    restored = {v.id: v.words for v in PersistentStore(bucket, profile).restore()}  # what a restart adds
    assert [w.text for w in restored[out["video_id"]]] == [ScriptedReader().text]
    assert restored[plain["video_id"]] == restored[broken["video_id"]] == ()
    assert gone["video_id"] not in restored


def test_a_failing_reader_still_indexes_the_video_by_its_pictures(tmp_path: Path, make_predictor,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    predictor = make_predictor(tmp_path / "data", uploads="shared")
    try:
        predictor.ingest.words = ScriptedReader(fail=True)
        with caplog.at_level(logging.INFO):
            out = predictor.add_video(write_clip(tmp_path / "x.mp4", frames=30), name="x.mp4")
            out = joined(predictor, out)  # (with it, or after it)
        assert out["status"] == "added" and out["video_id"] in predictor.index.ids
        assert re.search(r"Words skipped: words: unexpected server error \(error id \w{8}\); the video is "
                         r"searched by its pictures only\.", out["message"]), out["message"]
        assert re.search("no words (were )?found", out["message"]) and out["words"]["segments"] == 0
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "reading the words of x.mp4 failed" in errors[0].getMessage()
    finally:
        predictor.close()


def test_the_folder_demo_and_bucket_ways_read_words_once(tmp_path: Path, make_predictor) -> None:
    """--gallery reads a sidecar with the video's stem beside it; the demo's videos are read too; a video
    restored from --persist keeps its words (stored with it) without reading them again."""
    from types import SimpleNamespace

    from prvr.serve.folder import sync_folder

    folder, bucket = tmp_path / "folder", tmp_path / "bucket"
    first = make_predictor(tmp_path / "data", uploads="shared", persist=bucket)
    try:
        reader = first.ingest.words = ScriptedReader(text="the lighthouse keeper counts ships")
        clip = write_clip(folder / "keeper.mp4", frames=30)
        (folder / "keeper.srt").write_text("1\n00:00:00,500 --> 00:00:01,500\nthe lighthouse keeper\n")
        write_clip(folder / "plain.mp4", frames=26, size=(80, 48))
        demo = write_clip(tmp_path / "demo" / "demo99.mp4", frames=28, size=(96, 64))
        with first.ingest.starting():
            outcomes = sync_folder(first.ingest, folder)
            first.ingest.add_demo([SimpleNamespace(id="demo99", path=demo, title="a demo")])
        assert [o.status for o in outcomes] == ["added", "added"]
        asked = {c["path"].name: c["sidecar"] for c in reader.calls}
        assert asked == {"keeper.mp4": folder / "keeper.srt", "plain.mp4": None, "demo99.mp4": None}
        assert clip.exists()
    finally:
        first.close()
    again = make_predictor(tmp_path / "fresh", uploads="shared", persist=bucket)  # an empty data dir
    try:
        unused = again.ingest.words = ScriptedReader()
        assert again.ingest.restore() == 2
        assert unused.calls == []  # nothing read again
        hit = again.search("the lighthouse keeper counts ships", k=5).results[0]
        assert hit["video_id"] in ("folder:keeper.mp4", "folder:plain.mp4")
        assert hit["words"] and hit["words"][0]["text"] == "the lighthouse keeper counts ships"
    finally:
        again.close()


# ---------------------------------------------------- end to end: the API and MCP with a sidecar, the page
LINE = "the purple giraffe sings opera at midnight"
SRT = f"1\n00:00:01,000 --> 00:00:02,500\n{LINE}\n\n2\n00:00:03,000 --> 00:00:04,000\nthank you\n"


def test_the_api_takes_a_sidecar_and_a_query_naming_its_line_finds_the_video_first(served: tuple,
                                                                                   tmp_path: Path) -> None:
    from gradio_client import Client, handle_file

    from prvr.serve.page import card_html

    url = served[0]
    clip = write_clip(tmp_path / "opera night.mp4", frames=60, size=(80, 48))
    srt = tmp_path / "opera night.srt"
    srt.write_text(SRT)
    client = Client(url, verbose=False)
    added = client.predict(handle_file(str(clip)), "", handle_file(str(srt)), api_name="/add_video")
    assert added["status"] == "added", added
    added = joined_api(client, added)
    assert "subtitles" in added["words"]["sources"] and added["words"]["segments"] >= 2, added
    hits = client.predict("purple giraffe sings opera", 5, 0.7, api_name="/search")["results"]
    assert hits[0]["video_id"] == added["video_id"]
    line = hits[0]["words"][0]
    assert line["text"] == LINE and line["source"] == "subtitles"
    assert (line["start"], line["end"]) == (1.0, 2.5)
    card = card_html(hits[0], 0.7, (0.0, 1.0))  # the page draws the API's dict
    assert f"“{LINE}”" in card and 'data-t="1.00"' in card
    info = client.predict(api_name="/info")
    assert info["words"]["mode"] == "all" and "subtitles" in info["words"]["sources"]


def test_a_bad_subtitle_file_is_one_skipped_line_and_the_video_is_added(served: tuple, tmp_path: Path,
                                                                        capfd: pytest.CaptureFixture) -> None:
    from gradio_client import Client, handle_file

    clip = write_clip(tmp_path / "broken subs.mp4", frames=40, size=(64, 64))
    bad = tmp_path / "broken subs.srt"
    bad.write_bytes(b"\xff\xfe\x00garbage \x00\x01 not subtitles at all" * 10)
    client = Client(served[0], verbose=False)
    added = client.predict(handle_file(str(clip)), "", handle_file(str(bad)), api_name="/add_video")
    assert added["status"] == "added", added
    added = joined_api(client, added)
    assert any(s.startswith("subtitles") for s in added["words"]["skipped"]), added["words"]
    assert "Words skipped: subtitles" in added["message"]
    assert "Traceback" not in capfd.readouterr().err


def test_mcp_add_video_takes_a_sidecar_in_the_videos_forms(served: tuple, tmp_path: Path) -> None:
    import base64
    import json

    from tests.servers import call_mcp

    url, predictor, _ = served
    clip = write_clip(tmp_path / "sent.mp4", frames=44, size=(96, 48))
    video = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    sidecar = "data:text/plain;name=sent.srt;base64," + base64.b64encode(SRT.encode()).decode()
    outside = tmp_path / "secret.srt"
    outside.write_text(SRT)
    added, refused = call_mcp(url, ("add_video", {"video": video, "subtitles": sidecar}),
                              ("add_video", {"video": video, "subtitles": str(outside)}))
    assert not added.isError, added.content[0].text
    out = json.loads(added.content[0].text)  # a session upload (each MCP call is a session of its own)
    assert out["status"] == "added", out
    # its words joined with it, or follow it in that session (which no later call can see)
    assert out["words"]["segments"] >= 2 or out["words"]["state"] == "following", out
    assert refused.isError and "outside the allowed dirs" in refused.content[0].text  # the one path check
    # an allowed server path joins the shared gallery, with its sidecar: any later call finds it by its line
    allowed = Path(predictor.settings.mcp_allow_paths)
    shared = write_clip(allowed / "operator opera.mp4", frames=50, size=(72, 72))
    keeper = "the lighthouse keeper counts seven ships"
    (allowed / "operator opera.vtt").write_text(f"WEBVTT\n\n00:00:01.000 --> 00:00:02.500\n{keeper}\n")
    (added,) = call_mcp(url, ("add_video", {"video": str(shared), "subtitles": str(allowed /
                                                                                "operator opera.vtt")}))
    assert added.structuredContent["status"] == "added", added.content[0].text
    joined(predictor, added.structuredContent)  # its words joined (with it, or after it)
    (found,) = call_mcp(url, ("search", {"query": "lighthouse keeper counts seven ships", "top_k": 3}))
    first = found.structuredContent["results"][0]
    assert first["video_id"] == added.structuredContent["video_id"] and first["words"][0]["text"] == keeper


def test_the_page_says_words_follow_and_when_they_joined(served: tuple, tmp_path: Path) -> None:
    """Issue #43 item 4 on the page: an upload whose words take longer than its pictures shows, in its row
    of the upload table, that it is searchable and "words: 40 %", then (asked again each second) that its
    words joined; /info tells its session, not another."""
    from gradio_client import Client

    from tests.servers import PATIENCE_MS, choose_file
    from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, until

    if not Path(CHROMIUM).exists():
        pytest.skip("no chromium: install Debian's chromium package to run the browser test")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    url, predictor, _ = served
    gate, reader = threading.Event(), predictor.ingest.words
    predictor.ingest.words = ScriptedReader(text="the walrus recites a sonnet", gate=gate)
    clip = write_clip(tmp_path / "walrus.mp4", frames=40, size=(72, 48))
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.set_default_timeout(PATIENCE_MS)
            page.goto(url)
            page.get_by_role("tab", name="Add videos").click()
            page.get_by_role("button", name="Add to gallery").wait_for()  # the tab drawn, its inputs wired
            # (the box shows the name in two parts, "walrus" and ".mp4", laid out on two lines under load)
            choose_file(page, "#upload-files", clip)
            page.get_by_role("button", name="Add to gallery").click()
            row = page.locator("#upload-status table tr", has_text="walrus.mp4").first
            row.wait_for()
            following = "searchable now by its pictures, its words follow (words: 40 %)"
            assert until(lambda: following in row.inner_text()), row.inner_text()
            gate.set()
            joined_row = "then its words joined with 1 line of words (subtitles)"
            assert until(lambda: joined_row in row.inner_text()), row.inner_text()
            browser.close()
    finally:
        gate.set()
        predictor.ingest.words = reader
    from extract.decode import sha256_file

    others = Client(url, verbose=False).predict(api_name="/info")["words_follow"]  # another session's /info
    assert f"upload:{sha256_file(clip)[:12]}" not in [o["video_id"] for o in others]
