"""Throughput of the predictor's search path (text in, Contract 4 dicts out) with 1 and with N concurrent
clients, in-process on the demo gallery; prints JSON.

    python -m benchmarks.concurrency [--data-dir DIR] [--demo-videos demo01,demo05] [--clients 4]
                                     [--seconds 20] [--threads 2]

Each client searches the demo captions in turn (k=10) for ``--seconds``; the report gives searches per
second for 1 client and for ``--clients`` clients, their ratio, and the p50 latency of each. The first start
renders, extracts and indexes the demo videos into the data dir (minutes); later starts reuse it.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

import prvr  # noqa: F401  - applies the torchvision CPU fix before anything else
from prvr.serve.bootstrap import start
from prvr.serve.predictor import Predictor
from prvr.serve.settings import AppSettings


def run_clients(predictor: Predictor, queries: list[str], clients: int, seconds: float) -> dict:
    """Searches per second and p50 / p95 latency with ``clients`` threads searching for ``seconds``."""
    stop = time.perf_counter() + seconds
    times: list[float] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        i = c
        while time.perf_counter() < stop:
            t = time.perf_counter()
            predictor.search(queries[i % len(queries)], k=10)
            with lock:
                times.append(time.perf_counter() - t)
            i += clients

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    elapsed = time.perf_counter() - t0
    ms = 1e3 * np.array(times)
    return {"clients": clients, "searches": len(times), "per_s": round(len(times) / elapsed, 2),
            "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p95_ms": round(float(np.percentile(ms, 95)), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=None, help="the app's data dir (default: its own)")
    parser.add_argument("--demo-videos", default=None, help="comma-separated demo video ids (default: all)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    flags = ["--uploads", "shared"] + (["--data-dir", str(args.data_dir)] if args.data_dir else [])
    flags += ["--demo-videos", args.demo_videos] if args.demo_videos else []
    predictor = start(AppSettings.from_args(flags))
    if predictor.tracing is not None:  # measure the text model as it serves once traced
        predictor.tracing.join()
    queries = predictor.example_queries() or ["a video"]
    for q in queries:  # warm-up: every query once
        predictor.search(q, k=10)
    one = run_clients(predictor, queries, 1, args.seconds)
    many = run_clients(predictor, queries, args.clients, args.seconds)
    report = {"videos": len(predictor.index), "threads": args.threads,
              "text_model": "traced" if predictor.text.backbone.traced is not None else "eager",
              "one": one, "many": many,
              "speedup": round(many["per_s"] / one["per_s"], 2)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
