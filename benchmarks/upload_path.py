"""The upload path a user waits on, through the Predictor's public API: a real clip in, searchable out.

    python -m benchmarks.upload_path [--seconds 30 120] [--data-dir DIR] [--repeats 2]

For each length a clip of real footage is made (``benchmarks.long_clip``: the shipped demo clips and, where
present, ``../shared/videos``, looped; 640x360, 25 fps H.264, playable as it is) and uploaded with
``Predictor.add_video`` into the shared gallery of a predictor started with ``prvr.serve.bootstrap.start`` on
one demo video; the time runs from the call until a search (``Predictor.search``) lists the upload. Each
repeat uploads other bytes (the clip starts at another source), so none is a duplicate. Prints JSON: per
upload the seconds waited, the video's seconds and their ratio, and the machine's load (the numbers move
with it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import torch

import extract  # noqa: F401  - the torchvision fix, before any backbone
from benchmarks.long_clip import make_long_clip, real_clips


def main() -> None:
    """Start a predictor, upload each clip, print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, nargs="+", default=[30.0, 120.0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, help="default: a new temporary folder")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from prvr.serve.bootstrap import start
    from prvr.serve.settings import AppSettings

    work = Path(tempfile.mkdtemp(prefix="upload_path_"))
    sources = real_clips()
    clips = []
    for seconds in args.seconds:
        for r in range(args.repeats):
            order = sources[r:] + sources[:r]  # another first clip: other bytes
            clips.append((seconds, make_long_clip(work / f"upload {seconds:g}s {r}.mp4", seconds, order)))
    settings = AppSettings(data_dir=args.data_dir or work / "data", demo_videos="demo01", uploads="shared")
    t0 = time.perf_counter()
    predictor = start(settings)
    started = time.perf_counter() - t0
    rows, profile = [], predictor.describe()["profile"]["name"]
    try:
        for seconds, clip in clips:
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            outcome = predictor.add_video(clip, name=clip.name)
            added = time.perf_counter() - t0
            hits = predictor.search("a video", k=len(predictor.index)).results
            waited = time.perf_counter() - t0
            assert outcome["status"] == "added", outcome
            assert outcome["video_id"] in [h["video_id"] for h in hits]
            rows.append({"video_s": seconds, "added_s": round(added, 2), "searchable_s": round(waited, 2),
                         "video_s_per_s": round(seconds / waited, 2), "load_avg_1min": round(load, 2)})
    finally:
        predictor.close()
    print(json.dumps({"cpu_cores": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
                      "profile": profile, "start_s": round(started, 1),
                      "uploads": rows}, indent=2))


if __name__ == "__main__":
    main()
