"""Train MS-SL with the official recipe: BertAdam + warmup_linear, batches of videos with all their captions,
random then hard negatives, validation SumR every epoch, best checkpoint kept, early stopping.

    python -m prvr.train --data ROOT --collection tvr --feature i3d_resnet --preset tvr --out runs/tvr
    python -m prvr.train --features V.h5 --captions C.h5 --splits train=train.txt val=val.txt test=test.txt \\
        --out runs/mine [--preset charades] [--clusters 32] [--n_epoch=30 --lr=1e-4 ...]
    python -m prvr.train ... --resume runs/tvr/last          # continue an interrupted run

A preset (``prvr/train/presets/<name>.json``) lists only what differs from the defaults; ``--key=value``
options override any field of ``MSSLConfig`` or ``TrainConfig``, type-checked. OUT gets ``best/`` (the
checkpoint with the best val SumR), ``last/`` (model + ``train_state.pt`` for ``--resume``) and ``log.jsonl``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from prvr.data.official import (
    PreparedSplit,
    Source,
    add_source_args,
    check_compatible,
    prepare_split,
    source_from_args,
)
from prvr.evaluate.retrieval import evaluate_split, format_table
from prvr.models.checkpoint import load_checkpoint, save_checkpoint
from prvr.models.mssl import EXTENSIONS, MSSL, MSSLConfig
from prvr.plural import counted
from prvr.train.optim import BertAdam, param_groups

log = logging.getLogger(__name__)

PRESET_DIR = Path(__file__).parent / "presets"


@dataclass
class TrainConfig:
    lr: float = 2.5e-4  # peak learning rate
    warmup: float = 0.01  # fraction of all steps spent warming up (warmup_linear)
    weight_decay: float = 0.01  # BertAdam decoupled decay (not on biases and LayerNorms)
    batch_size: int = 128  # videos per batch, each with all of its captions
    n_epoch: int = 100
    max_es_cnt: int = 10  # stop once more than this many epochs in a row missed the best val SumR; -1 never
    hard_negative_start_epoch: int = 20  # from this epoch on, negatives come from the hardest; -1 never
    seed: int = 2018
    eval_query_bsz: int = 500  # evaluation batches (queries encoded per batch, videos scored per batch)
    eval_video_bsz: int = 200


_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def _fields() -> dict[str, tuple[str, type]]:
    """Every option name -> (owning config, type), over MSSLConfig and TrainConfig."""
    out = {}
    for owner in (MSSLConfig, TrainConfig):
        for f in dataclasses.fields(owner):
            out[f.name] = (owner.__name__, _TYPES[f.type if isinstance(f.type, str) else f.type.__name__])
    return out


def typed(key: str, value: object) -> object:
    """Check/convert one option value against its dataclass field type (strings come from the CLI)."""
    fields = _fields()
    if key not in fields:
        raise ValueError(f"unknown option {key!r}; valid: {', '.join(sorted(fields))}")
    typ = fields[key][1]
    if isinstance(value, str) and typ is not str:
        if typ is bool and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        try:
            return typ(value)
        except ValueError:
            raise ValueError(f"option {key}={value!r}: expected {typ.__name__}") from None
    if typ is float and type(value) is int:
        return float(value)
    if type(value) is not typ:
        raise ValueError(f"option {key}={value!r}: expected {typ.__name__}, got {type(value).__name__}")
    return value


def load_preset(name: str | None) -> dict:
    """The options of a named preset (or a JSON file path), type-checked; None -> {}."""
    if name is None:
        return {}
    path = Path(name) if name.endswith(".json") else PRESET_DIR / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in PRESET_DIR.glob("*.json"))
        raise FileNotFoundError(f"no preset {name!r} ({path}); known presets: {known}")
    return {k: typed(k, v) for k, v in json.loads(path.read_text()).items()}


def parse_overrides(items: list[str]) -> dict:
    """``--key=value`` strings -> typed options."""
    out = {}
    for item in items:
        if not item.startswith("--") or "=" not in item:
            raise ValueError(f"unrecognised argument {item!r}: options are --key=value")
        key, value = item[2:].split("=", 1)
        out[key] = typed(key, value)
    return out


def build_configs(options: dict, source: Source, owner: str) -> tuple[MSSLConfig, TrainConfig]:
    """Model and training configs from options; the feature dims come from the data and must agree."""
    dims = {"visual_dim": source.visual_dim, "query_dim": source.query_dim}
    wanted = {k: options.get(k, v) for k, v in dims.items()}
    check_compatible(wanted["visual_dim"], wanted["query_dim"], None, source, owner)
    fields = _fields()
    model_opts = {k: v for k, v in {**options, **dims}.items() if fields[k][0] == "MSSLConfig"}
    train_opts = {k: v for k, v in options.items() if fields[k][0] == "TrainConfig"}
    return MSSLConfig(**model_opts), TrainConfig(**train_opts)


class Trainer:
    """The official training loop over preprocessed splits, with resumable state."""

    def __init__(self, model: MSSL, cfg: TrainConfig, train: PreparedSplit, val: PreparedSplit, out: Path,
                 meta: dict | None = None):
        self.model, self.cfg, self.train, self.val, self.out = model, cfg, train, val, Path(out)
        self.meta = meta or {}  # recorded in checkpoints: data description, preset, profile
        self.device = model.device
        torch.manual_seed(cfg.seed)  # dropout and negative sampling
        self.shuffle = torch.Generator().manual_seed(cfg.seed)  # epoch order, separate so it can be saved
        t_total = train.n_batches(cfg.batch_size) * cfg.n_epoch
        self.optimizer = BertAdam(param_groups(model, cfg.weight_decay), lr=cfg.lr, t_total=t_total,
                                  warmup=cfg.warmup)
        self.epoch, self.best_sumr, self.best_epoch, self.es_cnt = 0, float("-inf"), -1, 0

    def train_epoch(self) -> dict:
        """One pass over the training videos; returns the mean of each loss term."""
        self.model.train()
        hard = self.cfg.hard_negative_start_epoch != -1 and self.epoch >= self.cfg.hard_negative_start_epoch
        pool = self.model.cfg.hard_pool_size if hard else None
        sums, n = {}, 0
        bar = tqdm(self.train.batches(self.cfg.batch_size, self.shuffle), total=self.train.n_batches(
            self.cfg.batch_size), desc=f"epoch {self.epoch}", leave=False, mininterval=2)
        for batch in bar:
            if len(batch.clip_inputs) < 2:  # a lone video has no negatives to contrast with
                continue
            b = batch.to(self.device)
            losses = self.model.loss(b.clip_inputs, b.frame_inputs, b.frame_mask, b.query_inputs,
                                     b.query_mask, b.query_labels, hard_negative_pool=pool)
            self.optimizer.zero_grad(set_to_none=True)
            losses["total"].backward()
            self.optimizer.step()
            for k, v in losses.items():  # summed on the device: no host sync per step
                sums[k] = sums.get(k, 0.0) + v.detach().double()  # float64, like the Python floats before
            n += 1
            if n % 20 == 0:  # an occasional progress read-out (each one waits for the device)
                bar.set_postfix(loss=f"{float(sums['total']) / n:.3f}")
        return {k: float(v) / max(n, 1) for k, v in sums.items()}

    def fit(self, max_epochs: int | None = None) -> dict:
        """Train until n_epoch, early stop, or ``max_epochs`` more epochs; returns the best val SumR."""
        stop = self.cfg.n_epoch if max_epochs is None else min(self.cfg.n_epoch, self.epoch + max_epochs)
        while self.epoch < stop:
            start = time.time()
            losses = self.train_epoch()
            metrics = evaluate_split(self.model, self.val, query_bsz=self.cfg.eval_query_bsz,
                                     video_bsz=self.cfg.eval_video_bsz)
            sumr = metrics["total"]["sumr"]
            if sumr > self.best_sumr:  # strictly better resets the counter, as official
                self.best_sumr, self.best_epoch, self.es_cnt = sumr, self.epoch, 0
                save_checkpoint(self.model, self.out / "best", train=self.meta,
                                profile=self.meta.get("profile"),
                                metrics={"val": metrics}, epoch=self.epoch)
            else:
                self.es_cnt += 1
            self.log_record({"epoch": self.epoch, "loss": losses, "val": metrics, "val_sumr": sumr,
                       "best_sumr": self.best_sumr, "es_cnt": self.es_cnt, "seconds": time.time() - start})
            log.info("epoch %d: loss %.4f val SumR %.2f (best %.2f at %d)", self.epoch,
                     losses.get("total", 0.0), sumr, self.best_sumr, self.best_epoch)
            self.epoch += 1
            self.save_state(self.out / "last")
            if self.cfg.max_es_cnt != -1 and self.es_cnt > self.cfg.max_es_cnt:
                log.info("early stop after epoch %d (%s without gain)", self.epoch - 1,
                         counted(self.es_cnt, "epoch"))
                break
        return {"best_epoch": self.best_epoch, "best_sumr": self.best_sumr}

    def log_record(self, record: dict) -> None:
        """Append one JSON line to OUT/log.jsonl."""
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def save_state(self, path: Path) -> None:
        """Model + everything needed to continue: optimizer, epoch, RNG states, best/early-stop counters."""
        save_checkpoint(self.model, path, train=self.meta, profile=self.meta.get("profile"), epoch=self.epoch)
        state = {"optimizer": self.optimizer.state_dict(), "epoch": self.epoch, "best_sumr": self.best_sumr,
                 "best_epoch": self.best_epoch, "es_cnt": self.es_cnt, "torch_rng": torch.get_rng_state(),
                 "shuffle_rng": self.shuffle.get_state(), "train_config": dataclasses.asdict(self.cfg)}
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        torch.save(state, path / "train_state.pt")

    def load_state(self, path: Path) -> None:
        """Restore what ``save_state`` wrote (the model weights are loaded by the caller)."""
        state = torch.load(path / "train_state.pt", weights_only=True)
        t_total = self.optimizer.param_groups[0]["t_total"]
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # n_epoch may have been extended on resume
            group["t_total"] = t_total
        self.epoch, self.best_sumr, self.es_cnt = state["epoch"], state["best_sumr"], state["es_cnt"]
        self.best_epoch = state["best_epoch"]
        self.shuffle.set_state(state["shuffle_rng"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point; returns the best val result and the test metrics of the best checkpoint."""
    parser = argparse.ArgumentParser(description="Train MS-SL (official recipe).",
                                     epilog="Any MSSLConfig/TrainConfig field can be set with --key=value.")
    add_source_args(parser)
    parser.add_argument("--out", required=True, help="output folder: best/, last/, log.jsonl")
    parser.add_argument("--preset", help="tvr, activitynet, charades, or a JSON file")
    parser.add_argument("--clusters", type=int, help="MS-SL++: k-medoids over the proposals (e.g. 32)")
    for name, what in EXTENSIONS.items():  # the seed papers' options; their weights: --key=value
        parser.add_argument(f"--{name}", action="store_true", help=what)
    parser.add_argument("--resume", help="a last/ folder of an earlier run to continue")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args, rest = parser.parse_known_args(argv)
    try:
        overrides = parse_overrides(rest)
    except ValueError as e:
        parser.error(str(e))
    if args.clusters is not None:
        overrides["clusters"] = args.clusters
    overrides.update({name: True for name in EXTENSIONS if getattr(args, name)})
    source = source_from_args(parser, args)
    if args.resume:
        model = load_checkpoint(args.resume)
        changed = [k for k, v in overrides.items() if _fields()[k][0] == "MSSLConfig" and
                   model.cfg.to_dict()[k] != v]
        if changed:
            parser.error(f"--resume {args.resume}: model options {changed} cannot change when resuming")
        options = {**model.checkpoint_meta["train"]["options"], **overrides}
        check_compatible(model.cfg.visual_dim, model.cfg.query_dim, model.profile, source,
                         f"checkpoint {args.resume}")
        train_cfg = TrainConfig(**{k: v for k, v in options.items() if _fields()[k][0] == "TrainConfig"})
    else:
        options = {**load_preset(args.preset), **overrides}
        model_cfg, train_cfg = build_configs(options, source, f"preset {args.preset!r} + options")
        torch.manual_seed(train_cfg.seed)  # the initial weights are part of a seeded run, as official
        model = MSSL(model_cfg)
        model.profile = source.profile
    model.to(args.device)
    splits = {name: prepare_split(source, name, model.cfg.map_size, model.cfg.max_ctx_l, model.cfg.max_desc_l)
              for name in ("train", "val")}
    meta = {"options": options, "preset": args.preset, "profile": source.profile,
            "data": {k: getattr(args, k) for k in ("data", "collection", "feature", "features", "captions",
                                                   "splits")}}
    trainer = Trainer(model, train_cfg, splits["train"], splits["val"], Path(args.out), meta)
    if args.resume:
        trainer.load_state(Path(args.resume))
        log.info("resumed from %s at epoch %d", args.resume, trainer.epoch)
    result = trainer.fit()
    if not source.has_split("test"):
        log.info("no test split in the data: skipping the final test evaluation")
        return result
    test = prepare_split(source, "test", model.cfg.map_size, model.cfg.max_ctx_l, model.cfg.max_desc_l)
    best = load_checkpoint(Path(args.out) / "best", map_location=args.device)
    result["test"] = evaluate_split(best, test, query_bsz=train_cfg.eval_query_bsz,
                                    video_bsz=train_cfg.eval_video_bsz)
    trainer.log_record({"test": result["test"], "best_epoch": result["best_epoch"]})
    print(f"test: {counted(len(test.captions), 'query', 'queries')}, "
          f"{counted(len(test.video_ids), 'video')}, best epoch {result['best_epoch']}")
    print(format_table(result["test"]))
    return result
