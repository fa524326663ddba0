"""Random MS-SL models, galleries and queries for the index and Qdrant tests (deterministic per seed)."""

from __future__ import annotations

import numpy as np
import torch

from prvr.index import GalleryVideo
from prvr.models.mssl import MSSL, MSSLConfig

SMALL = dict(visual_dim=24, query_dim=16, hidden_size=32, n_heads=2, max_ctx_l=32)


def small_model(seed: int = 0, **kw) -> MSSL:
    """A random-init MS-SL with small dims (deterministic per seed)."""
    torch.manual_seed(seed)
    return MSSL(MSSLConfig(**{**SMALL, **kw})).eval()


def gallery(n: int, seed: int = 0, dim: int = 24, max_rows: int = 40) -> list[GalleryVideo]:
    """Random videos of 1..max_rows rows, one row per second."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        rows = int(rng.integers(1, max_rows + 1))
        t = np.arange(rows, dtype=np.float32)
        out.append(GalleryVideo(f"vid/{seed}-{i}", rng.standard_normal((rows, dim)).astype(np.float32),
                                t, t + 1, float(rows), title=f"video {i}"))
    return out


def queries(n: int, seed: int = 1, dim: int = 16) -> list[np.ndarray]:
    """Random token features of 1..35 tokens."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(1, 36)), dim)).astype(np.float32) for _ in range(n)]
