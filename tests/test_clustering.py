"""MS-SL++ length-aware k-medoids: the length code, the medoid iteration and its batching."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import prvr  # noqa: F401  - applies the torchvision CPU fix first
from prvr.clustering import kmedoids, length_aware_kmedoids, length_embedding

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "mssl" / "msslpp_kmedoids.pt"


@pytest.fixture(scope="module")
def reference() -> dict:
    if not REFERENCE.is_file():
        pytest.skip(f"official MS-SL++ reference not found at {REFERENCE}")
    return torch.load(REFERENCE, weights_only=True)


def test_length_embedding_matches_official(reference):
    torch.testing.assert_close(length_embedding(32, 256), reference["length_embedding"], atol=1e-5, rtol=0)


def test_official_medoids_are_a_fixed_point(reference):
    """Started from the official medoids, our assign/update rounds must not move them.

    (Reproducing them from the KKZ seeds depends on BLAS rounding: the official routine breaks exact ties
    between symmetric windows with cdist's rounding noise, and gives different medoids on AVX2 and AVX512
    builds of the same library.)
    """
    points = torch.cat([reference["proposals"], reference["length_embedding"].expand(6, -1, -1)], dim=-1)
    assert torch.equal(kmedoids(points, 32, init=reference["medoids"]), reference["medoids"])
    ours = length_aware_kmedoids(reference["proposals"])
    assert ours.shape == (6, 32) and (ours.diff(dim=1) > 0).all()


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
    proposals = torch.randn(3, 36, 16)
    batched = length_aware_kmedoids(proposals, k=6)
    singles = torch.stack([length_aware_kmedoids(p, k=6) for p in proposals])
    assert torch.equal(batched, singles)
    assert batched.shape == (3, 6) and (batched.diff(dim=1) > 0).all()


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="cannot choose 40 medoids among 36"):
        length_aware_kmedoids(torch.randn(36, 4), k=40)
    with pytest.raises(ValueError, match="35 proposals is not M\\(M\\+1\\)/2"):
        length_aware_kmedoids(torch.randn(35, 4), k=3)
    with pytest.raises(ValueError, match="expected \\(P, H\\) or \\(B, P, H\\)"):
        length_aware_kmedoids(torch.randn(2, 2, 36, 4), k=3)
