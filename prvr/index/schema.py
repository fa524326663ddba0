"""What a gallery stores per video, declared once for both backends: the schema version, the record fields and
the per-video arrays. Every writer and reader takes their names from here.

``encode_for_index`` (``prvr.index.encoding``) produces the arrays; the built-in index writes them into
segments (``prvr.index.store``) and reads them through a ``Snapshot``; the Qdrant backend packs them into each
point's payload (``prvr.index.qdrant_store``); ``prvr.index.scoring`` reads them, through the ``VideoArrays``
interface, into exact scores and ``VideoEvidence`` (whose fields carry the same names). A ``fixed`` array has
one row per video; a ragged one holds a variable number of rows per video, with their count stored under
``count``. ``EXACT`` are what exact scores read (every scored video), the rest only what a hit's evidence
reads (the k winners).

Sizes for H = 384, M = 32 clip units, P = 528 proposals, L frames, r <= L the rank of a video's
frame-scale features, n raw rows, n' fine rows, F context rows, R reference queries: ``docs/design.md``.
"""

from __future__ import annotations

from typing import NamedTuple

# 11: the words channel (a video's timed text: its segments' vectors, times, sources, scores, UTF-8 text);
# 10: the frame-scale features factored (zbasis, zcoef) instead of stored whole (zhat); the first pass on a
# per-segment head basis; one version for both backends; 9: the moments context's beta recorded; 8: the
# reference bank's statistics of the fine and context rows; 7: the moments' propagated context; 6: fine rows,
# packed segments and reference scores per video; 1-5: the sketch's history
SCHEMA_VERSION = 11
RECORD = ("id", "title", "path", "duration", "sha256")  # a video's record: what a gallery lists and returns


class Array(NamedTuple):
    """One per-video array: its name, the name of its per-video row count (None: one row per video)."""

    name: str
    count: str | None = None


ARRAYS = (
    Array("units"),  # (M, H) float32 the clip units the proposals are pooled from
    Array("pnorm"),  # (P,) float32 the norm of each stored proposal
    Array("pidx"),  # (P,) int16 window number of each stored proposal
    # the unit key-clip-attended frame feature of proposal j is zcoef[j r:(j + 1) r] @ zbasis: an attended
    # feature is a mix of the video's L frames, so all P of them lie in an r <= L dimensional space
    # (prvr.index.encoding.frame_factors); a proposal's r coefficients are contiguous (one read per score)
    Array("zbasis", "n_zrank"),  # (r, H) float32 orthonormal rows spanning the frame-scale features
    Array("zcoef", "n_zcoef"),  # (P r,) float32 each proposal's feature in that basis: (P, r), row by row
    Array("ref_clip"),  # (R,) float16 clip scores of the reference bank's queries (confidence)
    Array("ref_frame"),  # (R,) float16 frame scores of the reference bank's queries
    Array("frames", "n_frames"),  # (L, H) float32 encoded frames (the key clip's attention; CSA)
    Array("row_start", "n_rows"),  # (n,) float32 seconds: start of each raw feature row
    Array("row_end", "n_rows"),  # (n,) float32 seconds: end of each raw feature row
    Array("fine", "n_fine"),  # (n', H) float16 unit rows of model.encode_rows (localisation)
    Array("fine_start", "n_fine"),  # (n',) float32 seconds
    Array("fine_end", "n_fine"),  # (n',) float32 seconds
    Array("segments", "n_segments"),  # (S, 3) int32 [scale, first, end) over the fine rows
    Array("context", "n_context"),  # (F, H) float32 the fine rows propagated over the segments
    Array("fine_bank", "n_fine_bank"),  # (n', 2) float32 reference-bank statistics of the fine rows
    Array("context_bank", "n_context_bank"),  # (F, 2) float32 reference-bank statistics of the context rows
    # the words channel: W timed word segments (extract.words.WordSegment) per video, W = 0 without words
    Array("words_vec", "n_words"),  # (W, H) float16 unit vectors: model.encode_queries of each segment's text
    Array("words_bank", "n_words"),  # (W, 2) float32 bank_stats of those vectors (zeros without a bank)
    Array("words_start", "n_words"),  # (W,) float32 seconds
    Array("words_end", "n_words"),  # (W,) float32 seconds
    Array("words_score", "n_words"),  # (W,) float32 the recogniser's confidence (1 for subtitles)
    Array("words_source", "n_words"),  # (W,) int8 index into extract.words.SOURCES
    Array("words_len", "n_words"),  # (W,) int32 bytes of each segment's text in words_text
    Array("words_text", "n_word_bytes"),  # (B,) uint8 the segments' texts, UTF-8, one after another
)
FIXED = tuple(a.name for a in ARRAYS if a.count is None)
RAGGED = {a.name: a.count for a in ARRAYS if a.count is not None}
ENCODED = tuple(a.name for a in ARRAYS)  # what encode_for_index returns for each video
EXACT = ("units", "pnorm", "pidx", "zbasis", "zcoef", "frames")  # what exact scores read (frames: CSA only)
FINE = ("fine", "fine_start", "fine_end", "segments", "context", "fine_bank", "context_bank")  # localisation
WORDS = ("words_vec", "words_bank", "words_start", "words_end", "words_score", "words_source", "words_len",
         "words_text")  # the words channel: read whole by a gallery's words table, never per hit
EVIDENCE = ("frames", "ref_clip", "ref_frame", "row_start", "row_end", *FINE)  # a hit's, besides EXACT
