"""Query validation, time mapping and the result dicts of prvr.results.search (moments and confidence through
search: tests/test_results.py)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import prvr  # noqa: F401
from prvr.index import GalleryVideo, VideoIndex
from prvr.models.mssl import MSSL, MSSLConfig
from prvr.results.query import MAX_QUERY_CHARS, QueryError, clean_query
from prvr.results.response import frame_times, unit_spans
from prvr.results.search import search, search_text

CONTRACT_KEYS = {"rank", "video_id", "title", "path", "duration", "score", "clip_score", "frame_score",
                 "confidence", "confidence_label", "key_moment", "moments", "heatmap", "key_clip",
                 "attention", "words"}


def fake_text_encoder(texts: list[str]) -> list[np.ndarray]:
    """Deterministic token features: one 16-d row per word, seeded by the word's hash."""
    out = []
    for text in texts:
        rows = [np.random.default_rng(int(hashlib.sha256(w.encode()).hexdigest()[:8], 16)).standard_normal(16)
                for w in text.split()]
        out.append(np.stack(rows).astype(np.float32))
    return out


def gallery() -> list[GalleryVideo]:
    """Six random videos: below 32 units, between, and re-binned frames (one row per 2 s)."""
    rng = np.random.default_rng(0)
    videos = []
    for i, rows in enumerate([1, 20, 45, 90, 33, 64]):
        t = np.arange(rows, dtype=np.float32) * 2.0
        videos.append(GalleryVideo(f"v{i}", rng.standard_normal((rows, 24)).astype(np.float32), t, t + 2.0,
                                   2.0 * rows, title=f"clip {i}", path=f"/videos/v{i}.mp4"))
    return videos


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> VideoIndex:
    torch.manual_seed(0)
    model = MSSL(MSSLConfig(visual_dim=24, query_dim=16, hidden_size=32, n_heads=2, max_ctx_l=32)).eval()
    ix = VideoIndex.create(tmp_path_factory.mktemp("search") / "ix", model)
    ix.add(gallery())
    return ix


def test_clean_query_rules() -> None:
    for empty in ("", "   \t\n", "\x00\x01"):
        with pytest.raises(QueryError, match="empty"):
            clean_query(empty)
    long = clean_query("word " * 2000)  # 10,000 characters
    assert long.truncated and long.original_chars == 10000 and len(long.text) <= MAX_QUERY_CHARS
    assert not long.text.endswith(" ") and long.text.split() == ["word"] * len(long.text.split())
    odd = clean_query("a cat\x07 on\u200b the\tsofa\r\n")
    assert odd.text == "a cat on the sofa" and odd.replaced_controls == 2 and not odd.truncated
    assert clean_query("un café".encode()).text == "un café"
    with pytest.raises(QueryError, match="UTF-8.*0xff"):
        clean_query(b"caf\xff")
    with pytest.raises(QueryError, match="text"):
        clean_query(42)  # type: ignore[arg-type]


def test_a_query_is_cut_only_past_the_cap_and_whitespace_is_not_a_replaced_control() -> None:
    at_cap, past = clean_query("a" * MAX_QUERY_CHARS), clean_query("a" * (MAX_QUERY_CHARS + 1))
    assert not at_cap.truncated and len(at_cap.text) == MAX_QUERY_CHARS
    assert past.truncated and len(past.text) == MAX_QUERY_CHARS
    spaced = clean_query("a\tcat\non the\r\nsofa")
    assert spaced.text == "a cat on the sofa" and spaced.replaced_controls == 0


def test_a_response_is_a_no_match_only_when_it_has_hits_and_every_one_is_none() -> None:
    """An empty response (an empty gallery) says nothing about the query: it is not "no match"."""
    from prvr.results.response import SearchResponse

    def response(labels: list[str]) -> SearchResponse:
        return SearchResponse([{"confidence": c} for c in labels], {"tokens": 1}, True, (0.7, 0.3), False)

    assert response(["none", "none"]).no_match and response(["none"]).to_dict()["no_match"] is True
    assert not response(["none", "low"]).no_match and not response([]).no_match
    assert response([]).to_dict()["no_match"] is False


def test_time_mapping_follows_the_official_binning() -> None:
    t = np.arange(64, dtype=np.float32)
    spans = unit_spans(t, t + 1)  # 64 rows -> 2 rows per unit
    np.testing.assert_array_equal(spans[:3], [[0, 2], [2, 4], [4, 6]])
    short = unit_spans(t[:5], t[:5] + 1)  # fewer rows than units: units repeat rows
    assert short.shape == (32, 2) and (np.diff(short[:, 0]) >= 0).all() and short[-1, 1] <= 5
    np.testing.assert_array_equal(frame_times(t[:10], t[:10] + 1), t[:10] + 0.5)
    binned = frame_times(np.arange(300.0), np.arange(300.0) + 1, max_ctx_l=128)
    assert binned.shape == (128,) and (np.diff(binned) > 0).all() and binned[0] < 3 and binned[-1] > 296


def test_search_result_dicts(index: VideoIndex) -> None:
    response = search_text([index], "a tabby cat sleeping on a sofa", fake_text_encoder, k=4)
    payload = json.loads(json.dumps(response.to_dict()))  # plain JSON types only
    assert len(response) == 4 and payload["query"]["text"] == "a tabby cat sleeping on a sofa"
    assert isinstance(payload["no_strong_match"], bool) and payload["weights"] == [0.7, 0.3]
    results = payload["results"]
    assert [r["rank"] for r in results] == [1, 2, 3, 4]
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    for r in results:
        assert set(r) == CONTRACT_KEYS and r["confidence"] in ("high", "medium", "low", "none")
        assert r["score"] == pytest.approx(0.7 * r["clip_score"] + 0.3 * r["frame_score"], abs=1e-5)
        assert r["key_moment"] == r["moments"][0] and 1 <= len(r["moments"]) <= 3
        assert r["key_clip"]["score"] == pytest.approx(r["clip_score"])  # MS-SL's own key clip, kept
        for m in (r["key_moment"], r["key_clip"]):
            assert 0 <= m["start"] < m["end"] <= r["duration"]
        spans = [(m["start"], m["end"]) for m in r["moments"]]
        assert all(a[1] <= b[0] or b[1] <= a[0] for i, a in enumerate(spans) for b in spans[i + 1:])
        heat = r["heatmap"]  # one cell per fine row: the model's frames (rows re-binned past max_ctx_l=32)
        rows = int(round(r["duration"] / 2))
        assert len(heat["start"]) == len(heat["end"]) == len(heat["score"]) == min(rows, 32)
        assert heat["start"][0] == 0 and heat["end"][-1] <= r["duration"]
        assert all(-1 - 1e-3 <= c <= 1 + 1e-3 for c in heat["score"])  # cosines of unit rows
        att = r["attention"]
        assert len(att["time"]) == len(att["weight"]) and sum(att["weight"]) == pytest.approx(1, abs=1e-4)
        assert all(0 <= t <= r["duration"] for t in att["time"])
        assert r["path"].endswith(".mp4") and r["title"].startswith("clip")


def test_the_key_clip_spans_exactly_the_key_windows_clip_units(index: VideoIndex) -> None:
    """MS-SL's key clip runs from the start of its window's first clip unit to the end of its last one (the
    official binning of the rows into 32 units), for videos shorter and longer than 32 rows."""
    from prvr.models.preprocess import window_table
    from prvr.results.response import result_dicts
    from prvr.results.search import encode_query

    windows = window_table(32)
    for text in ("a cat", "a dog runs after a ball", "rain on a window", "a red rocket"):
        q = encode_query(index.model, fake_text_encoder([text])[0])
        evidence = index.rank(q, k=6)
        for hit, r in zip(evidence.hits, result_dicts(evidence, ["low"] * 6, q), strict=True):
            spans = unit_spans(hit.row_start, hit.row_end)
            first, stop = (int(u) for u in windows[r["key_clip"]["proposal"]])  # units [first, stop)
            assert (r["key_clip"]["start"], r["key_clip"]["end"]) == pytest.approx(
                (spans[first, 0], spans[stop - 1, 1]), abs=1e-3), (r["video_id"], r["key_clip"], first, stop)


def test_attention_is_the_models_key_clip_attention(index: VideoIndex) -> None:
    """Each result's attention is what MS-SL's frame branch computes for its key clip (model.attend)."""
    rows = {v.id: v.features for v in gallery()}
    for r in search_text([index], "a dog runs after a ball", fake_text_encoder, k=6):
        enc = index.model.encode_videos([rows[r["video_id"]]])
        window = torch.tensor([[r["key_clip"]["proposal"]]])  # every window is stored: number = position
        _, alpha = index.model.attend(enc, window)
        np.testing.assert_allclose(r["attention"]["weight"], alpha[0, 0].numpy(), atol=2e-6)


def test_search_weights_rerank_and_token_queries(index: VideoIndex) -> None:
    tokens = fake_text_encoder(["a red rocket on the launch pad"])[0]
    clip_only = search([index], tokens, k=6, weights=(1.0, 0.0))
    assert clip_only.query == {"tokens": 7} and clip_only.weights == (1.0, 0.0)
    assert [r["score"] for r in clip_only] == [r["clip_score"] for r in clip_only]
    frame_only = search([index], tokens, k=6, weights=(0.0, 1.0))
    frames = [r["frame_score"] for r in frame_only]
    assert frames == sorted(frames, reverse=True)
    truncated = search_text([index], "rocket " * 2000, fake_text_encoder, k=1)
    assert truncated.query["truncated"] and truncated.query["original_chars"] == 14000


def test_search_rejects_bad_queries(index: VideoIndex) -> None:
    with pytest.raises(QueryError, match="empty"):
        search_text([index], "  ", fake_text_encoder)
    with pytest.raises(QueryError, match="UTF-8"):
        search_text([index], b"\xc3\x28", fake_text_encoder)
    with pytest.raises(QueryError, match="finite"):
        search([index], np.full((3, 16), np.nan, np.float32))
    with pytest.raises(QueryError, match="16"):
        search([index], np.ones((3, 15), np.float32))  # the model names the dims it expects
    with pytest.raises(QueryError, match="non-negative"):
        search_text([index], "a cat", fake_text_encoder, weights=(-1.0, 1.0))
    with pytest.raises(QueryError, match="whole number"):
        search_text([index], "a cat", fake_text_encoder, k=0)


def test_no_strong_match_for_an_unrelated_query_on_a_gallery_of_copies(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MSSL(MSSLConfig(visual_dim=24, query_dim=16, hidden_size=32, n_heads=2, max_ctx_l=32)).eval()
    features = np.random.default_rng(1).standard_normal((20, 24)).astype(np.float32)
    t = np.arange(20, dtype=np.float32)
    ix = VideoIndex.create(tmp_path / "ix", model)
    ix.add([GalleryVideo(f"copy{i}", features, t, t + 1, 20.0) for i in range(6)])  # identical videos
    response = search_text([ix], "anything at all", fake_text_encoder, k=3)
    # an index without a reference bank: no cuts, never a strong match (with a bank: tests/test_results.py)
    assert response.no_strong_match and all(r["confidence"] == "low" for r in response)
    assert [r["video_id"] for r in response] == ["copy0", "copy1", "copy2"]  # exact ties: index order


def test_search_ranks_by_model_score_over_several_indexes(tmp_path: Path) -> None:
    """search() over two indexes (a shared gallery and a session's) ranks their videos together exactly as
    the model scores them (``model.score``), best first, text encoded once."""
    torch.manual_seed(0)
    model = MSSL(MSSLConfig(visual_dim=24, query_dim=16, hidden_size=32, n_heads=2, max_ctx_l=32)).eval()
    rng = np.random.default_rng(5)
    videos = []
    for i, rows in enumerate([5, 70, 12, 33, 1, 48, 20, 9]):
        t = np.arange(rows, dtype=np.float32)
        videos.append(GalleryVideo(f"v{i}", rng.standard_normal((rows, 24)).astype(np.float32), t, t + 1,
                                   float(rows)))
    shared, session = VideoIndex.create(tmp_path / "a", model), VideoIndex.create(tmp_path / "b", model)
    shared.add(videos[:5])
    session.add(videos[5:])
    calls = []

    def encoder(texts: list[str]) -> list[np.ndarray]:
        calls.append(texts)
        return fake_text_encoder(texts)

    response = search_text([shared, session], "a dog catches a frisbee", encoder, k=6)
    tokens = fake_text_encoder(["a dog catches a frisbee"])[0]
    scores = model.score(model.encode_queries([tokens]), model.encode_videos([v.features for v in videos]))
    expected = np.lexsort((np.arange(len(videos)), -scores.total[0].numpy()))[:6]
    assert calls == [["a dog catches a frisbee"]]
    assert [r["video_id"] for r in response] == [videos[i].id for i in expected]
    np.testing.assert_allclose([r["score"] for r in response], scores.total[0].numpy()[expected], atol=1e-5)
    np.testing.assert_allclose([r["frame_score"] for r in response], scores.frame[0].numpy()[expected],
                               atol=1e-5)
    assert [r["rank"] for r in response] == list(range(1, 7)) and response.stats["videos"] == 8


def test_concurrent_searches_equal_serial_ones_while_the_index_is_written(tmp_path: Path) -> None:
    """Searches run in parallel (no global lock) over immutable snapshots: 4 threads searching while
    another thread adds videos get, for every query, either the result of the index before the add or the
    result after it, never a mix."""
    from concurrent.futures import ThreadPoolExecutor

    torch.manual_seed(0)
    model = MSSL(MSSLConfig(visual_dim=24, query_dim=16, hidden_size=32, n_heads=2, max_ctx_l=32)).eval()
    rng = np.random.default_rng(7)

    def videos(n: int, prefix: str) -> list[GalleryVideo]:
        out = []
        for i in range(n):
            rows = int(rng.integers(1, 40))
            t = np.arange(rows, dtype=np.float32)
            out.append(GalleryVideo(f"{prefix}{i}", rng.standard_normal((rows, 24)).astype(np.float32), t,
                                    t + 1, float(rows)))
        return out

    index = VideoIndex.create(tmp_path / "ix", model)
    index.add(videos(300, "a"))
    later = videos(100, "b")
    texts = [f"query number {i} about a {w}" for i, w in enumerate(["cat", "dog", "car", "tree"] * 3)]
    before = [search_text([index], t, fake_text_encoder, k=5).results for t in texts]
    with ThreadPoolExecutor(5) as pool:
        writer = pool.submit(index.add, later)
        during = list(pool.map(lambda t: search_text([index], t, fake_text_encoder, k=5).results, texts * 3))
        writer.result()
    after = [search_text([index], t, fake_text_encoder, k=5).results for t in texts]
    assert before != after  # the add changed some rankings
    for j, got in enumerate(during):
        assert got in (before[j % len(texts)], after[j % len(texts)])
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda t: search_text([index], t, fake_text_encoder, k=5).results,
                                 texts * 2))
    assert together == after * 2


def test_an_approximate_search_ranks_only_the_approximate_candidates(tmp_path: Path) -> None:
    """``search(..., approximate=True)`` asks each gallery for its approximate ranking: with room for 2
    candidate videos, 2 of the 6 are scored (exactly: the same scores as an exact search gives them)."""
    from prvr.index import IndexConfig

    torch.manual_seed(0)
    model = MSSL(MSSLConfig(visual_dim=24, query_dim=16, hidden_size=32, n_heads=2, max_ctx_l=32)).eval()
    cfg = IndexConfig(candidate_videos=2, candidate_units=2, nprobe=1)
    ix = VideoIndex.create(tmp_path / "ix", model, cfg)
    ix.add(gallery())
    tokens = fake_text_encoder(["a cat on a sofa"])[0]
    exact, approx = search([ix], tokens, k=6), search([ix], tokens, k=6, approximate=True)
    assert not exact.approximate and approx.approximate
    assert exact.stats["scored_exactly"] == len(exact) == 6
    assert approx.stats["scored_exactly"] == len(approx) == 2
    scores = {r["video_id"]: r["score"] for r in exact}
    assert all(r["score"] == pytest.approx(scores[r["video_id"]], abs=1e-6) for r in approx)
    from prvr.index import Evidence
    from prvr.results.search import encode_query

    q = encode_query(model, tokens)
    merged = Evidence.merge([ix.rank(q, 6), ix.rank(q, 6, approximate=True)], 6)
    assert merged.approximate and merged.scored_exactly == 6 + 2  # one approximate part makes it approximate
    assert not Evidence.merge([ix.rank(q, 6), ix.rank(q, 6)], 6).approximate


def test_a_hit_without_fine_rows_falls_back_to_the_key_clip(index: VideoIndex) -> None:
    """Evidence from a producer that fills no fine rows (the fields' defaults) still gives a Contract 4
    dict: the key moment is MS-SL's key clip and the heatmap one cell per clip unit."""
    import dataclasses

    from prvr.index.evidence import VideoEvidence
    from prvr.results.response import result_dict
    from prvr.results.search import encode_query

    q = encode_query(index.model, fake_text_encoder(["a cat"])[0])
    hit = index.rank(q, k=1).hits[0]
    bare = VideoEvidence(**{f.name: getattr(hit, f.name) for f in dataclasses.fields(VideoEvidence)
                            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING})
    full, old = result_dict(1, hit, "low", q), result_dict(1, bare, "low", q)
    assert set(old) == CONTRACT_KEYS and old["key_clip"] == full["key_clip"]
    key = {**old["key_clip"], "from": "pictures"}
    assert old["key_moment"] == key and old["moments"] == [key] and old["words"] == []
    assert len(old["heatmap"]["score"]) == 32 and old["attention"] == full["attention"]


def test_stats_time_the_text_and_count_it_in_the_total(index: VideoIndex) -> None:
    """A text search reports the text encoder's time (``text_ms``) and a total that includes it: the
    server's own time for a search, beside which the API's round trip is measured (issue #45)."""
    def slow_encoder(texts: list[str]) -> list[np.ndarray]:
        time.sleep(0.05)  # a text model that takes 50 ms
        return fake_text_encoder(texts)

    stats = search_text([index], "a tabby cat sleeping on a sofa", slow_encoder, k=3).stats
    steps = ("text_ms", "encode_ms", "rank_ms", "results_ms")
    assert all(isinstance(stats[s], float) and stats[s] >= 0 for s in (*steps, "total_ms"))
    assert stats["text_ms"] >= 50 and stats["total_ms"] >= sum(stats[s] for s in steps)
    assert "text_ms" not in search([index], fake_text_encoder(["a cat"])[0], k=3).stats  # no text given
