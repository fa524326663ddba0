"""ICE, IRM and TCP: training-only regularisers from "Enhanced PRVR through Inter- and Intra-Sample Analysis
with Coherence Prediction", plugged into MS-SL. Inference is unchanged; no public code exists, so this
follows the paper's description (see the MS-SL reference notes, section 9).

* ICE (inter correlation enhancement): a (clip unit, query) pair from different videos of the batch whose
  cosine is above a threshold and which are each other's nearest neighbour is a pseudo-positive; the pairs
  form an extra mini-batch trained with MS-SL's triplet + InfoNCE losses.
* IRM (intra redundancy mining): with v the attention-pooled frames of a query's video, m_k its key moment
  and q the query, r_v = FC(v - m_k) and r_q = FC(v - q) (one FC). They are extra negatives of the query at
  moment level (L_neg) and r_v is aligned with r_q by triplet + InfoNCE (L_red).
* TCP (temporal coherence prediction): each position of a sequence is labelled with its group among g equal
  consecutive groups; a fraction of the rows is shuffled, the original and the shuffled sequences are
  encoded with the branch's own encoder, and a classifier predicts every row's group (cross-entropy on both).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from prvr.models import losses


def pair_losses(a: Tensor, b: Tensor, margin: float, nce_weight: float, hard_pool: int | None) -> Tensor:
    """MS-SL's diagonal triplet (cosines) + weighted InfoNCE (raw dot products) for pairs a_i <-> b_i."""
    if len(a) < 2:  # a triplet needs one negative: nothing to learn from a single pair
        return a.new_zeros(())
    cos = F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).t()
    return losses.frame_triplet(cos, margin, hard_pool) + nce_weight * losses.frame_nce(a @ b.t())


# ----------------------------------------------------------------------------- ICE
@torch.no_grad()
def mutual_nearest_pairs(units: Tensor, queries: Tensor, labels: Tensor,
                         threshold: float) -> tuple[Tensor, Tensor, Tensor]:
    """Pseudo-positive (clip unit, query) pairs across videos -> (video index, unit index, query index).

    units (Nv, M, H) encoded clip units, queries (Nq, H), labels (Nq,) video of each query. A pair is kept
    when its cosine exceeds ``threshold`` and each is the other's argmax (same-video pairs count as -1).
    """
    Nv, M, _ = units.shape
    sim = F.normalize(units.reshape(Nv * M, -1), dim=-1) @ F.normalize(queries, dim=-1).t()  # (Nv*M, Nq)
    unit_video = torch.arange(Nv, device=units.device).repeat_interleave(M)
    sim = sim.masked_fill(unit_video[:, None] == labels[None, :], -1.0)
    best_unit = sim.argmax(dim=0)  # (Nq,) nearest unit of each query
    best_query = sim.argmax(dim=1)  # (Nv*M,) nearest query of each unit
    q = torch.arange(len(queries), device=units.device)
    keep = (best_query[best_unit] == q) & (sim[best_unit, q] > threshold)
    unit, query = best_unit[keep], q[keep]
    return unit // M, unit % M, query


def ice_loss(units: Tensor, queries: Tensor, labels: Tensor, threshold: float, margin: float,
             nce_weight: float, hard_pool: int | None) -> tuple[Tensor, int]:
    """L_ice on the mutual-nearest pseudo-positive pairs -> (loss, number of pairs)."""
    video, unit, query = mutual_nearest_pairs(units, queries, labels, threshold)
    return pair_losses(queries[query], units[video, unit], margin, nce_weight, hard_pool), len(query)


# ----------------------------------------------------------------------------- IRM
class RedundancyMiner(nn.Module):
    """IRM's parameters: attention pooling of frames into v, and the shared FC giving r_v and r_q."""

    def __init__(self, hidden: int):
        super().__init__()
        self.video_pool = nn.Linear(hidden, 1, bias=False)  # one logit per frame
        self.fc = nn.Linear(hidden, hidden)

    def pool(self, frames: Tensor, frame_mask: Tensor) -> Tensor:
        """Attention-pooled video feature v: frames (Nv, L, H), mask (Nv, L) -> (Nv, H)."""
        logits = self.video_pool(frames).squeeze(-1).masked_fill(frame_mask == 0, float("-inf"))
        return torch.einsum("vl,vlh->vh", logits.softmax(dim=-1), frames)

    def forward(self, frames: Tensor, frame_mask: Tensor, key_moments: Tensor, queries: Tensor,
                labels: Tensor) -> tuple[Tensor, Tensor]:
        """Per query: r_v = FC(v - m_k), r_q = FC(v - q), each (Nq, H); key_moments (Nq, H) in its video."""
        v = self.pool(frames, frame_mask)[labels]  # (Nq, H)
        return self.fc(v - key_moments), self.fc(v - queries)


def irm_loss(miner: RedundancyMiner, frames: Tensor, frame_mask: Tensor, queries: Tensor, labels: Tensor,
             key_moments: Tensor, clip_cos: Tensor, clip_raw: Tensor, margin: float, nce_weight: float,
             hard_pool: int | None) -> Tensor:
    """L_irm = L_neg + L_red.

    L_neg: the query's own r_v and r_q join its row of the moment-level (clip) scores as negatives: a hinge
    against its positive video's cosine score and a text->video InfoNCE over the raw scores of every video
    plus the two. L_red: r_v <-> r_q as positive pairs (``pair_losses``). clip_cos / clip_raw are (Nq, Nv).
    """
    r_v, r_q = miner(frames, frame_mask, key_moments, queries, labels)
    rows = torch.arange(len(queries), device=queries.device)
    q_unit = F.normalize(queries, dim=-1)
    extra_cos = torch.stack([(q_unit * F.normalize(r, dim=-1)).sum(-1) for r in (r_v, r_q)], dim=1)  # (Nq, 2)
    extra_raw = torch.stack([(queries * r).sum(-1) for r in (r_v, r_q)], dim=1)
    positive = clip_cos[rows, labels].unsqueeze(1)
    hinge = (margin + extra_cos - positive).clamp(min=0).mean()
    nce = F.cross_entropy(torch.cat([clip_raw, extra_raw], dim=1), labels)
    return hinge + nce_weight * nce + pair_losses(r_v, r_q, margin, nce_weight, hard_pool)


# ----------------------------------------------------------------------------- TCP
def group_labels(mask: Tensor, groups: int) -> Tensor:
    """(B, L) valid-mask -> (B, L) long: floor(position * groups / length), -100 (ignored) on padding."""
    lengths = mask.sum(dim=1, keepdim=True)
    pos = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
    labels = torch.div(pos * groups, lengths.clamp(min=1), rounding_mode="floor").long()
    return labels.masked_fill(mask == 0, -100)


def partial_shuffle(mask: Tensor, fraction: float, generator: torch.Generator | None = None) -> Tensor:
    """A (B, L) permutation per row that moves round(fraction * length) random valid rows, all of them.

    The chosen rows, in random order, are rotated by one place, so each moves (when at least 2 are chosen);
    every other position maps to itself. Apply as ``x.gather(1, perm)``.
    """
    B, L = mask.shape
    lengths = mask.sum(dim=1).long()
    k = torch.round(lengths * fraction).long()  # (B,)
    noise = torch.rand(B, L, generator=generator, device=mask.device)
    order = noise.masked_fill(mask == 0, 2.0).argsort(dim=1)  # random valid rows first, padding last
    j = torch.arange(L, device=mask.device).unsqueeze(0)
    step = torch.where(j < k.unsqueeze(1), (j + 1) % k.clamp(min=1).unsqueeze(1), j)  # rotate the first k
    return torch.empty_like(order).scatter_(1, order, order.gather(1, step))


def tcp_loss(head: nn.Module, encode: Callable[[Tensor], Tensor], inputs: Tensor, mask: Tensor,
             encoded: Tensor, groups: int, fraction: float) -> Tensor:
    """Cross-entropy of the group classifier on the encoded original and the encoded partly shuffled input.

    inputs (B, L, D) the branch's input rows, mask (B, L), encoded (B, L, H) = encode(inputs) from the main
    forward pass (reused, not recomputed); a shuffled row keeps the group label of where it came from.
    """
    labels = group_labels(mask, groups)
    perm = partial_shuffle(mask, fraction)
    shuffled = encode(inputs.gather(1, perm.unsqueeze(-1).expand_as(inputs)))
    original = F.cross_entropy(head(encoded).flatten(0, 1), labels.flatten(), ignore_index=-100)
    moved = F.cross_entropy(head(shuffled).flatten(0, 1), labels.gather(1, perm).flatten(), ignore_index=-100)
    return original + moved


class CoherenceHeads(nn.Module):
    """TCP's group classifiers, one per branch (frames and clip units)."""

    def __init__(self, hidden: int, groups: int = 8):
        super().__init__()
        if groups < 2:
            raise ValueError(f"TCP needs at least 2 groups, got {groups}")
        self.groups = groups
        self.frame = nn.Linear(hidden, groups)
        self.clip = nn.Linear(hidden, groups)
