"""MS-SL++ length-aware k-medoids: the length code, the medoid iteration and its batching."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import prvr  # noqa: F401  - applies the torchvision CPU fix first
from prvr.models.clustering import kmedoids, length_aware_kmedoids, length_embedding

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "mssl" / "msslpp_kmedoids.pt"


@pytest.fixture(scope="module")
def reference() -> dict:
    if not REFERENCE.is_file():
        pytest.skip(f"official MS-SL++ reference not found at {REFERENCE}")
    return torch.load(REFERENCE, weights_only=True)


def test_length_embedding_matches_official(reference):
    torch.testing.assert_close(length_embedding(32, 256), reference["length_embedding"], atol=1e-5, rtol=0)


def _official_batch_kmedoids(X: torch.Tensor, K: int) -> torch.Tensor:
    """Literal transcription of ms-sl-pp ``method/fast_kmeans.py::batch_fast_kmedoids`` (d5dba80)."""
    B, N = X.shape[:2]
    dis = torch.cdist(X, X, p=2.0)
    dis = dis - torch.max(dis) - 1.0
    diag = torch.arange(N)
    dis[..., diag, diag] -= 1.0
    repeat_dis_m = dis.unsqueeze(1).repeat(1, K, 1, 1)
    batch_i = torch.arange(B).unsqueeze(1)
    mediods = torch.arange(K).unsqueeze(0).repeat(B, 1)
    _, mediods[:, 0] = torch.max(torch.norm(X, dim=-1), dim=1)
    for i in range(1, K):
        values, _ = torch.min(dis[batch_i, mediods[:, :i], :], dim=1)
        mediods[:, i] = torch.max(values, dim=1)[1]
    K_index = torch.arange(K).reshape(1, K, 1).repeat(B, 1, 1)
    for _ in range(60):
        pre_mediods = mediods
        _, cluster_assignment = torch.min(dis[batch_i, mediods, :], dim=1)
        mask = cluster_assignment.unsqueeze(1).repeat(1, K, 1) == K_index
        sub_matrix = repeat_dis_m * mask.unsqueeze(-1) * mask.unsqueeze(-2)
        mediods = torch.argmin(torch.sum(sub_matrix, dim=-1), dim=-1)
        center_shift = torch.sum((X[batch_i, mediods, :] - X[batch_i, pre_mediods, :]) ** 2, dim=-1)
        if center_shift.sqrt().sum(dim=-1).mean() < 1e-5:
            break
    return torch.sort(mediods, dim=1)[0]


def test_kmedoids_is_the_official_routine_bit_for_bit():
    """On points with many exact distance ties and duplicates (where any change of op or order shows),
    our chunk routine gives exactly the official one's medoids, whatever the chunk size."""
    g = torch.Generator().manual_seed(0)
    for trial in range(12):
        points = torch.randint(0, 3, (1 + trial % 4, 36, 5), generator=g).float()
        assert torch.equal(kmedoids(points, 6), _official_batch_kmedoids(points, 6)), trial
    smooth = torch.randn(3, 45, 12, generator=g)
    assert torch.equal(kmedoids(smooth, 9), _official_batch_kmedoids(smooth, 9))


def test_official_medoids_are_a_fixed_point(reference):
    """Started from the official medoids (the 6 videos as one chunk), the rounds must not move them."""
    points = torch.cat([reference["proposals"], reference["length_embedding"].expand(6, -1, -1)], dim=-1)
    assert torch.equal(kmedoids(points, 32, init=reference["medoids"]), reference["medoids"])
    ours = length_aware_kmedoids(reference["proposals"])
    assert ours.shape == (6, 32) and (ours.diff(dim=1) > 0).all()


def test_reference_medoid_overlap_does_not_regress(reference):
    """Medoids shared with the official ones, per video, at least what this routine gives on the dev machine.

    Identical medoids are out of reach: the official routine breaks the many exact ties between mirrored
    windows with cdist's matrix-product rounding, which depends on the BLAS build and CPU (the same
    library gives different medoids on its AVX2 and AVX512 paths), and the reference machine's is unknown.
    The floor is loose: the previous, non-official op order (KKZ on the raw distances, per-video shift,
    einsum update) moved 13 of these 192 medoids yet kept these counts; the bit-for-bit test is strict.
    """
    ours = length_aware_kmedoids(reference["proposals"])  # one chunk of 6, as the official model would
    shared = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(ours, reference["medoids"], strict=True)]
    assert all(s >= floor for s, floor in zip(shared, [21, 18, 18, 17, 13, 18], strict=True)), shared


def test_separated_clusters_are_recovered():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 8, generator=g) * 50
    points = (centres.repeat_interleave(10, dim=0) + torch.randn(40, 8, generator=g)).unsqueeze(0)
    medoids = kmedoids(points, 4)[0]
    assert sorted((medoids // 10).tolist()) == [0, 1, 2, 3]  # one medoid inside each blob
    for m in medoids.tolist():  # and it is the blob member closest to all the others
        blob = points[0, m // 10 * 10 : m // 10 * 10 + 10]
        assert torch.cdist(blob, blob).sum(1).argmin() == m % 10


def test_batching_and_single_video_agree():
    """Without near-ties the chunk's shared distance shift does not change any video's medoids."""
    proposals = torch.randn(3, 36, 16)
    batched = length_aware_kmedoids(proposals, k=6)
    singles = torch.stack([length_aware_kmedoids(p, k=6) for p in proposals])
    assert torch.equal(batched, singles)
    assert batched.shape == (3, 6) and (batched.diff(dim=1) > 0).all()


def test_a_videos_medoids_do_not_depend_on_its_batch():
    g = torch.Generator().manual_seed(1)
    proposals = torch.randint(0, 3, (70, 36, 4), generator=g).float()  # ties: a chunk-wide shift would matter
    points = torch.cat([proposals, length_embedding(8).expand(70, -1, -1)], dim=-1)
    alone = torch.cat([kmedoids(points[i:i + 1], 6) for i in range(70)])
    assert torch.equal(length_aware_kmedoids(proposals, k=6), alone)
    assert torch.equal(length_aware_kmedoids(proposals[5:9], k=6), alone[5:9])


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="cannot choose 40 medoids among 36"):
        length_aware_kmedoids(torch.randn(36, 4), k=40)
    with pytest.raises(ValueError, match="35 proposals is not M\\(M\\+1\\)/2"):
        length_aware_kmedoids(torch.randn(35, 4), k=3)
    with pytest.raises(ValueError, match="expected \\(P, H\\) or \\(B, P, H\\)"):
        length_aware_kmedoids(torch.randn(2, 2, 36, 4), k=3)
