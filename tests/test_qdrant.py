"""QdrantIndex (embedded mode) against the built-in exact index: same top-k, scores and result dicts on a
1,000-video gallery with ties; compact and approximate modes; add / remove / reopen; refusals; URLs and
connection failures."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import numpy as np
import pytest

from prvr.index import GalleryError, GalleryVideo, IndexConfig, IndexMismatchError, VideoIndex
from prvr.index.ingest import ReferenceQueries, encode_for_index
from prvr.index.qdrant import QdrantConfig, QdrantIndex
from prvr.index.qdrant_store import QdrantConnectionError, QdrantTarget, pack, unpack
from prvr.index.store import IndexStoreError
from prvr.results.search import encode_query, search
from prvr.serve.settings import AppSettings
from tests.synthetic import gallery, queries, small_model

MEMORY = "qdrant+local://:memory:"
TINY = dict(map_size=8)  # 36 windows per video: the 1,000-video gallery encodes in seconds


def copies(base: list[GalleryVideo], originals: int, times: int) -> list[GalleryVideo]:
    """``times`` byte-identical copies of each of the first ``originals`` videos (equal totals: ties)."""
    return [GalleryVideo(f"copy{c}-{v.id}", v.features, v.start, v.end, v.duration, f"copy of {v.title}")
            for v in base[:originals] for c in range(times)]


def both(model, videos: list[GalleryVideo], root: Path,
         mode: str = "exact") -> tuple[VideoIndex, QdrantIndex]:
    """A built-in index and an in-memory Qdrant index of the same videos, encoded once (with the scores of
    a small reference bank, so that confidence and every stored array take part)."""
    refs = bank(model)
    fixed, ragged = encode_for_index(model, videos, mode, 64, refs)
    records = [v.record() for v in videos]
    builtin = VideoIndex.create(root, model, IndexConfig(mode=mode), refs)
    builtin.add_encoded(records, fixed, ragged)
    qdrant = QdrantIndex.create(MEMORY, model, QdrantConfig(mode=mode), refs)
    qdrant.add_encoded(records, fixed, ragged)
    return builtin, qdrant


def bank(model, n: int = 40) -> ReferenceQueries:
    """A reference bank of random queries, encoded by the model."""
    return ReferenceQueries(model.encode_queries(queries(n, seed=99)), "test-bank")


def assert_same_evidence(a, b) -> None:
    """Same ids in the same order, totals within 1e-5, same key clips, the same stored arrays for results
    (fine rows and their seconds, segments, reference scores)."""
    assert [h.id for h in a.hits] == [h.id for h in b.hits]
    np.testing.assert_allclose(a.totals, b.totals, rtol=0, atol=1e-5)
    assert [h.key_window for h in a.hits] == [h.key_window for h in b.hits]
    for x, y in zip(a.hits, b.hits, strict=True):
        for name in ("fine", "fine_start", "fine_end", "segments", "ref_clip", "ref_frame"):
            mine, theirs = getattr(x, name), getattr(y, name)
            assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), name
        assert len(x.fine) and len(x.segments)


def without_stats(response) -> dict:
    """A response's dict without its timings."""
    return {k: v for k, v in response.to_dict().items() if k != "stats"}


def test_equal_to_builtin_on_1000_videos_with_ties(tmp_path: Path) -> None:
    model = small_model(**TINY)
    base = gallery(700, max_rows=24)
    videos = base + copies(base, 20, 15)  # 1,000 videos; 20 of them with 15 identical copies each
    builtin, qdrant = both(model, videos, tmp_path / "builtin")
    assert len(qdrant) == len(builtin) == 1000 and qdrant.ids == builtin.ids
    straddled = 0
    for tokens in queries(5):
        q = encode_query(model, tokens)
        for k, w in ((10, None), (10, (1.0, 0.0)), (25, (0.2, 0.8))):
            assert_same_evidence(builtin.rank(q, k, w), qdrant.rank(q, k, w))
        wider = builtin.rank(q, 11).totals
        straddled += bool(wider[9] == wider[10])  # equal totals across the k = 10 boundary
    assert straddled >= 2  # the ties really decide which copies are in the top 10
    assert all(len(h.ref_clip) == 40 for h in qdrant.rank(q, 10).hits)  # the bank's scores took part
    for tokens in queries(2, seed=5):  # moments, heatmaps, attention, confidence: the same result dicts
        assert without_stats(search([builtin], tokens, 10)) == without_stats(search([qdrant], tokens, 10))


def test_bounds_stop_the_pages_early(tmp_path: Path) -> None:
    model = small_model(**TINY)
    videos = gallery(200, max_rows=24)
    builtin, qdrant = both(model, videos, tmp_path / "builtin")
    for tokens in queries(3):
        q = encode_query(model, tokens)
        for w in (None, (1.0, 0.0)):  # MS-SL's weights (the ball bound), clip only (the clip order alone)
            ev = qdrant.rank(q, 5, w)
            assert_same_evidence(builtin.rank(q, 5, w), ev)
            assert ev.scored_exactly < len(videos) and ev.searched == len(videos)


def test_compact_and_approximate(tmp_path: Path) -> None:
    model = small_model()  # 32 units: compact keeps 32 medoids of 528 windows
    videos = gallery(30, max_rows=40)
    videos += copies(videos, 3, 4)
    builtin, qdrant = both(model, videos, tmp_path / "builtin", mode="compact")
    for tokens in queries(3):
        q = encode_query(model, tokens)
        assert_same_evidence(builtin.rank(q, 10), qdrant.rank(q, 10))
        approx = qdrant.rank(q, 10, approximate=True)
        assert approx.approximate
        truth = builtin.exact(np.array([builtin.position[h.id] for h in approx.hits]), q)
        np.testing.assert_allclose(np.sort(approx.totals), np.sort(truth.total), atol=1e-6)  # exact scores


def test_csa_model_frame_scores_from_tokens(tmp_path: Path) -> None:
    model = small_model(csa=True, **TINY)  # frame score from the query's tokens: the ball bound is not used
    videos = gallery(40, max_rows=24)
    builtin, qdrant = both(model, videos + copies(videos, 2, 3), tmp_path / "builtin")
    for tokens in queries(3):
        q = encode_query(model, tokens)
        assert_same_evidence(builtin.rank(q, 5), qdrant.rank(q, 5))


def test_add_remove_reopen_and_refusals(tmp_path: Path) -> None:
    model = small_model(**TINY)
    videos = gallery(12, max_rows=20)
    spec = f"qdrant+local://{tmp_path / 'q'}"
    qdrant = QdrantIndex.open_or_create(spec, model)
    builtin = VideoIndex.create(tmp_path / "builtin", model)
    for index in (qdrant, builtin):
        index.add(videos[:8])
        index.remove([videos[2].id, videos[2].id, videos[5].id])  # a repeated id is removed once
        index.add(videos[8:])
    with pytest.raises(GalleryError, match="already in the index"):
        qdrant.add([videos[0]])
    with pytest.raises(GalleryError, match="no-such"):
        qdrant.remove([videos[0].id, "no-such"])
    bad = GalleryVideo("bad", np.full((3, 24), np.nan, np.float32), np.zeros(3), np.ones(3))
    with pytest.raises(GalleryError, match="NaN"):
        qdrant.add([videos[2], bad])
    assert qdrant.ids == builtin.ids and len(qdrant) == 10
    qdrant.close()
    with pytest.raises(IndexStoreError, match="already exists"):
        QdrantIndex.create(spec, model)
    reopened = QdrantIndex.open_or_create(spec, model)
    assert reopened.ids == builtin.ids and reopened.cfg.mode == "exact"
    for tokens in queries(3):
        q = encode_query(model, tokens)
        assert_same_evidence(builtin.rank(q, 4), reopened.rank(q, 4))
    reopened.add([videos[2]])  # re-added: it is now the newest, as in the built-in index
    builtin.add([videos[2]])
    assert reopened.ids == builtin.ids
    reopened.close()
    other = small_model(seed=1, **TINY)
    with pytest.raises(IndexMismatchError, match=f"model_fingerprint = '{model.fingerprint()}'.*"
                                                 f"'{other.fingerprint()}'"):
        QdrantIndex.open(spec, other)
    QdrantIndex.open(spec, model).close()  # a refused open released the store


def test_a_failed_upload_leaves_the_collection_as_it_was() -> None:
    model = small_model(**TINY)
    videos = gallery(6, max_rows=12)
    qdrant = QdrantIndex.create(MEMORY, model, QdrantConfig(upsert_bytes=1))  # one request per video
    qdrant.add(videos[:2])
    upsert, calls = qdrant.client.upsert, []

    def flaky(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise ConnectionError("the server went away")
        return upsert(*args, **kw)

    qdrant.client.upsert = flaky
    with pytest.raises(QdrantConnectionError, match="could not upsert videos.*the server went away"):
        qdrant.add(videos[2:])
    assert len(calls) == 3 and qdrant.client.count(qdrant.target.collection).count == 2
    assert qdrant.ids == [v.id for v in videos[:2]] and qdrant.meta["next_seq"] == 2
    qdrant.client.upsert = upsert
    qdrant.add(videos[2:])
    assert qdrant.ids == [v.id for v in videos]


def test_urls_and_connection_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    assert QdrantTarget.parse("qdrant://db.local:6334/videos") == QdrantTarget("videos", url="http://db.local:6334")
    assert QdrantTarget.parse("qdrants://db/videos").url == "https://db:6333"
    assert QdrantTarget.parse("qdrant+local://runs/q").path == "runs/q"
    for bad in ("qdrant://host:6333/", "qdrant://host:port/c", "qdrant://host:6333/a/b", "http://host/c",
                "qdrant+local://", "runs/q"):
        with pytest.raises(ValueError, match="index"):
            QdrantTarget.parse(bad)
    monkeypatch.delenv("PRVR_INDEX", raising=False)
    with pytest.raises(SystemExit):
        AppSettings.from_args(["--index", "qdrant://host"])
    assert AppSettings.from_args([]).index is None  # the built-in index by default
    monkeypatch.setenv("PRVR_INDEX", "qdrant://db:6333/videos")
    assert AppSettings.from_args([]).index == "qdrant://db:6333/videos"
    assert AppSettings.from_args(["--index", "qdrant+local://x"]).index == "qdrant+local://x"  # flags win
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    with pytest.raises(QdrantConnectionError, match=f"http://127.0.0.1:{port}/collections/c.*Connect"):
        QdrantIndex.open_or_create(f"qdrant://127.0.0.1:{port}/c", small_model(**TINY),
                                   QdrantConfig(timeout=2))
    assert time.perf_counter() - t0 < 10


def test_payload_arrays_round_trip_exactly() -> None:
    rng = np.random.default_rng(0)
    arrays = {"units": rng.standard_normal((8, 4)).astype(np.float32),
              "pnorm": rng.random(36).astype(np.float32),
              "pidx": np.arange(36, dtype=np.int16), "zhat": rng.standard_normal((36, 4)).astype(">f4"),
              "frames": rng.standard_normal((5, 4)).astype(np.float32), "row_start": np.arange(5.0),
              "row_end": np.arange(5.0) + 1, "fine": rng.standard_normal((5, 4)).astype(np.float16),
              "fine_start": np.arange(5, dtype=np.float32), "fine_end": np.arange(1, 6, dtype=np.float32),
              "segments": np.array([[0, 0, 2], [0, 2, 5], [1, 0, 5]], np.int32),
              "context": rng.standard_normal((2, 4)).astype(np.float32),
              "fine_bank": rng.random((5, 2)).astype(np.float32),
              "context_bank": np.zeros((0, 2), np.float32),
              "ref_clip": rng.random(7).astype(np.float16),
              "ref_frame": rng.random(7).astype(np.float16)}
    back = unpack(pack(arrays))
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype.newbyteorder("=") and np.array_equal(back[name], a)
