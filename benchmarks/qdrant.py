"""The Qdrant backend against the built-in exact index on the same videos: equality and latency; JSON.

    python -m benchmarks.qdrant [--videos 2000] [--mode exact] [--queries 30] [--index qdrant+local://DIR]

The gallery is ``benchmarks.search_speed``'s synthetic one (scene-model geometry, an MS-SL of hidden size
384), built into a built-in index, then moved into a Qdrant gallery with ``python -m prvr.index move``'s code
(the engine in-process by default; ``--index qdrant://HOST:PORT/NAME`` for a server), so both hold the same
stored videos. Reported: the share of queries whose top 10 (ids in order, totals to the last bit) and whole
``search`` responses are equal, how many videos each scored exactly, p50/p95 of ``rank`` and ``search`` for
both, recall@10 of Qdrant's ``approximate=True`` against exact, the move's seconds and the bytes per video
on disk. ``benchmarks.scale --backend qdrant`` measures the same at scale.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import prvr  # noqa: F401  - applies the torchvision CPU fix before anything else
from benchmarks.scale import disk_bytes
from benchmarks.search_speed import (
    SceneModel,
    build_index,
    identity_attention_model,
    latencies,
    make_queries,
    reference_bank,
)
from prvr.index import QdrantIndex, QdrantTarget
from prvr.index import move_gallery as move
from prvr.results.search import encode_query, search


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=2000)
    parser.add_argument("--mode", choices=("exact", "compact"), default="exact")
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--index", default=None, help="where the Qdrant gallery goes (default: the engine in "
                                                      "a temporary directory)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="qdrant-bench-"))
    try:
        model, sm = identity_attention_model(), SceneModel()
        t0 = time.perf_counter()
        builtin, concepts = build_index(work / "builtin", args.videos, args.mode, model, sm, seed=0)
        t1 = time.perf_counter()
        spec = args.index or f"qdrant+local://{work / 'qdrant'}"
        move(str(work / "builtin"), spec, report=lambda _: None)
        t2 = time.perf_counter()
        qdrant = QdrantIndex.open(spec, model, references=reference_bank(model))
        tokens = make_queries(sm, concepts, args.queries, torch.Generator().manual_seed(1))
        qs = [encode_query(model, t) for t in tokens]
        rank_b, ev_b = latencies(lambda q: builtin.rank(q, 10), qs)
        rank_q, ev_q = latencies(lambda q: qdrant.rank(q, 10), qs)
        approx_q, ev_a = latencies(lambda q: qdrant.rank(q, 10, approximate=True), qs)
        pairs = list(zip(ev_b, ev_q, strict=True))
        agree = np.mean([[h.id for h in a.hits] == [h.id for h in b.hits]
                         and a.totals.tolist() == b.totals.tolist() for a, b in pairs])
        recall = np.mean([len({h.id for h in a.hits} & {h.id for h in b.hits}) / len(b.hits)
                          for a, b in zip(ev_a, ev_q, strict=True)])
        tokens = tokens[:max(5, args.queries // 3)]
        search_b, res_b = latencies(lambda t: search([builtin], t, 10).to_dict(), tokens)
        search_q, res_q = latencies(lambda t: search([qdrant], t, 10).to_dict(), tokens)
        same_results = np.mean([{**a, "stats": 0} == {**b, "stats": 0}
                                for a, b in zip(res_b, res_q, strict=True)])
        out = {"videos": args.videos, "mode": args.mode, "queries": args.queries, "threads": args.threads,
               "qdrant": QdrantTarget.parse(spec).where,
               "equality": {"top10_ids_and_totals_equal": float(agree),
                            "search_dicts_equal": float(same_results)},
               "scored_exactly": {"builtin_mean": float(np.mean([e.scored_exactly for e in ev_b])),
                                  "qdrant_mean": float(np.mean([e.scored_exactly for e in ev_q]))},
               "rank": {"builtin": rank_b, "qdrant": rank_q, "qdrant_approximate": approx_q},
               "search": {"builtin": search_b, "qdrant": search_q},
               "approximate_recall_at_10": float(recall),
               "build_s": {"builtin": round(t1 - t0, 1), "move_to_qdrant": round(t2 - t1, 1)},
               "disk_bytes_per_video": {"builtin": disk_bytes(work / "builtin") // args.videos}}
        if args.index is None:
            out["disk_bytes_per_video"]["qdrant_engine"] = disk_bytes(work / "qdrant") // args.videos
        qdrant.close()
        print(json.dumps(out))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
