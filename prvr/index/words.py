"""The words channel: a video's timed text (``extract.words.WordSegment``: subtitles, speech, text on screen)
stored beside its pictures, and matched against a query two ways.

Stored (``schema.WORDS``, per video, ``encode_words``): each segment's text embedded by the profile's text
model and the model's own query encoding (``model.encode_queries``, as a query is), as a unit vector
(float16) with its reference-bank statistics (``prvr.temporal.hubness.bank_stats``), its seconds, source,
recogniser score and the text itself (UTF-8 bytes).

Matched (``match_words``, one query over a gallery's ``WordsTable``s):

- dense: the query vector's cosine with the segment's vector, as a z-score among the reference bank's
  cosines with that segment (a line close to every everyday caption is no evidence), mapped onto [0, 1]
  between ``DENSE_Z_FLOOR`` and ``DENSE_Z_FULL`` (0 without a bank: a raw cosine means something else for
  every model);
- lexical (only with the query's text: ``Gallery.rank(..., text=...)``): the query's content terms
  (``terms``: NFKC, case-folded, a plural ``s`` dropped; ``STOP_WORDS`` ignored) found exactly among the
  segment's, weighted by their rarity among the gallery's live segments (IDF, ``log(1 + N / (1 + df))``): the
  ``coverage`` is the matched share of the query's weight, 1 when the segment holds every content term.
  Names and numbers must match exactly: a query term with a digit ("Q3", "2024") or written as a name
  (a capital past the query's first character: "NASA", "Webb" inside a query) is ``required``; a segment
  missing one scores 0 on both parts, so "Q3 revenue 2024" never matches "Q4 revenue 2023" however close
  their vectors are. Rare words weigh the most in the coverage, so a line lacking them cannot reach it.

A segment's score is ``max(coverage, dense)``; it is a match at ``WORDS_MATCH`` or above. A video's words
score is its best matched segment's (0: none); ``prvr.index.evidence.best_first`` puts every video with a
words score ahead of those matched only by pictures, by that score (then by total): a line that says what
was asked is direct, checkable evidence, while the pictures are read through a proxy of the query
(benchmarks/RESULTS.md: on held-back real video the right video is first for half the queries). A gallery
with no words pays nothing: its stores answer ``words()`` with None, and ranking is what it was.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from extract.words.segment import SOURCES, WordSegment
from prvr.temporal.hubness import bank_stats

WORDS_MATCH = 0.5  # a segment scoring at least this matches the query (its video ranks by its words)
DENSE_Z_FLOOR = 2.0  # the dense part is 0 up to this z-score among the reference bank's cosines...
DENSE_Z_FULL = 6.0  # ... and 1 from this one (linear between)
MAX_LINES = 5  # matched segments kept per video (best first)
# A speech line holding none of the query's content terms matches by its dense part alone only from this
# dense score (speech is recognised, inexact: a line of only "that", or garbled words, sits close to many
# captions); 0: as any other line, at WORDS_MATCH; above 1: never (a shared content term is required).
# Decided on the words dev set's tuning half (benchmarks.words_decisions, rule 3; benchmarks/RESULTS.md,
# issue #43, Session 19).
SPEECH_DENSE_ALONE = math.inf  # never: a speech line must share a content term with the query
# text recognised on screen often comes back with its spaces dropped ("Quarterlyrevenuegrew12percent"); in a
# screen line with a token this long, a query term of at least GLUED_TERM characters is also found inside it
GLUED_TOKEN = 14
GLUED_TERM = 4
ENCODE_BATCH = 256  # segments encoded at once

SPEECH = SOURCES.index("speech")
_TOKEN = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*")


def _stem(token: str) -> str:
    """A case-folded token with a possessive dropped and a plural ``s`` dropped (not ``ss``; words of four
    letters or more, letters only): "rooms" and "room" match, "2024s" stays."""
    token = re.sub(r"['\u2019]s$", "", token).replace("\u2019", "'")
    if len(token) > 3 and token.isalpha() and token.endswith("s") and not token.endswith("ss"):
        token = token[:-1]
    return token


# English words that carry no content, and the words queries use to frame what is said or written ("when
# she says", "the slide about"): never matched, never weighed (kept in ``_stem`` form)
STOP_WORDS = frozenset(_stem(w) for w in """
a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not
now of off on once only or other our ours ourselves out over own same she should so some such than that
the their theirs them themselves then there these they this those through to too under until up very was
we were what when where which while who whom why will with would you your yours yourself yourselves
say says said saying tell tells told talk talks talking speak speaks speaking mention mentions mentioned
word words line lines show shows shown showing written write writes video clip moment scene part someone
somebody something one
""".split())


def terms(text: str) -> list[str]:
    """The content terms of a text, in order (see the module docstring)."""
    words = (_stem(t.casefold()) for t in _TOKEN.findall(unicodedata.normalize("NFKC", text)))
    return [w for w in words if w and w not in STOP_WORDS]


@dataclass(frozen=True)
class QueryTerms:
    """A query's content terms, each with whether it must match exactly (a name or a number)."""

    terms: tuple[str, ...]
    required: frozenset[str]

    @classmethod
    def of(cls, text: str) -> QueryTerms:
        """The query's distinct content terms; names (a capital past the text's first character) and
        numbers (a digit) required."""
        text = unicodedata.normalize("NFKC", text)
        out, required = [], set()
        for match in _TOKEN.finditer(text):
            raw = match.group()
            term = _stem(raw.casefold())
            if not term or term in STOP_WORDS:
                continue
            named = any(c.isupper() for c in (raw if match.start() > 0 else raw[1:]))
            if named or any(c.isdigit() for c in raw):
                required.add(term)
            if term not in out:
                out.append(term)
        return cls(tuple(out), frozenset(required))


@dataclass(frozen=True)
class WordMatch:
    """One segment of a video's words that matched a query, with how (``score`` = max(coverage, dense))."""

    source: str  # extract.words.SOURCES
    start: float  # seconds
    end: float
    text: str
    score: float  # the segment's words score, >= WORDS_MATCH
    coverage: float  # the IDF-weighted share of the query's content terms it holds (0 without the text)
    dense: float  # its dense part in [0, 1]
    recognised: float = 1.0  # the recogniser's confidence (1 for subtitles)

    def to_dict(self) -> dict:
        """What a result lists: {"source", "start", "end", "text", "score"} (rounded)."""
        return {"source": self.source, "start": round(self.start, 3), "end": round(self.end, 3),
                "text": self.text, "score": round(self.score, 6)}


@dataclass(frozen=True)
class VideoWords:
    """A video's matched segments for one query, best first, and its words score (the best one's)."""

    score: float
    lines: tuple[WordMatch, ...]


# ---------------------------------------------------------------------------------------------- storing


def no_words(width: int) -> dict[str, np.ndarray]:
    """The words arrays of a video without words (``schema.WORDS``), for vectors of ``width``."""
    return {"words_vec": np.zeros((0, width), np.float16), "words_bank": np.zeros((0, 2), np.float32),
            "words_start": np.zeros(0, np.float32), "words_end": np.zeros(0, np.float32),
            "words_score": np.zeros(0, np.float32), "words_source": np.zeros(0, np.int8),
            "words_len": np.zeros(0, np.int32), "words_text": np.zeros(0, np.uint8)}


TextEncoder = Callable[[list[str]], Sequence[np.ndarray]]  # texts -> token features (L, Dq) each (extract's)


def encode_words(model, segments: Sequence[WordSegment], text_encoder: TextEncoder, width: int,
                 bank: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """One video's words arrays (``schema.WORDS``): each segment's text through ``text_encoder`` and
    ``model.encode_queries`` as a unit vector (float16), with its bank statistics against the reference
    bank's (R, H) vectors (zeros without one), times, score, source and UTF-8 text."""
    if not segments:
        return no_words(width)
    texts = [s.text for s in segments]
    vectors = []
    for a in range(0, len(texts), ENCODE_BATCH):
        tokens = text_encoder(texts[a:a + ENCODE_BATCH])
        with torch.no_grad():
            q = model.encode_queries([np.asarray(t, np.float32) for t in tokens])
        q = getattr(q, "vectors", q)
        vectors.append(q.detach().float().cpu().numpy() if isinstance(q, torch.Tensor) else np.asarray(q))
    v = np.concatenate(vectors).astype(np.float64)
    v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    stored = v.astype(np.float16)
    stats = (bank_stats(stored.astype(np.float32), bank) if bank is not None and len(bank) >= 2
             else np.zeros((len(stored), 2), np.float32))
    raw = [s.text.encode("utf-8") for s in segments]
    return {"words_vec": stored, "words_bank": stats,
            "words_start": np.array([s.start for s in segments], np.float32),
            "words_end": np.array([s.end for s in segments], np.float32),
            "words_score": np.array([s.score for s in segments], np.float32),
            "words_source": np.array([SOURCES.index(s.source) for s in segments], np.int8),
            "words_len": np.array([len(b) for b in raw], np.int32),
            "words_text": np.frombuffer(b"".join(raw), np.uint8).copy()}


# ---------------------------------------------------------------------------------------------- reading


class WordsTable:
    """Every word segment of some videos, ready to match: the stored arrays of a run of videos (a built-in
    segment's, or a Qdrant gallery's), with each segment's video (``video``: the videos' local numbers),
    float32 vectors, texts and an inverted index of their terms (term -> sorted segment rows)."""

    def __init__(self, video: np.ndarray, arrays: Mapping[str, np.ndarray]) -> None:
        """``video`` (W,) int64: each segment's video; ``arrays``: the ``schema.WORDS`` arrays, concatenated
        in the same order."""
        self.video = np.asarray(video, np.int64)
        self.vectors = np.asarray(arrays["words_vec"], np.float32)
        self.bank = np.asarray(arrays["words_bank"], np.float32)
        self.start = np.asarray(arrays["words_start"], np.float64)
        self.end = np.asarray(arrays["words_end"], np.float64)
        self.recognised = np.asarray(arrays["words_score"], np.float64)
        self.source = np.asarray(arrays["words_source"], np.int64)
        data = np.asarray(arrays["words_text"], np.uint8).tobytes()
        ends = np.cumsum(np.asarray(arrays["words_len"], np.int64)).tolist()
        self.texts = [data[a:b].decode("utf-8", "replace")
                      for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        postings: dict[str, list[int]] = {}
        screen = SOURCES.index("screen")
        self.glued: dict[int, str] = {}  # screen rows read without spaces -> their letters, case-folded
        for row, text in enumerate(self.texts):
            found = terms(text)
            for term in set(found):
                postings.setdefault(term, []).append(row)
            if self.source[row] == screen and any(len(t) >= GLUED_TOKEN for t in found):
                self.glued[row] = "".join(_TOKEN.findall(unicodedata.normalize("NFKC", text).casefold()))
        self.index = {t: np.array(rows, np.int64) for t, rows in postings.items()}

    def rows_of(self, term: str) -> np.ndarray | None:
        """The rows holding ``term``: as a word, or (a number, or a term of GLUED_TERM characters or more)
        inside a screen line read without its spaces."""
        rows = self.index.get(term)
        number = any(c.isdigit() for c in term)
        if not self.glued or not number and len(term) < GLUED_TERM:
            return rows
        # a number must not run into other digits there ("12" is not inside "2012")
        pattern = re.compile(rf"(?<!\d){re.escape(term)}(?!\d)" if number else re.escape(term))
        inside = [row for row, letters in self.glued.items() if pattern.search(letters)]
        if not inside:
            return rows
        return np.union1d(rows if rows is not None else np.zeros(0, np.int64), np.array(inside, np.int64))

    def __len__(self) -> int:
        return len(self.video)

    @classmethod
    def of_videos(cls, arrays: Mapping[str, np.ndarray], counts: np.ndarray) -> WordsTable | None:
        """The table of a run of videos whose segments the arrays hold (``counts`` (V,) per video), None when
        they hold none."""
        counts = np.asarray(counts, np.int64)
        if not counts.sum():
            return None
        return cls(np.repeat(np.arange(len(counts)), counts), arrays)


@dataclass(frozen=True)
class Words:
    """A view's word segments: tables, each with the view id of each of its videos (by local number) and
    which of its segments belong to live videos."""

    tables: tuple[tuple[WordsTable, np.ndarray, np.ndarray], ...]  # (table, (V,) int64 ids, (W,) bool live)


def _dense(table: WordsTable, unit: np.ndarray) -> np.ndarray:
    """(W,) the dense part of every segment of a table for the unit query (module docstring)."""
    cos = np.einsum("wh,h->w", table.vectors, unit).astype(np.float64)
    mean, std = table.bank[:, 0].astype(np.float64), table.bank[:, 1].astype(np.float64)
    z = np.where(std > 0, (cos - mean) / np.maximum(std, 1e-12), -np.inf)
    return np.clip((z - DENSE_Z_FLOOR) / (DENSE_Z_FULL - DENSE_Z_FLOOR), 0.0, 1.0)


def match_words(words: Words, q: np.ndarray, text: str | None = None) -> dict[int, VideoWords]:
    """The videos (view ids) with a segment matching the query: the (H,) query vector, and the query's text
    for the lexical part (None: dense only); see the module docstring."""
    unit = np.asarray(q, np.float64).reshape(-1)
    unit = (unit / max(float(np.linalg.norm(unit)), 1e-12)).astype(np.float32)
    query = QueryTerms.of(text) if text is not None else None
    weight: dict[str, float] = {}
    if query is not None and query.terms:
        live = sum(int(alive.sum()) for _, _, alive in words.tables)
        for term in query.terms:
            df = sum(int(alive[rows].sum()) for t, _, alive in words.tables
                     if (rows := t.rows_of(term)) is not None)
            weight[term] = math.log1p(live / (1 + df))
    total = sum(weight.values())
    found: dict[int, list[WordMatch]] = {}
    for table, ids, alive in words.tables:
        dense = _dense(table, unit)
        coverage, held = np.zeros(len(table)), np.zeros(len(table), np.int64)
        ok = alive.copy()
        for term, w in weight.items():
            rows = table.rows_of(term)
            if rows is not None:
                coverage[rows] += w / total
                held[rows] += 1
            if query is not None and term in query.required:
                has = np.zeros(len(table), bool)
                if rows is not None:
                    has[rows] = True
                ok &= has
        # a segment holding every content term covers exactly 1 (not a float sum's 0.999...)
        coverage = np.where((held == len(weight)) & bool(weight), 1.0, np.minimum(coverage, 1.0))
        if query is not None:  # a speech line sharing no content term: its dense part alone must reach this
            alone = (table.source == SPEECH) & (held == 0)
            ok &= ~alone | (dense >= SPEECH_DENSE_ALONE)
        score = np.where(ok, np.maximum(coverage, dense), 0.0)
        for row in np.flatnonzero(score >= WORDS_MATCH).tolist():
            found.setdefault(int(ids[table.video[row]]), []).append(WordMatch(
                SOURCES[int(table.source[row])], float(table.start[row]), float(table.end[row]),
                table.texts[row], float(score[row]), float(coverage[row]), float(dense[row]),
                float(table.recognised[row])))
    out = {}
    for video, lines in found.items():
        lines.sort(key=lambda m: (-m.score, m.start))
        out[video] = VideoWords(lines[0].score, tuple(lines[:MAX_LINES]))
    return out
