"""Subtitles as words: real subtitle tracks (the NASA clip's mov_text; subrip, webvtt and ass tracks muxed
into real footage at test time), sidecar files, every bad input giving one line (issue #43 items 1, 7)."""

from __future__ import annotations

import codecs

import pytest

from extract.words import WordSegment, WordsUnavailable
from extract.words.subtitles import find_sidecar, plain_text, read_sidecar, subtitle_tracks
from tests.words_clips import ASS, FOOTAGE, NASA, SRT, VTT, bitmap_track, mov_text_mp4, mux, need, write


def lines(segments: list[WordSegment]) -> list[tuple[float, float, str]]:
    """(start, end, text) of each segment."""
    assert all(s.source == "subtitles" and s.score == 1.0 for s in segments)
    return [(s.start, s.end, s.text) for s in segments]


def test_the_nasa_clips_mov_text_track_is_read_with_its_times():
    # the clip has two identical English mov_text tracks (one per video rendition): each line once
    assert lines(subtitle_tracks(need(NASA))) == [
        (0.21, 4.26, "NAR: This is the optical and science segment of the Webb"),
        (4.26, 8.35, "space telescope in one of the largest cleanrooms in the world"),
        (8.35, 12.47, "at NASA’s Goddard Space Flight Center in Greenbelt, Maryland."),
        (12.47, 16.57, "This half of the observatory element successfully"),
    ]


def test_subrip_webvtt_and_ass_tracks_muxed_into_real_footage_are_read_without_their_styling(tmp_path):
    files = [write(tmp_path / "a.srt", SRT), write(tmp_path / "a.vtt", VTT), write(tmp_path / "a.ass", ASS)]
    video = mux(tmp_path / "talk.mkv", need(FOOTAGE), files)
    assert lines(subtitle_tracks(video)) == [
        (0.5, 1.5, "Coolant & pressure"),  # webvtt: the voice tag and the entity decoded
        (1.0, 2.0, "Quarterly revenue up twelve percent"),  # ass: override tags, \N
        (1.0, 2.5, "The reactor is overheating"),  # subrip: <i>
        (2.0, 3.25, "Check gauge seven"),
        (3.0, 4.0, "Open the valve on the left"),  # two rows, one line
        (4.0, 5.5, "Thank you"),  # ass: \pos, colour and a vector drawing dropped
    ]


def test_a_video_without_subtitle_tracks_gives_no_lines():
    assert subtitle_tracks(need(FOOTAGE)) == []


def test_a_mov_text_line_that_is_not_utf8_is_skipped_and_said(tmp_path):
    video = mov_text_mp4(tmp_path / "cafe.mp4", [(1.0, 2.0, "Café au lait".encode()),
                                                 (3.5, 1.0, "Café noir".encode("cp1252"))])
    with pytest.raises(WordsUnavailable, match=r"^track 1 \(mov_text\): skipped 1 damaged or non-UTF-8 "
                                               r"line$"):
        subtitle_tracks(video)
    said = []
    assert lines(subtitle_tracks(video, on_skip=said.append)) == [(1.0, 3.0, "Café au lait")]
    assert said == ["track 1 (mov_text): skipped 1 damaged or non-UTF-8 line"]


def test_a_bitmap_track_is_refused_by_name_and_the_text_track_beside_it_is_read(tmp_path):
    video = bitmap_track(tmp_path / "dvd.mkv", need(FOOTAGE))
    with pytest.raises(WordsUnavailable, match=r"^track 1 \(dvdsub\) holds pictures of text"):
        subtitle_tracks(video)
    said = []
    assert [t for _, _, t in lines(subtitle_tracks(video, on_skip=said.append))] == [
        "The reactor is overheating", "Open the valve on the left"]
    assert said == ["track 1 (dvdsub) holds pictures of text (a bitmap codec), not text; it cannot be read"]


def test_a_subtitle_codec_ffmpeg_does_not_know_is_refused_by_track(tmp_path):
    video = mux(tmp_path / "talk.mkv", need(FOOTAGE), [write(tmp_path / "a.srt", SRT),
                                                       write(tmp_path / "a.vtt", VTT)])
    unknown = tmp_path / "unknown.mkv"
    data = video.read_bytes()
    assert data.count(b"S_TEXT/UTF8") == 1
    unknown.write_bytes(data.replace(b"S_TEXT/UTF8", b"S_TEXT/ZZZZ"))  # a codec id no FFmpeg knows
    said = []
    assert [t for _, _, t in lines(subtitle_tracks(unknown, on_skip=said.append))] == [
        "Coolant & pressure", "Check gauge seven"]
    assert said == ["track 1 (unknown codec) has a subtitle codec this FFmpeg does not know; "
                    "it cannot be read"]


def test_a_file_that_is_not_media_is_one_line(tmp_path):
    junk = write(tmp_path / "junk.mp4", "not a video at all")
    with pytest.raises(WordsUnavailable, match=r"^subtitle tracks of junk.mp4 cannot be read \(.+\)$"):
        subtitle_tracks(junk)


@pytest.mark.parametrize(("encoding", "bom"), [("utf-8", b""), ("utf-8", codecs.BOM_UTF8),
                                               ("utf-16-le", codecs.BOM_UTF16_LE),
                                               ("utf-16-be", codecs.BOM_UTF16_BE)])
def test_a_sidecar_srt_in_utf8_or_with_a_byte_order_mark_is_read(tmp_path, encoding, bom):
    path = tmp_path / "talk.srt"
    path.write_bytes(bom + SRT.replace("reactor", "réacteur").encode(encoding))
    assert lines(read_sidecar(path)) == [(1.0, 2.5, "The réacteur is overheating"),
                                         (3.0, 4.0, "Open the valve on the left")]


def test_a_sidecar_vtt_is_read_without_markup(tmp_path):
    assert lines(read_sidecar(write(tmp_path / "talk.vtt", VTT))) == [(0.5, 1.5, "Coolant & pressure"),
                                                                       (2.0, 3.25, "Check gauge seven")]


@pytest.mark.parametrize(("name", "content", "reason"), [
    ("talk.srt", SRT.replace("reactor", "réacteur").encode("cp1252"),
     r"^sidecar talk.srt is not valid UTF-8 \(byte 0xe9 at \d+\); save it as UTF-8$"),
    ("talk.srt", b"", r"^sidecar talk.srt is empty$"),
    ("talk.vtt", b"  \n\n", r"^sidecar talk.vtt is empty$"),
    ("talk.vtt", codecs.BOM_UTF8 + b"\n", r"^sidecar talk.vtt is empty$"),
    ("talk.srt", b"just some notes, no cues\n", r"^sidecar talk.srt has no timed subtitle lines; is it a SRT "
                                                r"file\?$"),
    ("talk.srt", bytes(range(256)) * 4, r"^sidecar talk.srt is not valid UTF-8"),
    ("talk.txt", SRT.encode(), r"^sidecar talk.txt: not a subtitle file \(expected .srt or .vtt\)$"),
])
def test_a_bad_sidecar_is_one_line_saying_why(tmp_path, name, content, reason):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(WordsUnavailable, match=reason):
        read_sidecar(path)


def test_a_missing_sidecar_is_one_line(tmp_path):
    with pytest.raises(WordsUnavailable, match=r"^sidecar gone.srt cannot be read \(No such file"):
        read_sidecar(tmp_path / "gone.srt")


def test_the_sidecar_beside_a_video_is_found_by_its_stem(tmp_path):
    video = write(tmp_path / "talk.mp4", "x")
    assert find_sidecar(video) is None
    write(tmp_path / "talk.vtt", VTT)
    assert find_sidecar(video) == tmp_path / "talk.vtt"
    write(tmp_path / "talk.SRT", SRT)  # srt first; the suffix's case does not matter
    assert find_sidecar(video) == tmp_path / "talk.SRT"
    write(tmp_path / "Talk.srt", SRT)  # another stem
    assert find_sidecar(tmp_path / "Talk.mkv") == tmp_path / "Talk.srt"
    assert find_sidecar(tmp_path / "other.mp4") is None


def test_plain_text_strips_styling_but_keeps_words():
    assert plain_text(r"{\an8}{\fad(200,200)}Top {\i1}line{\i0}\Nsecond\hrow") == "Top line second row"
    assert plain_text(r"a {\p2}m 0 0 l 5 5{\p0}b") == "a b"
    assert plain_text("<font color=\"red\">x</font> < y > z <00:00:01.000>now") == "x < y > z now"
    assert plain_text("fish &amp; chips", entities=True) == "fish & chips"
    assert plain_text("fish &amp; chips") == "fish &amp; chips"  # SRT text is literal
