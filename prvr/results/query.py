"""Input validation of the search path: the query text (``k`` and the weights: ``prvr.index.query``).

``clean_query``: text (or bytes) -> the text that is searched, with what was changed. Bytes must be UTF-8
(anything else is refused: guessing an encoding would search for mojibake); control and format characters
become spaces, whitespace runs collapse, and text longer than ``MAX_QUERY_CHARS`` is cut at the last word
boundary before the cap (the result metadata says so). An empty query is refused.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from prvr.index import QueryError

MAX_QUERY_CHARS = 500  # longer queries are cut (text backbones keep ~64 tokens anyway)
_CONTROL = ("Cc", "Cf", "Cs", "Co")  # control, format, surrogate, private-use characters become spaces


@dataclass(frozen=True)
class CleanQuery:
    """The text that is searched and what cleaning did to the input."""

    text: str
    original_chars: int
    truncated: bool
    replaced_controls: int

    def to_dict(self) -> dict:
        """JSON-able metadata for the response."""
        return {"text": self.text, "original_chars": self.original_chars, "truncated": self.truncated,
                "replaced_controls": self.replaced_controls, "max_chars": MAX_QUERY_CHARS}


def clean_query(query: str | bytes) -> CleanQuery:
    """Validate and normalise a text query (see the module docstring for the rules)."""
    if isinstance(query, bytes | bytearray):
        try:
            query = bytes(query).decode("utf-8")
        except UnicodeDecodeError as e:
            raise QueryError(f"the query is not valid UTF-8 text (bad byte 0x{query[e.start]:02x} at "
                             f"position {e.start}); send UTF-8 encoded text") from None
    if not isinstance(query, str):
        raise QueryError(f"a query must be text, got {type(query).__name__}")
    original = len(query)
    text = unicodedata.normalize("NFC", query)
    controls = sum(1 for ch in text if unicodedata.category(ch) in _CONTROL and not ch.isspace())
    text = "".join(" " if unicodedata.category(ch) in _CONTROL else ch for ch in text)
    text = re.sub(r"\s+", " ", text).strip()
    if not text:
        raise QueryError("the query is empty: type a few words describing the moment you are looking for")
    truncated = len(text) > MAX_QUERY_CHARS
    if truncated:
        cut = text[:MAX_QUERY_CHARS]
        space = cut.rfind(" ")
        text = (cut[:space] if space > MAX_QUERY_CHARS // 2 else cut).strip()
    return CleanQuery(text=text, original_chars=original, truncated=truncated, replaced_controls=controls)
