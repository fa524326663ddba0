"""Restore time of the ``--persist`` folder (prvr.serve.persist) per 100 videos; prints JSON.

    python -m benchmarks.persist_restore [--videos 100] [--media-mb 1] [--threads 2] [--keep DIR]

Writes ``--videos`` synthetic shared videos (60-120 rows of 1280 floats, the lite profile's width; a media
file of ``--media-mb`` random MB each) into a fresh folder, then, as a start with an empty data dir does:
``restore()`` (read, verify by sha256, parse every entry; hash every media file) and adds the videos to a
new built-in index of the offline default model (``lite``) with the app's reference bank (the model
encodes every video's rows and its reference scores). Reports wall seconds for each part and per 100 videos
(and the add's CPU seconds: on a shared machine wall time includes waiting for a core), and the sha256
rate of the media check (what a bucket's read speed would bound).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import prvr  # noqa: F401  - applies the torchvision CPU fix before anything else
from extract.profiles import get_profile
from prvr.index import GalleryVideo, open_gallery
from prvr.models.factory import create_model
from prvr.results.confidence import Calibrator
from prvr.serve.persist import PersistentStore


def main() -> None:
    """Run the measurement and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int, default=100)
    parser.add_argument("--media-mb", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", type=Path, default=None, help="work here (default: a temporary dir)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = args.keep or Path(tempfile.mkdtemp(prefix="persist-bench-"))
    identity = get_profile("lite").identity()
    store = PersistentStore(work / "bucket", identity)
    rng = np.random.default_rng(0)
    rows = []
    t0 = time.perf_counter()
    for n in range(args.videos):
        r = int(rng.integers(60, 121))
        rows.append(r)
        media = work / "local" / f"{n}.mp4"
        media.parent.mkdir(parents=True, exist_ok=True)
        media.write_bytes(rng.bytes(int(args.media_mb * 2**20)))
        t = np.arange(r, dtype=np.float32)
        store.record_add(GalleryVideo(f"upload:{n:04d}", rng.random((r, 1280), dtype=np.float32), t, t + 1,
                                      float(r), f"video {n}", "", f"{n:064x}"), media)
    write_s = time.perf_counter() - t0

    loaded = create_model("lite")
    model = loaded.model
    calibrator = Calibrator.for_model(model, loaded.text_encoder(), cache_dir=work / "data" / "confidence")
    gallery = open_gallery(model, calibrator.reference_queries, data_dir=work / "data", profile="lite")
    fresh = PersistentStore(work / "bucket", identity)
    t0 = time.perf_counter()
    videos = fresh.restore()
    read_s = time.perf_counter() - t0
    quick = PersistentStore(work / "bucket", identity, verify_media=False)
    t0 = time.perf_counter()
    quick.restore()
    read_size_only_s = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    gallery.add(videos)
    add_s, add_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    per100 = 100 / args.videos
    media_mb = args.videos * args.media_mb
    print(json.dumps({
        "videos": len(videos), "rows_mean": float(np.mean(rows)), "media_mb_each": args.media_mb,
        "threads": args.threads, "write_s": round(write_s, 2),
        "restore_read_verify_s": round(read_s, 2), "restore_read_size_only_s": round(read_size_only_s, 2),
        "gallery_add_s": round(add_s, 2), "gallery_add_cpu_s": round(add_cpu_s, 2),
        "total_per_100_videos_s": round((read_s + add_s) * per100, 2),
        "media_hash_mb_per_s": round(media_mb / max(read_s - read_size_only_s, 1e-9), 1),
    }, indent=1))


if __name__ == "__main__":
    main()
