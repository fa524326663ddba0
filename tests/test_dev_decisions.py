"""Session 13's decisions on the real dev set are what the code does by default (benchmarks/RESULTS.md,
"Session 13: decisions on the real dev set"), and the decision rule itself; the same for the words dev set's
decisions (issue #43: "Issue #43: the words dev set")."""

from dataclasses import fields

import numpy as np

import prvr.index.words as words_channel
from benchmarks.words_decisions import STRONG_PRECISION, choose_strong, meets_strong_rule
from prvr.evaluate.bootstrap import decides, paired_bootstrap
from prvr.models.bridge import BridgeConfig
from prvr.models.zero_shot import ZeroShotConfig
from prvr.results.confidence import EXACT_SOURCES, STRONG_WORDS, ConfidenceConfig
from prvr.results.moments import MomentConfig


def test_defaults_are_the_decisions() -> None:
    assert BridgeConfig().propagation is False  # not supported by the tuning half
    assert ZeroShotConfig().propagation is False  # unmeasurable offline; the burden is on the mechanism
    assert BridgeConfig().prompt == "a photo of a {}." and BridgeConfig().top_k == 5  # ensembles etc. dropped
    assert not {"prompts", "synonyms", "posterior_temperature"} & {f.name for f in fields(BridgeConfig)}
    cfg = ConfidenceConfig()
    assert (cfg.high_quantile, cfg.high_margin) == (1.0, 0.1)  # strong: 0.1 over every reference caption
    assert (cfg.medium_quantile, cfg.medium_margin) == (cfg.high_quantile, cfg.high_margin)  # no "possible"
    assert MomentConfig().blank_cos == 0.99995  # moments never start on a frozen card


def test_the_rule_decides_on_the_tuning_half_and_keeps_only_what_the_checking_half_confirms() -> None:
    """A variant that wins on clearly more queries is decided (+1), one that wins on one of 40 is not (0)."""
    rng = np.random.default_rng(0)
    base = rng.integers(1, 10, 40)
    better = np.where(rng.random(40) < 0.4, 1, base)  # 40 % of the queries moved to rank 1
    one = base.copy()
    one[np.argmax(base > 1)] = 1
    clips = np.arange(40) // 2
    assert decides(paired_bootstrap({"ranks": base}, {"ranks": better}, groups=clips), "R@1") == 1
    assert decides(paired_bootstrap({"ranks": base}, {"ranks": one}, groups=clips), "R@1") == 0
    assert decides(paired_bootstrap({"ranks": better}, {"ranks": base}, groups=clips), "R@1") == -1


def test_the_words_constants_are_the_words_set_decisions() -> None:
    """``python -m benchmarks.words_decisions``: a subtitle or on-screen line makes a strong match from half
    of the query's content (by rarity; names and numbers all required), the smallest coverage at which the
    tuning half's strong matches are 97 % right (38 of 39) and no near-miss or off-topic query gets one from
    words (checking half: 35 of 35 right, none); no variant of the match rule's constants beat the defaults
    on R@1 (DENSE_Z_FULL 4: -8.8 [-13.8, -4.2])."""
    assert STRONG_WORDS == 0.5 and EXACT_SOURCES == ("subtitles", "screen")
    match = (words_channel.WORDS_MATCH, words_channel.DENSE_Z_FLOOR, words_channel.DENSE_Z_FULL)
    assert match == (0.5, 2.0, 6.0)


def test_the_strong_rule_takes_the_smallest_precise_threshold_that_gives_no_false_strong_match() -> None:
    assert STRONG_PRECISION == 0.90
    assert meets_strong_rule(0.95, {"near": 0, "off": 0})
    assert not meets_strong_rule(0.85, {"near": 0, "off": 0})  # too many wrong strong matches
    assert not meets_strong_rule(1.0, {"near": 1, "off": 0})  # a wrong number made strong
    assert not meets_strong_rule(None, {"near": 0, "off": 0})  # no strong match to measure
    rows = [(0.3, False), (0.4, False), (0.5, True), (0.6, True), (1.0, True)]
    assert choose_strong(rows) == 0.5 and choose_strong([(0.5, False), (1.0, False)]) == 1.0
