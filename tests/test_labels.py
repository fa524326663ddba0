"""The labels a person reads (prvr.results.confidence, calibrated in session 13): strong needs a margin over
every reference caption; there is no "possible" band by default; no strong hit, no "strong" banner."""

import numpy as np
import pytest

from prvr.results.confidence import Calibrator, ConfidenceConfig, cuts, labels


def bank(seed: int = 0, n: int = 261) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(0.1, 0.4, n).astype(np.float32), rng.uniform(0.1, 0.4, n).astype(np.float32)


def test_strong_needs_the_margin_over_the_best_caption_and_nothing_is_possible() -> None:
    clip, frame = bank()
    w = (0.7, 0.3)
    best = float((w[0] * clip.astype(np.float64) + w[1] * frame.astype(np.float64)).max())
    null = cuts(clip, frame, w)
    assert null.high == pytest.approx(best + 0.1) and null.medium == null.high
    scores = [best - 0.05, best + 0.05, best + 0.0999, best + 0.1001, best + 0.5]
    assert labels(scores, [null] * len(scores)) == ["low", "low", "low", "high", "high"]
    sweep = np.linspace(best - 1, best + 1, 2001)
    assert "medium" not in labels(sweep, [null] * len(sweep))  # no "possible" band by default


def test_a_possible_band_can_still_be_configured() -> None:
    clip, frame = bank(1)
    null = cuts(clip, frame, (0.7, 0.3), ConfidenceConfig(medium_quantile=0.8, medium_margin=0.0))
    assert null.medium < null.high
    assert Calibrator.label((null.medium + null.high) / 2, null) == "medium"


def test_the_banner_shows_exactly_when_no_hit_is_strong() -> None:
    assert Calibrator.no_strong_match(["low", "low"]) and Calibrator.no_strong_match(["medium", "low"])
    assert not Calibrator.no_strong_match(["low", "high", "low"])
    assert Calibrator.no_strong_match([])
