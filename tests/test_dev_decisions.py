"""Session 13's decisions on the real dev set are what the code does by default (benchmarks/RESULTS.md,
"Session 13: decisions on the real dev set"), and the decision rule itself."""

from dataclasses import fields

import numpy as np

from prvr.evaluate.bootstrap import decides, paired_bootstrap
from prvr.models.bridge import BridgeConfig
from prvr.models.zero_shot import ZeroShotConfig
from prvr.results.confidence import ConfidenceConfig
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
