"""Time the embedded default end to end on a fresh data dir and print its evaluation; JSON out.

    python -m benchmarks.demo_eval [--root DIR]     # default: a new temporary directory

Measures rendering the demo gallery, extracting its ``lite`` features (videos + captions) and
``prvr.evaluate.demo.evaluate_demo`` (model load, indexing the videos and searching every caption: the path
users get), each as wall-clock and CPU seconds.
"""

import argparse
import json
import logging
import os
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import prvr  # noqa: F401  - applies the compatibility fix first
from prvr.demo import gallery as demo
from prvr.evaluate import demo as demo_set


def timed(fn: Callable[[], object]) -> tuple[object, dict]:
    """Run fn; return its result and {wall_s, cpu_s} (CPU of this process, all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu, wall = usage.ru_utime + usage.ru_stime, time.perf_counter()
    result = fn()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return result, {"wall_s": round(time.perf_counter() - wall, 2),
                    "cpu_s": round(usage.ru_utime + usage.ru_stime - cpu, 2)}


def main() -> None:
    """Render, extract and evaluate; print timings, machine load and metrics as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=None, help="data dir (default: a fresh temporary one)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    root = args.root or Path(tempfile.mkdtemp(prefix="prvr-demo-"))
    gallery, render = timed(lambda: demo.build_demo_gallery(root))
    _, extract = timed(lambda: demo_set.extract_demo_features(gallery))
    report, evaluate = timed(lambda: demo_set.evaluate_demo(root))
    print(json.dumps({"root": str(root), "cpus": len(os.sched_getaffinity(0)), "load_avg": os.getloadavg(),
                      "video_s": sum(v.duration for v in gallery.videos),
                      "render": render, "extract": extract, "evaluate": evaluate, **report}, indent=1))


if __name__ == "__main__":
    main()
