"""Approximate candidate selection: a faiss IVF index over a few scene centres per video.

Each video stores ``SCENES`` centres of its clip-unit directions (``scene_centres``); a query's candidate
videos are those whose best centre is among the nearest ``candidate_units`` centres. The candidates are then
ranked exactly (``prvr.index.rank``): the scores are exact, the set may miss a video (recall measured in
benchmarks/search_speed.py).
"""

from __future__ import annotations

import logging
import math

import numpy as np

from prvr.index.sketch import cover_balls
from prvr.plural import counted

log = logging.getLogger(__name__)

SCENES = 4  # per-video unit-cluster centres that approximate search indexes with faiss


def scene_centres(units: np.ndarray, count: int = SCENES) -> np.ndarray:
    """(n, count, H) float16 unit-norm centres of the directions of each video's clip units (n, M, H)."""
    unit_dirs = units / np.maximum(np.linalg.norm(units, axis=-1, keepdims=True), 1e-12)
    scenes = cover_balls(unit_dirs, count)
    scenes /= np.maximum(np.linalg.norm(scenes, axis=-1, keepdims=True), 1e-12)
    return scenes.astype(np.float16)


def window_keys(units: np.ndarray, spans: np.ndarray, count: int) -> np.ndarray:
    """(n, count, H) float16 unit-norm centres of the directions of each video's stored windows: units
    (n, M, H), spans (n, P, 2) [start, end) units of each stored window. A clip score is a window's cosine,
    so these keys follow it closer than the units' (``scene_centres``): at 2,000 synthetic videos
    (``benchmarks.scale``) the best 64 videos by 8 window keys hold 0.998 of the exact top 10, by 8 unit
    keys 0.912 (4 unit keys: 0.874; 0.974 at 256)."""
    x = np.asarray(units, np.float32)
    cum = np.concatenate([np.zeros_like(x[:, :1]), np.cumsum(x, axis=1)], axis=1)  # (n, M + 1, H)
    rows = np.arange(len(x))[:, None]
    sums = cum[rows, spans[..., 1]] - cum[rows, spans[..., 0]]  # (n, P, H): each window's sum of units
    return scene_centres(sums, count)


def build_ivf(scenes: np.ndarray, nlist: int = 0):
    """faiss IVF index (inner product, 8-bit scalar-quantised lists) over scene centres (n, SCENES, H)."""
    import faiss

    vectors = np.ascontiguousarray(np.asarray(scenes, dtype=np.float32).reshape(-1, scenes.shape[-1]))
    nlist = nlist or max(1, min(int(math.sqrt(len(vectors))), len(vectors) // 39))
    # 8-bit lists: a quarter of the bytes per probed list; candidates are re-scored exactly anyway
    ivf = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(vectors.shape[1]), vectors.shape[1], nlist,
                                        faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors[np.random.default_rng(0).permutation(len(vectors))[: 40 * nlist]])
    ivf.add(vectors)
    log.info("built the approximate-search index: %s in %s", counted(len(vectors), "scene vector"),
             counted(nlist, "list"))
    return ivf


def candidates(ivf, q: np.ndarray, alive: np.ndarray, nprobe: int, units: int, videos: int) -> np.ndarray:
    """Sorted live positions of the ``videos`` videos whose best scene centre is nearest to q, among the
    ``units`` nearest centres that faiss finds visiting ``nprobe`` lists."""
    import faiss

    params = faiss.SearchParametersIVF(nprobe=nprobe)  # per call, not on the shared index (concurrency)
    qn = (q / max(float(np.linalg.norm(q)), 1e-12)).astype(np.float32)[None]
    sims, labels = ivf.search(qn, min(units, ivf.ntotal), params=params)
    found = labels[0] >= 0
    ids, sims = labels[0][found] // SCENES, sims[0][found]
    keep = alive[ids]
    ids, sims = ids[keep], sims[keep]
    first = np.unique(ids, return_index=True)[1]  # results come best first: a video's best centre
    best = first[np.argsort(-sims[first], kind="stable")][:videos]
    return np.sort(ids[best])
