"""Speed of the MS-SL core at the official TVR sizes (visual 3072, query 768, hidden 384), random weights.

Prints JSON: seconds (median of ``--repeats``) and throughput for video encoding, query encoding,
scoring a query x video block, one training step (forward + backward) on an official-sized batch, and
MS-SL++ k-medoids per video.

    python -m benchmarks.mssl_speed               # a few minutes on 2 CPU cores, seconds on a GPU
    python -m benchmarks.mssl_speed --repeats 5 --videos 200 --queries 500
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

import prvr  # noqa: F401  - applies the torchvision CPU fix first
from prvr.models.clustering import length_aware_kmedoids
from prvr.models.mssl import MSSL, MSSLConfig
from prvr.models.preprocess import clip_input, frame_input, pad, query_input

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _training_batch(cfg: MSSLConfig, n_videos: int, captions_per_video: int, g: torch.Generator) -> tuple:
    """A collated batch like the official loader's: videos of 40..200 rows, 5 captions each, on DEVICE."""
    raw = [torch.randn(int(n), cfg.visual_dim, generator=g)
           for n in torch.randint(40, 200, (n_videos,), generator=g)]
    clips = torch.stack([clip_input(x, cfg.map_size) for x in raw])
    frames, frame_mask = pad([frame_input(x, cfg.max_ctx_l) for x in raw])
    tokens = [torch.randn(int(n), cfg.query_dim, generator=g)
              for n in torch.randint(8, 40, (n_videos * captions_per_video,), generator=g)]
    queries, query_mask = pad([query_input(t, cfg.max_desc_l) for t in tokens])
    labels = torch.arange(n_videos).repeat_interleave(captions_per_video)
    return tuple(t.to(DEVICE) for t in (clips, frames, frame_mask, queries, query_mask, labels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=200, help="gallery size (official eval batch: 200)")
    parser.add_argument("--queries", type=int, default=500, help="queries scored against the gallery")
    parser.add_argument("--batch", type=int, default=32, help="videos per training batch (official: 128)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    cfg = MSSLConfig(visual_dim=3072, query_dim=768)
    model = MSSL(cfg).to(DEVICE).eval()
    videos = [torch.randn(int(n), cfg.visual_dim, generator=g)
              for n in torch.randint(20, 300, (args.videos,), generator=g)]
    tokens = [torch.randn(int(n), cfg.query_dim, generator=g)
              for n in torch.randint(8, 40, (args.queries,), generator=g)]
    encoded, queries = model.encode_videos(videos), model.encode_queries(tokens)

    result = {"device": DEVICE, "threads": torch.get_num_threads(), "videos": args.videos,
              "queries": args.queries}
    result["encode_videos_s"] = _median_seconds(lambda: model.encode_videos(videos), args.repeats)
    result["encode_queries_s"] = _median_seconds(lambda: model.encode_queries(tokens), args.repeats)
    result["score_s"] = _median_seconds(lambda: model.score(queries, encoded), args.repeats)
    result["videos_per_s"] = args.videos / result["encode_videos_s"]
    result["pairs_scored_per_s"] = args.videos * args.queries / result["score_s"]

    batch = _training_batch(cfg, args.batch, 5, g)
    model.train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model.loss(*batch, hard_negative_pool=cfg.hard_pool_size)["total"].backward()

    result["train_step_s"] = _median_seconds(step, args.repeats)
    result["train_batch"] = {"videos": args.batch, "queries": args.batch * 5}
    model.eval()
    result["kmedoids_per_video_s"] = _median_seconds(
        lambda: length_aware_kmedoids(encoded.proposals[:64], k=32), args.repeats) / min(64, args.videos)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
