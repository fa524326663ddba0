"""Real videos through the app's Predictor: the built-in index vs ``--index qdrant+local://DIR``; prints JSON.

    python -m benchmarks.qdrant_app [--videos DIR] [--clips N] [--demo-videos demo01] [--k 10]

Both predictors index the same real clips (every video file of ``--videos``, default ``../shared/videos``,
relative to the current directory or absolute; ``--clips N``: the N smallest) as the folder gallery
(``--gallery``) plus the chosen demo videos, each in its own temporary data directory; they answer the same
text queries, and must give the same top-k (ids in order, scores) and equal responses (ranks, scores, moments,
heatmaps, attention, confidence). The Qdrant one is then closed and started again on the same store, which
must hold the same gallery without extracting anything again. Exits 1 when any check fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import prvr  # noqa: F401  - applies the torchvision CPU fix before anything else
from extract.decode import VIDEO_SUFFIXES
from extract.pipeline import VideoExtractor
from prvr.serve.bootstrap import start
from prvr.serve.predictor import Predictor
from prvr.serve.settings import AppSettings

QUERIES = ("a person riding a bike", "a cat on a sofa", "a rocket launch", "people walking on a street",
           "a dog running", "a man talking to the camera", "a cartoon rabbit in a forest")


def top_k(predictor: Predictor, text: str, k: int) -> tuple[list[str], list[float], dict]:
    """(ids best first, their scores, the whole response without its timings and the results' server paths,
    which name each predictor's own data dir)."""
    response = predictor.search(text, k=k).to_dict()
    results = [{key: v for key, v in r.items() if key != "path"} for r in response["results"]]
    return ([r["video_id"] for r in results], [r["score"] for r in results],
            {**response, "results": results, "stats": None})


def counting_extractions() -> list[str]:
    """Count ``VideoExtractor.extract`` calls from now on (the paths extracted)."""
    calls: list[str] = []
    original = VideoExtractor.extract

    def extract(self, path, *args, **kw):
        calls.append(str(path))
        return original(self, path, *args, **kw)

    VideoExtractor.extract = extract
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "videos")
    parser.add_argument("--clips", type=int, default=0, help="the N smallest clips (0: all)")
    parser.add_argument("--demo-videos", default="demo01")
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    source = args.videos.expanduser().resolve()  # links in the work dir must not depend on the cwd
    if not source.is_dir():
        parser.error(f"--videos {args.videos} is not a directory")
    clips = sorted(p for p in source.iterdir() if p.is_file() and p.suffix.lower() in VIDEO_SUFFIXES)
    if args.clips:
        clips = sorted(clips, key=lambda p: p.stat().st_size)[:args.clips]
    if not clips:
        parser.error(f"--videos {args.videos}: no video files")
    work = Path(tempfile.mkdtemp(prefix="qdrant-app-"))
    predictors: list[Predictor] = []
    try:
        folder = work / "clips"
        folder.mkdir()
        for clip in clips:
            (folder / clip.name).symlink_to(clip)
        common = ["--gallery", str(folder), "--demo-videos", args.demo_videos]
        builtin_args = [*common, "--data-dir", str(work / "builtin")]
        # a data dir has one owner (prvr.serve.owner): the Qdrant predictor gets its own, with the rendered
        # demo videos and the model's caches copied over (nothing indexed)
        qdrant_args = [*common, "--data-dir", str(work / "qdrant-data"),
                       "--index", f"qdrant+local://{work / 'qdrant'}"]
        t0 = time.perf_counter()
        builtin = start(AppSettings.from_args(builtin_args))
        predictors.append(builtin)
        t1 = time.perf_counter()
        shutil.copytree(work / "builtin", work / "qdrant-data",
                        ignore=shutil.ignore_patterns("indexes", "media", "sessions", ".owner.lock"))
        qdrant = start(AppSettings.from_args(qdrant_args))
        predictors.append(qdrant)
        t2 = time.perf_counter()
        indexed_clips = [i for i in builtin.index.ids if i.startswith("folder:")]
        k = min(args.k, len(builtin.index))
        same_top_k = same_scores = equal = 0
        max_score_diff = 0.0
        for text in QUERIES:
            (ids_a, scores_a, a), (ids_b, scores_b, b) = top_k(builtin, text, k), top_k(qdrant, text, k)
            same_top_k += ids_a == ids_b
            same_scores += scores_a == scores_b
            if len(scores_a) == len(scores_b):
                diffs = [abs(x - y) for x, y in zip(scores_a, scores_b, strict=True)]
                max_score_diff = max([max_score_diff, *diffs])
            equal += a == b
        qdrant_ids = qdrant.index.ids
        qdrant.close()  # joins its background thread, releases the embedded store's lock
        predictors.remove(qdrant)
        extracted = counting_extractions()
        t3 = time.perf_counter()
        again = start(AppSettings.from_args(qdrant_args))
        predictors.append(again)
        t4 = time.perf_counter()
        reopened_equal = sum(top_k(again, text, k)[2] == top_k(builtin, text, k)[2] for text in QUERIES)
        report = {"clips_given": len(clips), "clips_indexed": len(indexed_clips),
                  "videos": len(builtin.index), "same_ids": builtin.index.ids == qdrant_ids, "k": k,
                  "queries": len(QUERIES), "same_top_k": same_top_k, "same_scores": same_scores,
                  "max_score_diff": max_score_diff, "equal_responses": equal,
                  "reopened_same_ids": again.index.ids == builtin.index.ids,
                  "reopened_equal_responses": reopened_equal, "reopened_extractions": len(extracted),
                  "start_s": {"builtin": round(t1 - t0, 1), "qdrant": round(t2 - t1, 1),
                              "qdrant_again": round(t4 - t3, 1)}}
        print(json.dumps(report))
        n = len(QUERIES)
        ok = (len(indexed_clips) == len(clips) and report["same_ids"]
              and same_top_k == same_scores == equal == n
              and report["reopened_same_ids"] and reopened_equal == n and not extracted)
        if not ok:
            print("FAILED: the two galleries differ, a clip was not indexed, or the reopened store "
                  "extracted again", file=sys.stderr)
        return 0 if ok else 1
    finally:
        for predictor in predictors:
            predictor.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
