"""MS-SL++ length-aware k-medoids: pick k representative clip proposals per video.

Each proposal is extended with a fixed sinusoidal code of its window length, then clustered with
Euclidean k-medoids (KKZ initialisation, alternating assign / update), following the official
``method/fast_kmeans.py::batch_fast_kmedoids`` (HuiGuanLab/ms-sl-pp, d5dba80) op for op. The chosen medoid
indices replace the 528 proposals in both training and inference.

One deliberate difference: the official model clusters chunks of 64 videos together, and there the
distance shift and the stopping test are chunk-wide, so a video's medoids (through float32 ties) depend on
the videos that share its batch. Here every video is a chunk of its own: encoding a video never depends on
its batch (which exact search and a stable index need). On the official reference videos this gives the
same agreement with the official medoids as the chunk of six.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from prvr.models.preprocess import window_table

MAX_ROUNDS, TOLERANCE = 60, 1e-5  # official iteration limit and stopping threshold


@lru_cache(maxsize=8)
def _sinusoid(n_positions: int, dim: int) -> Tensor:
    """Standard transformer sinusoidal table (n_positions, dim): sin on even dims, cos on odd dims."""
    position = torch.arange(n_positions, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(n_positions, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)
    return table


def length_embedding(map_size: int = 32, dim: int = 256) -> Tensor:
    """(M(M+1)/2, dim): the sinusoidal code of each proposal's window length (position = length - 1)."""
    windows = window_table(map_size)
    return _sinusoid(map_size, dim)[windows[:, 1] - windows[:, 0] - 1].clone()


def _shifted_distances(points: Tensor) -> Tensor:
    """Official ``pairwise_distance(all_negative=True, self_nearest=True)``: chunk (B, N, D) -> (B, N, N).

    The shift uses the largest distance of the whole chunk, so a video's float32 distances (and the ties
    they break) depend on the videos clustered with it, as in the official code.
    """
    dis = torch.cdist(points, points)
    dis = dis - torch.max(dis) - 1.0
    diag = torch.arange(dis.shape[-1], device=dis.device)
    dis[..., diag, diag] -= 1.0  # a medoid is always nearest to itself, even when another point coincides
    return dis


def _kkz_init(points: Tensor, dis: Tensor, k: int) -> Tensor:
    """KKZ seeds (B, k) on the shifted distances: largest-norm point, then the one farthest from its seeds."""
    batch = torch.arange(len(points), device=points.device).unsqueeze(1)  # (B, 1)
    medoids = torch.arange(k, device=points.device).unsqueeze(0).repeat(len(points), 1)
    _, medoids[:, 0] = torch.max(torch.norm(points, dim=-1), dim=1)
    for i in range(1, k):
        values, _ = torch.min(dis[batch, medoids[:, :i], :], dim=1)  # (B, N) to the nearest seed so far
        medoids[:, i] = torch.max(values, dim=1)[1]
    return medoids


def _medoid_update(dis: Tensor, assign: Tensor, k: int) -> Tensor:
    """Each cluster's member with the least summed distance to its cluster (B, k), as the official update.

    The official code reduces ``dis.repeat(K) * mask[..., None] * mask[..., None, :]`` (B, K, N, N) over
    the last dim. Row i of cluster c there is ``dis[i] * 1 * same[i]`` (exactly ``dis * same[i]``, zeros
    included, so the row sum runs in the same order) when i is in c, and all zeros otherwise. So the member
    rows are summed once here on (B, N, N), K times less memory, with bit-identical sums and argmin.
    """
    same = assign[:, :, None] == assign[:, None, :]  # (B, N, N) i and j in one cluster
    row_sum = torch.sum(dis * same, dim=-1)  # (B, N) point i to the members of its own cluster
    member = assign[:, None, :] == torch.arange(k, device=dis.device)[None, :, None]  # (B, k, N)
    return torch.argmin(row_sum[:, None, :].masked_fill(~member, 0.0), dim=-1)


def kmedoids(points: Tensor, k: int, init: Tensor | None = None) -> Tensor:
    """Official ``batch_fast_kmedoids`` on one chunk of (B, N, D) points -> (B, k) medoids, sorted ascending.

    float32 throughout; ``init`` (B, k) replaces the KKZ seeds (a warm start). The medoids depend on the
    chunk: the distance shift is chunk-wide and the loop stops on the chunk-mean medoid shift. cdist's
    matrix-product rounding (it differs between BLAS builds and CPUs) breaks the many exact ties between
    mirrored windows, so medoids can differ across machines, as the official ones do.
    """
    B, N, _ = points.shape
    if not 1 <= k <= N:
        raise ValueError(f"kmedoids: cannot choose {k} medoids among {N} points")
    if init is not None and init.shape != (B, k):
        raise ValueError(f"kmedoids: init has shape {tuple(init.shape)}, expected {(B, k)}")
    points = points.float()
    dis = _shifted_distances(points)
    medoids = _kkz_init(points, dis, k) if init is None else init.to(points.device)
    batch = torch.arange(B, device=points.device).unsqueeze(1)
    for _ in range(MAX_ROUNDS):
        previous = medoids
        _, assign = torch.min(dis[batch, medoids, :], dim=1)  # (B, N) nearest medoid's slot
        medoids = _medoid_update(dis, assign, k)
        shift = torch.sum((points[batch, medoids, :] - points[batch, previous, :]) ** 2, dim=-1)
        if shift.sqrt().sum(dim=-1).mean() < TOLERANCE:
            break
    return torch.sort(medoids, dim=1)[0]


def length_aware_kmedoids(proposals: Tensor, k: int = 32, dropout: float = 0.0) -> Tensor:
    """Proposals (P, H) or (B, P, H) -> medoid indices (k,) or (B, k), clustered with their length code.

    ``dropout`` > 0 drops entries of the concatenated features first, as the official model does in training.
    Each video is clustered on its own (see the module docstring).
    """
    single = proposals.ndim == 2
    batch = proposals.unsqueeze(0) if single else proposals
    if batch.ndim != 3:
        raise ValueError(f"length_aware_kmedoids: expected (P, H) or (B, P, H), got {tuple(proposals.shape)}")
    map_size = (math.isqrt(8 * batch.shape[1] + 1) - 1) // 2
    if map_size * (map_size + 1) // 2 != batch.shape[1]:
        raise ValueError(f"length_aware_kmedoids: {batch.shape[1]} proposals is not M(M+1)/2 for any M")
    with torch.no_grad():
        code = length_embedding(map_size).to(batch)
        points = torch.cat([batch.detach(), code.expand(len(batch), -1, -1)], dim=-1)
        points = F.dropout(points, dropout, training=dropout > 0)
        medoids = torch.cat([kmedoids(video, k) for video in points.split(1)])
    return medoids[0] if single else medoids
