"""The gallery contract (``prvr.index.gallery.Gallery``), run over both stores through the public interface.

Every test is parametrised over the built-in store (``VideoIndex``: a data directory) and Qdrant (embedded,
``qdrant+local://DIR``), both opened with ``prvr.index.backends.open_gallery`` as the app opens them: add,
refused input that changes nothing, remove, the catalogue (ids, records, find_sha256, len), reopening,
refusal of another model or profile, ``rank`` against the model's own ``model.score`` over every video (ties
by insertion order, and on a gallery past the first page of candidates), and the checks of ``k`` and the
weights. The Qdrant backend runs the Qdrant engine itself, in-process (``qdrant-edge-py``).
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from prvr.index import (
    Gallery,
    GalleryError,
    GalleryVideo,
    IndexMismatchError,
    IndexStoreError,
    QdrantTarget,
    QueryError,
    VideoIndex,
    private_gallery,
    stored_media_paths,
)
from prvr.index.backends import gallery_dir, open_gallery
from prvr.index.encoding import ReferenceQueries
from prvr.index.qdrant import QdrantConfig, QdrantIndex
from prvr.models.mssl import MSSL, MSSLConfig

DIMS = dict(visual_dim=24, query_dim=16, hidden_size=32, n_heads=2, max_ctx_l=32, map_size=8)  # 36 windows
PROFILE = "test"  # open_gallery's profile name (the built-in index's directory)
BACKENDS = ("builtin", "qdrant")


def small_model(seed: int = 0) -> MSSL:
    """A random-init MS-SL with small dims (deterministic per seed)."""
    torch.manual_seed(seed)
    return MSSL(MSSLConfig(**DIMS)).eval()


def videos(n: int, seed: int = 0, dim: int = 24) -> list[GalleryVideo]:
    """Random videos of 1..20 rows (one per second), each with its own content hash."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        rows = int(rng.integers(1, 21))
        t = np.arange(rows, dtype=np.float32)
        x = rng.standard_normal((rows, dim)).astype(np.float32)
        sha = hashlib.sha256(x.tobytes()).hexdigest()
        out.append(GalleryVideo(f"v{seed}-{i}", x, t, t + 1, float(rows), title=f"video {seed}-{i}",
                                path=f"media/{seed}-{i}.mp4", sha256=sha))
    return out


def copy_of(v: GalleryVideo, new_id: str) -> GalleryVideo:
    """The same features (so equal scores: a tie) under another id."""
    return GalleryVideo(new_id, v.features, v.start, v.end, v.duration, f"copy of {v.title}", v.path,
                        v.sha256)


def token_queries(n: int, seed: int = 1) -> list[np.ndarray]:
    """Random query token features of 1..12 tokens."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(1, 13)), DIMS["query_dim"])).astype(np.float32)
            for _ in range(n)]


@pytest.fixture(scope="module")
def model() -> MSSL:
    return small_model()


@pytest.fixture(scope="module")
def bank(model) -> ReferenceQueries:
    """A small reference bank (the app always opens its gallery with one)."""
    return ReferenceQueries(model.encode_queries(token_queries(8, seed=99)), "test-bank")


@pytest.fixture(scope="module")
def qs(model) -> np.ndarray:
    """Encoded query vectors (Q, H)."""
    return model.encode_queries(token_queries(4)).numpy()


class Place:
    """Where one backend keeps a gallery; ``open`` opens it the way the app does (``open_gallery``)."""

    def __init__(self, backend: str, root: Path) -> None:
        self.backend, self.root = backend, root

    def open(self, model, references) -> Gallery:
        if self.backend == "qdrant":
            return open_gallery(model, references, url=f"qdrant+local://{self.root}")
        return open_gallery(model, references, data_dir=self.root, profile=PROFILE)

    def open_with(self, model, references, made_for) -> Gallery:
        """The same store opened for ``model`` (the built-in index keeps one directory per model:
        ``open_gallery`` would give another model a fresh one, so open the first model's directly)."""
        if self.backend == "qdrant":
            return self.open(model, references)
        return VideoIndex.open(gallery_dir(self.root, PROFILE, made_for), model, references=references)


@pytest.fixture(params=BACKENDS)
def place(request, tmp_path: Path) -> Place:
    return Place(request.param, tmp_path / request.param)


@pytest.fixture
def gallery(place: Place, model, bank):
    """An open gallery of 6 videos (added in two updates); closed afterwards."""
    g = place.open(model, bank)
    assert isinstance(g, VideoIndex if place.backend == "builtin" else QdrantIndex)
    g.add(videos(4))
    g.add(videos(2, seed=1))
    yield g
    g.close()


def state(g: Gallery, qs: np.ndarray) -> tuple:
    """Everything a reader sees: ids, len, records, and every query's full ranking (ids, totals)."""
    ranks = []
    for q in qs:
        ev = g.rank(q, k=max(len(g), 1))
        ranks.append(([h.id for h in ev.hits], ev.totals.tolist()))
    return g.ids, len(g), [dict(r) for r in g.records()], ranks


def brute_force(model, gallery_videos: list[GalleryVideo], q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Clip and frame scores (float64) of the model's own ``model.score`` over every video. Each distinct
    content is scored once and its copies share its scores (a batched ``model.score`` may differ in the
    last bits between two copies at different batch positions: they are meant to tie)."""
    distinct = list({v.sha256: v for v in gallery_videos}.values())
    scores = model.score(torch.as_tensor(q)[None], model.encode_videos([v.features for v in distinct]))
    index = {v.sha256: i for i, v in enumerate(distinct)}
    at = np.array([index[v.sha256] for v in gallery_videos])
    return scores.clip[0].double().numpy()[at], scores.frame[0].double().numpy()[at]


# ------------------------------------------------------------------ the catalogue


def test_add_and_the_catalogue(gallery: Gallery) -> None:
    added = videos(4) + videos(2, seed=1)
    assert len(gallery) == 6 and gallery.ids == [v.id for v in added]  # insertion order
    assert gallery.records() == [gallery.record(v.id) for v in added]
    for v in added:
        record = gallery.record(v.id)
        assert {k: record[k] for k in ("id", "title", "path", "duration", "sha256")} == v.record()
        assert gallery.find_sha256(v.sha256)["id"] == v.id
    assert gallery.record("no-such") is None and gallery.find_sha256("0" * 64) is None
    assert gallery.describe()["videos"] == 6
    gallery.add([])  # nothing to add: nothing changes
    assert len(gallery) == 6


def test_the_media_files_it_names(gallery: Gallery, place: Place) -> None:
    """``media_paths``: the stored path of every live video (what a sweep of the media dir must keep), never
    a path no video had; a built-in index directory answers the same without being opened
    (``stored_media_paths``), for the data dir's indexes of other models."""
    added = videos(4) + videos(2, seed=1)
    assert gallery.media_paths() == {v.path for v in added}
    gallery.remove([added[0].id])
    assert {v.path for v in added[1:]} <= gallery.media_paths() <= {v.path for v in added}
    folder = gallery.data_folder(place.root)  # the folder the media sweep must not read as another's
    assert folder.listed == (place.backend == "builtin")
    if not folder.listed:  # a collection elsewhere: a folder named for it, where the sweep leaves its marker
        assert folder.path == place.root / "indexes" / f"qdrant-{gallery.describe()['name']}"
    else:  # the built-in index's own directory
        assert folder.path == gallery_dir(place.root, PROFILE, gallery.model)
        assert stored_media_paths(folder.path) == {v.path for v in added}  # removed ones kept: conservative
        (folder.path / "unknown.bin").write_bytes(b"?")
        foreign = place.root / "not-an-index"
        foreign.mkdir()
        (foreign / "records.bin").write_bytes(b"?")
        assert stored_media_paths(foreign) is None  # a layout it cannot list: nothing may be deleted


def refused_batches() -> dict[str, list[GalleryVideo]]:
    """Batches ``add`` must refuse whole, by what is wrong with them."""
    fresh = videos(2, seed=7)

    def bad(**change) -> GalleryVideo:
        v = copy.deepcopy(fresh[1])
        for name, value in change.items():
            setattr(v, name, value(v) if callable(value) else value)
        return v

    def poisoned(value: float):
        def f(v: GalleryVideo) -> np.ndarray:
            x = v.features.copy()
            x[-1, 0] = value
            return x
        return f

    return {"NaN features": [bad(features=poisoned(np.nan))],
            "inf features": [bad(features=poisoned(np.inf))],
            "wrong width": [bad(features=lambda v: np.ones((len(v.features), 25), np.float32))],
            "fewer times than rows": [bad(start=lambda v: v.start[:-1])],
            "end before start": [bad(end=lambda v: v.start - 1)],
            "no rows": [bad(features=np.zeros((0, 24), np.float32), start=np.zeros(0), end=np.zeros(0))],
            "an id already there": [videos(1)[0]],
            "an id twice in the batch": [fresh[0], fresh[0]],
            "an empty id": [bad(id="")],
            "a good video, then a bad one": [fresh[0], bad(features=poisoned(np.nan))]}


def test_refused_add_changes_nothing(gallery: Gallery, place: Place, model, bank, qs) -> None:
    before = state(gallery, qs)
    for case, batch in refused_batches().items():
        with pytest.raises(GalleryError):
            gallery.add(batch)
        assert state(gallery, qs) == before, case
        assert gallery.find_sha256(videos(2, seed=7)[0].sha256) is None, case
    gallery.close()  # and nothing was written: a fresh open sees the same
    reopened = place.open(model, bank)
    try:
        assert state(reopened, qs) == before
    finally:
        reopened.close()


def test_remove_and_unknown_ids(gallery: Gallery, place: Place, model, bank, qs) -> None:
    added = videos(4) + videos(2, seed=1)
    gallery.remove([added[1].id, added[4].id, added[1].id])  # an id given twice is removed once
    kept = [v for i, v in enumerate(added) if i not in (1, 4)]
    assert gallery.ids == [v.id for v in kept] and len(gallery) == 4
    assert gallery.record(added[1].id) is None and gallery.find_sha256(added[4].sha256) is None
    assert {h.id for h in gallery.rank(qs[0], k=10).hits} == {v.id for v in kept}
    before = state(gallery, qs)
    for ids in (["no-such"], [added[0].id, "no-such"], [added[1].id]):  # unknown, or already removed
        with pytest.raises(GalleryError):
            gallery.remove(ids)
        assert state(gallery, qs) == before
    gallery.add([added[1]])  # re-added: now the newest
    assert gallery.ids == [v.id for v in kept] + [added[1].id]
    gallery.remove(gallery.ids)
    assert len(gallery) == 0 and gallery.ids == [] and gallery.records() == []
    assert len(gallery.rank(qs[0], k=5)) == 0


def test_removing_an_id_given_twice_keeps_the_other_video_of_its_update(place: Place, model, bank,
                                                                      qs) -> None:
    """Two videos added in one update (the built-in index: one segment of two); the one id given twice is
    removed once, and the other video stays, also after reopening."""
    g = place.open(model, bank)
    try:
        a, b = videos(2, seed=9)
        g.add([a, b])
        g.remove([a.id, a.id])
        assert g.ids == [b.id] and len(g) == 1
        assert [h.id for h in g.rank(qs[0], k=5).hits] == [b.id]
    finally:
        g.close()
    reopened = place.open(model, bank)
    try:
        assert reopened.ids == [b.id] and [h.id for h in reopened.rank(qs[1], k=5).hits] == [b.id]
    finally:
        reopened.close()


def test_reopen_gives_the_same_gallery(gallery: Gallery, place: Place, model, bank, qs) -> None:
    gallery.remove([videos(4)[2].id])
    before = state(gallery, qs)
    gallery.close()
    reopened = place.open(model, bank)
    try:
        assert state(reopened, qs) == before
        reopened.add(videos(1, seed=3))  # and it takes writes again
        assert reopened.ids == before[0] + [videos(1, seed=3)[0].id]
    finally:
        reopened.close()


def test_refuses_another_model_or_profile(gallery: Gallery, place: Place, model, bank, qs) -> None:
    before = state(gallery, qs)
    gallery.close()
    other = small_model(seed=1)
    assert other.fingerprint() != model.fingerprint()
    with pytest.raises(IndexMismatchError, match="model_fingerprint"):
        place.open_with(other, ReferenceQueries(other.encode_queries(token_queries(8, 99)), "test-bank"),
                        made_for=model)
    relabelled = copy.deepcopy(model)  # the same weights, features of another profile
    relabelled.profile = {"name": "other", "version": 1}
    assert relabelled.fingerprint() == model.fingerprint()
    with pytest.raises(IndexMismatchError, match="profile"):
        place.open(relabelled, bank)
    with pytest.raises(IndexMismatchError, match="reference bank"):
        place.open(model, ReferenceQueries(bank.queries, "another-bank"))
    reopened = place.open(model, bank)  # the refusals changed nothing and released the store
    try:
        assert state(reopened, qs) == before
    finally:
        reopened.close()


def refusal(place: Place, model, references, made_for=None) -> str:
    """The message of the IndexMismatchError that opening the place for ``model`` raises, its store named
    "WHERE" (``made_for``: open the built-in index of that model, as ``Place.open_with``)."""
    with pytest.raises(IndexMismatchError) as err:
        if made_for is not None:
            place.open_with(model, references, made_for)
        else:
            place.open(model, references)
    if place.backend == "builtin":
        where = str(gallery_dir(place.root, PROFILE, made_for or model))
    else:
        where = QdrantTarget.parse(f"qdrant+local://{place.root}").where
    return str(err.value).replace(where, "WHERE")


def test_both_stores_refuse_a_mismatch_the_same_way(tmp_path: Path, model, bank, qs) -> None:
    """One identity check for both stores: another model, profile or reference bank is refused with the same
    message (the store's name aside), through ``open_gallery``, and the refused open leaves the gallery as it
    was; opened without a bank, it ranks but refuses to add, the same way."""
    relabelled = copy.deepcopy(model)  # the same weights, features of another profile
    relabelled.profile = {"name": "other", "version": 1}
    other = small_model(seed=1)
    messages = {}
    for backend in BACKENDS:
        place = Place(backend, tmp_path / backend)
        g = place.open(model, bank)
        g.add(videos(3))
        before = state(g, qs)
        g.close()
        messages[backend] = (refusal(place, relabelled, bank),
                             refusal(place, model, ReferenceQueries(bank.queries, "another-bank")),
                             refusal(place, other, None, made_for=model))
        reader = place.open(model, None)
        try:
            assert state(reader, qs) == before
            with pytest.raises(GalleryError) as err:
                reader.add(videos(1, seed=5))
            messages[backend] += (str(err.value).replace(reader.storage.where, "WHERE"),)
            assert state(reader, qs) == before
        finally:
            reader.close()
    profile, bank_msg, fingerprint, no_bank = messages["builtin"]
    assert messages["qdrant"] == messages["builtin"]
    assert profile.startswith("WHERE was built with profile = None") and "'other'" in profile
    assert bank_msg.startswith("WHERE stores the scores of reference bank 'test-bank' of 8 queries, not of "
                               "the one in use 'another-bank' of 8 queries")
    assert model.fingerprint() in fingerprint and other.fingerprint() in fingerprint
    assert no_bank.startswith("WHERE stores reference scores of bank 'test-bank' of 8 queries")


def test_a_private_gallery_is_its_own(tmp_path: Path, model, bank, qs) -> None:
    """``private_gallery``: a new, empty gallery in the given directory (a session's, a warm-up's), which
    refuses a directory that already holds one, and owns that directory."""
    g = private_gallery(model, bank, tmp_path / "session" / "index")
    assert len(g) == 0 and g.data_folder(tmp_path) == (tmp_path / "session" / "index", True)
    g.add(videos(2))
    assert sorted(h.id for h in g.rank(qs[0], k=5).hits) == sorted(v.id for v in videos(2))
    with pytest.raises(IndexStoreError, match="already holds"):
        private_gallery(model, bank, tmp_path / "session" / "index")


# ------------------------------------------------------------------ ranking


def test_rank_equals_brute_force_with_ties(place: Place, model, bank, qs) -> None:
    base = videos(20, seed=4)
    # copies of videos already there (equal totals): added before and after their originals
    gallery_videos = [copy_of(base[3], "early-copy")] + base + [copy_of(base[3], "late-copy"),
                                                               copy_of(base[7], "copy-of-7")]
    g = place.open(model, bank)
    try:
        g.add(gallery_videos[:10])
        g.add(gallery_videos[10:])
        g.remove([base[0].id])
        live = [v for v in gallery_videos if v.id != base[0].id]
        assert g.ids == [v.id for v in live]
        ties = 0
        for q in qs[:3]:
            clip, frame = brute_force(model, live, q)
            for weights in (None, (1.0, 0.0), (0.2, 0.8)):
                w = g.weights(weights)
                totals = w[0] * clip + w[1] * frame
                expected = np.lexsort((np.arange(len(live)), -totals))  # best first, ties by insertion
                for k in (1, 5, len(live)):
                    ev = g.rank(q, k=k, weights=weights)
                    want = expected[:k]
                    assert [h.id for h in ev.hits] == [live[i].id for i in want], (k, weights)
                    np.testing.assert_allclose(ev.totals, totals[want], rtol=0, atol=1e-6)
                    assert ev.searched == len(live) and ev.weights == w
                hits = [h.id for h in ev.hits]
                ties += hits.index("early-copy") < hits.index(base[3].id) < hits.index("late-copy")
        assert ties == 9  # equal totals always in insertion order
    finally:
        g.close()


def test_rank_equals_brute_force_past_the_first_page(place: Place, model, bank) -> None:
    """150 videos, the best few by MS-SL's weights and by frame-heavy ones: the winners are not all among
    the first candidates the bounds put forward (the Qdrant backend's first page made to hold 16 here), so a
    rank that stopped after its first page or chunk would miss some."""
    gallery_videos = videos(150, seed=11)
    g = (place.open(model, bank) if place.backend == "builtin" else
         QdrantIndex.open_or_create(f"qdrant+local://{place.root}", model, QdrantConfig(first_page=16), bank))
    try:
        g.add(gallery_videos)
        queries = model.encode_queries(token_queries(12, seed=12)).numpy()
        for q in queries:
            clip, frame = brute_force(model, gallery_videos, q)
            for weights in (None, (0.1, 0.9)):
                w = g.weights(weights)
                totals = w[0] * clip + w[1] * frame
                expected = np.lexsort((np.arange(len(gallery_videos)), -totals))
                for k in (1, 3):
                    ev = g.rank(q, k=k, weights=weights)
                    assert [h.id for h in ev.hits] == [gallery_videos[i].id for i in expected[:k]], (k, w)
                    np.testing.assert_allclose(ev.totals, totals[expected[:k]], rtol=0, atol=1e-6)
    finally:
        g.close()


def test_k_and_weights_are_checked(gallery: Gallery, qs) -> None:
    for k in (0, -1, True, False, 10**6, 1001, 2.5, "3", None):
        with pytest.raises(QueryError, match="k must be"):
            gallery.rank(qs[0], k=k)
    for weights in ((-0.1, 1.0), (1.0, -1e-9), (0.0, 0.0), (float("nan"), 1.0), (float("inf"), 0.0), (1.0,),
                    (0.5, 0.3, 0.2)):
        with pytest.raises(QueryError, match="weights"):
            gallery.rank(qs[0], k=3, weights=weights)
    assert len(gallery.rank(qs[0], k=np.int64(2))) == 2
    assert len(gallery.rank(qs[0], k=1000)) == len(gallery)  # more than there are: all of them
    assert gallery.rank(qs[0], k=3).weights == (0.7, 0.3)  # the model's
    as_tensor = gallery.rank(torch.as_tensor(qs[0]), k=3)
    assert as_tensor.totals.tolist() == gallery.rank(qs[0], k=3).totals.tolist()
