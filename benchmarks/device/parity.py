"""On the GPU machine (benchmarks/device/run.sh): each profile's features of a shipped clip extracted on CUDA
against the same on the CPU, same weights (``clip`` in fp16 on CUDA, as served): cosine per window.

    python benchmarks/device/parity.py WORK_DIR     # prints one JSON line
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import extract  # noqa: F401  - the torchvision fix, before any backbone
from benchmarks.gpu_check import clip_folder, weights_for
from extract.pipeline import VideoExtractor

CLIP = Path(__file__).resolve().parents[2] / "assets" / "demo_clips" / "switchboard.mp4"


def parity(profile: str, clip_dir: Path, device: str = "cuda") -> dict:
    """One profile's rows on the CPU and on ``device``: their cosines and largest difference."""
    weights = weights_for(profile, clip_dir)
    cpu, other = (np.asarray(VideoExtractor(profile, weights, device=d).extract(CLIP).features, np.float64)
                  for d in ("cpu", device))
    cos = (cpu * other).sum(1) / np.linalg.norm(cpu, axis=1) / np.linalg.norm(other, axis=1)
    return {"windows": len(cpu), "cos_min": round(float(cos.min()), 6),
            "cos_mean": round(float(cos.mean()), 6), "max_abs": float(np.abs(cpu - other).max())}


if __name__ == "__main__":
    folder = clip_folder(Path(sys.argv[1]) / "clip-vit-b-32")
    print(json.dumps({profile: parity(profile, folder) for profile in ("lite", "clip", "paper")}))
