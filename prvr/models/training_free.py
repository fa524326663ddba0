"""What the training-free models share: rows and queries mapped into one space, scored by MS-SL's branches.

A training-free model maps each raw feature row into a query space (``rows_to_space``) and each query's
raw token features to one vector (``query_vectors``). The rest is MS-SL's inference with identity
projections, through ``prvr.models.mssl``'s shared scoring functions: 32 clip units by the official binning,
all 528 windows, the max-cosine key clip, and key-clip-guided attention over the rows divided by a
temperature. ``prvr.models.bridge.BridgeModel`` (ImageNet classes -> MiniLM, ``lite``) and
``prvr.models.zero_shot.ZeroShotModel`` (a CLIP-family model, ``clip``) are the two subclasses.

A subclass's ``cfg`` has ``temperature``, ``clip_scale_w``, ``frame_scale_w``, ``map_size``, ``max_ctx_l``,
``propagation`` and ``propagation_beta``. With ``propagation`` on, ``encode_videos`` replaces every mapped
row by its TF-PRVR propagated segment feature (``prvr.temporal.propagation``, over
``prvr.temporal.segments.segment_video`` of the raw rows, computed here: deterministic) BEFORE the binning, so
both branches, ``score`` and an index built from ``encode_videos`` see the same rows. ``encode_rows``
(localisation's evidence) keeps each row's own vector, mapped by ``fine_rows_to_space`` (``rows_to_space``
unless a subclass maps them otherwise): propagated rows are constant inside a finest segment, so they cannot
say where inside a segment the query matches; ``prvr.results.moments`` propagates them itself where it chooses
among segments (measured in benchmarks/RESULTS.md, "Localisation and segment ranking").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from extract.pipeline import as_resolved
from extract.profiles import Profile
from prvr.models.branches import (
    EncodedVideos,
    Scores,
    attend_proposals,
    frame_attention,
    key_clip_attention,
    two_branch_scores,
    window_proposals,
)
from prvr.models.preprocess import check_rows, clip_input, frame_input, n_proposals, pad
from prvr.temporal.propagation import propagate_rows


class TrainingFreeModel:
    """MS-SL's inference protocol (docs/design.md, Contract 3) over rows and queries in one space."""

    cfg: object
    profile: dict | None

    # ---- how the model factory (prvr.models.factory) makes one: resolve the profile once, then build on it
    @classmethod
    def resolve(cls, profile: Profile, weights: Mapping[str, str]) -> Profile:
        """``profile`` resolved with the given weights of its backbones: what the model, its text encoder and
        its video extractor all read (a subclass may refuse weights or load them here)."""
        return as_resolved(profile, dict(weights) or None)

    @classmethod
    def build(cls, profile: Profile, cfg: object | None = None, device: str | torch.device | None = None,
              cache_dir: str | Path | None = None) -> TrainingFreeModel:
        """The model on a profile ``resolve`` returned (``cfg`` None: the default config; ``cache_dir``: where
        it may keep files derived from its weights)."""
        raise NotImplementedError

    # ---- what a subclass defines
    @property
    def device(self) -> torch.device:
        """Where the model's tensors live (inputs are moved here)."""
        raise NotImplementedError

    @property
    def dims(self) -> tuple[int, int]:
        """(visual row width, text token width) this model reads."""
        raise NotImplementedError

    def rows_to_space(self, rows: Tensor) -> Tensor:
        """Raw visual rows (n, Dv) on ``device`` -> (n, H) unit vectors in the query space."""
        raise NotImplementedError

    def fine_rows_to_space(self, rows: Tensor) -> Tensor:
        """Raw visual rows -> the unit vectors ``encode_rows`` gives localisation (``rows_to_space``)."""
        return self.rows_to_space(rows)

    def query_vectors(self, tokens_list: Sequence[np.ndarray | Tensor]) -> Tensor:
        """Raw per-query token rows (L_j, Dq) -> (Nq, H) unit query vectors."""
        raise NotImplementedError

    # ---- the protocol
    def _mapped(self, rows: np.ndarray | Tensor, what: str, propagate: bool = False,
                fine: bool = False) -> Tensor:
        """One video's rows, checked against ``dims``, in the query space (propagated if asked and on; by
        ``fine_rows_to_space`` if ``fine``)."""
        raw = check_rows(rows, what, self.dims[0])
        mapped = (self.fine_rows_to_space if fine else self.rows_to_space)(raw.to(self.device))
        if not (propagate and self.cfg.propagation):
            return mapped
        out = propagate_rows(raw.cpu().numpy(), mapped.float().cpu().numpy(), self.cfg.propagation_beta)
        return torch.from_numpy(out).to(mapped.device, mapped.dtype)

    @torch.no_grad()
    def encode_videos(self, frames_list: Sequence[np.ndarray | Tensor]) -> EncodedVideos:
        """Raw per-video rows (n_i, Dv) -> EncodedVideos in the query space (official binning inside)."""
        if len(frames_list) == 0:
            raise ValueError("encode_videos: got no videos")
        mapped = [self._mapped(rows, f"video {i}", propagate=True) for i, rows in enumerate(frames_list)]
        units = torch.stack([clip_input(x, self.cfg.map_size) for x in mapped])  # (Nv, M, H)
        frames, mask = pad([frame_input(x, self.cfg.max_ctx_l) for x in mapped])  # (Nv, L, H), (Nv, L)
        index = torch.arange(n_proposals(self.cfg.map_size), device=units.device).expand(len(units), -1)
        return EncodedVideos(units, window_proposals(units), index, frames, mask)

    @torch.no_grad()
    def encode_queries(self, tokens_list: Sequence[np.ndarray | Tensor]) -> Tensor:
        """Raw per-query token rows -> (Nq, H) query vectors on ``device``."""
        if len(tokens_list) == 0:
            raise ValueError("encode_queries: got no queries")
        return self.query_vectors(tokens_list).to(self.device)

    @torch.no_grad()
    def encode_rows(self, rows: np.ndarray | Tensor, start: np.ndarray,
                    end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One video's rows -> (vectors (n, H) float32 unit, start, end): every row, in the query space, as
        mapped (never propagated: the per-row evidence localisation reads)."""
        vectors = self._mapped(rows, "encode_rows", fine=True).float().cpu().numpy()
        start, end = np.asarray(start, dtype=np.float32), np.asarray(end, dtype=np.float32)
        if start.shape != (len(vectors),) or end.shape != (len(vectors),):
            raise ValueError(f"encode_rows: {len(vectors)} rows but start {start.shape} and end {end.shape}")
        return vectors, start, end

    def _attend(self, frames: Tensor, frame_mask: Tensor, key_clips: Tensor) -> tuple[Tensor, Tensor]:
        """Key-clip-guided attention with identity projections and this model's temperature."""
        return key_clip_attention(frames, frames, frame_mask, key_clips, self.cfg.temperature)

    def key_attention(self, frames: Sequence[np.ndarray], key_clips: np.ndarray) -> list[np.ndarray]:
        """``_attend``'s alpha alone (what results show) for one key clip per video (key_clips (V, H)) over
        its frames (L_i, H)."""
        return frame_attention(frames, np.asarray(key_clips, np.float32) / np.float32(self.cfg.temperature))

    @torch.no_grad()
    def attend(self, videos: EncodedVideos, proposal_idx: Tensor) -> tuple[Tensor, Tensor]:
        """Key-clip-guided attention for proposals (Nv, J) (indices into videos.proposals) -> z, alpha."""
        return attend_proposals(videos, proposal_idx, self._attend)

    @torch.no_grad()
    def score(self, queries: Tensor, videos: EncodedVideos) -> Scores:
        """MS-SL's inference scores for every (query, video) pair."""
        weights = (self.cfg.clip_scale_w, self.cfg.frame_scale_w)
        return two_branch_scores(queries.to(self.device), videos, self._attend, weights)
