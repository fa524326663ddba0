"""Query-bank statistics of rows: how similar each row is to ordinary queries, so that a row similar to every
caption is not taken as evidence for one of them.

Hubness is the standard failure of cross-modal nearest neighbours: some vectors are close to every query
(a row of a blank card, of a scene whose classifier output is vague), and a plain cosine makes them win
wherever they are. Query-bank normalisation (Bogolin et al., CVPR 2022; CSLS, Conneau et al. 2018, is the
same idea with a k-nearest mean) corrects a similarity by what the row scores against a fixed bank of
queries. Here the bank is ``prvr.results.confidence``'s reference captions (the index is handed their encoded
vectors) and the correction is a z-score per row:

    z_t = (cos(q, row_t) - mean_r cos(ref_r, row_t)) / std_r cos(ref_r, row_t)

``bank_stats`` computes (mean, std) of every row once, at indexing time (it depends on the video and the bank
only); ``bank_z`` applies it per query: two vector operations per row, no product with the bank.
"""

from __future__ import annotations

import numpy as np

STD_FLOOR = 1e-6  # a row whose cosine is the same with every reference caption (never met) divides by this


def bank_stats(rows: np.ndarray, bank: np.ndarray) -> np.ndarray:
    """(n, 2) float32 [mean, std] of each of the (n, H) rows' cosine with the (R, H) bank's vectors."""
    rows, bank = np.asarray(rows, np.float64), np.asarray(bank, np.float64)
    if rows.ndim != 2 or bank.ndim != 2 or rows.shape[1] != bank.shape[1] or len(bank) < 2:
        raise ValueError(f"bank_stats: rows {rows.shape} and bank {bank.shape}: expected (n, H) and "
                         "(R >= 2, H)")
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # noqa: E731
    cos = unit(rows) @ unit(bank).T  # (n, R)
    return np.stack([cos.mean(axis=1), cos.std(axis=1)], axis=1).astype(np.float32)


def bank_z(sim: np.ndarray, stats: np.ndarray) -> np.ndarray:
    """(n,) z-scores of the similarities (n,) by each row's bank statistics (n, 2) from ``bank_stats``."""
    stats = np.asarray(stats, np.float64)
    if stats.shape != (len(sim), 2):
        raise ValueError(f"bank_z: {len(sim)} similarities but statistics of shape {stats.shape}")
    return (np.asarray(sim, np.float64) - stats[:, 0]) / np.maximum(stats[:, 1], STD_FLOOR)
