"""The words in a video: subtitle tracks and sidecar files, speech, text on screen, as timed segments."""

from extract.words.segment import SOURCES, WordSegment, WordsUnavailable

__all__ = ["SOURCES", "WordSegment", "WordsUnavailable"]
