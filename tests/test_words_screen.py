"""Text on screen as words: RapidOCR on real footage with a caption card rendered onto it at test time (issue
#43 item 1): the text and the times it is on screen are read; footage without text gives nothing."""

from __future__ import annotations

import re

import pytest

from extract.words.screen import Ocr, Scene, ScreenSettings, _merge, _thinned, choose, scenes, screen_text
from tests.words_clips import card_video

CAPTION = "Quarterly revenue grew 12 percent"


@pytest.fixture(scope="module")
def ocr() -> Ocr:
    """The OCR engine, loaded once for the module."""
    return Ocr()


@pytest.fixture(scope="module")
def card(tmp_path_factory) -> object:
    """6 s of real footage with the caption on screen from 2 s to 4 s."""
    return card_video(tmp_path_factory.mktemp("screen") / "card.mp4", CAPTION)


def letters(text: str) -> str:
    """Letters and digits, case folded (OCR of compressed frames may drop the spaces between words)."""
    return re.sub(r"\W+", "", text.casefold())


def test_a_caption_on_real_footage_is_read_with_the_times_it_is_on_screen(card, ocr):
    found = screen_text(card, ScreenSettings(share=3.0), ocr)  # a budget that reads every scene
    assert [letters(s.text) for s in found] == [letters(CAPTION)]
    (caption,) = found
    assert caption.source == "screen" and caption.score >= 0.85
    # on screen from 2.0 s to 4.0 s; change detection samples every 0.5 s (at 0.25, 0.75, ...)
    assert 2.0 <= caption.start <= 2.5 and 4.0 <= caption.end <= 4.5


def test_scenes_start_where_the_caption_comes_and_goes(card):
    starts = [scene.start for scene in scenes(card)]
    assert starts[0] == 0.0
    assert any(2.0 <= t <= 2.5 for t in starts) and any(4.0 <= t <= 4.5 for t in starts)
    assert all(b - a >= ScreenSettings().min_gap_s for a, b in zip(starts, starts[1:], strict=False))


def test_footage_without_text_gives_nothing(tmp_path, ocr):
    plain = card_video(tmp_path / "plain.mp4", None, seconds=4.0)
    assert screen_text(plain, ScreenSettings(share=3.0), ocr) == []


def test_the_frame_budget_is_a_share_of_the_duration():
    settings = ScreenSettings(share=0.5, seconds_per_frame=1.5)
    assert settings.budget(60.0) == 20 and settings.budget(2.0) == 1  # at least one frame


def test_over_budget_every_part_of_the_video_is_visited_and_long_scenes_first():
    short = [Scene(float(t), t + 1.0, t + 0.5) for t in range(10)]  # ten 1 s scenes
    assert choose(short, 3) == [1, 5, 8]  # under 1.67, 5.0, 8.33 s: not the first three
    mixed = [Scene(0.0, 1.0, 0.5), Scene(1.0, 9.0, 5.0), Scene(9.0, 10.0, 9.5), Scene(10.0, 10.5, 10.2)]
    assert choose(mixed, 2) == [0, 1]  # both evenly spaced times fall in the long scene, then the longest
    assert choose(mixed, 3) == [0, 1, 2]  # other (the earlier of equals)
    assert choose(mixed, 4) == [0, 1, 2, 3]


def test_ocr_slower_than_planned_reads_fewer_frames_not_longer(card, ocr):
    class Counted(Ocr):
        """The same engine, its reads counted."""

        def __init__(self) -> None:
            self.__dict__.update(ocr.__dict__)
            self.frames = 0

        def read(self, rgb):
            self.frames += 1
            return super().read(rgb)

    counted = Counted()
    # planned: every scene (a frame "costs" 0.1 ms); allowed: 0.06 s of OCR for 6 s of video; one frame is
    # always read, and it takes longer than that
    screen_text(card, ScreenSettings(share=0.01, seconds_per_frame=0.0001), counted)
    assert counted.frames == 1


def test_frames_left_are_thinned_evenly_over_the_rest_of_the_video():
    # 10 planned, frame 0 read in 1 s, 3 s left: 3 of the 9 ahead, spread (not the next three)
    assert _thinned(set(range(10)), 0, 10, 3.0, 1.0) == {0, 2, 5, 8}
    assert _thinned(set(range(10)), 0, 10, 20.0, 1.0) == set(range(10))  # on pace: all
    assert _thinned({0, 2, 5, 8}, 2, 10, 0.5, 1.0) == {0, 2}  # out of time: nothing more


def test_a_line_is_one_segment_while_read_in_scenes_next_to_each_other():
    read = [Scene(0.0, 2.0, 1.0), Scene(2.0, 3.0, 2.5), Scene(5.0, 6.0, 5.5)]  # scene 2 (3-5 s) was not read
    lines = [[("Q3 revenue", 0.9), ("口", 0.99)], [("q3 Revenue", 0.97), ("Thanks", 0.9)],
             [("Q3 revenue", 0.95)]]
    assert [(s.start, s.end, s.text, s.score) for s in _merge(read, [0, 1, 3], lines)] == [
        (0.0, 3.0, "Q3 revenue", 0.97),  # the same letters in scenes 0 and 1: one segment, its best score
        (2.0, 3.0, "Thanks", 0.9),
        (5.0, 6.0, "Q3 revenue", 0.95),  # again after an unread scene: a new segment
    ]  # "口" alone: an icon, dropped


def test_settings_out_of_range_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^screen min_score 1.5: expected a value in \[0, 1\]$"):
        ScreenSettings(min_score=1.5)
    with pytest.raises(ValueError, match=r"^screen share 0: expected a positive number$"):
        ScreenSettings(share=0)
