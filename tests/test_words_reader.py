"""The words reader: every source of a mode read for one video, in parallel, merged by time; every failure one
``skipped`` line, never an exception (issue #43 items 1 and 7); models loaded once per reader."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from extract.words import WordSegment
from extract.words.reader import WordsConfig, WordsReader, WordsReport
from extract.words.screen import OCR_MODEL, ScreenSettings
from tests.words_clips import FOOTAGE, NASA, SRT, VTT, bitmap_track, card_video, mux, need, write


@pytest.fixture
def talk(tmp_path):
    """Real footage with subrip and webvtt tracks, named talk.mkv."""
    return mux(tmp_path / "talk.mkv", need(FOOTAGE), [write(tmp_path / "a.srt", SRT),
                                                       write(tmp_path / "a.vtt", VTT)])


class Speech:
    """A stand-in for extract.words.speech (its interface): counts model loads, hears one line."""

    def __init__(self, audio: np.ndarray | None, heard: list[WordSegment] | Exception) -> None:
        self.module = types.ModuleType("extract.words.speech")
        self.module.decode_audio = lambda path, rate=16000: audio
        self.module.load_speech = self.load
        self.heard, self.loads = heard, []

    def load(self, weights=None, device=None):
        """load_speech: one recogniser."""
        self.loads.append((weights, device))
        outer = self

        class Recognizer:
            name, model = "pocketsphinx", "pocketsphinx 5.1.1 en-us"

            def transcribe(self, audio, rate=16000, progress=None):
                if isinstance(outer.heard, Exception):
                    raise outer.heard
                for fraction in (0.5, 1.0):
                    if progress:
                        progress(fraction)
                return list(outer.heard)

            def spent(self):
                return ""  # runs in process

        return Recognizer()


def test_subtitles_mode_reads_the_tracks_and_the_sidecar_beside_the_video(talk, tmp_path):
    # the sidecar repeats the subrip track's lines and adds one: each line once
    write(tmp_path / "talk.srt", SRT + "\n3\n00:00:05,000 --> 00:00:05,800\nFrom the sidecar\n")
    report = WordsReader(WordsConfig(mode="subtitles")).read(talk)
    assert [(s.start, s.text) for s in report.segments] == [
        (0.5, "Coolant & pressure"), (1.0, "The reactor is overheating"), (2.0, "Check gauge seven"),
        (3.0, "Open the valve on the left"), (5.0, "From the sidecar")]
    assert report.sources == ("subtitles",) and report.skipped == ()
    assert report.to_dict()["segments"][0] == {"source": "subtitles", "start": 0.5, "end": 1.5,
                                               "text": "Coolant & pressure", "score": 1.0}


def test_a_bad_sidecar_and_a_bitmap_track_are_skipped_lines_and_the_rest_is_read(tmp_path):
    video = bitmap_track(tmp_path / "film.mkv", need(FOOTAGE))
    bad = tmp_path / "upload.srt"
    bad.write_bytes(SRT.replace("valve", "vålve").encode("cp1252"))
    report = WordsReader(WordsConfig(mode="subtitles")).read(video, sidecar=bad)
    assert [s.text for s in report.segments] == ["The reactor is overheating", "Open the valve on the left"]
    assert report.skipped == (
        "subtitles: track 1 (dvdsub) holds pictures of text (a bitmap codec), not text; it cannot be read",
        "subtitles: sidecar upload.srt is not valid UTF-8 (byte 0xe5 at 109); save it as UTF-8")
    assert report.sources == ("subtitles",)


def test_a_file_that_is_no_video_is_a_skipped_line_not_an_exception(tmp_path):
    junk = write(tmp_path / "junk.mp4", "not a video")
    report = WordsReader(WordsConfig(mode="subtitles")).read(junk)
    assert report.segments == () and report.sources == ()
    assert len(report.skipped) == 1
    assert report.skipped[0].startswith("subtitles: subtitle tracks of junk.mp4 cannot be read (")


def test_lines_are_cut_to_the_videos_duration():
    report = WordsReader(WordsConfig(mode="subtitles")).read(need(NASA))
    assert report.segments[-1].text == "This half of the observatory element successfully"
    assert report.segments[-1].end == 13.0  # the track says 16.57 s; the pictures end at 13 s


def test_off_reads_nothing_and_says_so():
    reader = WordsReader(WordsConfig(mode="off"))
    assert reader.read(need(NASA)) == WordsReport()
    assert reader.describe() == {"mode": "off", "sources": [], "models": {}}


def test_a_mode_that_does_not_exist_is_one_line():
    with pytest.raises(ValueError, match=r"^words mode 'loud': expected one of off, subtitles, all$"):
        WordsConfig(mode="loud")


def test_all_sources_in_parallel_merged_by_time_the_speech_model_loaded_once(talk, monkeypatch):
    speech = Speech(np.zeros(16000, np.float32), [WordSegment("speech", 1.2, 2.0, "open the valve", 0.7)])
    monkeypatch.setitem(sys.modules, "extract.words.speech", speech.module)
    reader = WordsReader(WordsConfig(speech="pocketsphinx", device="cpu", screen=ScreenSettings(share=0.3)))
    assert reader.describe()["models"] == {"subtitles": "PyAV 18.1.0 (tracks), pysubs2 1.8.1 (sidecars)",
                                           "speech": "pocketsphinx (loaded with the first video)",
                                           "screen": OCR_MODEL}
    shown = []
    report = reader.read(talk, progress=shown.append)
    assert report.sources == ("subtitles", "speech", "screen") and report.skipped == ()
    assert [(s.source, s.text) for s in report.segments[:3]] == [
        ("subtitles", "Coolant & pressure"), ("subtitles", "The reactor is overheating"),
        ("speech", "open the valve")]
    assert shown == sorted(shown) and shown[-1] == 1.0 and len(shown) >= 2
    reader.read(talk)
    assert speech.loads == [("pocketsphinx", "cpu")]  # once per reader, not per video
    assert reader.describe()["models"]["speech"] == "pocketsphinx: pocketsphinx 5.1.1 en-us"


def test_no_audio_and_failing_speech_are_skipped_lines(tmp_path, monkeypatch):
    silent = card_video(tmp_path / "silent.mp4", None, seconds=2.0)
    speech = Speech(None, [])
    monkeypatch.setitem(sys.modules, "extract.words.speech", speech.module)
    config = WordsConfig(screen=ScreenSettings(share=0.1))
    report = WordsReader(config).read(silent)
    assert report.skipped == ("speech: the file has no audio",) and report.sources == ("subtitles", "screen")
    assert speech.loads == []  # no audio: the model is not even loaded

    from extract.words import WordsUnavailable

    speech = Speech(np.zeros(16000, np.float32), WordsUnavailable("audio of silent.mp4 cannot be decoded"))
    monkeypatch.setitem(sys.modules, "extract.words.speech", speech.module)
    report = WordsReader(config).read(silent)
    assert report.skipped == ("speech: audio of silent.mp4 cannot be decoded",)

    monkeypatch.setitem(sys.modules, "extract.words.speech", None)  # not installed: import fails
    reader = WordsReader(config)
    report = reader.read(silent)
    assert len(report.skipped) == 1
    assert report.skipped[0].startswith("speech: speech recognition is not installed")
    said = reader.describe()["models"]["speech"]
    assert said.startswith("unavailable: speech recognition is not installed")


def test_a_progress_callback_that_raises_stops_the_read(talk):
    class Stop(Exception):
        """The caller gave up (a closed page)."""

    def stop(fraction: float) -> None:
        raise Stop

    with pytest.raises(Stop):
        WordsReader(WordsConfig(mode="subtitles")).read(talk, progress=stop)
