"""Text-to-video retrieval evaluation, exactly as the official MS-SL ``eval.py`` computes it.

Each query has one ground-truth video; scores are negated and ``np.argsort``ed per query (numpy's default
sort, so ties break as in the official code), the rank is the 1-based position of the ground truth,
R@k = 100 * fraction of ranks <= k, SumR = R@1 + R@5 + R@10 + R@100 (unrounded), medr = median rank,
meanr = mean rank, map = mean(1 / rank). The command line is ``prvr.evaluate.__main__``.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

import prvr  # noqa: F401 - applies the torchvision CPU fix before anything imports torchvision
from prvr.data.official import PreparedSplit
from prvr.evaluate.annotated import first_relevant_ranks
from prvr.models.branches import EncodedVideos, cat_queries
from prvr.models.mssl import MSSL

log = logging.getLogger(__name__)

RECALLS = (1, 5, 10, 100)
SCORES = ("total", "clip", "frame")


def retrieval_metrics(scores: np.ndarray | torch.Tensor, gt_video: np.ndarray | torch.Tensor) -> dict:
    """scores (Nq, Nv), higher = better; gt_video (Nq,) -> r1 r5 r10 r100 sumr medr meanr map."""
    scores = scores.detach().cpu().numpy() if isinstance(scores, torch.Tensor) else np.asarray(scores)
    gt = gt_video.detach().cpu().numpy() if isinstance(gt_video, torch.Tensor) else np.asarray(gt_video)
    if scores.ndim != 2 or gt.shape != (scores.shape[0],):
        raise ValueError(f"retrieval_metrics: scores {scores.shape} and gt_video {gt.shape} do not match")
    if ((gt < 0) | (gt >= scores.shape[1])).any():
        raise ValueError(f"retrieval_metrics: gt_video outside [0, {scores.shape[1]})")
    relevant = np.zeros(scores.shape, bool)
    relevant[np.arange(len(gt)), gt] = True
    ranks, _ = first_relevant_ranks(scores, relevant)  # the official per-row argsort
    out = {f"r{k}": 100.0 * np.mean(ranks <= k) for k in RECALLS}
    out["sumr"] = sum(out[f"r{k}"] for k in RECALLS)
    out.update(medr=float(np.median(ranks)), meanr=float(np.mean(ranks)), map=float(np.mean(1.0 / ranks)))
    return {k: float(v) for k, v in out.items()}


def chance_sumr(n_videos: int) -> float:
    """Expected SumR of a random ranking over ``n_videos`` (one ground truth per query)."""
    return sum(100.0 * min(k, n_videos) / n_videos for k in RECALLS)


@torch.no_grad()
def encode_split_videos(model: MSSL, split: PreparedSplit, idx: torch.Tensor) -> EncodedVideos:
    """Encode the preprocessed videos ``idx`` of a split (``MSSL.encode_videos`` minus preprocessing)."""
    return model.encode_video_inputs(split.clip_inputs[idx], *split.frames.gather(idx))


@torch.no_grad()
def score_split(model: MSSL, split: PreparedSplit, query_bsz: int = 500, video_bsz: int = 200) -> dict:
    """(Nq, Nv) total / clip / frame score matrices of a split, as float32 numpy arrays."""
    was_training = model.training
    model.eval()
    queries = cat_queries([model.encode_query_inputs(*(t.to(model.device) for t in split.queries.gather(c)))
                           for c in torch.arange(len(split.captions)).split(query_bsz)])  # CSA: with tokens
    out = {name: np.empty((len(queries), len(split.video_ids)), np.float32) for name in SCORES}
    for c in torch.arange(len(split.video_ids)).split(video_bsz):
        scores = model.score(queries, encode_split_videos(model, split, c))
        for name in SCORES:
            out[name][:, c.numpy()] = getattr(scores, name).float().cpu().numpy()
    model.train(was_training)
    return out


def evaluate_split(model: MSSL, split: PreparedSplit, **batch_sizes) -> dict:
    """Metrics of the total, clip and frame scores: {"total": {...}, "clip": {...}, "frame": {...}}."""
    scores = score_split(model, split, **batch_sizes)
    gt = split.cap_video.numpy()
    return {name: retrieval_metrics(scores[name], gt) for name in SCORES}


def format_table(results: dict) -> str:
    """A readable table: one row per score, R@1/5/10/100, SumR, median and mean rank."""
    columns = ("R@1", "R@5", "R@10", "R@100", "SumR", "MedR", "MeanR")
    lines = [f"{'score':8s}" + "".join(f"{c:>9s}" for c in columns)]
    for name, m in results.items():
        values = [m["r1"], m["r5"], m["r10"], m["r100"], m["sumr"], m["medr"], m["meanr"]]
        lines.append(f"{name:8s}" + "".join(f"{v:9.2f}" for v in values))
    return "\n".join(lines)
