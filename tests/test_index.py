"""VideoIndex: exact against model.score, compact against MS-SL++, persistence, atomicity, bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

import prvr  # noqa: F401
from prvr.index import (
    GalleryError,
    GalleryVideo,
    IndexConfig,
    IndexMismatchError,
    VideoIndex,
    store,
    video_index,
)
from prvr.index.encoding import frame_factors, unfactor
from prvr.index.rank import HeadQuery, Page, Stored, clip_bounds, exact_rows, frame_bounds, head_bounds, top_k
from prvr.index.sketch import BoundQuery, head_basis, quantize, sketch, window_factors
from prvr.models.mssl import MSSL
from prvr.models.preprocess import window_table
from tests.synthetic import gallery, queries, small_model

SHARED = Path(os.environ.get("PRVR_SHARED", Path(__file__).resolve().parents[2] / "shared"))
REPO = Path(__file__).resolve().parents[1]
def ranked(index: VideoIndex, q: np.ndarray, k: int, **kw) -> tuple[np.ndarray, np.ndarray, int]:
    """(positions, totals, scored exactly) of ``index.rank``'s Evidence."""
    ev = index.rank(q, k, **kw)
    return (np.array([index.position[h.id] for h in ev.hits], dtype=np.int64), ev.totals, ev.scored_exactly)


def stored_arrays(units: np.ndarray, pnorm: np.ndarray, windows: np.ndarray, zhat: np.ndarray, n_balls: int,
                  basis: np.ndarray | None = None, **extra: np.ndarray) -> dict:
    """One segment's stored arrays of these videos, as the index writes them: the units, proposal norms,
    factored frame-scale features (``frame_factors``), the head basis (the units' own unless given) and the
    sketch."""
    factors = [frame_factors(z) for z in zhat]
    zbasis, zcoef = [f[0] for f in factors], [f[1] for f in factors]
    basis = head_basis(units) if basis is None else basis
    return {"units": units, "pnorm": pnorm, "zbasis": np.concatenate(zbasis), "zcoef": np.concatenate(zcoef),
            "n_zrank": np.array([len(z) for z in zbasis]), "n_zcoef": np.array([len(z) for z in zcoef]),
            "head_basis": basis, **extra,
            **sketch(units, pnorm, windows, zbasis, zcoef, n_balls, basis)}


def stored_zhat(arrays: dict) -> np.ndarray:
    """(n, P, H) the frame-scale features the stored factors hold (what bounds and scores read)."""
    rows = np.concatenate([[0], np.cumsum(arrays["n_zrank"])])
    coefs = np.concatenate([[0], np.cumsum(arrays["n_zcoef"])])
    return np.stack([unfactor(arrays["zbasis"][a:b], arrays["zcoef"][c:d])
                     for a, b, c, d in zip(rows[:-1], rows[1:], coefs[:-1], coefs[1:], strict=True)])


def _one_segment(arrays: dict) -> tuple[Stored, np.ndarray]:
    """The typed Lists and seg_start of one segment's arrays."""
    return Stored.of([arrays]), np.array([0, len(arrays["units"])])


def clip_upper(arrays: dict, rows: np.ndarray, q: BoundQuery, table: np.ndarray | None = None) -> tuple:
    """rank.clip_bounds (the full codes) of one segment's arrays."""
    return clip_bounds(*_one_segment(arrays), rows, q, table, 1)


def head_upper(arrays: dict, rows: np.ndarray, q: BoundQuery, table: np.ndarray | None = None) -> np.ndarray:
    """rank.head_bounds (the first pass) of one segment's arrays."""
    basis = arrays["head_basis"].astype(np.float64)[None]
    head = HeadQuery.of(q, basis, basis @ basis.transpose(0, 2, 1))
    return head_bounds(*_one_segment(arrays), rows, head, table, 1)


def frame_upper(arrays: dict, rows: np.ndarray, hi: np.ndarray, q: BoundQuery,
                table: np.ndarray | None = None, enough: np.ndarray | None = None) -> np.ndarray:
    """rank.frame_bounds of one segment's arrays (enough: -inf, every tier)."""
    enough = np.full(len(rows), -np.inf) if enough is None else enough
    return frame_bounds(*_one_segment(arrays), rows, hi, np.arange(len(rows)), q, table, enough, 1)


def exact_scores(arrays: dict, rows: np.ndarray, q: np.ndarray, w: tuple,
                 table: np.ndarray | None = None):
    """rank.exact_rows of one segment's arrays."""
    return exact_rows(*_one_segment(arrays), rows, BoundQuery.of(q), w, table)


def assert_matches_model(index: VideoIndex, model, videos: list[GalleryVideo], tokens: list[np.ndarray],
                         k: int = 10) -> None:
    """Index scores == model.score within 1e-5 and the same top-k (ties by position)."""
    scores = model.score(model.encode_queries(tokens), model.encode_videos([v.features for v in videos]))
    q = model.encode_queries(tokens).numpy()
    w = (model.cfg.clip_scale_w, model.cfg.frame_scale_w)
    everything = np.arange(len(videos))
    for j in range(len(tokens)):
        ex = index.exact(everything, q[j], w)
        for mine, theirs in ((ex.total, scores.total), (ex.clip, scores.clip), (ex.frame, scores.frame)):
            np.testing.assert_allclose(mine, theirs[j].numpy(), atol=1e-5)
        positions, totals, _ = ranked(index, q[j], k)
        expected = np.lexsort((everything, -scores.total[j].numpy()))[:k]
        assert positions.tolist() == expected.tolist()
        np.testing.assert_allclose(totals, scores.total[j].numpy()[expected], atol=1e-5)


@pytest.mark.parametrize("name", ["forward_small_dims.pt", "forward_tvr_dims.pt"])
def test_exact_on_official_reference(tmp_path: Path, name: str) -> None:
    path = SHARED / "reference" / "mssl" / name
    if not path.is_file():
        pytest.skip(f"{path} not available (needs ../shared next to the checkout)")
    ref = torch.load(path, weights_only=True)
    model = MSSL.from_official(ref["state_dict"], ref["config"]).eval()
    times = [np.arange(len(v), dtype=np.float32) * 1.5 for v in ref["videos"]]
    videos = [GalleryVideo(f"ref{i}", v.numpy(), t, t + 1.5, 1.5 * len(v))
              for i, (v, t) in enumerate(zip(ref["videos"], times, strict=True))]
    index = VideoIndex.create(tmp_path / "ix", model)
    index.add(videos)
    tokens = [t.numpy() for t in ref["queries"]]
    assert_matches_model(index, model, videos, tokens, k=5)
    q = model.encode_queries(tokens).numpy()
    ex = [index.exact(np.arange(len(videos)), q[j], (0.7, 0.3)) for j in range(len(q))]
    np.testing.assert_allclose(np.stack([e.total for e in ex]), ref["scores"].numpy(), atol=1e-4)
    np.testing.assert_allclose(np.stack([e.frame for e in ex]), ref["frame_scores"].numpy(), atol=1e-4)


@pytest.mark.parametrize("head_from", [0, 10**9], ids=["head-first", "full-codes-first"])
def test_exact_on_random_gallery_of_1000(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         head_from: int) -> None:
    """Exact and approximate ranks equal the model's, whichever pass bounds the candidates first (the
    head's from ``video_index.HEAD_FROM`` candidates on; below it the full codes', which refine reuses)."""
    monkeypatch.setattr(video_index, "HEAD_FROM", head_from)
    model = small_model()
    videos = gallery(1000, max_rows=24)
    index = VideoIndex.create(tmp_path / "ix", model, IndexConfig())
    index.add(videos[:600])
    index.add(videos[600:])  # two segments
    assert_matches_model(VideoIndex.open(tmp_path / "ix", model), model, videos, queries(4))
    # approximate: faiss picks 100 candidates, whose returned scores are exact; a candidate budget that
    # covers the gallery gives exactly the exact ranking
    w = (model.cfg.clip_scale_w, model.cfg.frame_scale_w)
    narrow = VideoIndex.open(tmp_path / "ix", model, IndexConfig(candidate_units=400, candidate_videos=100))
    wide = VideoIndex.open(tmp_path / "ix", model, IndexConfig(candidate_videos=1000))
    for q in model.encode_queries(queries(4, seed=5)).numpy():
        positions, totals, scored = ranked(narrow, q, 10, approximate=True)
        assert len(positions) == 10 and scored <= 100
        np.testing.assert_array_equal(totals, narrow.exact(np.sort(positions), q, w).total[
            np.argsort(np.argsort(positions))])
        exact = ranked(wide, q, 10)
        approx = ranked(wide, q, 10, approximate=True)
        assert [x.tolist() for x in approx[:2]] == [x.tolist() for x in exact[:2]]


def mapped_kb(directory: Path) -> tuple[int, int]:
    """(size, resident) in KB of this process's mappings of files under ``directory`` (/proc/self/smaps)."""
    size = rss = 0
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):  # a mapping's header
            inside = len(fields) >= 6 and fields[5].startswith(str(directory))
        elif inside and fields[0] in ("Size:", "Rss:"):
            size, rss = (size + int(fields[1]), rss) if fields[0] == "Size:" else (size, rss + int(fields[1]))
    return size, rss


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps (Linux)")
def test_an_open_maps_the_pages_of_a_gallery_that_fits_in_memory(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh process's first queries took a page fault for every page of the mapped arrays they touched: an
    open maps them all at once in a thread (``snapshot.populate``) where they fit in a quarter of memory, and
    leaves them to each query's read-ahead past that (a gallery bigger than the page cache), whose pages then
    stay mapped (unmapping them after each query cost an approximate rank at 100,000 videos 8 ms). Both rank
    alike: the frame bound in one pass in memory, in two around the read-ahead of the factors past that."""
    from prvr.index import snapshot

    model = small_model()
    VideoIndex.create(tmp_path / "ix", model, IndexConfig()).add(gallery(60, seed=3, max_rows=24))
    index = VideoIndex.open(tmp_path / "ix", model)
    deadline, (size, rss) = time.monotonic() + 10, mapped_kb(tmp_path / "ix")
    while rss <= 0.9 * size and time.monotonic() < deadline:  # every mapped array (bar a few headers)
        time.sleep(0.05)
        size, rss = mapped_kb(tmp_path / "ix")
    assert size > 1000 and rss > 0.9 * size, (size, rss)
    qs = model.encode_queries(queries(8, seed=5)).numpy()
    in_memory = [ranked(index, q, 5) for q in qs]  # the frame bound's three tiers in one pass
    del index
    monkeypatch.setattr(snapshot, "ADVISE_ABOVE", 0.0)  # as if the gallery outgrew the page cache
    other = VideoIndex.open(tmp_path / "ix", model)
    time.sleep(0.5)
    size, rss = mapped_kb(tmp_path / "ix")
    assert other.snapshot.reads_ahead and size > 1000 and rss < size / 4, (size, rss)
    for q, (want, totals, scored) in zip(qs, in_memory, strict=True):  # scores a few videos, reads its hits
        got = ranked(other, q, 5)  # the frame factors read ahead between two passes: the same answers
        assert (got[0].tolist(), got[1].tolist(), got[2]) == (want.tolist(), totals.tolist(), scored)
    after = mapped_kb(tmp_path / "ix")[1]  # (unmapped after each query: 1,000 of 2,428 KB; kept: 2,232)
    assert after > 0.75 * size, (size, rss, after)


def test_a_gallery_in_memory_and_read_from_its_files_share_one_compiled_kernel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """numba compiles a kernel once per argument type, an array's layout and writeable flag included: the
    arrays of a gallery just written (in memory), of one opened from its files (mapped, read-only) and a
    bare segment's (as the tests above build them) reach the kernels as one type, so a search after an open
    compiles nothing again (seconds a kernel on a first start; a clean checkout's tests compiled each scan
    up to five times). The clip pass that the head's scan and the full codes' scan share, and the query's
    levels (one query's, the head's rows), are compiled once too."""
    from prvr.index import kernels, sketch

    model = small_model()
    index = VideoIndex.create(tmp_path / "ix", model, IndexConfig())
    index.add(gallery(40, seed=3, max_rows=24))
    q = model.encode_queries(queries(2)).numpy()[0]
    for ix in (index, VideoIndex.open(tmp_path / "ix", model)):
        for approximate, head_from in ((False, 0), (False, video_index.HEAD_FROM), (True, 0)):
            monkeypatch.setattr(video_index, "HEAD_FROM", head_from)  # the head's pass and the full codes'
            ranked(ix, q, 5, approximate=approximate)
    units, pnorm, windows, zhat, qs = _scan_data(30, 8, seed=4)
    arrays, rows, bq = stored_arrays(units, pnorm, windows, zhat, n_balls=4), np.arange(30), BoundQuery.of(
        qs[0].astype(np.float32))
    frame_upper(arrays, rows, clip_upper(arrays, rows, bq)[1], bq)
    exact_scores(arrays, rows, qs[0].astype(np.float32), (0.5, 0.5))
    scans = ("_head_scan", "_clip_scan", "_frame_scan", "_exact_scan")
    assert {name: len(getattr(kernels, name).signatures) for name in scans} == dict.fromkeys(scans, 1)
    # the pass both clip scans call: compiled with them when they compile (0 when they come from the cache)
    assert len(kernels._clip_pass.signatures) <= 1
    assert len(sketch.query_levels.signatures) == 1  # one query's and the head's rows alike


def test_concurrent_searches_return_what_each_returns_alone(tmp_path: Path) -> None:
    """The app serves several users at once: ranks from 4 threads together (each scan itself spread over
    numba's threads, over two segments) equal the same ranks run one at a time."""
    model = small_model()
    index = VideoIndex.create(tmp_path / "ix", model)
    videos = gallery(600, seed=8, max_rows=24)
    index.add(videos[:250])
    index.add(videos[250:])
    qs = model.encode_queries(queries(12, seed=9)).numpy()
    alone = [ranked(index, q, 10) for q in qs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda q: ranked(index, q, 10), [*qs, *qs[::-1]]))
    for (pos, tot, n), (pos2, tot2, n2) in zip(alone + alone[::-1], together, strict=True):
        assert pos.tolist() == pos2.tolist() and n == n2
        np.testing.assert_array_equal(tot, tot2)


def test_compact_is_exact_for_msslpp(tmp_path: Path) -> None:
    model = small_model()
    videos = gallery(40, seed=3)
    index = VideoIndex.create(tmp_path / "ix", model, IndexConfig(mode="compact"))
    index.add(videos)
    assert (index.snapshot.segments[0]["n_zcoef"] == 32 * index.snapshot.segments[0]["n_zrank"]).all()
    assert index.snapshot.windows is not None
    plus = small_model(clusters=32)  # same weights, MS-SL++ inference
    plus.load_state_dict(model.state_dict())
    assert_matches_model(index, plus, videos, queries(6, seed=4))


def _scan_data(n: int, rank: int, seed: int) -> tuple:
    """Per-video arrays of videos made of 2-4 scenes, each scene one of 50 concepts in a ``rank``-dim
    subspace of R^48 (the first-pass bounds are tight, so they prune, when rank is small)."""
    rng = np.random.default_rng(seed)
    H = 48
    span = np.linalg.qr(rng.standard_normal((H, H)))[0][:, :rank]  # (H, rank)
    concepts = rng.standard_normal((50, rank)) @ span.T
    scene = np.sort(rng.integers(0, 3, (n, 32)), axis=1)  # (n, 32) scene of each unit
    which = rng.integers(0, 50, (n, 3))
    units = concepts[np.take_along_axis(which, scene, 1)] + 0.05 * rng.standard_normal((n, 32, rank)) @ span.T
    units = units.astype(np.float32)
    units[1::7] = units[0::7][: len(units[1::7])]  # duplicated videos: exact ties
    table = window_table().numpy()
    windows = np.broadcast_to(table, (n, len(table), 2))
    csum = np.concatenate([np.zeros((n, 1, H)), units.astype(np.float64).cumsum(1)], 1)
    props = (csum[:, table[:, 1]] - csum[:, table[:, 0]]) / (table[:, 1] - table[:, 0])[:, None]
    pnorm = np.linalg.norm(props, axis=-1).astype(np.float32)
    zhat = props + 0.1 * rng.standard_normal(props.shape) @ span @ span.T  # any unit rows will do
    zhat = (zhat / np.linalg.norm(zhat, axis=-1, keepdims=True)).astype(np.float32)
    zhat[1::7] = zhat[0::7][: len(zhat[1::7])]
    return units, pnorm, windows, zhat, concepts[rng.integers(0, 50, 6)] + 0.1 * rng.standard_normal((6, H))


def split(arrays: dict, first: int) -> list[dict]:
    """One segment's arrays as two segments: the first ``first`` videos, then the rest (factor rows cut
    where their videos are; the head basis shared)."""
    cut = {"zbasis": int(arrays["n_zrank"][:first].sum()), "zcoef": int(arrays["n_zcoef"][:first].sum())}
    parts = []
    for videos, second in ((slice(first), False), (slice(first, None), True)):
        parts.append({f: a if f == "head_basis" else
                      (a[cut[f]:] if second else a[:cut[f]]) if f in cut else a[videos]
                      for f, a in arrays.items()})
    return parts


def pages_of(rows: np.ndarray, bounds: np.ndarray, n: int) -> list[Page]:
    """The candidates in n pages by decreasing bound, each page's rest the largest bound after it."""
    order = np.argsort(-bounds, kind="stable")
    parts = np.array_split(order, n)
    return [Page(rows[p], bounds[p], float(bounds[parts[i + 1][0]]) if i + 1 < n else -np.inf)
            for i, p in enumerate(parts)]


@pytest.mark.parametrize("rank", [8, 48])
def test_pruned_top_k_equals_full_scan_with_ties(rank: int) -> None:
    units, pnorm, windows, zhat, qs = _scan_data(400, rank, seed=rank)
    arrays = stored_arrays(units, pnorm, windows, zhat, n_balls=16)
    n, rows = len(units), np.arange(len(units))
    stored, seg_start = Stored.of(split(arrays, n // 2)), np.array([0, n // 2, n])  # two "segments"
    for q in qs[:3].astype(np.float32):
        qc = BoundQuery.of(q)
        head = head_upper(arrays, rows, qc)
        clip, prefix = clip_upper(arrays, rows, qc)
        frame = frame_upper(arrays, rows, prefix, qc)
        for w in ((0.7, 0.3), (0.5, 0.5), (1.0, 0.0)):
            def score(pos: np.ndarray, q: np.ndarray = q, w: tuple = w) -> np.ndarray:
                return exact_scores(arrays, pos, q, w).total

            ex = exact_scores(arrays, rows, q, w)
            assert (head >= ex.clip - 1e-6).all() and (clip >= ex.clip - 1e-6).all()
            assert (frame >= ex.frame - 1e-6).all()
            # the bounds are tight: a few thousandths above the exact clip score (the head: where the units'
            # energy lies in the head's dimensions, here all of it)
            assert np.median(clip - ex.clip) < 0.02 and np.median(head - ex.clip) < 0.02
            full = ex.total
            expected = np.lexsort((rows, -full))[:10]
            eps = 1e-4 * (1 + w[0] + w[1])

            def refine(pos: np.ndarray, tau: float, qc: BoundQuery = qc, w: tuple = w,
                       eps: float = eps) -> np.ndarray:
                """The full codes' clip bound, then the frame bound (over the two segments)."""
                c, hi = clip_bounds(stored, seg_start, pos, qc, None, 2)
                total = w[0] * c + w[1]
                if w[1] > 0 and tau > -np.inf:
                    f = frame_bounds(stored, seg_start, pos, hi, np.arange(len(pos)), qc, None,
                                     (tau - eps - w[0] * c) / w[1], 2)
                    total = w[0] * c + w[1] * f
                return total

            runs = [top_k([Page(rows, w[0] * clip + w[1], -np.inf)], 10, score, None, eps),
                    top_k([Page(rows, w[0] * head + w[1], -np.inf)], 10, score, refine, eps),
                    # the same candidates in three pages of decreasing bounds (Qdrant's way)
                    top_k(pages_of(rows, w[0] * clip + w[1], 3), 10, score, None, eps)]
            for positions, totals, scored in runs:
                assert positions.tolist() == expected.tolist()
                np.testing.assert_array_equal(totals, full[expected])  # the same totals, to the last bit
                assert scored < n // 4  # the bounds prune most videos


def test_a_video_whose_bound_reaches_the_kth_total_within_the_slack_is_still_scored() -> None:
    """Ties at tau, where the earliest positions must win: the later page holds them, its bounds equal
    the totals (no slack) or lie under them by less than ``eps`` (the float rounding ``eps`` covers), and so
    does the bound given for what the first page leaves (``rest``) and the refined bounds."""
    totals = np.ones(300)
    later, earlier = np.arange(100, 300), np.arange(100)

    def score(positions: np.ndarray) -> np.ndarray:
        return totals[positions]

    exact = [Page(later, totals[later], 1.0), Page(earlier, totals[earlier], -np.inf)]
    positions, got, _ = top_k(exact, 2, score, None, eps=0.0)
    assert positions.tolist() == [0, 1] and got.tolist() == [1.0, 1.0]
    low = 1.0 - 5e-5  # rounded under the totals, by less than eps
    refined = np.where(np.arange(300) < 100, low, 1.0)
    rounded = [Page(later, totals[later], low), Page(earlier, refined[earlier], -np.inf)]
    for refine in (None, lambda positions, tau: refined[positions]):
        positions, got, _ = top_k(rounded, 2, score, refine, eps=1e-4)
        assert positions.tolist() == [0, 1] and got.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("compact", [False, True])
def test_frame_bound_uses_only_key_clip_candidates(compact: bool) -> None:
    """The frame bound over every z row (each within its ball's radius of the ball's centre) is what a video
    gets when it is already low enough; the others get the key-clip bound: only the balls of windows that
    can be the key clip (the exact key among them), tighter, and never below the exact frame score; where
    that is still not low enough, the candidates' own z rows. With every window stored (the factor grid)
    and with some windows per video (compact)."""
    units, pnorm, windows, zhat, qs = _scan_data(200, 8, seed=11)
    table, pidx = None, {}
    if compact:  # 96 of the 528 windows, different ones per video
        rng = np.random.default_rng(12)
        keep = np.sort(np.argsort(rng.random((len(units), len(windows[0]))), axis=1)[:, :96], axis=1)
        pnorm, windows, zhat = (np.take_along_axis(x, keep if x.ndim == 2 else keep[..., None], 1)
                                for x in (pnorm, windows, zhat))
        table, pidx = window_table().numpy(), {"pidx": keep.astype(np.int16)}
    arrays = stored_arrays(units, pnorm, windows, zhat, 16, **pidx)
    rows = np.arange(len(units))
    centres = arrays["ball_codes"] * arrays["ball_scale"][..., None].astype(np.float64)
    radius = np.full((len(units), 16), -np.inf)
    np.maximum.at(radius, (rows[:, None], arrays["ball_of"].astype(np.int64)), arrays["ball_dist"])
    np.testing.assert_array_equal(arrays["ball_radius"], radius)
    assert np.isfinite(radius).any(1).all()
    assert (arrays["ball_norm"] >= np.linalg.norm(centres, axis=-1)).all()
    rows_z = stored_zhat(arrays)  # the stored features, from their factors
    dist = np.linalg.norm(rows_z[:, :, None] - centres[:, None], axis=-1)  # (n, P, B)
    assigned = np.take_along_axis(dist, arrays["ball_of"][..., None].astype(np.int64), -1)[..., 0]
    assert (assigned <= dist.min(-1) + 1e-9).all()  # each row in its nearest ball
    assert (arrays["ball_dist"] >= assigned).all()
    for q in qs.astype(np.float32):
        qc = BoundQuery.of(q)
        ex = exact_scores(arrays, rows, q, (0.5, 0.5), table)
        every_row = (centres @ (q.astype(np.float64) / qc.norm) + radius).max(1)
        hi = clip_upper(arrays, rows, qc, table)[1]
        coarse = frame_upper(arrays, rows, hi, qc, table, enough=np.full(len(rows), np.inf))
        # the query's 16-bit copy adds at most |q - q~| |c~| / |q| to each ball's dot product
        assert (coarse >= np.minimum(every_row, 1.0)).all() and (coarse <= every_row + 1e-4).all()
        bound = frame_upper(arrays, rows, hi, qc, table)
        assert (bound >= ex.frame - 1e-6).all() and (bound <= coarse).all()
        assert np.median(bound) < np.median(coarse) - (0.01 if compact else 0.02)  # fewer rows: tighter balls
        enough = np.median(coarse)  # only the videos at or above it are refined
        mixed = frame_upper(arrays, rows, hi, qc, table, enough=np.full(len(rows), enough))
        low, refined = coarse < enough, bound < enough
        np.testing.assert_array_equal(mixed[low], coarse[low])
        np.testing.assert_array_equal(mixed[~low & refined], bound[~low & refined])
        # the candidates' z rows: still a bound, changed only to go below the threshold, and more often so
        tight = ~low & ~refined
        assert (mixed >= ex.frame - 1e-6).all()
        assert ((mixed[tight] == bound[tight]) | (mixed[tight] < enough)).all()
        # (of the videos whose exact frame score is below the threshold, the key-clip bound ruled out none)
        assert (mixed[tight] < enough).sum() >= 0.6 * (ex.frame[tight] < enough).sum() > 0


@pytest.mark.parametrize("M", [32, 7])
def test_quantized_bounds_hold_for_every_window(M: int) -> None:
    """The clip bound is >= the exact max-over-windows cosine; the unit codes reconstruct within err."""
    rng = np.random.default_rng(3)
    units = (rng.standard_normal((50, M, 64)) * rng.uniform(0.01, 10, (50, M, 1))).astype(np.float32)
    units[0, 5] = 0.0  # an all-zero unit
    units[1::2] += 30.0 * rng.standard_normal(64).astype(np.float32)  # -offset: every window's cosine < 0
    codes, scale, err, norm = quantize(units)
    recon = codes.astype(np.float64) * scale[..., None]
    assert (np.linalg.norm(units - recon, axis=-1) <= err).all() and codes.dtype == np.int8
    table = window_table(M).numpy()
    windows = np.broadcast_to(table, (50, len(table), 2))
    csum = np.concatenate([np.zeros((50, 1, 64)), units.astype(np.float64).cumsum(1)], 1)
    props = (csum[:, table[:, 1]] - csum[:, table[:, 0]]) / (table[:, 1] - table[:, 0])[:, None]
    pnorm = np.linalg.norm(props, axis=-1).astype(np.float32)
    zhat = (props / np.maximum(np.linalg.norm(props, axis=-1, keepdims=True), 1e-12)).astype(np.float32)
    arrays = stored_arrays(units, pnorm, windows, zhat, 4)
    rows = np.arange(50)
    compact = np.sort(rng.permutation(len(table))[:min(32, len(table) - 1)])  # per-video windows (compact)
    some = stored_arrays(units, pnorm[:, compact], windows[:, compact], zhat[:, compact], 4,
                         pidx=np.tile(compact, (50, 1)).astype(np.int16))  # the compact index's windows
    offset = units[1::2].mean((0, 1)) - units[0::2].mean((0, 1))
    queries = rng.standard_normal((5, 64)).astype(np.float32) * np.array([[1e-3], [1], [1], [50], [1]])
    for q, away in [*((q, False) for q in queries), (-offset.astype(np.float32), True)]:
        qc = BoundQuery.of(q)
        for arr, tab in ((arrays, None), (some, table)):
            ex = exact_scores(arr, rows, q, (0.5, 0.5), tab)
            clip, prefix = clip_upper(arr, rows, qc, tab)
            assert (clip >= ex.clip - 1e-6).all() and (head_upper(arr, rows, qc, tab) >= ex.clip - 1e-6).all()
            if away:  # every window's sum is negative: the factors' rounding works against the bound
                assert (ex.clip[1::2] < 0).all() and (clip[1::2] < 0.05).all()
            assert (frame_upper(arr, rows, prefix, qc, tab) >= ex.frame - 1e-6).all()
        full = exact_scores(arrays, rows, q, (0.5, 0.5)).proposal_cos
        np.testing.assert_allclose(exact_scores(some, rows, q, (0.5, 0.5), table).proposal_cos,
                                   full[:, compact], atol=1e-6)


@pytest.mark.parametrize("H", [7, 16, 40, 384, 1000])
def test_integer_unit_dots_are_exact(H: int) -> None:
    """The first pass's dot products of 8-bit codes with the query's 16-bit levels are exact integers, even
    at the extremes of both: units that are exactly their codes (no quantisation error) get a clip bound
    within the query's own rounding of the exact score, never below it; the levels are within ``spread``."""
    rng = np.random.default_rng(H)
    q = rng.standard_normal(H).astype(np.float32) * 1e3
    bq = BoundQuery.of(q)
    assert np.linalg.norm(q.astype(np.float64) - bq.levels * bq.step) <= bq.spread
    M = 7
    codes = rng.integers(-127, 128, (6, M, H)).astype(np.int8)
    codes[0], codes[1] = 127 * np.sign(bq.levels), -127 * np.sign(bq.levels)  # the largest sums
    codes[:, :, 0] = 127  # every unit's peak is 127: scale 1, the codes are the units exactly
    units = codes.astype(np.float32)
    table = window_table(M).numpy()
    windows = np.broadcast_to(table, (len(units), len(table), 2))
    csum = np.concatenate([np.zeros((len(units), 1, H)), units.astype(np.float64).cumsum(1)], 1)
    props = (csum[:, table[:, 1]] - csum[:, table[:, 0]]) / (table[:, 1] - table[:, 0])[:, None]
    pnorm = np.linalg.norm(props, axis=-1).astype(np.float32)
    zhat = (props / np.linalg.norm(props, axis=-1, keepdims=True)).astype(np.float32)
    arrays = stored_arrays(units, pnorm, windows, zhat, 4)
    assert (arrays["err"] < 1e-20).all()
    rows = np.arange(len(units))
    clip = clip_upper(arrays, rows, bq)[0]
    exact = exact_scores(arrays, rows, q, (1.0, 0.0)).clip
    slack = bq.spread * np.linalg.norm(units, axis=-1).max() / bq.norm  # the query's rounding, per unit
    assert (clip >= exact - 1e-6).all() and (clip <= exact + 2 * slack + 1e-4).all()


@pytest.mark.parametrize("dims", [8, 64, 200])
def test_the_head_bound_holds_whatever_the_basis(dims: int) -> None:
    """The first pass's bound (head codes of the units in a basis of ``dims`` directions, plus what the head
    leaves out) is never below the exact clip score: for a random basis that misses most of the units'
    energy, for the units' own principal directions (then it is tight when they hold the units), with zero
    units and units far off the origin; and it prunes: where the units' energy lies in the head, it is within
    a few thousandths of the exact score."""
    rng = np.random.default_rng(dims)
    H, M, n = 128, 16, 60
    spread = np.zeros(H)
    spread[: min(dims, H) // 2] = 1.0  # half the head's directions hold most of the energy
    units = (rng.standard_normal((n, M, H)) * (spread + 0.02)).astype(np.float32)
    units[0, 3] = 0.0
    units[1::3] += 5.0 * rng.standard_normal(H).astype(np.float32)
    table = window_table(M).numpy()
    windows = np.broadcast_to(table, (n, len(table), 2))
    csum = np.concatenate([np.zeros((n, 1, H)), units.astype(np.float64).cumsum(1)], 1)
    props = (csum[:, table[:, 1]] - csum[:, table[:, 0]]) / (table[:, 1] - table[:, 0])[:, None]
    pnorm = np.linalg.norm(props, axis=-1).astype(np.float32)
    zhat = (props / np.maximum(np.linalg.norm(props, axis=-1, keepdims=True), 1e-12)).astype(np.float32)
    own = head_basis(units, dims)
    assert own.shape == (min(dims, H), H)
    np.testing.assert_allclose(own @ own.T, np.eye(len(own)), atol=1e-5)
    random = np.linalg.qr(rng.standard_normal((H, H)))[0][:, :min(dims, H)].T.astype(np.float32)
    rows = np.arange(n)
    for basis, tight in ((own, dims >= 64), (random, False)):
        arrays = stored_arrays(units, pnorm, windows, zhat, 4, basis=basis)
        for q in [*(units[i].mean(0) for i in (0, 1, 7)), rng.standard_normal(H).astype(np.float32)]:
            qc = BoundQuery.of(q.astype(np.float32))
            ex = exact_scores(arrays, rows, q.astype(np.float32), (1.0, 0.0))
            head = head_upper(arrays, rows, qc)
            assert (head >= ex.clip - 1e-6).all()
            if tight:
                assert np.median(head - ex.clip) < 0.03


@pytest.mark.parametrize("M", [1, 2, 7, 16, 32, 40])
def test_window_factor_grid_holds_every_window_once(M: int) -> None:
    """All M (M + 1) / 2 windows land on distinct grid cells, each within one step above 1 / (k |p|) (the
    clip pass reads them: test_quantized_bounds_hold_for_every_window)."""
    rng = np.random.default_rng(M)
    table = window_table(M).numpy()
    pnorm = rng.uniform(0.05, 3.0, (4, len(table))).astype(np.float32)
    factors, scale = window_factors(pnorm, np.broadcast_to(table, (4, len(table), 2)), M)
    assert factors.shape == (4, (M + 1) // 2 * (M + 1)) and (np.count_nonzero(factors, 1) == len(table)).all()
    k, first = table[:, 1] - table[:, 0], table[:, 1] - table[:, 0] <= (M + 1) // 2  # the documented layout
    cell = (np.where(first, k, M + 1 - k) - 1) * (M + 1) + np.where(first, table[:, 0], table[:, 1])
    values = factors * scale[:, None].astype(np.float64)
    inv = 1.0 / (k * pnorm.astype(np.float64))
    assert (values[:, cell] >= inv).all() and (values[:, cell] <= inv + scale[:, None]).all()


def test_persistence_add_remove_compact(tmp_path: Path) -> None:
    model = small_model()
    videos = gallery(30, seed=5)
    index = VideoIndex.create(tmp_path / "ix", model, IndexConfig())
    index.add(videos[:10])
    index.add(videos[10:])
    manifest = json.loads((tmp_path / "ix" / "manifest.json").read_text())
    assert manifest["schema_version"] == store.SCHEMA_VERSION and manifest["counts"]["videos"] == 30
    assert manifest["model_fingerprint"] == model.fingerprint() and manifest["mode"] == "exact"
    q = model.encode_queries(queries(1, seed=6)).numpy()[0]
    before = ranked(index, q, 30)
    gone = [videos[i].id for i in before[0][:3]]
    index.remove(gone)
    reopened = VideoIndex.open(tmp_path / "ix", model)
    assert len(reopened) == 27 and not set(gone) & set(reopened.ids)
    after = ranked(reopened, q, 27)
    assert [reopened.catalog.videos[p]["id"] for p in after[0]] == [videos[p].id for p in before[0][3:]]
    reopened.compact()
    compacted = VideoIndex.open(tmp_path / "ix", model)
    ids = [compacted.catalog.videos[p]["id"] for p in ranked(compacted, q, 27)[0]]
    assert ids == [videos[p].id for p in before[0][3:]]
    # the old segments are retired, kept for lock-free readers of the old manifest, deleted after a grace
    retired = {r["name"] for r in compacted.manifest["retired"]}
    assert retired == {s["name"] for s in index.manifest["segments"]}
    store.remove_debris(tmp_path / "ix", compacted.manifest, grace=0.0)
    assert len(list((tmp_path / "ix").glob("seg-*"))) == 1
    with pytest.raises(GalleryError, match="no video with id"):
        compacted.remove(["missing"])


def test_removing_an_id_twice_removes_only_that_video(tmp_path: Path) -> None:
    model = small_model()
    index = VideoIndex.create(tmp_path / "ix", model)
    a, b = gallery(2, seed=21)
    index.add([a, b])  # one segment of two videos
    index.remove([a.id, a.id])
    assert index.ids == [b.id] and VideoIndex.open(tmp_path / "ix", model).ids == [b.id]


def test_open_leaves_the_given_config_alone_and_restores_the_stored_one(tmp_path: Path) -> None:
    model = small_model()
    created = IndexConfig(mode="compact", frame_balls=8, segment_videos=3, encode_batch=5)
    VideoIndex.create(tmp_path / "ix", model, created).add(gallery(4, seed=22))
    given = IndexConfig(nprobe=7)
    opened = VideoIndex.open(tmp_path / "ix", model, given)
    assert given == IndexConfig(nprobe=7)  # not mutated
    assert (opened.cfg.mode, opened.cfg.frame_balls, opened.cfg.nprobe) == ("compact", 8, 7)
    assert VideoIndex.open(tmp_path / "ix", model).cfg == created  # all of it, not only two fields


def test_a_reader_of_the_old_manifest_can_still_open_its_segments(tmp_path: Path) -> None:
    """Readers take no lock: one that read the manifest just before a compaction must still find the
    segments it names (the writer keeps retired segments for a grace period)."""
    model = small_model()
    index = VideoIndex.create(tmp_path / "ix", model)
    index.add(gallery(3, seed=23))
    index.add(gallery(3, seed=24))
    old = store.read_manifest(tmp_path / "ix")  # a reader, between reading the manifest and the segments
    index.remove([index.ids[0]])
    index.compact()
    index.add(gallery(1, seed=25))
    for entry in old["segments"]:
        arrays, videos, _ = store.load_segment(tmp_path / "ix", entry, checksum=True)
        assert len(videos) == 3 and len(arrays["units"]) == 3


def test_durable_writes_do_not_sleep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sleep(seconds: float) -> None:
        raise AssertionError(f"time.sleep({seconds}) in a write")

    model = small_model()
    index = VideoIndex.create(tmp_path / "ix", model)
    monkeypatch.setattr(time, "sleep", no_sleep)
    index.add(gallery(2, seed=26))
    assert len(index) == 2


def test_refuses_other_model_schema_and_corruption(tmp_path: Path) -> None:
    model = small_model()
    index = VideoIndex.create(tmp_path / "ix", model)
    index.add(gallery(3))
    other = small_model(seed=1)
    with pytest.raises(IndexMismatchError) as err:
        VideoIndex.open(tmp_path / "ix", other)
    assert model.fingerprint() in str(err.value) and other.fingerprint() in str(err.value)
    model.profile = {"name": "lite", "version": 1}
    with pytest.raises(IndexMismatchError, match="profile"):
        VideoIndex.open(tmp_path / "ix", model)
    model.profile = None
    segment = next((tmp_path / "ix").glob("seg-*"))
    data = bytearray((segment / "units.npy").read_bytes())
    data[-1] ^= 0xFF
    (segment / "units.npy").write_bytes(bytes(data))
    with pytest.raises(store.IndexCorruptError, match="sha256"):
        VideoIndex.open(tmp_path / "ix", model)
    manifest = json.loads((tmp_path / "ix" / "manifest.json").read_text())
    manifest["schema_version"] = 99
    (tmp_path / "ix" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(store.IndexStoreError, match="schema 99"):
        VideoIndex.open(tmp_path / "ix", model)


def test_a_file_of_another_size_is_refused_even_without_checksums(tmp_path: Path) -> None:
    """Sizes are always checked: a file cut short or grown is refused on open with checksums off too."""
    model = small_model()
    VideoIndex.create(tmp_path / "ix", model).add(gallery(3))
    units = next((tmp_path / "ix").glob("seg-*")) / "units.npy"
    data = units.read_bytes()
    for changed in (data[:-8], data + bytes(8)):
        units.write_bytes(changed)
        with pytest.raises(store.IndexCorruptError, match="bytes, the manifest recorded"):
            VideoIndex.open(tmp_path / "ix", model, IndexConfig(verify_checksums=False))
    units.write_bytes(data)
    assert len(VideoIndex.open(tmp_path / "ix", model, IndexConfig(verify_checksums=False))) == 3


def test_an_index_of_the_previous_schema_is_refused_with_a_rebuild_message(tmp_path: Path) -> None:
    """Schema 6 stores fine rows, segments and reference scores per video; a schema-5 index lacks them and
    is refused, naming both schemas (the app keeps its index in a directory named by schema, so it builds a
    new one beside the old)."""
    model = small_model()
    index = VideoIndex.create(tmp_path / "ix", model)
    index.add(gallery(2))
    manifest = json.loads((tmp_path / "ix" / "manifest.json").read_text())
    manifest["schema_version"] = store.SCHEMA_VERSION - 1
    (tmp_path / "ix" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(store.IndexStoreError, match=f"schema {store.SCHEMA_VERSION - 1}.*schema "
                                                    f"{store.SCHEMA_VERSION}; rebuild the index"):
        VideoIndex.open(tmp_path / "ix", model)


def _snapshot(root: Path) -> dict:
    """Every file's bytes and mtime under root."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()}


def test_rejected_adds_leave_the_index_unchanged(tmp_path: Path) -> None:
    model = small_model()
    index = VideoIndex.create(tmp_path / "ix", model)
    good = gallery(4)
    index.add(good)
    before = _snapshot(tmp_path / "ix")
    nan = gallery(1, seed=9)[0]
    nan.features[0, 0] = np.nan
    wrong_dim = GalleryVideo("wide", np.ones((5, 25), np.float32), np.arange(5.0), np.arange(5.0) + 1)
    bad_times = GalleryVideo("times", np.ones((5, 24), np.float32), np.arange(4.0), np.arange(4.0))
    fresh = gallery(1, seed=10)[0]
    no_id = GalleryVideo("", np.ones((2, 24), np.float32), np.zeros(2), np.ones(2))
    cases = [([nan], "NaN"), ([wrong_dim], "wide"), ([bad_times], "times"),
             ([good[0]], "already in the index"), ([fresh, fresh], "in this batch"), ([no_id], "non-empty")]
    for batch, message in cases:
        with pytest.raises(GalleryError, match=message):
            index.add(batch)
        assert _snapshot(tmp_path / "ix") == before
    assert len(VideoIndex.open(tmp_path / "ix", model)) == 4


def test_second_writer_gets_a_clear_error_and_readers_still_work(tmp_path: Path) -> None:
    model = small_model()
    index = VideoIndex.create(tmp_path / "ix", model, IndexConfig(lock_timeout=0.2))
    index.add(gallery(3))
    q = model.encode_queries(queries(1)).numpy()[0]
    with store.writer_lock(tmp_path / "ix", timeout=1.0):
        with pytest.raises(store.IndexLockedError, match="another process"):
            index.add(gallery(2, seed=7))
        reader = VideoIndex.open(tmp_path / "ix", model)
        assert len(reader.rank(q, 3)) == 3
    index.add(gallery(2, seed=7))
    assert len(index) == 5


CHILD = textwrap.dedent("""
    import builtins, io, os, sys, time, numpy as np, torch
    sys.path.insert(0, {root_dir!r})
    from tests.synthetic import gallery, small_model
    from prvr.index import IndexConfig, VideoIndex, store
    durable = store._write_durable
    def slow(path, data):  # each add then takes ~1 s of writes, so a kill at a random time lands mid-update
        entry = durable(path, data)
        time.sleep(0.05)
        return entry
    if not {armed!r}:  # a child killed at a pause of its manifest write needs no slow writes to be caught
        store._write_durable = slow
    # Once armed, every write of a file named manifest.json* (the manifest itself or a temporary one,
    # however it is opened) goes in 8 fsynced chunks, and the process stops at each point (just opened,
    # after each chunk, just after an os.replace onto the manifest) until the parent says go: the parent
    # SIGKILLs it at the point it chose. The write is the same; only the pauses are added.
    armed, real_open, real_replace = False, builtins.open, os.replace
    def pause(what):
        print(what, flush=True)
        sys.stdin.readline()
    class Chunked:
        def __init__(self, f):
            self.f = f
        def write(self, data):
            step = max(1, -(-len(data) // 8))
            for i in range(0, len(data), step):
                self.f.write(data[i:i + step])
                self.f.flush()
                os.fsync(self.f.fileno())
                pause("manifest chunk")
            return len(data)
        def __getattr__(self, name):
            return getattr(self.f, name)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.f.__exit__(*exc)
    def chunked_open(file, mode="r", *args, **kw):
        f = real_open(file, mode, *args, **kw)
        named = isinstance(file, (str, os.PathLike)) and os.path.basename(os.fspath(file))
        if armed and named and store.MANIFEST in named and any(c in mode for c in "wax+"):
            pause("manifest opened")
            return Chunked(f)
        return f
    def replace(src, dst, *args, **kw):
        real_replace(src, dst, *args, **kw)
        if armed and os.path.basename(os.fspath(dst)) == store.MANIFEST:
            pause("manifest replaced")
    builtins.open = io.open = chunked_open
    os.replace = replace
    index = VideoIndex.open_or_create({root!r}, small_model(), IndexConfig())
    batch = len(index) // 3
    while True:
        index.add(gallery(3, seed=100 + batch))
        print("committed", batch, flush=True)
        if not armed:
            sys.stdin.readline()  # the parent's go for the next add (it may be busy with another child)
        armed = {armed!r}
        batch += 1
""")

# where each child is killed: at a random moment of its next add (mostly while it writes the segment), or
# at a pause of its manifest write: just after opening the file (pause 0), after 4 of its 8 chunks (pause
# 4), after all 8 (pause 8: written, not yet in place), or just after the os.replace that puts it in place
KILLS = [("random", None), ("manifest", 0), ("manifest", 4), ("manifest", 8), ("manifest", "replaced")]


def test_killed_writer_leaves_old_or_new_index(tmp_path: Path) -> None:
    """SIGKILL a writer anywhere in an add, the manifest write included: the index opens (sizes and
    checksums verified) as exactly the generation before the add or the one after it, never a mix, and
    the next writer clears what the kill left. Fails if the manifest is written in place. (One index and
    one child per kill, the children started together: their imports overlap.)"""
    rng = np.random.default_rng(0)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    roots = [tmp_path / f"ix{i}" for i in range(len(KILLS))]
    children = [subprocess.Popen([sys.executable, "-c", CHILD.format(root_dir=str(REPO), root=str(root),
                                                                     armed=how == "manifest")],
                                 stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, env=env)
                for root, (how, _) in zip(roots, KILLS, strict=True)]
    try:
        outcomes, debris_seen = killed_in_turn(roots, children, rng)
    finally:  # a failure midway leaves no child adding behind it (a closed stdin reads as a go)
        for child in children:
            child.kill()
            child.wait()
    assert debris_seen >= 1  # at least one kill interrupted a write half-way
    # a manifest written aside is not in place until its os.replace; once replaced, it is the new index
    assert outcomes[1:] == ["old", "old", "old", "new"], outcomes


def killed_in_turn(roots: list[Path], children: list, rng: np.random.Generator) -> tuple[list[str], int]:
    """Kill each child at its ``KILLS`` point and check its index: each kill's outcome ("old" or "new"), and
    how many kills left debris."""
    debris_seen, outcomes = 0, []
    for root, child, (how, point) in zip(roots, children, KILLS, strict=True):
        line = child.stdout.readline()  # one commit done: the next add starts on our go
        assert line.startswith("committed"), line
        old = int(line.split()[1]) + 1  # batches in the index before the add that is killed
        child.stdin.write("\n")
        child.stdin.flush()
        if how == "random":
            named = {s["name"] for s in store.read_manifest(root)["segments"]}
            deadline = time.monotonic() + 60
            while not {p.name for p in root.glob("seg-*")} - named and time.monotonic() < deadline:
                time.sleep(0.01)  # wait until the next add starts writing its segment
            time.sleep(float(rng.uniform(0.0, 0.8)))  # then kill at a random point of its ~1 s of writes
        else:
            pauses = 0
            while True:
                line = child.stdout.readline()
                assert line.startswith(("manifest", "committed")), line
                if line.startswith("committed") or pauses == point or line.strip() == f"manifest {point}":
                    break  # (an add that never pauses at the chosen point is killed once it committed)
                pauses += 1
                child.stdin.write("\n")
                child.stdin.flush()
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdin.close()
        child.stdout.close()
        index = VideoIndex.open(root, small_model())  # verifies sizes and checksums
        n_batches = len(index) // 3
        assert len(index) % 3 == 0 and n_batches in (old, old + 1), (how, point, len(index), old)
        expected = [v.id for b in range(n_batches) for v in gallery(3, seed=100 + b)]
        assert index.ids == expected  # whole batches, in order: never a partial add, nothing lost
        assert len(index.rank(small_model().encode_queries(queries(1)).numpy()[0], 3)) == 3
        named = {s["name"] for s in index.manifest["segments"]}
        debris_seen += bool({p.name for p in root.glob("seg-*")} - named)
        outcomes.append("new" if n_batches == old + 1 else "old")
        index.add(gallery(1, seed=999))  # the next writer removes the debris of killed writes
        assert {p.name for p in root.glob("seg-*")} == {s["name"] for s in index.manifest["segments"]}
        assert not list(root.glob(f".{store.MANIFEST}.*"))  # and the temporary manifests
    return outcomes, debris_seen


def test_exact_with_the_training_free_bridge(tmp_path: Path) -> None:
    from prvr.models.bridge import BridgeModel

    torch.manual_seed(0)
    head = torch.nn.Linear(24, 50)  # 50 "classes" embedded in a 16-d "text space"
    model = BridgeModel(head, torch.nn.functional.normalize(torch.randn(50, 16), dim=-1))
    videos = gallery(60, seed=11)
    index = VideoIndex.create(tmp_path / "ix", model)
    index.add(videos)
    assert_matches_model(VideoIndex.open(tmp_path / "ix", model), model, videos, queries(4, seed=12))


def write_schema_9(index: VideoIndex, root: Path, schema: int = 9) -> None:
    """The live videos of ``index`` written as an earlier release wrote an index (schema 10: no words;
    schema 9: nor the frame-scale features factored, but whole, ``zhat``); the sketch left out, which an
    upgrade does not read."""
    from prvr.index.schema import FIXED, RAGGED, WORDS

    snap, live = index.snapshot, index.snapshot.live
    fixed = {k: snap.gather(k, live) for k in FIXED}
    skip = WORDS if schema == 10 else (*WORDS, "zbasis", "zcoef")
    if schema == 9:
        fixed["zhat"] = np.stack([unfactor(snap.ragged("zbasis", p), snap.ragged("zcoef", p)).astype(
            np.float32) for p in live])
    ragged = {k: [snap.ragged(k, p) for p in live] for k in RAGGED if k not in skip}
    arrays = dict(fixed)
    for key, count in RAGGED.items():
        if key not in skip:
            arrays[key] = np.concatenate(ragged[key])
            arrays[count] = np.array([len(x) for x in ragged[key]], dtype=np.int64)
    root.mkdir(parents=True)
    manifest = {**{k: v for k, v in index.manifest.items() if k not in ("segments", "retired")},
                "schema_version": schema, "generation": 1,
                "segments": [store.write_segment(root, arrays, [snap.videos[p] for p in live])]}
    store.commit_manifest(root, manifest)


def test_an_index_of_the_previous_schema_is_upgraded_when_the_app_opens_it(tmp_path: Path) -> None:
    """A data dir with the previous release's index (schema 9) of the model in use: ``open_gallery`` brings
    every live video over (records, order, stored arrays; the frame-scale features factored), ranking as
    before, without encoding anything; the old directory is left as it was. Another model's old index is
    not brought over (its gallery starts empty), and one of an older schema is never read."""
    from prvr.index import gallery_dir, open_gallery
    from prvr.index.encoding import ReferenceQueries

    model = small_model()
    refs = ReferenceQueries(model.encode_queries(queries(6, seed=31)), "bank")
    data = tmp_path / "data"
    first = open_gallery(model, refs, data_dir=data, profile="p")
    videos = gallery(30, seed=32)
    first.add(videos[:20])
    first.add(videos[20:])
    first.remove([videos[4].id])
    qs = model.encode_queries(queries(3, seed=33)).numpy()
    before = [first.rank(q, 29) for q in qs]
    old = gallery_dir(data, "p", model, schema=9)
    write_schema_9(first, old)
    shutil.rmtree(first.root)
    old_files = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    encodes = []
    model.encode_videos = lambda *a, **kw: encodes.append(a)  # nothing may be encoded again
    upgraded = open_gallery(model, refs, data_dir=data, profile="p")
    assert upgraded.root == gallery_dir(data, "p", model) and upgraded.ids == first.ids and not encodes
    for q, ev in zip(qs, before, strict=True):
        again = upgraded.rank(q, 29)
        assert [h.id for h in again.hits] == [h.id for h in ev.hits]
        np.testing.assert_allclose(again.totals, ev.totals, rtol=0, atol=1e-6)
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file()} == old_files
    other = small_model(seed=5)
    shutil.copytree(old, gallery_dir(data, "p", other, schema=9))  # made for another model: left alone
    assert len(open_gallery(other, refs, data_dir=data, profile="p")) == 0
    # made for this model but another reference bank (its stored scores are of other captions): left alone
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(old, gallery_dir(elsewhere, "p", model, schema=9))
    other_bank = ReferenceQueries(model.encode_queries(queries(6, seed=34)), "another bank")
    assert len(open_gallery(model, other_bank, data_dir=elsewhere, profile="p")) == 0
    shutil.copytree(old, gallery_dir(tmp_path / "same", "p", model, schema=9))  # the same bank: brought over
    assert open_gallery(model, refs, data_dir=tmp_path / "same", profile="p").ids == first.ids
    older = gallery_dir(tmp_path / "older", "p", model, schema=9)  # where schema 9 lives, but of schema 8
    shutil.copytree(old, older)
    manifest = json.loads((older / store.MANIFEST).read_text())
    (older / store.MANIFEST).write_text(json.dumps({**manifest, "schema_version": 8}))
    assert len(open_gallery(model, refs, data_dir=tmp_path / "older", profile="p")) == 0


def test_approximate_candidates_come_from_the_faiss_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The built-in index's approximate search bounds, refines and scores only the videos faiss gives
    (``candidate_videos``): 10x the videos, not 10x the videos a query reads (counted on the pages it ranks);
    exact search of the same gallery reads every video's first pass. (Qdrant's: tests/test_qdrant.py.)"""
    from prvr.index.video_index import BuiltinView
    from prvr.results.search import encode_query

    pages, read = BuiltinView.pages, []

    def counted(self, *args, **kw):
        for page in pages(self, *args, **kw):
            read.append(len(page.positions))
            yield page

    monkeypatch.setattr(BuiltinView, "pages", counted)
    model = small_model(map_size=8)
    per_query: dict[int, dict[bool, float]] = {}
    for n in (60, 600):
        index = VideoIndex.create(tmp_path / str(n), model,
                                  IndexConfig(candidate_videos=24, candidate_units=96, nprobe=4))
        index.add(gallery(n, seed=11, max_rows=12))
        per_query[n] = {}
        for approx in (True, False):
            read.clear()
            for tokens in queries(5, seed=12):
                got = index.rank(encode_query(model, tokens), 5, approximate=approx)
                assert got.approximate == approx and len(got.hits) == 5
            per_query[n][approx] = sum(read) / 5
    assert per_query[600][True] <= 1.5 * per_query[60][True], per_query  # not 10x
    assert per_query[600][True] < per_query[600][False] == 600, per_query


def test_approximate_keys_of_two_kinds_name_their_own_videos() -> None:
    """faiss's keys carry their video's position: segments of 8 window keys a video and of 4 unit keys a
    video (written before window keys) in one index, each key finds its own video, and only live ones."""
    from prvr.index import approximate

    rng = np.random.default_rng(3)
    new = rng.standard_normal((30, approximate.KEYS, 16))
    old = rng.standard_normal((20, approximate.SCENES, 16))
    keys = np.concatenate([new.reshape(-1, 16), old.reshape(-1, 16)])
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    videos = np.concatenate([np.repeat(np.arange(30), approximate.KEYS), 30 + np.repeat(np.arange(20),
                                                                                        approximate.SCENES)])
    ivf = approximate.build_ivf(keys, videos, nlist=4)
    alive = np.ones(50, dtype=bool)
    alive[7] = False
    for video, key in ((3, 5), (41, 2), (49, 3), (29, 7)):
        row = np.flatnonzero(videos == video)[key]
        got = approximate.candidates(ivf, 2.0 * keys[row], alive, nprobe=4, units=12, videos=3)
        assert video in got and len(got) == 3 and (got < 50).all(), (video, got)
    dead = np.flatnonzero(videos == 7)[0]
    assert 7 not in approximate.candidates(ivf, keys[dead], alive, nprobe=4, units=12, videos=3)
