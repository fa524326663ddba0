"""Do both MS-SL branches help? Test SumR of the total, clip-only and frame-only scores on the synthetic set.

    python -m benchmarks.synthetic_branches [--seeds 1 2 3] [--epochs 6] [--threads 2] [--ablate]

For every seed: generate ``SyntheticConfig.branches(seed=seed)`` (planted moments whose event is a weak
signal over the moment, visible to the clip branch, and whose object flickers, visible only to single frames;
see ``prvr/data/synthetic.py``) into a temporary folder, train MS-SL with ``prvr.train.loop.main`` (the
official recipe, small model: ``FAST`` below) and evaluate the best checkpoint on the test split. Prints JSON:
per seed and on average the test SumR of the total score (0.7 clip + 0.3 frame, the official default), of the
clip score alone and of the frame score alone, their differences, and chance. ``--set FIELD=VALUE`` changes
fields of the preset (e.g. ``object_mean=0.4``).

``--ablate`` also trains each seed twice more with one branch's losses removed (``OneBranchMSSL``) and
reports the test SumR of the remaining branch's score: the stronger reading of "each branch helps".
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from prvr.data.official import OfficialSource, prepare_split
from prvr.data.synthetic import SyntheticConfig, generate
from prvr.evaluate.retrieval import chance_sumr, evaluate_split
from prvr.models.checkpoint import load_checkpoint
from prvr.models.mssl import MSSL
from prvr.train.loop import Trainer, build_configs, main, parse_overrides

log = logging.getLogger(__name__)

# a small MS-SL (hidden 32, 16 clip units over 64-row videos: 4 rows per unit as 128 rows over 32 units),
# the official losses, optimiser and schedule; the larger learning rate makes up for the few steps
FAST = ["--hidden_size=32", "--map_size=16", "--max_ctx_l=64", "--batch_size=16", "--lr=1e-3"]
BRANCH_LOSSES = {"clip": ("clip_nce", "clip_trip"), "frame": ("frame_nce", "frame_trip")}


class OneBranchMSSL(MSSL):
    """MS-SL trained with only one branch's losses (``keep`` = "clip" or "frame"); the ablation."""

    keep = "clip"

    def loss(self, *args, **kwargs) -> dict:
        """The official loss terms of the kept branch only, and their sum as "total"."""
        out = {k: v for k, v in super().loss(*args, **kwargs).items() if k in BRANCH_LOSSES[self.keep]}
        out["total"] = sum(out.values())
        return out


def train_and_test(root: Path, cfg: SyntheticConfig, epochs: int) -> dict:
    """Train with prvr.train.loop.main on the set under ``root``; test SumR of total / clip / frame."""
    argv = ["--data", str(root), "--collection", cfg.collection, "--feature", cfg.feature,
            "--out", str(root / "run"), *FAST, f"--n_epoch={epochs}", "--device=cpu"]
    with contextlib.redirect_stdout(io.StringIO()):  # main prints a table; keep stdout for the JSON
        result = main(argv)
    return {name: round(m["sumr"], 2) for name, m in result["test"].items()}


def train_one_branch(root: Path, cfg: SyntheticConfig, epochs: int, keep: str) -> float:
    """Test SumR of the ``keep`` score of a model trained with only that branch's losses."""
    source = OfficialSource(root, cfg.collection, cfg.feature)
    options = parse_overrides([*FAST, f"--n_epoch={epochs}"])
    model_cfg, train_cfg = build_configs(options, source, "ablation")
    splits = {s: prepare_split(source, s, model_cfg.map_size, model_cfg.max_ctx_l, model_cfg.max_desc_l)
              for s in ("train", "val", "test")}
    torch.manual_seed(train_cfg.seed)
    model = OneBranchMSSL(model_cfg)
    model.keep = keep
    # validation picks the best epoch on the kept branch's own score: weight 1 on it, 0 on the other
    model.cfg.clip_scale_w, model.cfg.frame_scale_w = float(keep == "clip"), float(keep == "frame")
    out = root / f"only_{keep}"
    Trainer(model, train_cfg, splits["train"], splits["val"], out, {"options": options}).fit()
    best = load_checkpoint(out / "best")
    return round(evaluate_split(best, splits["test"])[keep]["sumr"], 2)


def parse_fields(items: list[str]) -> dict:
    """``field=value`` strings -> SyntheticConfig overrides, typed like the field's default."""
    defaults = SyntheticConfig.branches()
    out = {}
    for item in items:
        name, value = item.split("=", 1)
        default = getattr(defaults, name)
        out[name] = value.lower() in ("1", "true") if isinstance(default, bool) else type(default)(value)
    return out


def run_seed(seed: int, epochs: int, ablate: bool, overrides: dict) -> dict:
    """One seed: generate, train the full model (and the one-branch ablations), test SumR."""
    cfg = SyntheticConfig.branches(**overrides, seed=seed)
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        generate(cfg, root)
        out = {"seed": seed, "test_sumr": train_and_test(root, cfg, epochs)}
        if ablate:
            out["trained_alone_test_sumr"] = {keep: train_one_branch(root, cfg, epochs, keep)
                                              for keep in ("clip", "frame")}
    out["seconds"] = round(time.time() - start, 1)
    log.info("seed %d: %s", seed, out)
    return out


def mean_of(runs: list[dict], key: str) -> dict:
    """Per-score mean over seeds of ``run[key]``."""
    return {name: round(float(np.mean([r[key][name] for r in runs])), 2) for name in runs[0][key]}


def main_cli(argv: list[str] | None = None) -> dict:
    """CLI entry point; prints and returns the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ablate", action="store_true", help="also train each branch alone")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="override SyntheticConfig.branches fields (scalars), e.g. object_mean=0.4")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = parse_fields(args.set)
    runs = [run_seed(seed, args.epochs, args.ablate, overrides) for seed in args.seeds]
    cfg = SyntheticConfig.branches(**overrides)
    report = {"config": {"synthetic": f"SyntheticConfig.branches(seed=SEED, **{overrides})", "train": FAST,
                         "epochs": args.epochs, "threads": args.threads, "score_weights": [0.7, 0.3]},
              "chance_sumr": round(chance_sumr(cfg.n_videos[2]), 2), "runs": runs,
              "mean_test_sumr": mean_of(runs, "test_sumr")}
    if args.ablate:
        report["mean_trained_alone_test_sumr"] = mean_of(runs, "trained_alone_test_sumr")
    m = report["mean_test_sumr"]
    report["total_minus_clip"] = round(m["total"] - m["clip"], 2)
    report["total_minus_frame"] = round(m["total"] - m["frame"], 2)
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main_cli()
