"""The Qdrant backend against the built-in exact index: equality and latency; prints JSON.

    python -m benchmarks.qdrant [--videos 1000] [--mode exact] [--queries 30] [--disk-videos 50]
                                [--index qdrant://HOST:PORT/COLLECTION]

The gallery is ``benchmarks.search_speed``'s synthetic one (scene-model geometry, an MS-SL of hidden size
384), built once into a built-in index; its stored arrays are copied into a Qdrant collection (embedded in
memory by default, or ``--index``: a server, or ``qdrant+local://DIR``), so both hold the same encoded
videos. Reported: top-10 id agreement and the largest score difference against the built-in index, how many
videos Qdrant's pages had scored exactly, p50/p95 of ``rank`` (query vector in) and of the whole ``search``
(token features in, Contract 4 dicts out) for both, recall@10 of ``approximate=True``, and bytes per video:
from the point layout, and measured as the size on disk of an embedded store of ``--disk-videos`` videos.
The embedded mode is qdrant-client's pure-Python brute force: its latencies say nothing about a server.
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
from benchmarks.search_speed import (
    SceneModel,
    build_index,
    identity_attention_model,
    latencies,
    make_queries,
    reference_bank,
)
from prvr.index import VideoIndex
from prvr.index.qdrant import QdrantConfig, QdrantIndex
from prvr.index.qdrant_store import ARRAYS, QdrantTarget, frame_balls
from prvr.index.schema import FIXED, RAGGED
from prvr.results.search import encode_query, search


def copy_into(qdrant: QdrantIndex, builtin: VideoIndex, positions: np.ndarray, batch: int = 200) -> None:
    """The built-in index's stored videos at ``positions`` -> the Qdrant collection (same arrays)."""
    snap = builtin.snapshot
    for a in range(0, len(positions), batch):
        part = positions[a:a + batch]
        fixed = {k: snap.gather(k, part) for k in FIXED}
        ragged = {k: [snap.ragged(k, p) for p in part] for k in RAGGED}
        qdrant.add_encoded([snap.videos[p] for p in part], fixed, ragged)


def layout_bytes(builtin: VideoIndex, position: int, builtin_balls: int = QdrantConfig.frame_balls) -> dict:
    """Bytes of one video's point: its two multivectors (float32) and payload arrays (raw and base64)."""
    snap = builtin.snapshot
    arrays = {k: snap.gather(k, np.array([position]))[0] for k in FIXED}
    arrays.update({k: snap.ragged(k, position) for k in RAGGED})
    raw = {k: int(np.asarray(arrays[k]).nbytes) for k in ARRAYS}
    windows = int(arrays["pnorm"].size * arrays["units"].shape[1] * 4)
    balls = int(frame_balls(arrays["zhat"][None], builtin_balls)[0].nbytes)
    encoded = sum(raw.values()) * 4 // 3
    return {"windows": windows, "frame_balls": balls, "payload_arrays_raw": raw, "payload_base64": encoded,
            "point": windows + balls + encoded}


def disk_bytes(root: Path) -> int:
    """Bytes of every file under root."""
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=1000)
    parser.add_argument("--mode", choices=("exact", "compact"), default="exact")
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--disk-videos", type=int, default=50,
                        help="videos in the on-disk size check (0: none)")
    parser.add_argument("--index", default="qdrant+local://:memory:", help="where the Qdrant collection goes")
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
        qdrant = QdrantIndex.create(args.index, model, QdrantConfig(mode=args.mode), reference_bank(model))
        copy_into(qdrant, builtin, builtin.snapshot.live)
        t2 = time.perf_counter()
        tokens = make_queries(sm, concepts, args.queries, torch.Generator().manual_seed(1))
        qs = [encode_query(model, t) for t in tokens]
        rank_b, ev_b = latencies(lambda q: builtin.rank(q, 10), qs)
        rank_q, ev_q = latencies(lambda q: qdrant.rank(q, 10), qs)
        _, ev_a = latencies(lambda q: qdrant.rank(q, 10, approximate=True), qs)
        pairs = list(zip(ev_b, ev_q, strict=True))
        agree = np.mean([[h.id for h in a.hits] == [h.id for h in b.hits] for a, b in pairs])
        diff = max(float(np.abs(a.totals - b.totals).max()) for a, b in pairs)
        recall = np.mean([len({h.id for h in a.hits} & {h.id for h in b.hits}) / len(b.hits)
                          for a, b in zip(ev_a, ev_b, strict=True)])
        tokens = tokens[:max(5, args.queries // 3)]
        search_b, res_b = latencies(lambda t: search([builtin], t, 10).to_dict(), tokens)
        search_q, res_q = latencies(lambda t: search([qdrant], t, 10).to_dict(), tokens)
        same_results = np.mean([{**a, "stats": 0} == {**b, "stats": 0}
                                for a, b in zip(res_b, res_q, strict=True)])
        out = {"videos": args.videos, "mode": args.mode, "queries": args.queries, "threads": args.threads,
               "qdrant": QdrantTarget.parse(args.index).where,
               "equality": {"top10_ids_agree": float(agree), "max_total_diff": diff,
                            "search_dicts_equal": float(same_results)},
               "scored_exactly": {"builtin_mean": float(np.mean([e.scored_exactly for e in ev_b])),
                                  "qdrant_mean": float(np.mean([e.scored_exactly for e in ev_q]))},
               "rank": {"builtin": rank_b, "qdrant": rank_q},
               "search": {"builtin": search_b, "qdrant": search_q},
               "approximate_recall_at_10": float(recall),
               "build_s": {"builtin": round(t1 - t0, 1), "qdrant_copy": round(t2 - t1, 1)},
               "bytes_per_video": {"layout": layout_bytes(builtin, int(builtin.snapshot.live[0])),
                                   "builtin_stored": builtin.stored_bytes() // len(builtin)}}
        qdrant.close()
        if args.disk_videos:
            store = work / "disk"
            disk = QdrantIndex.create(f"qdrant+local://{store}", model, QdrantConfig(mode=args.mode),
                                      reference_bank(model))
            copy_into(disk, builtin, builtin.snapshot.live[:args.disk_videos])
            disk.close()
            out["bytes_per_video"]["embedded_on_disk"] = disk_bytes(store) // args.disk_videos
        print(json.dumps(out))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
