"""Query-independent video segments: planted cuts are found, scales nest, odd videos are one segment."""

import time

import numpy as np
import pytest

from prvr.temporal.segments import finest, resample, segment_video


def scenes(lengths: list[int], dim: int = 64, noise: float = 0.3, seed: int = 0) -> np.ndarray:
    """Rows of consecutive scenes, each a random direction plus per-row noise."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(lengths), dim))
    rows = np.repeat(centres, lengths, axis=0) + noise * rng.normal(size=(sum(lengths), dim))
    return rows.astype(np.float32)


def partitions(seg: np.ndarray) -> dict[int, list[tuple[int, int]]]:
    """scale -> its segments as (start, end) pairs."""
    return {int(j): [tuple(map(int, r)) for r in seg[seg[:, 0] == j, 1:]] for j in np.unique(seg[:, 0])}


def cuts(part: list[tuple[int, int]]) -> set[int]:
    """Inner boundaries of a partition."""
    return {start for start, _ in part[1:]}


def test_planted_cuts_are_found_at_the_finest_scale_and_scales_nest() -> None:
    lengths = [10, 30, 5, 40, 15]
    seg = segment_video(scenes(lengths))
    assert seg.dtype == np.int32 and seg.shape[1] == 3
    parts = partitions(seg)
    assert sorted(parts) == list(range(len(parts))) and len(parts) == 7  # ceil(log2(100)) scales
    assert cuts(parts[0]) == {10, 40, 45, 85}
    for j, part in parts.items():
        assert part[0][0] == 0 and part[-1][1] == 100  # every scale partitions the video ...
        assert all(a[1] == b[0] for a, b in zip(part, part[1:], strict=False))
        if j + 1 in parts:
            assert cuts(parts[j + 1]) <= cuts(part)  # ... and a coarser scale keeps a subset of the cuts
    assert cuts(parts[max(parts)]) and cuts(parts[max(parts)]) < cuts(parts[0])  # the coarsest keeps big cuts


def test_wide_rows_and_gradual_fades_are_cut_where_the_content_changes() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 1280))
    fade = np.linspace(0, 1, 6)[1:-1, None]  # four rows of a cross-fade between two scenes
    rows = np.concatenate([np.repeat(a[None], 20, 0), (1 - fade) * a + fade * b, np.repeat(b[None], 20, 0)])
    rows = (rows + 0.02 * rng.normal(size=rows.shape)).astype(np.float32)
    cut = cuts(partitions(segment_video(rows))[0])
    assert cut and all(20 <= c <= 24 for c in cut)  # inside the fade, nowhere else


def test_constant_one_row_and_two_row_videos() -> None:
    constant = np.tile(np.arange(1, 9, dtype=np.float32), (50, 1))
    parts = partitions(segment_video(constant))
    assert all(part == [(0, 50)] for part in parts.values())
    assert segment_video(constant[:1]).tolist() == [[0, 0, 1]]
    assert segment_video(np.eye(2, dtype=np.float32)).tolist() == [[0, 0, 1], [0, 1, 2]]


def test_deterministic_and_fast_on_a_20_minute_video() -> None:
    rng = np.random.default_rng(2)
    lengths = rng.integers(5, 60, 40)
    rows = scenes(list(lengths), dim=1280, seed=3)[:1200]
    segment_video(rows)
    start = time.perf_counter()
    first = segment_video(rows)
    elapsed = time.perf_counter() - start
    np.testing.assert_array_equal(first, segment_video(rows.copy()))
    assert elapsed < 0.5  # a few ms on an idle core; generous for a shared CI machine
    planted = set(np.cumsum(lengths)[:-1].tolist()) & set(range(1, 1200))
    found = cuts(partitions(first)[0])
    assert len(planted & found) >= 0.9 * len(planted)


def test_bad_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        segment_video(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="shape"):
        segment_video(np.zeros((0, 4), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        segment_video(np.array([[1.0, np.nan]], np.float32))
    with pytest.raises(ValueError, match="dtype"):
        segment_video(np.ones((3, 2), np.int64))


def test_finest_checks_the_partition_and_resample_moves_cuts_to_coarser_rows() -> None:
    seg = segment_video(scenes([100, 150, 50], dim=32, noise=0.02))
    assert cuts(partitions(seg)[0]) == {100, 250}
    with pytest.raises(ValueError, match="partition"):
        finest(seg, 301)
    start = np.arange(300, dtype=np.float64)
    coarse = np.arange(0, 300, 300 / 128)  # 128 re-binned rows of ~2.34 s
    moved = resample(seg, start, coarse)
    finest(moved, 128)  # still partitions the coarse rows
    nearest = {int(np.abs(coarse - t).argmin()) for t in (100, 250)}
    assert cuts(partitions(moved)[0]) == nearest
    np.testing.assert_array_equal(resample(seg, start, start), seg)
