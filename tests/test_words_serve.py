"""Issue #43 at the serving layer: every way in reads a video's words, the page, the API and MCP show them
(``prvr.serve.ingest.WordsRun``, ``prvr.serve.page.words_html``, ``--words``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
    from prvr.serve.page import card_html, words_html

    card = card_html(a_result([SUBTITLE, SAID], key_from="words"), 0.7, (0.0, 1.0))
    lines = re.findall(r'<button class="line" data-t="([\d.]+)"[^>]*>(.*?)</button>', card)
    assert [t for t, _ in lines] == ["31.00", "65.00"]  # best first; each seeks its start (SEEK_JS: data-t)
    assert "“Q3 revenue”" in lines[0][1] and "subtitles 0:31-0:34" in lines[0][1]
    assert "said 1:05-1:10" in lines[1][1] and "&lt;overheating&gt;" in lines[1][1]  # escaped, never markup
    assert "<overheating>" not in card
    # the strip marks each line's time (a click seeks there too); the key moment says it came from the words
    marks = re.findall(r'<rect class="word" data-t="([\d.]+)" x="([\d.]+)"', card)
    assert marks == [("31.00", "258.3"), ("65.00", "541.7")]
    assert "★ key moment (words)" in card and "teal marks" in card
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
    from prvr.serve.settings import AppSettings

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
