"""More results and the moment taken away, on the running app over the demo gallery (8 videos): the API's
``offset`` gives exactly the later ranks; in a real Chromium the "more" button adds the next cards under the
first ones, which stay as they are, and a moment's download link gives its MP4 (issue #45, items 3 and 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.servers import client
from tests.test_browser import QUERY, page, played_from, search, until  # noqa: F401  - page: the Chromium page fixture
from tests.test_paging import same


def test_the_api_offset_gives_exactly_the_later_ranks(app_url: str) -> None:
    from gradio_client.exceptions import AppError

    api = client(app_url)
    eight = api.predict(QUERY, 8, 0.7, api_name="/search")["results"]
    later = api.predict(QUERY, 3, 0.7, 5, api_name="/search")
    assert [r["rank"] for r in later["results"]] == [6, 7, 8]
    assert same(later["results"], eight[5:]), (later["results"], eight[5:])
    first = api.predict(QUERY, 4, 0.7, 0, api_name="/search")["results"]  # offset 0: as without it
    assert same(first, eight[:4])
    refusal = (r"offset must be a whole number from 0 with offset \+ top_k at most 100 \(results 1-100 can "
               r"be asked for\), got offset 91 with top_k 10")
    with pytest.raises(AppError, match=refusal):
        api.predict(QUERY, 10, 0.7, 91, api_name="/search")


def test_more_adds_the_next_cards_under_the_first_and_a_moment_downloads(page) -> None:  # noqa: F811
    number = page.locator("#top-k input")
    search(page, QUERY)
    number.fill("3")
    number.press("Enter")
    assert until(lambda: page.locator(".card-head").count() == 3), page.locator(".card-head").count()
    # the text as the page holds it (a card off screen is not laid out, content-visibility: its innerText is
    # empty until it is scrolled to)
    heads = page.locator(".card-head")
    first = heads.all_text_contents()
    more = page.get_by_role("button", name="More results (the next 10)")
    more.click()
    assert until(lambda: page.locator(".card-head").count() == 8), page.locator(".card-head").count()
    shown = heads.all_text_contents()
    assert shown[:3] == first and all(first), (first, shown)  # the first cards stay as they were
    ranks = page.locator(".card-head .rank").all_text_contents()
    assert ranks == [f"#{r}" for r in range(1, 9)], shown
    assert until(lambda: not more.is_visible())  # all 8 demo videos are shown
    extra = page.locator(".more-card").first  # its player plays from its key moment, as the first cards'
    key = float(extra.locator(".chip.key").get_attribute("data-t"))
    assert played_from(extra, extra.locator(".player-stub").click) == pytest.approx(key, abs=0.5)
    links = page.locator(".more-card .clip-link")
    assert links.count() >= 5  # each further card's moments can be taken away too
    with page.expect_download() as download:
        links.first.click()
    saved = Path(download.value.path())
    assert download.value.suggested_filename.endswith("s.mp4") and saved.read_bytes()[4:8] == b"ftyp"
    number.fill("10")  # back to the default
    number.press("Enter")
    assert until(lambda: page.locator(".card-head").count() == 8 and not more.is_visible())
