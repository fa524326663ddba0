"""The page's HTML is plain text over result dicts (``prvr.serve.page``): it is made without Gradio, so it is
checked, and can be reused, without a server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_page_module_loads_no_gradio() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, prvr.serve.page; print(sorted(m for m in sys.modules "
                               "if m.split('.')[0] in ('gradio', 'gradio_client')))"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "[]", loaded.stdout


def test_a_player_plays_from_the_apps_own_route_at_the_key_moment() -> None:
    from prvr.serve.page import player_html

    key = {"start": 4.0, "end": 9.0, "play_from": 4.5}
    result = {"video_id": "up/a b.mp4", "title": 'a "quoted" <title>', "duration": 20.0, "key_moment": key,
              "moments": [key]}
    html = player_html(result, "https://example.org")
    # a stand-in the page's script makes into the player when asked (no <video> per card: issue #45)
    assert 'data-src="https://example.org/prvr/video/up/a%20b.mp4#t=4.50"' in html, html
    assert "<video" not in html, html
    assert 'data-start="4.50"' in html and "&quot;quoted&quot; &lt;title&gt;" in html
    # over the frame it starts on (tests/test_posters.py), fetched when the card is scrolled to
    assert '<img class="poster" src="https://example.org/prvr/poster/up/a%20b.mp4?t=4.50" alt="" ' \
           'loading="lazy"' in html, html


def a_result(confidence: str, label: str, contrast: float = 6.3) -> dict:
    """A result dict as ``prvr.results`` makes it, with this confidence and key moment contrast."""
    key = {"start": 25.0, "end": 31.0, "play_from": 25.5, "contrast": contrast}
    return {"rank": 1, "title": "t", "video_id": "demo01", "duration": 60.0, "confidence": confidence,
            "confidence_label": label, "score": 0.3, "clip_score": 0.3, "frame_score": 0.3, "key_moment": key,
            "moments": [key, dict(key, start=40.0, end=44.0, play_from=40.5, contrast=2.0)],
            "heatmap": {"start": [0.0], "end": [60.0], "score": [0.1]},
            "attention": {"time": [], "weight": []}}


def test_stands_out_reads_as_evidence_only_on_a_strong_match() -> None:
    """Issue #45 item 5: "stands out 6.3" on the key moment of an absent query read as evidence of a match;
    it compares a moment with the rest of its own video, so only a strong match shows the number."""
    import re

    from prvr.serve.page import card_html

    strong = card_html(a_result("high", "strong match"), 0.7, (0.0, 1.0))
    chips = re.findall(r'<button class="chip[^"]*" data-t="[\d.]+" title="([^"]*)">(.*?)</button>', strong)
    assert [c for _, c in chips] == ["★ key moment · 0:25-0:31 · stands out 6.3",
                                     "moment 2 · 0:40-0:44 · stands out 2.0"]
    assert chips[0][0].startswith("Stands out 6.3: the query matches here clearly better")
    for confidence, label in (("medium", "possible match"), ("low", "unconfirmed"), ("none", "no match")):
        card = card_html(a_result(confidence, label), 0.7, (0.0, 1.0))
        chips = re.findall(r'<button class="chip[^"]*" data-t="[\d.]+" title="([^"]*)">(.*?)</button>', card)
        assert [c for _, c in chips] == ["★ key moment · 0:25-0:31", "moment 2 · 0:40-0:44"], chips
        assert "stands out" not in re.sub(r'title="[^"]*"', "", card)  # not on the card, only in a tooltip
        tip = chips[0][0]
        assert "stands out 6.3 within this video only" in tip and "no evidence the video shows" in tip, tip
        assert f"this result is “{label}”, not a strong match" in tip, tip


def test_the_help_is_said_once_above_the_cards_with_the_notice() -> None:
    """Issue #45 item 5: the same five-line paragraph was on every card; and a query the text model cannot
    read as English says so above its results."""
    from prvr.results.query import clean_query, reading_notice
    from prvr.results.response import SearchResponse
    from prvr.serve.page import CARD_HELP, card_html, summary_html

    results = [a_result("low", "unconfirmed"), dict(a_result("low", "unconfirmed"), rank=2)]
    cards = "".join(card_html(r, 0.7, (0.0, 1.0)) for r in results)
    assert 'class="hint"' not in cards and "a t statistic): 0 is no better" not in cards
    notice = reading_notice("un perro en la playa <b>")
    response = SearchResponse(results, clean_query("un perro <b>").to_dict(), True, (0.7, 0.3), False,
                              notice=notice.to_dict())
    page = summary_html("un perro <b>", response)
    assert page.count(CARD_HELP) == 1 and page.index("No confident match") < page.index(CARD_HELP)
    assert "3 or more is clearly better than the rest of that video" in CARD_HELP
    assert '<div class="notice" role="note"><b>Not read as English.</b>' in page and "perro, playa" in page
    assert "<b>mat" not in page and response.to_dict()["notice"]["kind"] == "unknown_words"
    plain = SearchResponse(results, clean_query("a dog").to_dict(), True, (0.7, 0.3), False)
    assert 'class="notice"' not in summary_html("a dog", plain) and plain.to_dict()["notice"] is None
