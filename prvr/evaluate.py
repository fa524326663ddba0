"""Text-to-video retrieval evaluation, exactly as the official MS-SL ``eval.py`` computes it.

Each query has one ground-truth video; scores are negated and ``np.argsort``ed per query (numpy's default
sort, so ties break as in the official code), the rank is the 1-based position of the ground truth,
R@k = 100 * fraction of ranks <= k, SumR = R@1 + R@5 + R@10 + R@100 (unrounded), medr = median rank,
meanr = mean rank, map = mean(1 / rank).

CLI (prints a table, or JSON with ``--json``)::

    python -m prvr.evaluate --checkpoint CKPT --data ROOT --collection NAME --feature FEATURE --split test
    python -m prvr.evaluate --checkpoint CKPT --features V.h5 --captions C.h5 [--splits test=test.txt]
    python -m prvr.evaluate --gallery demo [--json]                  # the default model on the demo gallery
    python -m prvr.evaluate --videos DIR --moments FILE.json [--json]  # any annotated folder (prvr.annotated)

The last two evaluate the default (training-free) model, or ``--checkpoint``'s, with ``prvr.annotated``:
first-relevant-video R@1/5/10, SumR, and the localisation of the key moment, MS-SL's raw key clip and a
random window on that video (IoU >= 0.3/0.5/0.7, mean IoU, centre inside).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np
import torch

import prvr  # noqa: F401 - applies the torchvision CPU fix before anything imports torchvision
from prvr.annotated import first_relevant_ranks
from prvr.branches import EncodedVideos, cat_queries
from prvr.data import PreparedSplit, add_source_args, check_compatible, prepare_split, source_from_args
from prvr.model import MSSL

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


def evaluate_folder(videos: Path, moments: Path, checkpoint: str | None, device: str, as_json: bool) -> dict:
    """``--videos DIR --moments FILE``: the annotated folder's report (printed as JSON or a table)."""
    from prvr.annotated import evaluate_set, format_report, load_moments_file

    model = MSSL.from_checkpoint(checkpoint, map_location=device) if checkpoint else None
    report = {"videos_dir": str(videos), "moments": str(moments),
              **evaluate_set(load_moments_file(videos, moments), model)}
    print(json.dumps(report, indent=1) if as_json else format_report(report))
    return report


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point; returns the results dict."""
    parser = argparse.ArgumentParser(description="Evaluate an MS-SL checkpoint (official protocol).")
    parser.add_argument("--checkpoint", help="our checkpoint dir or an official model.ckpt")
    parser.add_argument("--gallery", choices=("demo",), help="instead: evaluate the embedded default model "
                        "on the generated demo gallery (same as python -m prvr.demo evaluate)")
    parser.add_argument("--videos", type=Path, help="instead: a folder of videos annotated by --moments")
    parser.add_argument("--moments", type=Path, help="the moments file of --videos (format: prvr.annotated)")
    add_source_args(parser)
    parser.add_argument("--split", default=None, help="split to evaluate (default: test; 'all' for "
                        "--features/--captions without --splits)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.gallery == "demo":
        from prvr import demo

        demo.main(["evaluate", *(["--json"] if args.json else [])])
        return {}
    if args.videos or args.moments:
        if not (args.videos and args.moments):
            parser.error("--videos and --moments go together")
        return evaluate_folder(args.videos, args.moments, args.checkpoint, args.device, args.json)
    if not args.checkpoint:
        parser.error("--checkpoint is required (or --gallery demo, or --videos DIR --moments FILE)")
    source = source_from_args(parser, args)
    split_name = args.split or ("all" if args.features and not args.splits else "test")
    model = MSSL.from_checkpoint(args.checkpoint, map_location=args.device)
    check_compatible(model.cfg.visual_dim, model.cfg.query_dim, model.profile, source,
                     f"checkpoint {args.checkpoint}")
    split = prepare_split(source, split_name, model.cfg.map_size, model.cfg.max_ctx_l, model.cfg.max_desc_l)
    results = evaluate_split(model, split)
    if args.json:
        print(json.dumps({"split": split_name, "videos": len(split.video_ids), "queries": len(split.captions),
                          "checkpoint": str(args.checkpoint), "metrics": results}, indent=1))
    else:
        print(f"{split_name}: {len(split.captions)} queries, {len(split.video_ids)} videos")
        print(format_table(results))
    return results


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main()
