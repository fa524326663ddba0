"""QdrantIndex on the Qdrant engine itself, in-process (``qdrant+local://``, ``qdrant-edge-py``), against the
built-in exact index: the same top-k, scores (to the last bit) and result dicts on a 1,000-video gallery with
ties; the engine's bounds are upper bounds; compact and approximate modes; add / remove / reopen; refusals;
the layout declared once for the engine and for a server; URLs and connection failures.

No Qdrant server runs here: the server path (``qdrant://``, qdrant-client) is checked by building the same
collection and points as the engine's, and its requests run once against qdrant-client's local mode (a Python
re-implementation of the API, not the engine: it checks the requests, not Qdrant)."""

from __future__ import annotations

import base64
import dataclasses
import gc
import json
import socket
import tempfile
import time
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest

from prvr.index import GalleryError, GalleryVideo, IndexConfig, IndexMismatchError, VideoIndex
from prvr.index.encoding import ReferenceQueries, encode_for_index
from prvr.index.qdrant import META, QdrantConfig, QdrantIndex
from prvr.index.qdrant_store import (
    ARRAY_FILE,
    BOUNDS,
    META_ID,
    SKETCH,
    ClientStore,
    EdgeDirectory,
    QdrantConnectionError,
    QdrantTarget,
    Stores,
    array_points,
    arrays_spec,
    bound_query,
    client_payload,
    client_vectors,
    collection_spec,
    edge_config,
    engine_eps,
    key_ids,
    key_points,
    keys_spec,
    pack,
    unpack,
    video_point,
)
from prvr.index.schema import ENCODED, SCHEMA_VERSION
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


def both(model, videos: list[GalleryVideo], root: Path, mode: str = "exact", spec: str = MEMORY,
         cfg: QdrantConfig | None = None) -> tuple[VideoIndex, QdrantIndex]:
    """A built-in index and a Qdrant index (in memory unless ``spec``) of the same videos, encoded once (with
    the scores of a small reference bank, so that confidence and every stored array take part)."""
    refs = bank(model)
    fixed, ragged = encode_for_index(model, videos, mode, 64, refs)
    records = [v.record() for v in videos]
    builtin = VideoIndex.create(root, model, IndexConfig(mode=mode), refs)
    builtin.add_encoded(records, fixed, ragged)
    qdrant = QdrantIndex.create(spec, model, cfg or QdrantConfig(mode=mode), refs)
    qdrant.add_encoded(records, fixed, ragged)
    return builtin, qdrant


def bank(model, n: int = 40) -> ReferenceQueries:
    """A reference bank of random queries, encoded by the model."""
    return ReferenceQueries(model.encode_queries(queries(n, seed=99)), "test-bank")


def assert_same_evidence(a, b) -> None:
    """Same ids in the same order, the same totals to the last bit, same key clips, the same stored arrays
    for results (fine rows and their seconds, segments, reference scores)."""
    assert [h.id for h in a.hits] == [h.id for h in b.hits]
    np.testing.assert_array_equal(a.totals, b.totals)
    assert [h.key_window for h in a.hits] == [h.key_window for h in b.hits]
    for x, y in zip(a.hits, b.hits, strict=True):
        for name in ("fine", "fine_start", "fine_end", "segments", "ref_clip", "ref_frame"):
            mine, theirs = getattr(x, name), getattr(y, name)
            assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), name
        assert len(x.fine) and len(x.segments)


def without_stats(response) -> dict:
    """A response's dict without its timings."""
    return {k: v for k, v in response.to_dict().items() if k != "stats"}


def test_equal_to_builtin_on_500_videos_with_ties(tmp_path: Path) -> None:
    model = small_model(**TINY)
    base = gallery(350, max_rows=24)
    videos = base + copies(base, 10, 15)  # 500 videos; 10 of them with 15 identical copies each
    builtin, qdrant = both(model, videos, tmp_path / "builtin")
    assert len(qdrant) == len(builtin) == 500 and qdrant.ids == builtin.ids
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


def test_sketches_fetched_per_query_where_the_table_does_not_fit(tmp_path: Path) -> None:
    """With no room for the decoded sketches (``sketch_cache_bytes`` 0) refining fetches them for each query:
    the same evidence as the built-in index, and nothing kept."""
    model = small_model(**TINY)
    builtin, qdrant = both(model, gallery(80, max_rows=24), tmp_path / "builtin",
                           cfg=QdrantConfig(sketch_cache_bytes=0))
    for tokens in queries(3):
        q = encode_query(model, tokens)
        assert_same_evidence(builtin.rank(q, 5), qdrant.rank(q, 5))
    assert not qdrant.storage._sketch_table.have.any()
    qdrant.close()


def test_an_opened_gallery_reads_its_sketches_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a gallery whose sketches fit ``sketch_cache_bytes`` reads every live video's sketch once, and
    its ranks then read none (answering as the built-in index does); where they do not fit, opening reads at
    most one."""
    from prvr.index import qdrant_store

    model = small_model(**TINY)
    videos, spec, refs = gallery(60, max_rows=24), f"qdrant+local://{tmp_path / 'q'}", bank(model)
    builtin, made = both(model, videos, tmp_path / "builtin", spec=spec)
    for index in (made, builtin):
        index.remove([videos[2].id])
    made.close()
    sketches: list[int] = []  # the insertion numbers of the sketch points read
    retrieve = qdrant_store.EdgeStore.retrieve

    def counted(self, ids, fields):
        sketches.extend(i // 4 for i in ids if i % 4 == 0 and self.file is not None)  # array_id(s, "sketch")
        return retrieve(self, ids, fields)

    monkeypatch.setattr(qdrant_store.EdgeStore, "retrieve", counted)
    index = QdrantIndex.open(spec, model, references=refs)
    assert sorted(sketches) == [s for s in range(len(videos)) if s != 2]  # each live one, once
    sketches.clear()
    for tokens in queries(3):
        q = encode_query(model, tokens)
        for w in (None, (0.2, 0.8)):
            assert_same_evidence(builtin.rank(q, 5, w), index.rank(q, 5, w))
    assert sketches == []
    index.close()
    small = QdrantIndex.open(spec, model, QdrantConfig(sketch_cache_bytes=4096), references=refs)
    assert len(sketches) <= 1
    q = encode_query(model, queries(1)[0])
    assert_same_evidence(builtin.rank(q, 5), small.rank(q, 5))
    small.close()


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


class Counted:
    """A ``PointStore`` that counts the points its queries return and its reads fetch (what a rank reads of
    the engine)."""

    def __init__(self, store) -> None:
        self.store, self.read = store, 0

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    def query(self, *args, **kw):
        hits = self.store.query(*args, **kw)
        self.read += len(hits.ids)
        return hits

    def retrieve(self, ids, fields):
        self.read += len(ids)
        return self.store.retrieve(ids, fields)


def test_approximate_candidates_come_from_the_engines_index(tmp_path: Path) -> None:
    """Approximate search takes its candidates from the HNSW graph over the keys (``candidate_keys`` of them,
    grouped into ``candidate_videos``), so the points a query reads of the engine (hits of its queries on the
    videos and the keys, points fetched) do not grow with the gallery: 10x the videos, not 10x the points
    (here: at most 1.5x); exact search of the same gallery reads more, and its totals equal the approximate
    ones on the videos both found."""
    model = small_model(**TINY)
    cfg = QdrantConfig(candidate_videos=24, candidate_keys=8 * 24, hnsw_ef=64, key_scan_videos=0)  # the graph
    read = {}
    for n in (60, 600):
        videos = gallery(n, seed=11, max_rows=12)
        index = QdrantIndex.create(MEMORY, model, cfg, bank(model))
        index.add(videos)
        stores = index.storage.stores
        counted = Counted(stores.videos), Counted(stores.arrays), Counted(stores.keys)
        index.storage.stores = stores._replace(videos=counted[0], arrays=counted[1], keys=counted[2])
        per_query = {}
        for approx in (True, False):
            for c in counted:
                c.read = 0
            for tokens in queries(5, seed=12):
                got = index.rank(encode_query(model, tokens), 5, approximate=approx)
                assert got.approximate == approx and len(got.hits) == 5
            per_query[approx] = sum(c.read for c in counted) / 5
        read[n] = per_query
        index.storage.stores = stores
        index.close()
    assert read[600][True] <= 1.5 * read[60][True], read  # not 10x
    assert read[600][True] < read[600][False], read


def test_an_exact_ranks_first_page_holds_a_share_of_the_gallery(tmp_path: Path) -> None:
    """Each page of an exact rank is a scan of every point, so the first page holds ``first_page_share`` of
    the gallery at least (a tenth of 300 videos: 30 points, not ``first_page``'s 16); the same answers."""
    model = small_model(**TINY)
    index = QdrantIndex.create(MEMORY, model, QdrantConfig(first_page=16, first_page_share=0.0), bank(model))
    try:
        index.add(gallery(300, seed=11, max_rows=12))
        videos = index.storage.stores.videos
        first, answers = {}, {}
        for share in (0.0, 0.1):
            index.storage.cfg = dataclasses.replace(index.storage.cfg, first_page_share=share)
            first[share], answers[share] = set(), []
            for tokens in queries(8, seed=12):
                with patch.object(videos, "query", wraps=videos.query) as scan:
                    got = index.rank(encode_query(model, tokens), 5)
                first[share].add(scan.call_args_list[0].args[2])  # the first page's limit
                answers[share].append(([h.id for h in got.hits], got.totals.tolist()))
        assert first == {0.0: {16}, 0.1: {30}}, first
        assert answers[0.1] == answers[0.0]
    finally:
        index.close()


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


def test_an_in_memory_store_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the engine's temporary shards go
    model = small_model(**TINY)
    closed = QdrantIndex.create(MEMORY, model, QdrantConfig())
    closed.add(gallery(2, max_rows=12))
    dropped = QdrantIndex.create(MEMORY, model, QdrantConfig())
    dropped.add(gallery(2, max_rows=12))
    assert len(list(tmp_path.iterdir())) == 2
    closed.close()
    assert len(list(tmp_path.iterdir())) == 1
    del dropped  # never closed: removed when collected (or at exit)
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_a_failed_upload_leaves_the_collection_as_it_was() -> None:
    model = small_model(**TINY)
    videos = gallery(6, max_rows=12)
    qdrant = QdrantIndex.create(MEMORY, model, QdrantConfig(upsert_bytes=1))  # one request per video
    qdrant.add(videos[:2])
    upsert, calls = qdrant.store.upsert, []

    def flaky(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise ConnectionError("the server went away")
        return upsert(*args, **kw)

    qdrant.store.upsert = flaky
    with pytest.raises(ConnectionError, match="the server went away"):
        qdrant.add(videos[2:])
    assert len(calls) == 3 and qdrant.store.count() == 2 + 1  # and the metadata point
    stores = qdrant.storage.stores  # nor arrays or keys of the failed videos (the third's were written)
    assert stores.arrays.count() == 4 * 2 and stores.keys.count() == QdrantConfig.scene_keys * 2
    assert qdrant.ids == [v.id for v in videos[:2]] and qdrant.meta["next_seq"] == 2
    qdrant.store.upsert = upsert
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
              "pidx": np.arange(36, dtype=np.int16), "zbasis": rng.standard_normal((3, 4)).astype(">f4"),
              "zcoef": rng.standard_normal((3, 36)).astype(np.float32),
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


def test_the_engines_bounds_are_upper_bounds_of_every_total(tmp_path: Path) -> None:
    """The ``bounds`` multivector's MAX_SIM at a query's weights, as the engine computes it (float16 rows,
    float16 query) plus ``engine_eps``, is at least every video's exact total: what makes a page's last score
    a bound of every video after it. For MS-SL's weights, clip only, frame only and a mix, on 200 videos."""
    model = small_model(**TINY)
    videos = gallery(200, seed=3, max_rows=24)
    builtin, qdrant = both(model, videos, tmp_path / "builtin")
    everything = np.arange(len(videos))
    slack = []
    for tokens in queries(6, seed=4):
        q = encode_query(model, tokens)
        unit = q / np.linalg.norm(q.astype(np.float64))
        for w in ((0.7, 0.3), (1.0, 0.0), (0.0, 1.0), (0.3, 0.7)):
            exact = builtin.exact(everything, q, w).total
            hits = qdrant.store.query(BOUNDS, bound_query(unit.astype(np.float32), w, True), len(videos))
            bound = np.empty(len(videos))
            bound[hits.ids] = hits.scores  # a video point's id: its insertion number
            assert len(hits.ids) == len(videos) and (bound + engine_eps(w) >= exact).all(), w
            slack.append(np.median(bound - exact))
    assert 0 < np.median(slack) < 0.5  # and they bound something: not everything at the maximum


def test_the_layout_is_declared_once_for_the_engine_and_a_server() -> None:
    """The engine's shards and a server's collections are made from one ``collection_spec`` and one
    ``keys_spec``: the same named vectors, widths, float16 storage, DOT (+ MAX_SIM for ``bounds``), graph
    (none for ``bounds``) and int8 quantization; a point is the same id, vectors and payload whichever store
    writes it."""
    from qdrant_client import models

    for spec, names in ((collection_spec(384), {"bounds"}), (keys_spec(384), {"key"})):
        edge, client = edge_config(spec).vectors, client_vectors(spec)
        assert set(edge) == set(client) == names
        for name in edge:
            e, c = edge[name], client[name]
            assert e.size == c.size == spec[name]["size"]
            assert "Float16" in str(e.datatype) and c.datatype == models.Datatype.FLOAT16
            assert "Dot" in str(e.distance) and c.distance == models.Distance.DOT
            if name == "bounds":
                assert "MaxSim" in str(e.multivector_config.comparator)
                assert c.multivector_config.comparator == models.MultiVectorComparator.MAX_SIM
            else:
                assert e.multivector_config is None and c.multivector_config is None
            assert e.hnsw_config.m == c.hnsw_config.m == spec[name]["hnsw_m"]
            assert (e.quantization_config is None) == (c.quantization_config is None)
    spec = collection_spec(384)
    assert edge_config(spec).vectors["bounds"].hnsw_config.m == 0
    assert edge_config(keys_spec(384)).vectors["key"].quantization_config is not None
    # the segments a query searches at once: the engine's and a server's optimizer are asked the same
    assert edge_config(spec).optimizers.default_segment_number == spec["optimizers"]["default_segment_number"]
    assert collection_spec(384, segments=7)["optimizers"] == {"default_segment_number": 7}
    sharded = collection_spec(384, shards=6, replicas=2)  # what a server's collections are made with
    assert sharded["cluster"] == arrays_spec(6, 2)["cluster"] == {"shard_number": 6, "replication_factor": 2}
    rng = np.random.default_rng(0)
    arrays = {"units": rng.random((4, 3), np.float32), "pnorm": rng.random(10, np.float32),
              "pidx": np.arange(10, dtype=np.int16), "zbasis": rng.random((2, 3), np.float32),
              "zcoef": rng.random((2, 10), np.float32), "ref_clip": np.zeros(0, np.float16),
              "ref_frame": np.zeros(0, np.float16), **{k: np.zeros((1, 2), np.float32) for k in ENCODED[7:]},
              **{k: np.zeros(3, np.float32) for k in SKETCH}}
    import qdrant_edge

    video = video_point({"id": "v1", "title": "t", "path": "p.mp4", "duration": 2.0, "sha256": "ab"}, 5,
                        rng.random((3, 6)).astype(np.float16))
    keys = key_points(5, rng.random((2, 3)).astype(np.float16))
    assert [k.id for k in keys] == [10, 11] == key_ids([5], 2)  # K seq + j
    for point in (video, *keys):
        struct = models.PointStruct(id=point.id, vector=point.vectors, payload=point.payload)  # ClientStore's
        mine = qdrant_edge.Point(point.id, point.vectors, point.payload)  # what EdgeStore sends
        assert struct.id == mine.id and struct.vector == mine.vector and struct.payload == mine.payload
    for p in array_points(5, arrays):  # the arrays' bytes: base64 to a server (the engine: ``ArrayFile``)
        assert isinstance(p.payload["data"], bytes) and not p.vectors
        sent = client_payload(p.payload)
        assert base64.b64decode(sent["data"]) == p.payload["data"] and set(sent) == {"data"}
    assert video.id == video.payload["seq"] == 5 and (video.payload["id"], video.payload["path"]) == ("v1",
                                                                                                      "p.mp4")
    groups = array_points(5, arrays)
    assert [p.id for p in groups] == [20, 21, 22, 23]  # 4 seq + group
    names = [n for p in groups for n in unpack(p.payload)]  # all, pidx in the sketch and the exact
    assert sorted(names) == sorted((*ENCODED, *SKETCH, "pidx"))
    assert {n: a.tolist() for p in groups for n, a in unpack(p.payload).items()} == {
        n: np.asarray(a).tolist() for n, a in arrays.items()}


@pytest.mark.filterwarnings("ignore:Local mode performs exact")
def test_the_server_path_requests_through_qdrant_client(tmp_path: Path) -> None:
    """The server path's code (``ClientStore``: create the collection, upsert, the metadata point, paged
    queries with offsets and id filters, retrieve, scroll, delete) run against qdrant-client's local mode, the
    only Qdrant API that runs here without a server (a Python re-implementation, not the engine): it answers
    as the built-in index does."""
    from qdrant_client import QdrantClient

    model = small_model(**TINY)
    videos = gallery(80, seed=5, max_rows=20)
    builtin, engine = both(model, videos, tmp_path / "builtin")
    target = QdrantTarget.parse("qdrant://localhost:6333/videos")
    client = QdrantClient(location=":memory:")
    stores = Stores(ClientStore(target, client, "videos"), ClientStore(target, client, "videos-arrays"),
                    ClientStore(target, client, "videos-keys"), client.close)
    server = QdrantIndex.create(target, model, QdrantConfig(first_page=16, shards=2), bank(model),
                                stores=stores)
    fixed, ragged = encode_for_index(model, videos, "exact", 64, bank(model))
    server.add_encoded([v.record() for v in videos], fixed, ragged)
    server.remove([videos[3].id])
    builtin.remove([videos[3].id])
    assert server.ids == builtin.ids and stores.videos.count() == len(videos)  # 79 and the metadata point
    assert stores.arrays.count() == 4 * (len(videos) - 1)  # four points of arrays per video
    assert stores.keys.count() == QdrantConfig.scene_keys * (len(videos) - 1)  # and of keys
    for tokens in queries(3, seed=6):
        q = encode_query(model, tokens)
        for w in (None, (0.2, 0.8)):
            assert_same_evidence(builtin.rank(q, 5, w), server.rank(q, 5, w))
    reopened = QdrantIndex.open(target, model, references=bank(model), stores=stores)
    assert reopened.ids == builtin.ids and reopened.meta["next_seq"] == len(videos)


def test_an_older_store_is_refused_with_a_rebuild_message(tmp_path: Path) -> None:
    """A directory of qdrant-client's embedded store (what ``qdrant+local://`` was before schema 10), and a
    gallery whose metadata has another schema, are refused, saying to rebuild; the store is released."""
    old = tmp_path / "old"
    (old / "collection" / "prvr").mkdir(parents=True)
    (old / "meta.json").write_text('{"collections": {"prvr": {}}}')
    with pytest.raises(IndexStoreError, match="older release.*rebuild the index"):
        QdrantIndex.open_or_create(f"qdrant+local://{old}", small_model(**TINY))
    model = small_model(**TINY)
    spec = f"qdrant+local://{tmp_path / 'q'}"
    qdrant = QdrantIndex.create(spec, model)
    qdrant.add(gallery(2, max_rows=6))
    qdrant.store.set_payload(META_ID, {META: {**qdrant.meta, "schema_version": SCHEMA_VERSION - 1}})
    qdrant.close()
    with pytest.raises(IndexMismatchError, match=f"schema {SCHEMA_VERSION - 1}.*reads {SCHEMA_VERSION}; "
                                                 "rebuild the index"):
        QdrantIndex.open(spec, model)
    with pytest.raises(QdrantConnectionError, match="another process"):  # one process at a time
        held = EdgeDirectory(QdrantTarget.parse(spec))
        try:
            EdgeDirectory(QdrantTarget.parse(spec))
        finally:
            held.close()


def test_the_engine_keeps_arrays_as_raw_bytes_in_a_file(tmp_path: Path) -> None:
    """In the engine, no payload holds an array: each point of arrays names its bytes in ``DIR/arrays.bin``
    (raw, what ``pack`` made, no base64), read back to the last bit (bytes on disk against the built-in
    index's: ``benchmarks.scale``); a directory of the earlier layout (arrays in payloads, no file) is refused
    with a rebuild message and released."""
    import shutil

    import qdrant_edge as qe

    model = small_model(**TINY)
    videos = gallery(40, seed=3, max_rows=20)
    refs = bank(model)
    fixed, ragged = encode_for_index(model, videos, "exact", 64, refs)
    root = tmp_path / "q"
    qdrant = QdrantIndex.create(f"qdrant+local://{root}", model, references=refs)
    qdrant.add_encoded([v.record() for v in videos], fixed, ragged)
    shard = qdrant.stores.arrays.shard
    records, _ = shard.scroll(qe.ScrollRequest(limit=1000, with_payload=True, with_vector=False))
    assert len(records) == 4 * len(videos)
    assert all(set(r.payload) == {"at", "size"} for r in records)  # no array in any payload
    raw = sum(a.nbytes for group in (fixed, {k: [x for x in v] for k, v in ragged.items()})
              for arrs in group.values() for a in (arrs if isinstance(arrs, list) else list(arrs)))
    held = (root / ARRAY_FILE).stat().st_size
    assert sum(r.payload["size"] for r in records) == held and held >= raw  # the sketch's bytes on top
    seq = 7
    got = qdrant.storage.fetch([seq], "exact")[seq]
    for name, a in got.items():
        src = fixed[name][seq] if name in fixed else ragged[name][seq]
        assert a.dtype == src.dtype.newbyteorder("=") and np.array_equal(a, src), name
    qdrant.close()
    shutil.copytree(root, tmp_path / "old")
    (tmp_path / "old" / ARRAY_FILE).unlink()
    with pytest.raises(IndexStoreError, match="arrays in payloads.*rebuild the index"):
        QdrantIndex.open(f"qdrant+local://{tmp_path / 'old'}", model, references=refs)
    EdgeDirectory(QdrantTarget.parse(f"qdrant+local://{tmp_path / 'old'}")).close()  # released


def test_a_gallery_moves_to_qdrant_as_it_is(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``python -m prvr.index move``: a built-in index (with a removed video and two updates) into the Qdrant
    engine, and that store on into another, without the model; each answers every query as the source does,
    to the last bit, in the same insertion order; the source is unchanged; an existing target is refused.
    (The server case, ``qdrant://``, runs the same code through ``ClientStore``; no server runs here.)"""
    from prvr.index.__main__ import main

    model = small_model(**TINY)
    videos = gallery(60, seed=7, max_rows=20)
    refs = bank(model)
    builtin = VideoIndex.create(tmp_path / "builtin", model, IndexConfig(segment_videos=16), refs)
    builtin.add(videos[:40])
    builtin.add(videos[40:])
    builtin.remove([videos[5].id])
    before = sorted(p.stat().st_mtime_ns for p in (tmp_path / "builtin").rglob("*") if p.is_file())
    first, second = f"qdrant+local://{tmp_path / 'q1'}", f"qdrant+local://{tmp_path / 'q2'}"
    assert main(["move", str(tmp_path / "builtin"), first]) == 0
    assert "moved 59 videos" in capsys.readouterr().out
    assert main(["move", first, second]) == 0
    assert before == sorted(p.stat().st_mtime_ns for p in (tmp_path / "builtin").rglob("*") if p.is_file())
    for spec in (first, second):
        moved = QdrantIndex.open(spec, model, references=refs)
        try:
            assert moved.ids == builtin.ids and moved.cfg.mode == "exact"
            for tokens in queries(3, seed=8):
                q = encode_query(model, tokens)
                for w in (None, (0.2, 0.8)):
                    assert_same_evidence(builtin.rank(q, 5, w), moved.rank(q, 5, w))
            moved.add(gallery(1, seed=9, max_rows=5))  # and it takes new videos, after the moved ones
            assert moved.ids[:-1] == builtin.ids
        finally:
            moved.close()
    assert main(["move", str(tmp_path / "builtin"), first]) == 1
    assert "already exists" in capsys.readouterr().err


def test_a_gallery_without_the_keys_collection_is_refused_and_moves_into_one(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A gallery of the layout before the keys' collection (its keys were a vector of the videos' points;
    here, a gallery whose ``keys`` shard is gone) is refused at open with the move command to run; the move
    copies it into the current layout, where approximate search finds its candidates in the keys' graph (a
    point a key) and exact search answers as before."""
    import shutil

    from prvr.index.__main__ import main

    model = small_model(**TINY)
    refs = bank(model)
    old, new = tmp_path / "old", tmp_path / "new"
    index = QdrantIndex.create(f"qdrant+local://{old}", model, QdrantConfig(key_scan_videos=0), refs)
    index.add(gallery(30, seed=3, max_rows=12))
    q = encode_query(model, queries(1, seed=4)[0])
    exact = index.rank(q, 5)
    index.close()
    shutil.rmtree(old / "keys")
    command = f"python -m prvr.index move qdrant\\+local://{old} NEW_TARGET"
    with pytest.raises(IndexStoreError, match=f"earlier layout.*{command}"):
        QdrantIndex.open(f"qdrant+local://{old}", model, references=refs)
    assert main(["move", f"qdrant+local://{old}", f"qdrant+local://{new}"]) == 0
    assert "moved 30 videos" in capsys.readouterr().out
    moved = QdrantIndex.open(f"qdrant+local://{new}", model, QdrantConfig(key_scan_videos=0), refs)
    try:
        assert moved.storage.stores.keys.count() == QdrantConfig.scene_keys * 30
        assert_same_evidence(exact, moved.rank(q, 5))
        approx = moved.rank(q, 5, approximate=True)
        assert approx.approximate and [h.id for h in approx.hits] == [h.id for h in exact.hits]
    finally:
        moved.close()


def test_a_servers_arrays_measured_in_each_form_read_back_to_the_last_bit(
        capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks.server_arrays``: a video's arrays as a server would send them (base64 in the payload as
    today, one uint8 multivector, or float32 and uint8 multivectors by type), over REST and gRPC, each read
    back to the last bit (the benchmark stops otherwise); base64 keeps 4/3 of the raw bytes on the server's
    disk, the vector forms within 5 %, and only the typed form over gRPC carries about as few bytes as
    base64."""
    from benchmarks import server_arrays

    monkeypatch.setattr("sys.argv", ["server_arrays", "--videos", "2", "--repeats", "1"])
    server_arrays.main()
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    got = {(x["protocol"], x["form"]): x for x in lines}
    assert set(got) == {(p, f) for p in ("rest", "grpc") for f in server_arrays.FORMS}
    raw = lines[0]["raw_bytes_per_video"]
    assert 150_000 < raw < 400_000  # the exact and evidence groups of a synthetic video (docs/qdrant.md)
    base64_disk = got["rest", "base64_payload"]["server_disk_bytes_per_video"]
    assert base64_disk == pytest.approx(4 / 3 * raw, rel=0.01)
    for form in ("uint8_multivector", "typed_multivectors"):
        assert raw <= got["grpc", form]["server_disk_bytes_per_video"] <= 1.05 * raw
    assert got["grpc", "typed_multivectors"]["wire_bytes_per_video"] < 1.1 * got["grpc", "base64_payload"][
        "wire_bytes_per_video"] < got["grpc", "uint8_multivector"]["wire_bytes_per_video"]
