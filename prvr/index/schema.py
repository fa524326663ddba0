"""The per-video arrays a gallery stores, declared once: every writer and reader takes their names from here.

``encode_for_index`` (``prvr.index.ingest``) produces them; the built-in index writes them into segments
(``prvr.index.store``) and reads them through a ``Snapshot``; the Qdrant backend packs them into each point's
payload (``prvr.index.qdrant_store``); ``prvr.index.scoring`` reads them into ``VideoEvidence`` (whose fields
carry the same names). A ``fixed`` array has one row per video; a ragged one holds a variable number of rows
per video, with their count stored under ``count``.
"""

from __future__ import annotations

from typing import NamedTuple


class Array(NamedTuple):
    """One per-video array: its name, the name of its per-video row count (None: one row per video), and
    whether the built-in index memory-maps it (False: loaded whole, read by every query or every hit)."""

    name: str
    count: str | None = None
    mapped: bool = True


ARRAYS = (
    Array("units"),  # (M, H) the clip units the proposals are pooled from
    Array("pnorm"),  # (P,) the norm of each stored proposal
    Array("pidx", mapped=False),  # (P,) int16 window number of each stored proposal
    Array("zhat"),  # (P, H) unit key-clip-attended frame vectors of each proposal
    Array("ref_clip"),  # (R,) float16 clip scores of the reference bank's queries (confidence)
    Array("ref_frame"),  # (R,) float16 frame scores of the reference bank's queries
    Array("frames", "n_frames"),  # (L, H) encoded frames (the key clip's attention)
    Array("row_start", "n_rows", mapped=False),  # (n,) seconds: start of each raw feature row
    Array("row_end", "n_rows", mapped=False),  # (n,) seconds: end of each raw feature row
    Array("fine", "n_fine"),  # (n', H) float16 unit rows of model.encode_rows (localisation)
    Array("fine_start", "n_fine"),  # (n',) seconds
    Array("fine_end", "n_fine"),  # (n',) seconds
    Array("segments", "n_segments"),  # (S, 3) int32 [scale, first, end) over the fine rows
    Array("context", "n_context"),  # (F, H) the fine rows propagated over the segments
    Array("fine_bank", "n_fine_bank"),  # (n', 2) reference-bank statistics of the fine rows
    Array("context_bank", "n_context_bank"),  # (F, 2) reference-bank statistics of the context rows
)
FIXED = tuple(a.name for a in ARRAYS if a.count is None)
RAGGED = {a.name: a.count for a in ARRAYS if a.count is not None}
ENCODED = tuple(a.name for a in ARRAYS)  # what encode_for_index returns for each video
FINE = ("fine", "fine_start", "fine_end", "segments", "context", "fine_bank", "context_bank")  # localisation
