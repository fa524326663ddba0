"""Moments never start (or end) on filler: a frozen picture such as a grey or black card
(prvr.results.moments, step 6), detected from the stored rows alone."""

import numpy as np
import pytest

from prvr.results.moments import MomentConfig, blank_rows, find_moments
from prvr.temporal.segments import segment_video


def unit(x: np.ndarray) -> np.ndarray:
    """Rows (or a vector) scaled to unit length, float32."""
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def video_with_card(card_len: int = 3, seed: int = 0, card_matches: float = 0.0):
    """40 s of 1 s rows: a scene (0-15), a grey card (15-15+card_len: one frozen vector repeated), the
    queried scene, another scene. ``card_matches``: how much of the query's direction the card's vector has
    (a flat frame's class mix can be close to a query)."""
    rng = np.random.default_rng(seed)
    dim = 32
    a, b, c, card = (rng.normal(size=dim) for _ in range(4))
    query = unit(b)
    rows = np.concatenate([a + 0.6 * rng.normal(size=(15, dim)),
                           np.repeat((card + card_matches * b)[None], card_len, axis=0),
                           b + 0.6 * rng.normal(size=(12, dim)),
                           c + 0.6 * rng.normal(size=(13 - card_len, dim))])
    start = np.arange(40, dtype=np.float32)
    return unit(rows), start, start + 1, query


def test_blank_rows_are_the_frozen_ones_only() -> None:
    rows, *_ = video_with_card(card_len=3)
    blank = blank_rows(rows)
    assert blank[15:18].all() and blank.sum() == 3  # the card's rows, none of the moving ones
    assert not blank_rows(rows, None).any()  # the rule off
    assert not blank_rows(np.repeat(rows[:1], 5, axis=0)).any()  # all frozen: nothing to skip to
    fp16 = rows.astype(np.float16)  # as an index stores the rows
    assert (blank_rows(fp16) == blank).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_moment_next_to_a_card_starts_on_content(seed: int) -> None:
    """The card's frozen vector half-matches the query, so without the rule the key moment takes it in;
    with the rule the key moment starts where the queried scene starts, and no moment starts or ends on it."""
    rows, start, end, query = video_with_card(seed=seed, card_matches=1.5)
    segments = np.array([[0, 0, 15], [0, 15, 18], [0, 18, 30], [0, 30, 40], [1, 0, 15], [1, 15, 30],
                         [1, 30, 40]])
    off = find_moments(query, rows, start, end, segments, MomentConfig(blank_cos=None))
    assert off["key_moment"]["rows"][0] == 15  # the card joins the moment without the rule
    on = find_moments(query, rows, start, end, segments)
    assert on["key_moment"]["rows"] == [18, 30] and on["key_moment"]["start"] == 18.0
    blank = blank_rows(rows)
    for m in on["moments"]:
        first, stop = m["rows"]
        assert not blank[first] and not blank[stop - 1], m


def test_a_moment_of_card_rows_only_is_never_listed() -> None:
    """A query that matches the card itself best still gets moments on content."""
    rows, start, end, _ = video_with_card(card_len=3)
    query = rows[16]
    out = find_moments(query, rows, start, end, segment_video(rows))
    blank = blank_rows(rows)
    for m in out["moments"]:
        assert not blank[m["rows"][0]] and not blank[m["rows"][1] - 1], m


def test_blank_cos_is_checked() -> None:
    with pytest.raises(ValueError, match="blank_cos"):
        MomentConfig(blank_cos=0.0)
