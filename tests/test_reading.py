"""Queries the text model cannot read as English say so (issue #45 item 5):
``prvr.results.query.reading_notice`` is the one rule; the API's ``notice`` and the page's notice carry its
words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prvr.results.confidence import load_reference_captions
from prvr.results.query import english_words, reading_notice

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("query", "kind", "words"), [
    ("un perro en la playa", "unknown_words", ("perro", "playa")),
    ("一只狼", "not_english", ("一只狼",)),
    ("asdfghjkl", "unknown_words", ("asdfghjkl",)),
    ("!!!", "no_words", ()),
    ("a dog on the собака beach", "not_english", ("собака",)),
])
def test_a_query_the_text_model_cannot_read_as_english_gets_a_notice(query: str, kind: str,
                                                                     words: tuple) -> None:
    notice = reading_notice(query)
    assert notice is not None and (notice.kind, notice.words) == (kind, words), notice
    assert "English" in notice.message and notice.to_dict() == {"kind": kind, "words": list(words),
                                                                "message": notice.message}


def english_queries() -> list[str]:
    """The English the app is searched with: the reference captions, the demo gallery's examples and the
    words dev set's queries (names among them)."""
    demo = json.loads((REPO / "assets" / "demo_gallery.json").read_text())["examples"]
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "queries" and isinstance(value, list):
                    found.extend(q["text"] for q in value if isinstance(q, dict) and "text" in q)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads((REPO / "prvr" / "evaluate" / "words_set.json").read_text()))
    assert len(found) > 100  # the dev set's queries were found
    return load_reference_captions() + demo + found


def test_english_queries_get_no_notice() -> None:
    queries = english_queries() + ["a submarine surfacing in arctic ice", "purple giraffe sings opera",
                                   "Q3 revenue 2024", "2024", "Keiko Tanabe", "rabbits and glasses"]
    noticed = {q: n.words for q in queries if (n := reading_notice(q)) is not None}
    # one query of the words dev set is a butterfly's Latin name: its second word is not English (true), and
    # its results are found by the videos' words, matched as written, as before
    assert noticed == {"Vanessa atalanta": ("atalanta",)}, noticed


def test_the_word_list_is_whole_english_words() -> None:
    known = english_words()
    assert len(known) > 20000 and {"dog", "beach", "submarine"} <= known
    assert not any(w.startswith("##") or "[" in w for w in known)
    assert reading_notice("perro playa", known=frozenset()) is None  # no list: only the script rules
