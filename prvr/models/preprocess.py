"""The official MS-SL preprocessing of raw feature rows, shared by the model and the data loader.

Clip input: the rows averaged into ``map_size`` bins (``average_to_fixed_length``), frame input: the rows
re-binned to at most ``max_ctx_l`` (``uniform_feature_sampling``), query input: token features cut to
``max_desc_l``; every row L2-normalised (norm + 1e-5). The binning keeps the official quirks on purpose
(official checkpoints were trained on them): edges are rounded half-to-even and clamped to ``n - 1`` with
end-exclusive slices, so the last row is normally never used, and an empty bin takes its single start row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

ArrayLike = np.ndarray | Tensor

NORM_EPS = 1e-5  # the official numpy helper adds this to every row norm (clips, frames and tokens)


def check_rows(x: ArrayLike, what: str, width: int | None = None) -> Tensor:
    """Check a raw (n, D) feature array (``what`` names it in errors), of D = ``width`` when given; return
    it as a float32 tensor."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    elif not isinstance(x, Tensor):
        raise TypeError(f"{what}: expected a numpy array or torch tensor, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{what}: expected a 2-D (rows, dim) array, got shape {tuple(x.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{what}: empty feature array of shape {tuple(x.shape)}")
    if width is not None and x.shape[1] != width:
        raise ValueError(f"{what}: features of shape {tuple(x.shape)}, expected (n, {width})")
    if not x.is_floating_point():
        raise ValueError(f"{what}: expected floating point features, got dtype {x.dtype}")
    if not torch.isfinite(x).all():
        bad = (~torch.isfinite(x)).any(dim=1).nonzero().flatten()
        raise ValueError(f"{what}: NaN or inf values in rows {bad[:10].tolist()} (of {x.shape[0]})")
    return x.float()


def _l2_normalize(x: Tensor) -> Tensor:
    """Divide each row by its L2 norm + NORM_EPS, as the official numpy helper does."""
    return x / (torch.linalg.vector_norm(x, dim=-1, keepdim=True) + NORM_EPS)


def _bin_edges(n_rows: int, n_bins: int, dtype: torch.dtype) -> Tensor:
    """The official bin edges round(i * n / M), i = 0..M, half-to-even, clamped to n - 1."""
    # dtype matters only for rounding ties: the clip binning runs in torch float32, frames in numpy float64
    edges = torch.arange(n_bins + 1, dtype=dtype) / n_bins * n_rows
    return torch.round(edges).long().clamp(max=n_rows - 1)


def clip_unit_rows(n_rows: int, map_size: int = 32, dtype: torch.dtype = torch.float32) -> Tensor:
    """For each of the ``map_size`` clip units, the [first_row, end_row) range of raw rows it averages."""
    if n_rows < 1:
        raise ValueError(f"clip_unit_rows: a video needs at least one row, got {n_rows}")
    edges = _bin_edges(n_rows, map_size, dtype)
    start, end = edges[:-1], edges[1:]
    end = torch.where(start < end, end, start + 1)  # an empty bin is its start row alone
    return torch.stack([start, end], dim=1)  # (M, 2)


def _rebin(x: Tensor, rows: Tensor) -> Tensor:
    """Mean of x over each [start, end) row range, as one (bins, n) averaging matrix product."""
    start, end = rows[:, 0:1].to(x.device), rows[:, 1:2].to(x.device)
    position = torch.arange(x.shape[0], device=x.device)
    weights = ((position >= start) & (position < end)).to(x.dtype) / (end - start).to(x.dtype)  # (bins, n)
    return weights @ x


def clip_input(frames: ArrayLike, map_size: int = 32) -> Tensor:
    """Raw rows (n, Dv) -> the clip branch input (map_size, Dv): binned means, L2-normalised."""
    x = check_rows(frames, "clip_input")
    return _l2_normalize(_rebin(x, clip_unit_rows(x.shape[0], map_size)))


def frame_input(frames: ArrayLike, max_len: int = 128) -> Tensor:
    """Raw rows (n, Dv) -> the frame branch input (min(n, max_len), Dv), L2-normalised."""
    x = check_rows(frames, "frame_input")
    if x.shape[0] > max_len:  # only longer videos are re-binned (the same quirky edges)
        x = _rebin(x, clip_unit_rows(x.shape[0], max_len, torch.float64))
    return _l2_normalize(x)


def query_input(tokens: ArrayLike, max_len: int = 30) -> Tensor:
    """Raw token features (L, Dq) -> the query input (min(L, max_len), Dq): normalised, then cut."""
    x = check_rows(tokens, "query_input")
    return _l2_normalize(x)[:max_len]


def pad(seqs: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Zero-pad (L_i, D) tensors to (B, Lmax, D) with a float32 mask (B, Lmax), 1 = valid."""
    if len(seqs) == 0:
        raise ValueError("pad: got an empty list of sequences")
    dims = {s.shape[1:] for s in seqs}
    if len(dims) != 1:
        raise ValueError(f"pad: sequences have different feature shapes {sorted(tuple(d) for d in dims)}")
    lengths = torch.tensor([s.shape[0] for s in seqs])
    padded = torch.nn.utils.rnn.pad_sequence(list(seqs), batch_first=True)
    mask = (torch.arange(padded.shape[1]) < lengths.unsqueeze(1)).float().to(padded.device)
    return padded, mask


def n_proposals(map_size: int = 32) -> int:
    """Number of contiguous windows over ``map_size`` clip units: M(M+1)/2 (528 for 32)."""
    return map_size * (map_size + 1) // 2


def proposal_index(k: int | Tensor, s: int | Tensor, map_size: int = 32) -> int | Tensor:
    """Index of the window of length k (1..M) starting at unit s (0-based): (M+1)(k-1) - k(k-1)/2 + s."""
    if isinstance(k, Tensor) or isinstance(s, Tensor):
        k, s = torch.as_tensor(k), torch.as_tensor(s)
        if ((k < 1) | (k > map_size) | (s < 0) | (s + k > map_size)).any():
            raise ValueError(f"proposal_index: window outside {map_size} units")
    elif not (1 <= k <= map_size and 0 <= s and s + k <= map_size):
        raise ValueError(f"proposal_index: window (length {k}, start {s}) outside {map_size} units")
    return (map_size + 1) * (k - 1) - k * (k - 1) // 2 + s


def window_table(map_size: int = 32) -> Tensor:
    """(P, 2) long: [start_unit, end_unit_exclusive) of every proposal, ordered by length then start."""
    return torch.tensor(
        [(s, s + k) for k in range(1, map_size + 1) for s in range(map_size - k + 1)], dtype=torch.long
    )


def proposal_units(idx: int | Tensor, map_size: int = 32) -> tuple[int, int] | tuple[Tensor, Tensor]:
    """(start_unit, end_unit_exclusive) of proposal ``idx`` (0..P-1); vectorised over tensors."""
    table = window_table(map_size)
    if isinstance(idx, Tensor):
        if ((idx < 0) | (idx >= len(table))).any():
            raise ValueError(f"proposal_units: indices must lie in [0, {len(table)})")
        units = table.to(idx.device)[idx]
        return units[..., 0], units[..., 1]
    if not 0 <= idx < len(table):
        raise ValueError(f"proposal_units: index {idx} outside [0, {len(table)})")
    start, end = table[idx].tolist()
    return start, end
