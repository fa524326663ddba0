"""Training and evaluation throughput on a TVR-shaped synthetic set: our loop vs the official MS-SL loop.

    python -m benchmarks.train_speed [--data ROOT] [--batches 4] [--threads 2] [--no-anomaly] [--workers 0]

Prints JSON. The set is 2,000 training videos x 5 captions, 3072-d visual rows (up to 128 per video) and
768-d tokens (``SyntheticConfig.tvr_shaped``), generated into a temporary folder unless ``--data`` names one
made by ``python -m prvr.data.synthetic ROOT --tvr``. After one warm-up batch each, ``--batches`` batches of
128 videos (about 640 queries each) are timed for both loops, alternating batch by batch so that load from
other processes hits both alike; data loading is included, and seconds per epoch are extrapolated.

MEASURING STICK, NOT PRODUCT CODE: the second half of this file re-creates the official training step
(HuiGuanLab/ms-sl as ../shared/docs/mssl-reference.md describes it) in our own words, with the official
costs: per item and per epoch, every feature row is read from the BigFile with its own open/seek/read and
turned into Python floats, binned in float64 (32 clip bins, <= 128 frames) and L2-normalised, the tokens
read from the HDF5 file and normalised; ``collate`` sorts and pads item by item; the model runs as
written: padded inputs everywhere, proposals from 31 average-pooling layers into a zero (B, 32, 32, H)
map, the clip-scale product computed twice (cosine and raw) with autograd through both, the key-clip
attention on a per-query copy of its video's frames, losses with Python loops over the videos; BertAdam
updates one tensor at a time; the loop runs under ``torch.autograd.detect_anomaly()`` as the official
``train.py`` does (``--no-anomaly`` drops it). Left out: TensorBoard logging per step. Before timing,
``check_official`` asserts that it reproduces the official reference losses
(``../shared/reference/mssl/loss_small_dims.pt``) and our model's losses on a TVR-shaped batch.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import tempfile
import time
from array import array
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from prvr.data.official import Batch, OfficialSource, PreparedSplit, prepare_split
from prvr.data.synthetic import SyntheticConfig, generate
from prvr.evaluate.retrieval import evaluate_split
from prvr.models.mssl import MSSL, MSSLConfig
from prvr.train.optim import BertAdam, param_groups

log = logging.getLogger(__name__)
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "mssl" / "loss_small_dims.pt"


# ----------------------------------------------------------------------------- official data path
def _bin_means(x: np.ndarray, m: int) -> list:
    """Official binning: edges round(i n / m) clamped to n - 1; a bin is a mean, or one row when empty."""
    e = np.minimum(np.round(np.arange(m + 1) / m * len(x)).astype(int), len(x) - 1)
    return [x[e[i]: e[i + 1]].mean(0) if e[i] < e[i + 1] else x[e[i]] for i in range(m)]


def _l2(x: np.ndarray) -> np.ndarray:
    return x / (np.linalg.norm(x, axis=-1, keepdims=True) + 1e-5)


class OfficialDataset(torch.utils.data.Dataset):
    """One item = one video and all its captions, read and preprocessed on every access."""

    def __init__(self, source: OfficialSource, split: PreparedSplit, cfg: MSSLConfig):
        self.source, self.split, self.cfg = source, split, cfg
        self.bin_path = source.bigfile.dir / "feature.bin"
        self.caps = {v: [] for v in split.video_ids}
        for c in split.captions:
            self.caps[c.video_id].append(c.cap_id)
        self.h5 = None  # opened on first access, as official (one per worker)

    def __len__(self) -> int:
        return len(self.split.video_ids)

    def _read_one(self, row_id: str) -> list:
        """One row like the official BigFile.read_one: open, seek, array('f').fromfile, tolist."""
        with open(self.bin_path, "rb") as f:
            f.seek(self.source.bigfile.row_of[row_id] * self.source.visual_dim * 4)
            row = array("f")
            row.fromfile(f, self.source.visual_dim)
        return row.tolist()

    def __getitem__(self, i: int):
        self.h5 = self.h5 or h5py.File(self.source.query_path, "r")
        video_id = self.split.video_ids[i]
        rows = [self._read_one(r) for r in self.source.video2frames[video_id]]
        # the official helpers each build their own float64 array from the list of lists
        clip = torch.stack([torch.as_tensor(b) for b in _bin_means(np.array(rows), self.cfg.map_size)])
        clip = torch.from_numpy(_l2(clip.numpy())).unsqueeze(0)
        frames = np.array(rows)
        if len(frames) > self.cfg.max_ctx_l:
            frames = np.asarray(_bin_means(frames, self.cfg.max_ctx_l))
        frames = torch.from_numpy(_l2(frames))
        caps = [torch.from_numpy(_l2(self.h5[c][...]))[: self.cfg.max_desc_l] for c in self.caps[video_id]]
        return clip, frames, caps


def official_collate(items: list) -> Batch:
    """Sort by frame count, pad frames and tokens item by item, flatten captions in video order."""
    items = sorted(items, key=lambda it: len(it[1]), reverse=True)
    clips = torch.cat([it[0] for it in items]).float()
    lengths = [len(it[1]) for it in items]
    frames = torch.zeros(len(items), max(lengths), items[0][1].shape[-1])
    frame_mask = torch.zeros(len(items), max(lengths))
    for i, it in enumerate(items):
        frames[i, : lengths[i]], frame_mask[i, : lengths[i]] = it[1], 1.0
    tokens = [t for it in items for t in it[2]]
    labels = [i for i, it in enumerate(items) for _ in it[2]]  # a Python list, as official
    query = torch.zeros(len(tokens), max(len(t) for t in tokens), tokens[0].shape[-1])
    query_mask = torch.zeros(query.shape[:2])
    for j, t in enumerate(tokens):
        query[j, : len(t)], query_mask[j, : len(t)] = t, 1.0
    return Batch(clips, frames, frame_mask, query, query_mask, labels)


# ----------------------------------------------------------------------------- official model and losses
class OfficialMSSL(MSSL):
    """Our parameters (the official names) driven by the official forward and loss code paths."""

    def __init__(self, cfg: MSSLConfig):
        super().__init__(cfg)
        M = cfg.map_size
        pools = [nn.AvgPool1d(k, stride=1) for k in range(2, M + 1)]
        self.pool_layers = nn.ModuleList([nn.Identity(), *pools])
        # window (length i + 1, start j) sits at i * M + j of the flattened (M, M) map
        self.ones_index = torch.tensor([i * M + j for i in range(M) for j in range(M - i)])
        self.hard, self.pool = False, cfg.hard_pool_size

    def _encode(self, x, mask, proj, encoder, pos):
        return encoder(pos(proj(x)), mask)  # padded rows included, as official

    def official_loss(self, clip, frames, frame_mask, query, query_mask, labels: list) -> dict:
        """The four official losses; negatives random, or hard (pool ``self.pool``) when ``self.hard``."""
        units = self._encode(clip, None, self.clip_input_proj, self.clip_encoder, self.clip_pos_embed)
        frames = self._encode(frames, frame_mask, self.frame_input_proj, self.frame_encoder,
                              self.frame_pos_embed)
        B, M, H = units.shape
        fmap = torch.zeros(B, M, M, H)
        for k, pool in enumerate(self.pool_layers):
            pooled = pool(units.permute(0, 2, 1)).permute(0, 2, 1)
            fmap[:, k, : pooled.shape[1], :] = pooled
        props = fmap.view(B, M * M, H)[:, self.ones_index, :]
        tokens = self._encode(query, query_mask, self.query_input_proj, self.query_encoder,
                              self.query_pos_embed)
        logits = self.modular_vector_mapping(tokens)
        m = query_mask.unsqueeze(2)
        att = F.softmax(logits * m + (1 - m) * -1e10, dim=1)
        q = torch.einsum("blm,bld->bmd", att, tokens).squeeze()
        clip_cos, key_idx = torch.max(
            torch.matmul(F.normalize(props, dim=-1), F.normalize(q, dim=-1).t()).permute(2, 1, 0), dim=1)
        rows = list(range(len(q)))  # key-clip attention on a per-query copy of its video
        own_frames, own_props = frames[labels], props[labels]
        keys, values = self.mapping_linear[0](own_frames), self.mapping_linear[1](own_frames)
        key_clip = own_props[rows, key_idx[rows, labels], :].unsqueeze(-1)
        scores = torch.bmm(keys, key_clip).squeeze().masked_fill(frame_mask[labels].eq(0), -1e9).unsqueeze(1)
        z = torch.bmm(F.softmax(scores, dim=-1), values).squeeze()
        frame_cos = torch.matmul(F.normalize(q, dim=-1), F.normalize(z, dim=-1).t())
        clip_raw, _ = torch.max(torch.matmul(props, q.t()).permute(2, 1, 0), dim=1)
        frame_raw = torch.matmul(q, z.t())
        by_video: dict = {}
        for i, label in enumerate(labels):
            by_video.setdefault(label, []).append(i)
        out = {"clip_nce": 0.02 * self._clip_nce(clip_raw, labels, by_video),
               "clip_trip": self._clip_trip(clip_cos, labels),
               "frame_nce": 0.04 * self._frame_nce(frame_raw), "frame_trip": self._frame_trip(frame_cos)}
        out["total"] = out["clip_nce"] + out["clip_trip"] + out["frame_nce"] + out["frame_trip"]
        return out

    @staticmethod
    def _clip_nce(s, labels, by_video):
        t2v = torch.logsumexp(s, dim=1) - torch.logsumexp(s[torch.arange(len(s)), labels].unsqueeze(1), dim=1)
        num, den = torch.zeros(s.shape[1]), torch.zeros(s.shape[1])
        for v, idx in by_video.items():  # one video at a time
            num[v], den[v] = torch.logsumexp(s[idx, v], dim=0), torch.logsumexp(s[:, v], dim=0)
        return t2v.mean() + (den - num).mean()

    @staticmethod
    def _frame_nce(s):
        x = s.view(len(s), len(s), -1)
        pos = torch.logsumexp((x * torch.eye(len(s))[:, :, None]).sum(dim=1), dim=1)
        both = torch.cat((x, x.permute(1, 0, 2)), dim=1).view(len(s), -1)
        return (torch.logsumexp(both, dim=1) - pos).mean()

    def _clip_trip(self, s, labels):
        labels_np, margin, v2t = np.array(labels), self.cfg.margin, 0
        for v in range(s.shape[1]):  # video -> text, one video at a time
            pos = torch.mean(s.t()[v][np.where(labels_np == v)])
            neg, _ = torch.sort(s.t()[v][np.where(labels_np != v)[0]], descending=True)
            pick = neg[0] if self.hard else neg[torch.randint(0, neg.shape[0], size=(1,))]
            v2t = v2t + (margin + pick - pos).clamp(min=0).sum()
        rows = torch.arange(len(s))
        masked = copy.deepcopy(s.data)
        masked[rows, labels] = 999
        _, order = torch.sort(masked, descending=True, dim=1)
        high = min(1 + self.pool, s.shape[1]) if self.hard else s.shape[1]
        neg = s[rows, order[rows, torch.randint(1, high, size=(len(s),))]]
        return (margin + neg - s[rows, labels]).clamp(min=0).sum() / len(s) + v2t / s.shape[1]

    def _frame_trip(self, s):
        rows = torch.arange(len(s))
        masked = copy.deepcopy(s.data)
        masked[rows, rows] = 999
        high = min(1 + self.pool, len(s)) if self.hard else len(s)

        def negatives(scores, scores_masked):
            _, order = torch.sort(scores_masked, descending=True, dim=1)
            return scores[rows, order[rows, torch.randint(1, high, size=(len(s),))]]

        pos = s[rows, rows]
        return sum((self.cfg.margin + n - pos).clamp(min=0).sum() / len(s)
                   for n in (negatives(s, masked), negatives(s.t(), masked.t())))


class OfficialBertAdam(BertAdam):
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


def check_official(cfg: MSSLConfig, batch: Batch) -> dict:
    """Assert the re-created official loss equals the official reference numbers and our model's losses."""
    checked = {}
    if REFERENCE.is_file():
        ref = torch.load(REFERENCE, weights_only=True)
        small = OfficialMSSL(MSSLConfig.from_official(ref["config"]))
        small.load_state_dict(ref["state_dict"])  # the official names; pool_layers hold no weights
        small.eval()
        small.hard, small.pool = True, 1  # as the reference was computed: every negative the hardest
        out = small.official_loss(ref["clip_inputs"], ref["frame_inputs"], ref["frame_mask"],
                                  ref["query_inputs"], ref["query_mask"], ref["query_labels"].tolist())
        names = {"clip_nce": "clip_nce_loss", "clip_trip": "clip_trip_loss", "frame_nce": "frame_nce_loss",
                 "frame_trip": "frame_trip_loss", "total": "loss_overall"}
        gap = max(abs(out[k].item() - ref["loss"][v]) for k, v in names.items())
        assert gap < 1e-4, f"re-created official loss is {gap} away from the official reference numbers"
        checked["vs_official_reference"] = gap
    torch.manual_seed(1)
    ours = MSSL(cfg).eval()
    official = OfficialMSSL(cfg).eval()
    official.load_state_dict(ours.state_dict())
    official.hard, official.pool = True, 1
    with torch.no_grad():
        a = ours.loss(batch.clip_inputs, batch.frame_inputs, batch.frame_mask, batch.query_inputs,
                      batch.query_mask, batch.query_labels, hard_negative_pool=1)
        b = official.official_loss(batch.clip_inputs, batch.frame_inputs, batch.frame_mask,
                                   batch.query_inputs, batch.query_mask, batch.query_labels.tolist())
    gap = max(abs(a[k].item() - b[k].item()) for k in a)
    assert gap < 1e-4, f"our losses and the re-created official ones differ by {gap}: {a} vs {b}"
    checked["vs_ours_tvr_batch"] = gap
    return checked


# ----------------------------------------------------------------------------- timing
class Loop:
    """One training loop under test: its model, optimizer and batch source, timed step by step."""

    def __init__(self, model: MSSL, optimizer: BertAdam, batches, official: bool, anomaly: bool):
        self.model, self.opt, self.it, self.official = model.train(), optimizer, iter(batches), official
        self.anomaly = anomaly
        self.seconds, self.queries, self.steps = 0.0, 0, 0

    def step(self, timed: bool) -> None:
        """Load one batch and train on it; add its time to the total when ``timed``."""
        start = time.perf_counter()
        guard = torch.autograd.detect_anomaly() if self.anomaly else contextlib.nullcontext()
        with guard:
            b = next(self.it)
            if self.official:
                out = self.model.official_loss(b.clip_inputs, b.frame_inputs, b.frame_mask, b.query_inputs,
                                               b.query_mask, b.query_labels)
                self.opt.zero_grad()
                out["total"].backward()
                self.opt.step()
                [float(v) for v in out.values()]  # the official loss meters read every term each step
            else:
                out = self.model.loss(b.clip_inputs, b.frame_inputs, b.frame_mask, b.query_inputs,
                                      b.query_mask, b.query_labels)
                self.opt.zero_grad(set_to_none=True)
                out["total"].backward()
                self.opt.step()
        if timed:
            self.seconds += time.perf_counter() - start
            self.queries += len(b.query_labels)
            self.steps += 1

    def report(self, n_batches: int) -> dict:
        return {"queries_per_s": self.queries / self.seconds, "seconds_per_batch": self.seconds / self.steps,
                "seconds_per_epoch": self.seconds / self.steps * n_batches, "batches_timed": self.steps}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="an existing TVR-shaped synthetic root (else generated in a temp dir)")
    parser.add_argument("--batches", type=int, default=4, help="timed training batches per loop")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers of the official loop")
    parser.add_argument("--no-anomaly", action="store_true", help="official loop without detect_anomaly")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    syn = SyntheticConfig.tvr_shaped()
    report: dict = {"threads": args.threads, "device": "cpu", "data": {"videos": syn.n_videos,
                    "captions_per_video": syn.captions_per_video, "visual_dim": syn.visual_dim,
                    "query_dim": syn.query_dim, "frames": [syn.min_frames, syn.max_frames]},
                    "official_loop": {"workers": args.workers, "detect_anomaly": not args.no_anomaly}}
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
        report["prepare_train_seconds"] = time.perf_counter() - start  # once per run, not per epoch
        n_batches = train.n_batches(128)
        report["official_check"] = check_official(cfg, train.collate(torch.arange(32)))

        def build(cls, opt_cls):
            torch.manual_seed(0)
            model = cls(cfg)
            return model, opt_cls(param_groups(model, 0.01), lr=2.5e-4, t_total=100 * n_batches)

        ours = Loop(*build(MSSL, BertAdam), train.batches(128, torch.Generator().manual_seed(0)), False,
                    False)
        loader = torch.utils.data.DataLoader(OfficialDataset(source, train, cfg), batch_size=128,
                                             shuffle=True, collate_fn=official_collate,
                                             num_workers=args.workers)
        official = Loop(*build(OfficialMSSL, OfficialBertAdam), loader, True, not args.no_anomaly)
        for i in range(args.batches + 1):  # alternate, so both see the same load; batch 0 warms up
            for loop in (ours, official):
                loop.step(timed=i > 0)
        report["ours"], report["official"] = ours.report(n_batches), official.report(n_batches)
        report["speedup"] = report["ours"]["queries_per_s"] / report["official"]["queries_per_s"]
        val = prepare_split(source, "val")
        start = time.perf_counter()
        evaluate_split(ours.model, val)
        seconds = time.perf_counter() - start
        report["eval"] = {"queries": len(val.captions), "videos": len(val.video_ids), "seconds": seconds,
                          "queries_per_s": len(val.captions) / seconds}
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
