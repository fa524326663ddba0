"""The building blocks of MS-SL's encoders, with the official parameter names: input projection,
trainable positional encoding, BERT-style self-attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LinearLayer(nn.Module):
    """Input projection: LayerNorm over the input dim -> Dropout -> Linear -> ReLU."""

    def __init__(self, in_dim: int, out_dim: int, dropout: float):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(in_dim)
        self.net = nn.Sequential(nn.Dropout(dropout), nn.Linear(in_dim, out_dim))

    def forward(self, x: Tensor) -> Tensor:  # (B, L, in_dim) -> (B, L, out_dim)
        return F.relu(self.net(self.LayerNorm(x)))


def project_valid(proj: LinearLayer, x: Tensor, mask: Tensor) -> Tensor:
    """proj over the valid rows of a zero-padded (B, L, D) batch only -> (B, L, H).

    Every padded row gets the projection of one zero row (in eval mode exactly what projecting the zero
    padding gives). Padded rows never reach a valid output (attention and pooling give them exactly zero
    weight), so valid rows are unchanged, while the largest matmul of a training step (and its backward)
    skips the padding. Only the dropout draws differ from projecting the padded batch (fewer rows).
    """
    B, L, D = x.shape
    idx = mask.reshape(-1).nonzero().squeeze(1)  # flat positions of the valid rows
    if len(idx) == B * L:
        return proj(x)
    valid = proj(x.reshape(B * L, D).index_select(0, idx))  # (n, H)
    padding = proj(x.new_zeros(1, D)).expand(B * L, -1)
    return padding.index_copy(0, idx, valid).view(B, L, -1)


class TrainablePositionalEncoding(nn.Module):
    """x + learned position embedding, then LayerNorm and Dropout."""

    def __init__(self, max_len: int, hidden: int, dropout: float):
        super().__init__()
        self.position_embeddings = nn.Embedding(max_len, hidden)
        self.LayerNorm = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:  # (B, L, H)
        positions = torch.arange(x.shape[1], device=x.device)
        return self.dropout(self.LayerNorm(x + self.position_embeddings(positions)))


class BertAttention(nn.Module):
    """One multi-head self-attention block with residual + LayerNorm and no feed-forward (as official)."""

    def __init__(self, hidden: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        # ModuleDicts reproduce the official names: self.{query,key,value}, output.{dense,LayerNorm}
        self.self = nn.ModuleDict({name: nn.Linear(hidden, hidden) for name in ("query", "key", "value")})
        self.output = nn.ModuleDict({"dense": nn.Linear(hidden, hidden), "LayerNorm": nn.LayerNorm(hidden)})

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x (B, L, H), mask (B, L) 1 = valid or None -> (B, L, H)."""
        B, L, H = x.shape
        q, k, v = (self.self[n](x).view(B, L, self.n_heads, -1).transpose(1, 2)  # (B, nh, L, hs)
                   for n in ("query", "key", "value"))
        logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, nh, L, L)
        if mask is not None:  # additive -10000, as BERT does; padded keys get ~0 weight
            logits = logits + (1.0 - mask[:, None, None, :]) * -10000.0
        probs = F.dropout(logits.softmax(dim=-1), self.dropout, self.training)
        context = (probs @ v).transpose(1, 2).reshape(B, L, H)
        out = F.dropout(self.output["dense"](context), self.dropout, self.training)
        return self.output["LayerNorm"](out + x)
