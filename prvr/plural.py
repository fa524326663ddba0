"""Numbers in words for logs and messages: "1 video", "2 videos" (the lowest layer: any module may use it)."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun in the number it needs: ``counted(1, "video")`` -> "1 video", ``counted(3,
    "video")`` -> "3 videos"; ``plural``: an irregular plural (``counted(2, "entry", "entries")``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
