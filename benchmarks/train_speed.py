"""Training and evaluation throughput on a TVR-shaped synthetic set, ours vs an official-style loop.

    python -m benchmarks.train_speed [--data ROOT] [--batches 4] [--threads 2]

Prints JSON. The set is 2,000 training videos x 5 captions, 3072-d visual rows (up to 128 per video) and
768-d tokens (``SyntheticConfig.tvr_shaped``), generated into a temporary folder unless ``--data`` names one
made by ``python -m prvr.synthetic ROOT --tvr``. Training is timed over ``--batches`` batches of 128 videos
(about 640 queries each) after one warm-up batch, and extrapolated to seconds per epoch.

The "official_style" mode reproduces the costs of the official loop that the reference notes describe and
that our loop removes: every epoch each item is read from the BigFile row by row (seek + read per row id)
and preprocessed in numpy inside the Dataset (``average_to_fixed_length``, ``uniform_feature_sampling``,
L2 normalisation, token normalisation from the HDF5 file), each batch is padded in ``collate``, and BertAdam
updates one tensor at a time. Both modes run the same model forward/backward (``prvr.model``), so the model
math itself is not compared: the official model code is not available here.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from array import array
from pathlib import Path

import h5py
import numpy as np
import torch

from prvr.data import Batch, OfficialSource, PreparedSplit, prepare_split
from prvr.evaluate import evaluate_split
from prvr.model import MSSL, MSSLConfig
from prvr.optim import BertAdam, param_groups
from prvr.synthetic import SyntheticConfig, generate

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- the official-style loop
def _bins(n: int, m: int) -> np.ndarray:
    """Official bin edges: round(i n / m), half-to-even, clamped to n - 1."""
    return np.minimum(np.round(np.arange(m + 1) / m * n).astype(int), n - 1)


def _rebin(x: np.ndarray, m: int) -> np.ndarray:
    """Mean of each bin (a single row for an empty bin), one bin at a time as the official loop does."""
    e = _bins(len(x), m)
    return np.stack([x[e[i]: e[i + 1]].mean(0) if e[i] < e[i + 1] else x[e[i]] for i in range(m)])


def _l2(x: np.ndarray, eps: float = 0.0) -> np.ndarray:
    return x / (np.linalg.norm(x, axis=-1, keepdims=True) + eps)


class OfficialStyleDataset(torch.utils.data.Dataset):
    """One item = one video and its captions, read and preprocessed on every access."""

    def __init__(self, source: OfficialSource, split: PreparedSplit, cfg: MSSLConfig):
        self.source, self.split, self.cfg = source, split, cfg
        self.bin = open(source.bigfile.dir / "feature.bin", "rb")  # noqa: SIM115 - lives with the dataset
        self.h5 = h5py.File(source.query_path, "r")
        self.caps = [[c.cap_id for c in split.captions if c.video_id == v] for v in split.video_ids]

    def __len__(self) -> int:
        return len(self.split.video_ids)

    def _row(self, row_id: str) -> array:
        """One row, read like the official BigFile: seek, then array('f').fromfile."""
        self.bin.seek(self.source.bigfile.row_of[row_id] * self.source.visual_dim * 4)
        row = array("f")
        row.fromfile(self.bin, self.source.visual_dim)
        return row

    def __getitem__(self, i: int):
        rows = np.array([self._row(r) for r in self.source.video2frames[self.split.video_ids[i]]], np.float32)
        clip = _l2(_rebin(rows, self.cfg.map_size))
        frames = _l2(rows if len(rows) <= self.cfg.max_ctx_l else _rebin(rows.astype(np.float64),
                                                                          self.cfg.max_ctx_l))
        tokens = [_l2(self.h5[c][...], 1e-5)[: self.cfg.max_desc_l] for c in self.caps[i]]
        return torch.from_numpy(clip).float(), torch.from_numpy(frames).float(), [torch.from_numpy(t) for t in
                                                                                   tokens]


def official_collate(items: list) -> Batch:
    """Sort by frame count, pad frames and tokens item by item, flatten captions in video order."""
    items = sorted(items, key=lambda it: -len(it[1]))
    clips = torch.stack([it[0] for it in items])
    frames = torch.zeros(len(items), max(len(it[1]) for it in items), clips.shape[-1])
    frame_mask = torch.zeros(frames.shape[:2])
    for i, it in enumerate(items):
        frames[i, : len(it[1])], frame_mask[i, : len(it[1])] = it[1], 1
    tokens = [t for it in items for t in it[2]]
    labels = torch.tensor([i for i, it in enumerate(items) for _ in it[2]])
    query = torch.zeros(len(tokens), max(len(t) for t in tokens), tokens[0].shape[-1])
    query_mask = torch.zeros(query.shape[:2])
    for j, t in enumerate(tokens):
        query[j, : len(t)], query_mask[j, : len(t)] = t, 1
    return Batch(clips, frames, frame_mask, query, query_mask, labels)


class LoopBertAdam(BertAdam):
    """BertAdam updating one tensor at a time (the official optimizer's structure)."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr = self.scheduled_lr(group)
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["next_m"], state["next_v"] = torch.zeros_like(p), torch.zeros_like(p)
                torch.nn.utils.clip_grad_norm_(p, group["max_grad_norm"])
                state["next_m"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
                state["next_v"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                update = state["next_m"] / (state["next_v"].sqrt() + group["eps"])
                if group["weight_decay"] > 0:
                    update += group["weight_decay"] * p
                p.add_(-lr * update)
            group["step"] += 1


# ----------------------------------------------------------------------------- timing
def time_training(model: MSSL, batches, optimizer: BertAdam, n: int) -> tuple[float, int]:
    """Seconds and queries for ``n`` batches after one warm-up batch (data loading included)."""
    model.train()
    it = iter(batches)
    seconds, queries = 0.0, 0
    for i in range(n + 1):
        start = time.perf_counter()
        b = next(it)
        losses = model.loss(b.clip_inputs, b.frame_inputs, b.frame_mask, b.query_inputs, b.query_mask,
                            b.query_labels)
        optimizer.zero_grad(set_to_none=True)
        losses["total"].backward()
        optimizer.step()
        if i:  # the first batch warms up allocators and caches
            seconds += time.perf_counter() - start
            queries += len(b.query_labels)
    return seconds, queries


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="an existing TVR-shaped synthetic root (else generated in a temp dir)")
    parser.add_argument("--batches", type=int, default=4, help="timed training batches per mode")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    syn = SyntheticConfig.tvr_shaped()
    report: dict = {"threads": args.threads, "device": "cpu", "data": {"videos": syn.n_videos,
                    "captions_per_video": syn.captions_per_video, "visual_dim": syn.visual_dim,
                    "query_dim": syn.query_dim, "frames": [syn.min_frames, syn.max_frames]}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.data) if args.data else Path(tmp)
        if not args.data:
            start = time.perf_counter()
            generate(syn, root)
            report["generate_seconds"] = time.perf_counter() - start
        source = OfficialSource(root, syn.collection, syn.feature)
        cfg = MSSLConfig(visual_dim=syn.visual_dim, query_dim=syn.query_dim, margin=0.1)
        start = time.perf_counter()
        train = prepare_split(source, "train")
        report["prepare_train_seconds"] = time.perf_counter() - start
        n_batches = train.n_batches(128)

        def run(mode: str, batches, opt_cls) -> dict:
            torch.manual_seed(0)
            model = MSSL(cfg)
            opt = opt_cls(param_groups(model, 0.01), lr=2.5e-4, t_total=100 * n_batches)
            seconds, queries = time_training(model, batches, opt, args.batches)
            return {"queries_per_s": queries / seconds, "seconds_per_batch": seconds / args.batches,
                    "seconds_per_epoch": seconds / args.batches * n_batches, "batches_timed": args.batches}

        report["ours"] = run("ours", train.batches(128, torch.Generator().manual_seed(0)), BertAdam)
        loader = torch.utils.data.DataLoader(OfficialStyleDataset(source, train, cfg), batch_size=128,
                                             shuffle=True, collate_fn=official_collate, num_workers=0)
        report["official_style"] = run("official_style", loader, LoopBertAdam)
        report["speedup"] = report["ours"]["queries_per_s"] / report["official_style"]["queries_per_s"]
        val = prepare_split(source, "val")
        model = MSSL(cfg)
        start = time.perf_counter()
        evaluate_split(model, val)
        seconds = time.perf_counter() - start
        report["eval"] = {"queries": len(val.captions), "videos": len(val.video_ids), "seconds": seconds,
                          "queries_per_s": len(val.captions) / seconds}
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
