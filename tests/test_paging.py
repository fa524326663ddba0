"""Pages of results (issue #45, item 4): ``offset`` skips the best results, so ``offset=5, top_k=5`` is
exactly results 6-10 of ``top_k=10`` (ranks, scores, labels, moments), over one gallery or several; the API
checks ``offset + top_k <= 100`` with a message; the page's "more" button asks for the next ones."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import prvr  # noqa: F401
from prvr.index import GalleryVideo, QueryError, VideoIndex
from prvr.models.mssl import MSSL, MSSLConfig
from prvr.results.search import search, search_text
from prvr.serve.routes import offset_value
from tests.test_search import fake_text_encoder


def videos(prefix: str, count: int, seed: int) -> list[GalleryVideo]:
    """``count`` random videos of 6 to 60 rows of 2 s."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        rows = int(rng.integers(6, 60))
        t = np.arange(rows, dtype=np.float32) * 2.0
        features = rng.standard_normal((rows, 24)).astype(np.float32)
        out.append(GalleryVideo(f"{prefix}{i}", features, t, t + 2.0, 2.0 * rows, title=f"{prefix} {i}",
                                path=f"/videos/{prefix}{i}.mp4"))
    return out


@pytest.fixture(scope="module")
def galleries(tmp_path_factory: pytest.TempPathFactory) -> tuple[VideoIndex, VideoIndex]:
    """A shared gallery of 16 videos and a session's of 7, over one small MS-SL model."""
    torch.manual_seed(0)
    model = MSSL(MSSLConfig(visual_dim=24, query_dim=16, hidden_size=32, n_heads=2, max_ctx_l=32)).eval()
    root = tmp_path_factory.mktemp("paging")
    shared, session = VideoIndex.create(root / "shared", model), VideoIndex.create(root / "session", model)
    shared.add(videos("s", 16, 1))
    session.add(videos("p", 7, 2))
    return shared, session


def test_a_page_is_exactly_those_ranks_of_the_longer_list(galleries: tuple[VideoIndex, VideoIndex]) -> None:
    shared, session = galleries
    for indexes in ([shared], [shared, session]):
        for text in ("a dog runs after a ball", "two people dance in the rain"):
            whole = search_text(indexes, text, fake_text_encoder, k=16).results
            assert [r["rank"] for r in whole] == list(range(1, 17))
            for offset, k in ((5, 5), (0, 3), (10, 6), (15, 1), (7, 6)):
                page = search_text(indexes, text, fake_text_encoder, k=k, offset=offset).results
                assert [r["rank"] for r in page] == list(range(offset + 1, offset + k + 1))
                assert same(page, whole[offset: offset + k]), (text, offset, k)
    tokens = fake_text_encoder(["a red rocket on the launch pad"])[0]
    ten = search([shared, session], tokens, k=10).results
    assert same(search([shared, session], tokens, k=5, offset=5).results, ten[5:10])  # the example


def same(page: list[dict], ranks: list[dict]) -> bool:
    """The page's dicts are those ranks' dicts: every field identical but the key clip's attention weights,
    equal to 1e-5 (the model attends over a batch of the hits, whose size changes their last bits)."""
    def apart(results: list[dict]) -> tuple[str, np.ndarray]:
        rest = [dict(r, attention=r["attention"]["time"]) for r in results]
        return json.dumps(rest), [np.array(r["attention"]["weight"]) for r in results]

    (text, weights), (other, expected) = apart(page), apart(ranks)
    return text == other and all(np.allclose(a, b, rtol=0, atol=1e-5) and a.shape == b.shape
                                 for a, b in zip(weights, expected, strict=True))


def test_a_page_past_the_gallery_is_short_or_empty(galleries: tuple[VideoIndex, VideoIndex]) -> None:
    shared, session = galleries  # 23 videos in all
    tail = search_text([shared, session], "a cat", fake_text_encoder, k=10, offset=20)
    assert [r["rank"] for r in tail.results] == [21, 22, 23] and tail.stats["videos"] == 23
    assert search_text([shared, session], "a cat", fake_text_encoder, k=5, offset=23).results == []


def test_a_bad_offset_is_refused_in_words(galleries: tuple[VideoIndex, VideoIndex]) -> None:
    shared, _ = galleries
    for bad in (-1, 2.5, True, "3", None, 996):
        with pytest.raises(QueryError, match=r"offset must be a whole number from 0 to 995 \(offset \+ k at "
                                             rf"most 1000\), got {bad!r}"):
            search_text([shared], "a cat", fake_text_encoder, k=5, offset=bad)


def test_the_api_takes_offset_plus_top_k_up_to_100() -> None:
    assert offset_value(0, 10) == 0 and offset_value(90.0, 10) == 90 and offset_value("5", 5) == 5
    for offset, top_k in ((91, 10), (1, 100), (-1, 5), (2.5, 5), ("x", 5), (None, 5), (float("nan"), 5)):
        with pytest.raises(QueryError, match=r"offset must be a whole number from 0 with offset \+ top_k at "
                                             rf"most 100 \(results 1-100 can be asked for\), got offset "
                                             rf"{offset!r} with top_k {top_k}"):
            offset_value(offset, top_k)


def fake_result(rank: int) -> dict:
    """A result dict as the page's cards read it, ranked ``rank``."""
    moment = {"start": 1.0, "end": 3.0, "play_from": 1.5, "score": 0.2, "contrast": 2.0}
    return {"rank": rank, "video_id": f"v{rank}", "title": f"video {rank}", "duration": 10.0, "score": 0.5,
            "clip_score": 0.5, "frame_score": 0.5, "confidence": "low", "confidence_label": "unconfirmed",
            "key_moment": moment, "moments": [moment],
            "heatmap": {"start": [0.0], "end": [10.0], "score": [0.1 * rank]}}


class FakePredictor:
    """Answers searches over ``videos`` ranked videos and records what was asked."""

    def __init__(self, videos: int) -> None:
        self.videos, self.asked = videos, []

    def search(self, text: str, k: int, weight: float, session: object, offset: int = 0):
        """Results ``offset + 1`` to ``offset + k`` (as far as there are videos)."""
        from prvr.results.response import SearchResponse

        self.asked.append((text, k, weight, offset))
        results = [fake_result(r) for r in range(offset + 1, min(offset + k, self.videos) + 1)]
        return SearchResponse(results, {"text": text}, True, (weight, 1 - weight), False,
                              {"videos": self.videos})


def split(updates: list) -> tuple[list, dict | None, dict]:
    """The further-results blocks' updates, the state and the button's update, as the page gets them."""
    import app

    assert len(updates) == app.MORE_BLOCKS + 2
    return updates[:-2], updates[-2], updates[-1]


def filled(blocks: list) -> dict[int, str]:
    """Block number -> the cards sent to it (the blocks not sent again are left out)."""
    return {i: b["value"] for i, b in enumerate(blocks) if "value" in b and b["value"]}


def test_more_adds_the_next_results_under_those_shown() -> None:
    """The page's "more": the search on the page (its text and weight) asked for the results after the ones
    shown, their cards sent to a block of their own under the shown ones, which are not sent again (a player
    opened in them keeps playing); the button goes when the gallery has no more, or 100 are shown."""
    import app

    predictor = FakePredictor(23)
    first = predictor.search("a dog", 10, 0.6, None)
    blocks, state, button = split(app.more_after(first, "a dog", 0.6, "http://host"))
    assert filled(blocks) == {} and all(b["visible"] == "hidden" for b in blocks)  # a search empties them
    assert state["shown"] == 10 and button["visible"] is True
    blocks, state, button = split(app.show_more(predictor, state, None))
    assert predictor.asked[-1] == ("a dog", 10, 0.6, 10)
    [(where, shown)] = filled(blocks).items()
    assert where == 0 and blocks[0]["visible"] is True
    assert [f"#{r}<" in shown for r in (11, 20)] == [True, True]
    assert "#10<" not in shown and "#21<" not in shown and shown.count('class="more-card"') == 10
    assert 'href="http://host/prvr/clip/v11?start=1.000&amp;end=3.000"' in shown
    assert all(b == app.gr.update() for b in blocks[1:])  # nothing else is sent: the page keeps it as it is
    assert state["shown"] == 20 and button["visible"] is True
    blocks, state, button = split(app.show_more(predictor, state, None))
    assert predictor.asked[-1] == ("a dog", 10, 0.6, 20)
    [(where, shown)] = filled(blocks).items()
    assert where == 1 and shown.count('class="more-card"') == 3 and "#21<" in shown and "#23<" in shown
    assert blocks[0] == app.gr.update()  # the first more's cards are not sent again
    assert state["shown"] == 23 and button["visible"] is False  # the gallery's last video is shown
    many = FakePredictor(500)
    _, state, _ = split(app.more_after(many.search("a cat", 1, 0.7, None), "a cat", 0.7, ""))
    for _ in range(10):  # from one result shown: ten more make 100, each in a block of its own
        blocks, state, button = split(app.show_more(many, state, None))
    assert [a[3] for a in many.asked[1:]] == [1, *range(11, 100, 10)] and state["shown"] == 100
    assert list(filled(blocks)) == [app.MORE_BLOCKS - 1] and filled(blocks)[app.MORE_BLOCKS - 1].count(
        'class="more-card"') == 9
    assert button["visible"] is False  # 100 at most
    blocks, state, button = split(app.more_after(None))
    assert filled(blocks) == {} and state is None and button == app.gr.update(visible=False)


def test_top_k_past_the_card_slots_fills_the_further_results_block() -> None:
    """Issue #45 item 5: the page's top-k stopped at 10 (50 gave 10 silently); it takes the server's 1-100,
    the results past the card slots shown under them, and "more" goes on after the last one shown."""
    import app

    predictor = FakePredictor(40)
    response = predictor.search("a dog", 25, 0.6, None)
    updates = app.search_updates("a dog", response, 0.6, "http://host")
    slots = updates[1:1 + 2 * app.MAX_CARDS]
    blocks, state, button = split(updates[1 + 2 * app.MAX_CARDS:])
    assert [u.get("visible") for u in slots[::2]] == [True] * app.MAX_CARDS  # every slot filled
    assert [f"#{r}<" in slots[2 * (r - 1) + 1] for r in (1, 10)] == [True, True]
    shown = filled(blocks)[0]
    assert shown.count('class="more-card"') == 15 and "#11<" in shown and "#25<" in shown
    assert list(filled(blocks)) == [0] and all(b["visible"] == "hidden" for b in blocks[1:])
    assert state["shown"] == 25 and button["visible"] is True
    blocks, state, _ = split(app.show_more(predictor, state, None))
    assert predictor.asked[-1] == ("a dog", 10, 0.6, 25)  # the next ten after the 25 shown
    assert list(filled(blocks)) == [1] and blocks[0] == app.gr.update()  # under the search's own
