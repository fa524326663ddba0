"""Real videos through the app's Predictor: the built-in index vs ``--index qdrant+local://DIR``; prints JSON.

    python -m benchmarks.qdrant_app [--videos DIR] [--clips 4] [--demo-videos demo01,demo06]

Both predictors index the same demo videos and real clips (the first ``--clips`` files of ``--videos``,
default ``../shared/videos``) in one temporary data directory, answer the same text queries, and must give
equal responses (ranks, scores, moments, heatmaps, attention, confidence). The Qdrant one is then closed and
started again on the same store, which must hold the same gallery without indexing anything again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import prvr  # noqa: F401  - applies the torchvision CPU fix before anything else
from prvr.predictor import Predictor
from prvr.settings import AppSettings

QUERIES = ("a person riding a bike", "a cat on a sofa", "a rocket launch", "people walking on a street",
           "a dog running")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "videos")
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--demo-videos", default="demo01,demo06")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qdrant-app-"))
    try:
        folder = work / "clips"
        folder.mkdir()
        clips = sorted(p for p in args.videos.iterdir() if p.suffix in (".mp4", ".avi"))
        clips = sorted(clips, key=lambda p: p.stat().st_size)[:args.clips]  # the smallest: a quick run
        for clip in clips:
            (folder / clip.name).symlink_to(clip)
        common = ["--data-dir", str(work / "data"), "--gallery", str(folder),
                  "--demo-videos", args.demo_videos]
        qdrant_args = [*common, "--index", f"qdrant+local://{work / 'qdrant'}"]
        t0 = time.perf_counter()
        builtin = Predictor.from_settings(AppSettings.from_args(common))
        t1 = time.perf_counter()
        qdrant = Predictor.from_settings(AppSettings.from_args(qdrant_args))
        t2 = time.perf_counter()
        equal = []
        for text in QUERIES:
            a, b = builtin.search(text, k=5).to_dict(), qdrant.search(text, k=5).to_dict()
            equal.append({**a, "stats": 0} == {**b, "stats": 0})
        qdrant.index.close()
        again = Predictor.from_settings(AppSettings.from_args(qdrant_args))
        print(json.dumps({"videos": len(builtin.index), "same_ids": builtin.index.ids == qdrant.index.ids,
                          "queries": len(QUERIES), "equal_responses": sum(equal),
                          "reopened_same_ids": again.index.ids == builtin.index.ids,
                          "start_s": {"builtin": round(t1 - t0, 1), "qdrant": round(t2 - t1, 1)}}))
        again.index.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
