"""A timed piece of text a video says or shows: the one record every words source produces and every
later layer (the gallery's words channel, results, the page) reads."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# where a segment's text comes from: a subtitle track or sidecar file (exact), speech recognition, or text
# recognised on screen (OCR); the order is the order the page lists sources in
SOURCES = ("subtitles", "speech", "screen")


class WordsUnavailable(Exception):
    """One source of words cannot be read for this video (a corrupt subtitle file, undecodable audio, an
    unknown codec): its message is the one line the upload's report shows; the video is still indexed."""


@dataclass(frozen=True)
class WordSegment:
    """Text heard or seen in [start, end) seconds of a video, from one source, with the recogniser's
    confidence (1.0 for subtitles: their text is exact)."""

    source: str  # one of SOURCES
    start: float  # seconds
    end: float  # seconds
    text: str
    score: float = 1.0  # the recogniser's confidence in [0, 1]

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"word segment source {self.source!r}: expected one of {', '.join(SOURCES)}")
        if not (math.isfinite(self.start) and math.isfinite(self.end) and 0 <= self.start <= self.end):
            raise ValueError(f"word segment [{self.start}, {self.end}): "
                             "times must be finite with 0 <= start <= end")
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"word segment score {self.score}: expected a value in [0, 1]")

    def to_dict(self) -> dict:
        """JSON-able: source, start, end, text, score."""
        return asdict(self)
