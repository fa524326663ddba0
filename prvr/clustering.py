"""MS-SL++ length-aware k-medoids: pick k representative clip proposals per video.

Each proposal is extended with a fixed sinusoidal code of its window length, then clustered with
Euclidean k-medoids (KKZ initialisation, alternating assign / update), batched over videos. The chosen
medoid indices replace the 528 proposals in both training and inference.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from prvr.preprocess import window_table

MAX_ROUNDS, TOLERANCE = 60, 1e-5  # official iteration limit and stopping threshold
_VIDEOS_PER_CHUNK = 64  # bounds the (B, N, N) distance matrices, as the official code does


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


def _kkz_init(points: Tensor, dist: Tensor, k: int) -> Tensor:
    """KKZ seeds (B, k): the largest-norm point, then repeatedly the point farthest from its nearest seed."""
    batch = torch.arange(len(points), device=points.device)
    seeds = [points.norm(dim=-1).argmax(dim=-1)]  # (B,)
    nearest = dist[batch, seeds[0]]  # (B, N) distance to the nearest seed so far
    for _ in range(k - 1):
        seeds.append(nearest.argmax(dim=-1))
        nearest = torch.minimum(nearest, dist[batch, seeds[-1]])
    return torch.stack(seeds, dim=1)


def kmedoids(points: Tensor, k: int, init: Tensor | None = None) -> Tensor:
    """Euclidean k-medoids over (B, N, D) points -> (B, k) medoid indices, sorted ascending.

    ``init`` (B, k) replaces the KKZ seeds (a warm start). As in the official code the distances come from
    ``torch.cdist``'s matrix-product path, whose rounding (it differs between BLAS builds and CPUs) breaks
    the many exact ties between symmetric windows; so medoids can differ across machines, as the official
    ones do.
    """
    B, N, _ = points.shape
    if not 1 <= k <= N:
        raise ValueError(f"kmedoids: cannot choose {k} medoids among {N} points")
    if init is not None and init.shape != (B, k):
        raise ValueError(f"kmedoids: init has shape {tuple(init.shape)}, expected {(B, k)}")
    dist = torch.cdist(points, points)  # (B, N, N)
    medoids = _kkz_init(points, dist, k) if init is None else init.to(points.device)
    # all-negative distances with a lowered diagonal: a medoid is always assigned to its own cluster,
    # even when another point coincides with it
    shifted = dist - dist.amax(dim=(1, 2), keepdim=True) - 1.0
    shifted = shifted - torch.eye(N, device=points.device)
    clusters = torch.arange(k, device=points.device)[None, :, None]
    for _ in range(MAX_ROUNDS):
        assign = shifted.gather(1, medoids[..., None].expand(-1, -1, N)).argmin(dim=1)  # (B, N)
        member = assign[:, None, :] == clusters  # (B, k, N)
        # summed distance from each point to the members of each cluster, only members are candidates
        cost = torch.einsum("bkj,bij->bki", member.to(shifted.dtype), shifted).masked_fill(~member, math.inf)
        updated = cost.argmin(dim=-1)  # (B, k)
        moved = (updated - medoids).abs().sum(dim=1).float().mean()
        medoids = updated
        if moved < TOLERANCE:
            break
    return medoids.sort(dim=-1).values


def length_aware_kmedoids(proposals: Tensor, k: int = 32, dropout: float = 0.0) -> Tensor:
    """Proposals (P, H) or (B, P, H) -> medoid indices (k,) or (B, k), clustered with their length code.

    ``dropout`` > 0 drops entries of the concatenated features first, as the official model does in training.
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
        medoids = torch.cat([kmedoids(chunk, k) for chunk in points.split(_VIDEOS_PER_CHUNK)])
    return medoids[0] if single else medoids
