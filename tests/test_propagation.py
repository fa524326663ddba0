"""TF-PRVR propagation over a video's segments: context within a segment, events kept across boundaries."""

import numpy as np
import pytest

from prvr.temporal.propagation import propagate
from prvr.temporal.segments import segment_video


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length."""
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def scenes(lengths: list[int], dim: int = 48, noise: float = 0.3, seed: int = 0) -> tuple:
    """Unit rows of consecutive scenes (one random direction each, plus noise) and the directions."""
    rng = np.random.default_rng(seed)
    centres = unit(rng.normal(size=(len(lengths), dim)))
    rows = np.repeat(centres, lengths, axis=0)
    return unit(rows + noise / np.sqrt(dim) * rng.normal(size=rows.shape)), centres


@pytest.mark.parametrize("seed", range(3))
def test_a_planted_event_stays_distinct_across_its_boundaries(seed: int) -> None:
    rows, centres = scenes([30, 6, 30], seed=seed)  # a 6-row event between two long scenes
    out = propagate(rows, segment_video(rows), 0.7)
    assert out.shape == rows.shape and np.allclose(np.linalg.norm(out, axis=1), 1)
    nearest = (out @ centres.T).argmax(axis=1)  # which scene each propagated row is closest to
    np.testing.assert_array_equal(nearest, np.repeat([0, 1, 2], [30, 6, 30]))
    event = out[30:36] @ centres[1]
    assert event.min() > 0.6  # the event's rows still point at the event, not at their neighbours


def test_rows_take_their_segments_context() -> None:
    rows, centres = scenes([20, 20], noise=1.0, seed=3)
    out = propagate(rows, segment_video(rows), 0.7)
    # every row of a finest segment gets one vector, closer to its scene's direction than the row was
    before, after = (rows @ centres.T)[np.arange(40), np.repeat([0, 1], 20)], \
        (out @ centres.T)[np.arange(40), np.repeat([0, 1], 20)]
    assert after.mean() > before.mean() + 0.05 and (after > before - 1e-9).mean() > 0.8
    seg = segment_video(rows)
    for _, a, b in seg[seg[:, 0] == 0]:
        np.testing.assert_allclose(out[a:b], np.repeat(out[a:a + 1], b - a, axis=0), atol=1e-12)


def test_one_segment_is_its_mean_and_bad_input_is_refused() -> None:
    rows, _ = scenes([10], seed=1)
    seg = np.array([[0, 0, 10]])
    mean = np.repeat(unit(rows.mean(0))[None], 10, 0)
    np.testing.assert_allclose(propagate(rows, seg, 0.7), mean, atol=1e-9)
    with pytest.raises(ValueError, match="beta"):
        propagate(rows, seg, 1.0)
    with pytest.raises(ValueError, match="partition"):
        propagate(rows[:8], seg, 0.7)


def test_the_clip_profiles_model_propagates_when_asked_and_not_by_default() -> None:
    import torch

    from prvr.models.zero_shot import ZeroShotConfig, ZeroShotModel

    rows, _ = scenes([12, 5, 12], dim=16, seed=2)
    rows = rows.astype(np.float32)
    off = ZeroShotModel(torch.nn.Linear(8, 16), 16)
    on = ZeroShotModel(off.text_head, 16, ZeroShotConfig(propagation=True))
    assert not off.cfg.propagation and on.fingerprint() != off.fingerprint()
    expected = propagate(rows, segment_video(rows), 0.7)
    np.testing.assert_allclose(on.encode_videos([rows]).frames[0].numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(off.encode_videos([rows]).frames[0].numpy(), rows, atol=1e-5)
    with pytest.raises(ValueError, match="propagation_beta"):
        ZeroShotConfig(propagation_beta=-0.1)
