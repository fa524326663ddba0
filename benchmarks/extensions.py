"""MS-SL vs its seed-paper extensions (RAL: CSA, MSRA; ICE, IRM, TCP) on the learnable synthetic benchmark.

Each setting is trained with the official recipe (``prvr.train.loop.Trainer``: BertAdam, random then hard
negatives, best val checkpoint) over several seeds on one generated data set, then the best checkpoint is
evaluated on the test split. Prints JSON: per setting the test SumR mean and std over seeds, every seed's
SumR, and the training cost: median seconds per epoch (training only, validation excluded), also relative to
MS-SL.

    python -m benchmarks.extensions                 # the default table (~10-15 min on 2 idle cores)
    python -m benchmarks.extensions --seeds 5 --epochs 20 --settings mssl csa

The setting is deliberately small (hidden size 64, 16 clip units, short videos) so the table runs on a CPU;
it is not the papers' data, and says nothing about TVR/ActivityNet-scale gains.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

import prvr  # noqa: F401  - applies the torchvision CPU fix first
from prvr.data.official import OfficialSource, prepare_split
from prvr.data.synthetic import SyntheticConfig, generate
from prvr.evaluate.retrieval import evaluate_split
from prvr.models.checkpoint import load_checkpoint
from prvr.models.mssl import MSSL, MSSLConfig
from prvr.train.loop import TrainConfig, Trainer

SETTINGS = {  # name -> MSSLConfig switches
    "mssl": {},
    "csa": {"csa": True},
    "msra": {"msra": True},
    "ral": {"csa": True, "msra": True},
    "ice": {"ice": True},
    "irm": {"irm": True},
    "tcp": {"tcp": True},
    "all": {"csa": True, "msra": True, "ice": True, "irm": True, "tcp": True},
}
# tests/test_train.py's learnable setting: small enough for a CPU, and MS-SL learns it in a few epochs
DATA = SyntheticConfig(n_videos=(160, 40, 200), captions_per_video=3, distractors_per_video=1, visual_dim=32,
                       query_dim=24, min_frames=32, max_frames=64, n_events=24, n_objects=24, seed=1)
MODEL = {"hidden_size": 64, "map_size": 16, "max_ctx_l": 64}  # official: 384, 32, 128 (too slow here)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class TimedTrainer(Trainer):
    """The official loop, recording the wall time of each training pass (validation excluded)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_seconds: list[float] = []

    def train_epoch(self) -> dict:
        start = time.perf_counter()
        losses = super().train_epoch()
        self.train_seconds.append(time.perf_counter() - start)
        return losses


def run(setting: dict, seed: int, source: OfficialSource, splits: dict, train_cfg: TrainConfig,
        out: Path) -> dict:
    """Train one (setting, seed), evaluate its best checkpoint on test -> SumR and s/epoch."""
    torch.manual_seed(seed)  # parameter init; the trainer seeds dropout, sampling and order itself
    model = MSSL(MSSLConfig(visual_dim=source.visual_dim, query_dim=source.query_dim, **MODEL, **setting))
    model.to(DEVICE)
    trainer = TimedTrainer(model, TrainConfig(**{**asdict(train_cfg), "seed": seed}), splits["train"],
                           splits["val"], out)
    trainer.fit()
    best = load_checkpoint(out / "best", map_location=DEVICE)
    test = evaluate_split(best, splits["test"])["total"]
    return {"sumr": test["sumr"], "s_per_epoch": statistics.median(trainer.train_seconds)}


def main(argv: list[str] | None = None) -> dict:
    """Run every (setting, seed) and print the JSON table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3, help="official 2.5e-4; higher for the few steps")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default); "
                        "1 is much faster on a machine busy with other work")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if "mssl" not in args.settings:
        args.settings.insert(0, "mssl")  # the reference for the relative cost
    train_cfg = TrainConfig(n_epoch=args.epochs, batch_size=args.batch_size, lr=args.lr, max_es_cnt=-1,
                            hard_negative_start_epoch=args.epochs // 2)
    runs: dict[str, list[dict]] = {name: [] for name in args.settings}
    with tempfile.TemporaryDirectory() as tmp:
        source = OfficialSource(generate(DATA, tmp).parent, DATA.collection, DATA.feature)
        splits = {s: prepare_split(source, s) for s in ("train", "val", "test")}
        for seed in range(args.seeds):
            for name in args.settings:
                runs[name].append(run(SETTINGS[name], seed, source, splits, train_cfg,
                                      Path(tmp) / f"{name}-{seed}"))
                logging.info("%s seed %d: %s", name, seed, runs[name][-1])
    # medians: a busy machine slows some epochs down a lot, and a median ignores those
    base_cost = statistics.median(r["s_per_epoch"] for r in runs["mssl"])
    table = {}
    for name, rs in runs.items():
        sumr = [r["sumr"] for r in rs]
        cost = statistics.median(r["s_per_epoch"] for r in rs)
        table[name] = {"options": SETTINGS[name], "sumr_mean": statistics.mean(sumr),
                       "sumr_std": statistics.stdev(sumr) if len(sumr) > 1 else 0.0, "sumr": sumr,
                       "s_per_epoch": cost, "cost_vs_mssl": cost / base_cost,
                       "s_per_epoch_by_seed": [r["s_per_epoch"] for r in rs]}
    report = {"data": asdict(DATA), "model": MODEL, "train": asdict(train_cfg), "seeds": args.seeds,
              "device": DEVICE if DEVICE == "cuda" else f"cpu, {torch.get_num_threads()} threads",
              "settings": table}
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    main()
