"""Approximate candidate selection: a faiss IVF index over a few keys per video.

Each video stores ``KEYS`` centres of the directions of its windows (``window_keys``; a segment written
before them: ``SCENES`` centres of its clip units, ``scene_centres``); a query's candidate videos are those
whose best key is among the nearest ``candidate_units`` keys. The candidates are then ranked exactly
(``prvr.index.rank``): the scores are exact, the set may miss a video (recall measured in benchmarks/scale.py
and benchmarks/search_speed.py).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from prvr.index.sketch import cover_balls
from prvr.plural import counted

log = logging.getLogger(__name__)

SCENES = 4  # per-video unit-cluster centres of a segment written before window keys (``scene_centres``)
KEY_BATCH = 64  # videos whose window sums (P, H) are held at once while their keys are made
KEYS = 8  # per-video window-direction centres that approximate search indexes with faiss (``window_keys``)


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
    keys 0.912 (4 unit keys: 0.874; 0.974 at 256).

    A window's sum lies in the span of the video's M units: the sums and their clustering are computed in
    coordinates of that span (M numbers a window, not H; the same cosines), then mapped back."""
    out = []
    for a in range(0, len(units), KEY_BATCH):  # a batch at a time bounds the memory
        x = np.array(units[a:a + KEY_BATCH], dtype=np.float64)  # (b, M, H)
        # the units' Gram matrix L L^T (a ridge of 1e-9 keeps repeated units apart): the units' coordinates
        # in an orthonormal basis of their span are the rows of L (a batched QR of H x M matrices costs
        # 1,000x more: the keys would be most of an add)
        gram = x @ x.transpose(0, 2, 1)
        ridge = 1e-9 * np.trace(gram, axis1=1, axis2=2)[:, None, None] / gram.shape[1] + 1e-300
        lower = torch.from_numpy(np.linalg.cholesky(gram + ridge * np.eye(gram.shape[1])))  # (b, M, M)
        cum = torch.cat([torch.zeros_like(lower[:, :1]), torch.cumsum(lower, dim=1)], dim=1)
        span = torch.from_numpy(np.array(spans[a:a + KEY_BATCH], dtype=np.int64))  # (b, P, 2)
        ends = torch.gather(cum, 1, span[..., 1:].expand(-1, -1, cum.shape[-1]))
        starts = torch.gather(cum, 1, span[..., :1].expand(-1, -1, cum.shape[-1]))
        sums = ends - starts  # (b, P, M): each window's sum of units
        dirs = (sums / sums.norm(dim=-1, keepdim=True).clamp(min=1e-12)).float()
        centres = cover_balls(dirs.numpy(), count).astype(np.float64)  # (b, count, M)
        # back to H: a centre c is (c L^-1) x (numpy's batched solve: torch's takes 100x longer here)
        mix = np.linalg.solve(lower.numpy().transpose(0, 2, 1), centres.transpose(0, 2, 1))  # (b, M, count)
        centres = mix.transpose(0, 2, 1) @ x  # (b, count, H)
        centres /= np.maximum(np.linalg.norm(centres, axis=-1, keepdims=True), 1e-12)
        out.append(centres.astype(np.float16))
    return np.concatenate(out) if out else np.zeros((0, count, units.shape[-1]), np.float16)


def build_ivf(keys: np.ndarray, videos: np.ndarray, nlist: int = 0):
    """faiss IVF index (inner product, 8-bit scalar-quantised lists) over keys (N, H), key i of the video at
    position videos[i] (a video may have any number of keys: segments of two key kinds can be mixed)."""
    import faiss

    vectors = np.ascontiguousarray(np.asarray(keys, dtype=np.float32))
    nlist = nlist or max(1, min(int(math.sqrt(len(vectors))), len(vectors) // 39))
    # 8-bit lists: a quarter of the bytes per probed list; candidates are re-scored exactly anyway
    ivf = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(vectors.shape[1]), vectors.shape[1], nlist,
                                        faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors[np.random.default_rng(0).permutation(len(vectors))[: 40 * nlist]])
    ivf.add_with_ids(vectors, np.ascontiguousarray(videos, dtype=np.int64))
    # a query searches alone: its probed lists split over the threads, not the queries (100,000 videos,
    # 64 of 894 lists: 4.7 -> 3.5 ms, the same candidates)
    ivf.parallel_mode = 1
    log.info("built the approximate-search index: %s in %s", counted(len(vectors), "key"),
             counted(nlist, "list"))
    return ivf


def candidates(ivf, q: np.ndarray, alive: np.ndarray, nprobe: int, units: int, videos: int) -> np.ndarray:
    """Sorted live positions of the ``videos`` videos whose best key is nearest to q, among the ``units``
    nearest keys that faiss finds visiting ``nprobe`` lists (at least ``KEYS`` x ``videos``: a video has at
    most ``KEYS`` keys, so that many keys name ``videos`` videos whenever the lists visited hold them)."""
    import faiss

    units = max(units, KEYS * videos)
    params = faiss.SearchParametersIVF(nprobe=nprobe)  # per call, not on the shared index (concurrency)
    qn = (q / max(float(np.linalg.norm(q)), 1e-12)).astype(np.float32)[None]
    sims, labels = ivf.search(qn, min(units, ivf.ntotal), params=params)
    found = labels[0] >= 0
    ids, sims = labels[0][found], sims[0][found]  # the keys' video positions
    keep = alive[ids]
    return best_videos(ids[keep], sims[keep], videos)


def best_videos(videos: np.ndarray, sims: np.ndarray, count: int) -> np.ndarray:
    """Sorted ids of the ``count`` videos whose best key scores highest, of found keys given best first as
    the ids of their videos and their scores (the built-in index's faiss lists and the engine's key graph)."""
    first = np.unique(videos, return_index=True)[1]  # found keys come best first: a video's best key
    best = first[np.argsort(-sims[first], kind="stable")][:count]
    return np.sort(videos[best])
