"""The search path users wait on: a query in, Contract 4 result dicts out.

```python
response = search([shared, session], tokens, k=10)                  # token features (L, Dq) in
response = search_text([shared], "a cat jumps", text.encode, k=10)  # text in: cleaned, then encoded by the
                                                                    # profile's text backbone (extract)
```

``k`` and the weights are checked here, once (``prvr.index.query.check_k`` / ``check_weights``); the query
is encoded by the model ONCE; every gallery ranks the same query vector (``Gallery.rank``); their evidence is
merged by exact total; results and confidence are built once, for all hits alike.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from prvr.index import MAX_K, Evidence, Gallery, QueryError, check_k, check_weights
from prvr.models.branches import EncodedQueries
from prvr.results.confidence import UNCALIBRATED, CalibratedConfidence
from prvr.results.query import clean_query, reading_notice
from prvr.results.response import Confidence, SearchResponse, result_dicts

__all__ = ["check_offset", "encode_query", "search", "search_text"]

TextEncoder = Callable[[list[str]], list[np.ndarray]]  # texts -> token features (L, Dq) each (extract's)


def encode_query(model, tokens: np.ndarray | torch.Tensor) -> np.ndarray | EncodedQueries:
    """Token features (L, Dq) -> the model's encoded query: an (H,) vector, or for a CSA model the
    ``EncodedQueries`` of this one query (its frame score needs the tokens)."""
    x = np.asarray(tokens.detach().cpu() if isinstance(tokens, torch.Tensor) else tokens)
    if x.ndim != 2 or len(x) == 0 or not np.isfinite(x).all():
        raise QueryError(f"token features must be a finite (L >= 1, dim) array, got shape {x.shape}")
    try:
        with torch.no_grad():
            q = model.encode_queries([np.asarray(x, dtype=np.float32)])
    except ValueError as e:
        raise QueryError(str(e)) from None
    if isinstance(q, EncodedQueries):
        return q
    return np.ascontiguousarray(q.reshape(-1).float().cpu().numpy())


def search(indexes: Sequence[Gallery], tokens: np.ndarray | torch.Tensor, k: int = 10,
           weights: Sequence[float] | None = None, approximate: bool = False,
           confidence: Confidence | None = None, query: dict | None = None,
           text: str | None = None, offset: int = 0) -> SearchResponse:
    """Rank every index (all over one model) for the query's token features; the best k over all of them.

    ``confidence`` defaults to ``CalibratedConfidence(UNCALIBRATED)`` (no model calibration: every hit "low");
    ``query``: what the response reports about the query (default: the token count); ``text``: the query's
    text, which galleries match their videos' words with lexically (None, raw token features: the words'
    dense match only).
    """
    if not indexes:
        raise ValueError("search needs at least one index")
    # a page: the k results after the first ``offset`` (offset=5, k=5 is results 6-10 of k=10, ranked from 6);
    # every gallery ranks the hits up to the page's last, ``page_of`` makes the page's dicts
    offset = check_offset(offset, check_k(k))
    k = offset + k
    model = indexes[0].model
    w = check_weights(weights, (model.cfg.clip_scale_w, model.cfg.frame_scale_w))
    t0 = time.perf_counter()
    q = encode_query(model, tokens)
    t1 = time.perf_counter()
    evidence = Evidence.merge([ix.rank(q, k, w, approximate, text) for ix in indexes if len(ix)] or
                              [indexes[0].rank(q, k, w, approximate, text)], k)
    t2 = time.perf_counter()
    judged = (confidence or CalibratedConfidence(UNCALIBRATED)).assess(q, evidence)
    results = page_of(evidence, judged.labels, q, offset)
    t3 = time.perf_counter()
    stats = {"videos": evidence.searched, "scored_exactly": evidence.scored_exactly,
             "encode_ms": 1e3 * (t1 - t0), "rank_ms": 1e3 * (t2 - t1), "results_ms": 1e3 * (t3 - t2),
             "total_ms": 1e3 * (t3 - t0)}
    info = query if query is not None else {"tokens": int(np.shape(tokens)[0])}
    return SearchResponse(results, info, not judged.strong, w, approximate, stats, judged.calibrated)


def search_text(indexes: Sequence[Gallery], text: str | bytes, text_encoder: TextEncoder, k: int = 10,
                weights: Sequence[float] | None = None, approximate: bool = False,
                confidence: Confidence | None = None, offset: int = 0) -> SearchResponse:
    """``search`` for a text: validated and cleaned (``clean_query``), then encoded by ``text_encoder``; the
    cleaned text goes to every gallery's rank too (the words' lexical match). Its ``stats`` add
    ``text_ms`` (cleaning and the text encoder) and count it in ``total_ms``; its ``notice`` says when the
    text model cannot read the text as English (``reading_notice``)."""
    t0 = time.perf_counter()
    cleaned = clean_query(text)
    tokens = text_encoder([cleaned.text])[0]
    text_ms = 1e3 * (time.perf_counter() - t0)
    response = search(indexes, tokens, k, weights, approximate, confidence, cleaned.to_dict(), cleaned.text,
                      offset)
    notice = reading_notice(cleaned.text)
    stats = {**response.stats, "text_ms": text_ms, "total_ms": 1e3 * (time.perf_counter() - t0)}
    return dataclasses.replace(response, stats=stats, notice=notice.to_dict() if notice else None)


def check_offset(offset: object, k: int) -> int:
    """``offset`` (results skipped before a page of ``k``) as a whole number from 0 with ``offset + k`` at
    most ``MAX_K``, else a QueryError naming what was given."""
    if not isinstance(offset, int | np.integer) or isinstance(offset, bool) or not 0 <= offset <= MAX_K - k:
        raise QueryError(f"offset must be a whole number from 0 to {MAX_K - k} (offset + k at most {MAX_K}), "
                         f"got {offset!r}")
    return int(offset)


def page_of(evidence: Evidence, labels: Sequence[str], q: object, offset: int) -> list[dict]:
    """The result dicts of the hits after the first ``offset``, ranked from ``offset + 1``: the same dicts,
    scores and labels as those ranks of one longer list (only the page's are made)."""
    page = dataclasses.replace(evidence, hits=evidence.hits[offset:])
    return [dict(r, rank=offset + r["rank"]) for r in result_dicts(page, labels[offset:], q)]
