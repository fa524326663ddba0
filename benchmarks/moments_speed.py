"""Time the moments path on a 20-minute video: segments (indexing), moments (per returned video); JSON.

    python -m benchmarks.moments_speed [--rows 1200] [--repeats 200]

``segment_video`` runs on extracted ``lite`` rows (1280-d, once per video when it is indexed);
``find_moments`` on the model's rows in the query space (384-d for the training-free default, per returned
video and query), with its default propagation and without; ``propagate`` alone (the training-free model
runs it once per video in ``encode_videos``). Synthetic rows: scenes of random lengths plus noise (timing
does not depend on content beyond the number of segments, which is reported).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from prvr.results.moments import MomentConfig, find_moments
from prvr.temporal.propagation import propagate
from prvr.temporal.segments import segment_video


def percentiles_ms(fn, repeats: int) -> dict:
    """p10 / p50 / p90 milliseconds of ``fn()`` over ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {f"p{p}_ms": round(float(np.percentile(times, p)) * 1e3, 3) for p in (10, 50, 90)}


def main() -> None:
    """Print the timings as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1200, help="rows (1 s each in lite): 1,200 = 20 minutes")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    scene = np.repeat(np.arange(args.rows), rng.integers(5, 60, args.rows))[: args.rows]
    centres = 3 * rng.normal(size=(args.rows, 1280))
    raw = (rng.normal(size=(args.rows, 1280)) + centres[scene]).astype(np.float32)
    rows = rng.normal(size=(args.rows, 384)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    start = np.arange(args.rows, dtype=np.float32)
    segments = segment_video(raw)
    query = rows[args.rows // 2]
    unpropagated = MomentConfig(propagation_beta=None)
    print(json.dumps({
        "rows": args.rows, "segments": len(segments), "load_avg": os.getloadavg(),
        "segment_video_1280d": percentiles_ms(lambda: segment_video(raw), max(10, args.repeats // 10)),
        "propagate_384d": percentiles_ms(lambda: propagate(rows, segments, 0.7), max(10, args.repeats // 10)),
        "find_moments_384d": percentiles_ms(lambda: find_moments(query, rows, start, start + 1, segments),
                                            args.repeats),
        "find_moments_384d_unpropagated": percentiles_ms(
            lambda: find_moments(query, rows, start, start + 1, segments, unpropagated), args.repeats),
    }, indent=1))


if __name__ == "__main__":
    main()
