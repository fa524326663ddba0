"""MS-SL (ACM MM 2022) and its MS-SL++ variant: a clip-scale and a frame-scale branch over video features.

Read top to bottom: ``MSSLConfig``, then ``MSSL``: encoders (built from ``prvr.models.layers``), inference on
raw features through the shared branch functions (``prvr.models.branches``, also used by the training-free
models), the training loss, checkpoints. Parameter names are the official ones, so official checkpoints load
with ``strict=True``; every numeric quirk of the official code is kept (see docs/design.md and the MS-SL
reference notes).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Self

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from prvr.models import losses, ral, regularizers
from prvr.models.branches import (
    EncodedQueries,
    EncodedVideos,
    Scores,
    attend_proposals,
    branch_scores,
    cat_queries,
    chunks,
    clip_scale,
    clip_scale_with_raw,
    frame_attention,
    key_clip_attention,
    two_branch_scores,
    window_proposals,
)
from prvr.models.clustering import length_aware_kmedoids
from prvr.models.layers import BertAttention, LinearLayer, TrainablePositionalEncoding, project_valid
from prvr.models.preprocess import (
    ArrayLike,
    check_rows,
    clip_input,
    clip_unit_rows,
    frame_input,
    pad,
    query_input,
)

log = logging.getLogger(__name__)

EXTENSIONS = {  # the seed papers' options, each switched by one MSSLConfig field (train.py: --<name>)
    "csa": "RAL's CSA: word-confidence set-to-set frame score (also used at inference)",
    "msra": "RAL's MSRA: Gaussian support-set alignment losses (training only)",
    "ice": "ICE: cross-video mutual-nearest (clip unit, query) pseudo-positives (training only)",
    "irm": "IRM: redundancy features as extra negatives (training only)",
    "tcp": "TCP: temporal coherence prediction on both branches (training only)",
}


# ----------------------------------------------------------------------------- config and outputs
class DictConfig:
    """``to_dict`` / ``from_dict`` of a model's config dataclass (stored with checkpoints and indexes)."""

    def to_dict(self) -> dict:
        """A JSON-able dict that ``from_dict`` turns back into an equal config."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> Self:
        """Build from ``to_dict`` output; unknown keys are an error (they mean another code version)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields {unknown}; known: {sorted(names)}")
        return cls(**d)


@dataclass
class MSSLConfig(DictConfig):
    visual_dim: int  # width of a raw video feature row (official visual_input_size)
    query_dim: int  # width of a raw token feature (official query_input_size)
    hidden_size: int = 384  # width of every encoded vector
    max_ctx_l: int = 128  # frames kept per video (longer videos are re-binned)
    max_desc_l: int = 30  # tokens kept per query
    map_size: int = 32  # clip units per video; proposals are all M(M+1)/2 = 528 windows over them
    input_drop: float = 0.1  # dropout in input projections and positional encodings
    drop: float = 0.1  # dropout in the attention blocks
    n_heads: int = 4  # attention heads per block
    initializer_range: float = 0.02  # std of the normal init of Linear and Embedding weights
    margin: float = 0.2  # triplet margin (official TVR runs use 0.1)
    hard_pool_size: int = 20  # hard negatives are drawn among this many hardest (from epoch 20 on)
    clip_scale_w: float = 0.7  # weight of the clip-scale score in the total (Charades: 0.5)
    frame_scale_w: float = 0.3  # weight of the frame-scale score in the total (Charades: 0.5)
    clusters: int = 0  # MS-SL++: 0 = off, else k-medoids over the proposals, in training and inference
    # seed-paper extensions (prvr/models/ral.py, regularizers.py). Off = the official MS-SL; each one adds
    # parameters only when on, so default checkpoints keep the official 54 tensors
    csa: bool = False  # RAL: frame score = word-confidence set-to-set score (replaces key-clip attention)
    msra: bool = False  # RAL: Gaussian support-set alignment losses (training only)
    msra_samples: int = 6  # MSRA: Gaussian samples per modality (released: 6)
    msra_mil_w: float = 4e-3  # MSRA multi-instance InfoNCE weight (released code and README: 0.004)
    msra_kl_w: float = 2.5e-4  # MSRA KL weight (released code; its README says 1e-3)
    ice: bool = False  # ICE: mutual-nearest cross-video (clip unit, query) pseudo-positives (training only)
    ice_threshold: float = 0.4  # ICE: minimum cosine of a pseudo-positive pair (paper: 0.4)
    ice_w: float = 1.0  # ICE loss weight (the paper gives none)
    irm: bool = False  # IRM: redundancy features as extra negatives + their alignment (training only)
    irm_w: float = 1.0  # IRM loss weight (the paper gives none)
    tcp: bool = False  # TCP: predict each frame's / clip unit's temporal group, partly shuffled (training)
    tcp_groups: int = 8  # TCP: consecutive groups (paper: 8 best)
    tcp_shuffle: float = 0.25  # TCP: fraction of rows shuffled (paper: 25%)
    tcp_w: float = 0.1  # TCP loss weight (the paper gives none; 4 cross-entropies start near 8.3)

    def __post_init__(self) -> None:
        """Refuse settings the architecture cannot run with, naming the field."""
        sizes = ("visual_dim", "query_dim", "hidden_size", "max_ctx_l", "max_desc_l", "map_size", "n_heads")
        for name in sizes:
            if getattr(self, name) < 1:
                raise ValueError(f"MSSLConfig.{name} must be positive, got {getattr(self, name)}")
        if self.map_size > self.max_ctx_l:  # clip units take the first map_size clip position embeddings
            raise ValueError(f"MSSLConfig.map_size {self.map_size} exceeds max_ctx_l {self.max_ctx_l}")
        if self.hidden_size % self.n_heads:
            raise ValueError(f"MSSLConfig.hidden_size {self.hidden_size} is not divisible by "
                             f"n_heads {self.n_heads}")
        if not 0 <= self.clusters <= self.map_size * (self.map_size + 1) // 2:
            raise ValueError(f"MSSLConfig.clusters {self.clusters} outside [0, {self.map_size} * "
                             f"{self.map_size + 1} / 2]")

    @classmethod
    def from_official(cls, official_cfg: Mapping) -> MSSLConfig:
        """Map an official ``model_cfg`` / ``opt.json`` (visual_input_size, query_input_size, ...) to ours."""
        missing = [k for k in ("visual_input_size", "query_input_size") if k not in official_cfg]
        if missing:
            raise ValueError(f"official config lacks {missing}; has {sorted(official_cfg)}")
        shared = {f.name for f in dataclasses.fields(cls)} & set(official_cfg)
        kwargs = {k: official_cfg[k] for k in shared}
        if official_cfg.get("cluster"):  # MS-SL++ flags: --cluster --cluster_num K
            kwargs["clusters"] = int(official_cfg.get("cluster_num", 32))
        return cls(visual_dim=int(official_cfg["visual_input_size"]),
                   query_dim=int(official_cfg["query_input_size"]), **kwargs)


# ----------------------------------------------------------------------------- the model
class MSSL(nn.Module):
    def __init__(self, cfg: MSSLConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.profile: dict | None = None  # feature-profile identity of the training data, None if unknown
        self.checkpoint_meta: dict = {}  # what load_checkpoint read: train options, profile, metrics, epoch
        self.query_pos_embed = TrainablePositionalEncoding(cfg.max_desc_l, H, cfg.input_drop)
        self.clip_pos_embed = TrainablePositionalEncoding(cfg.max_ctx_l, H, cfg.input_drop)
        self.frame_pos_embed = TrainablePositionalEncoding(cfg.max_ctx_l, H, cfg.input_drop)
        self.query_input_proj = LinearLayer(cfg.query_dim, H, cfg.input_drop)
        self.query_encoder = BertAttention(H, cfg.n_heads, cfg.drop)
        self.clip_input_proj = LinearLayer(cfg.visual_dim, H, cfg.input_drop)
        self.clip_encoder = BertAttention(H, cfg.n_heads, cfg.drop)
        self.frame_input_proj = LinearLayer(cfg.visual_dim, H, cfg.input_drop)
        self.frame_encoder = BertAttention(H, cfg.n_heads, cfg.drop)
        self.modular_vector_mapping = nn.Linear(H, 1, bias=False)  # token logits for query pooling
        self.mapping_linear = nn.ModuleList([nn.Linear(H, H, bias=False) for _ in range(2)])  # W_k, W_v
        if cfg.csa:  # RAL's names: a frame-branch query encoder keeping its tokens, and the word confidence
            self.frame_branch_query_proj = LinearLayer(cfg.query_dim, H, cfg.input_drop)
            self.frame_branch_query_encoder = BertAttention(H, cfg.n_heads, cfg.drop)
            self.text_weight_fc = ral.word_confidence_head(H)
        if cfg.msra:
            self.msra = ral.MSRA(H, cfg.msra_samples)
        if cfg.irm:
            self.irm = regularizers.RedundancyMiner(H)
        if cfg.tcp:
            self.tcp = regularizers.CoherenceHeads(H, cfg.tcp_groups)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """Official init: Linear/Embedding weights N(0, initializer_range), biases 0, LayerNorm 1/0."""
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=self.cfg.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @property
    def device(self) -> torch.device:
        """Where the parameters live (inputs are moved here)."""
        return self.query_pos_embed.position_embeddings.weight.device

    def check_dims(self, visual_dim: int, query_dim: int, source: str) -> None:
        """Raise ValueError when data of these dims cannot feed this model (naming both sides)."""
        if (visual_dim, query_dim) != (self.cfg.visual_dim, self.cfg.query_dim):
            raise ValueError(
                f"{source} has visual dim {visual_dim} and query dim {query_dim}, but the model expects "
                f"visual dim {self.cfg.visual_dim} and query dim {self.cfg.query_dim}"
            )

    # ---- encoders on preprocessed, collated inputs (training and inference share them)
    def encode_query_tokens(self, query_inputs: Tensor, query_mask: Tensor,
                            frame_branch: bool = False) -> Tensor:
        """(Nq, L, Dq) tokens + (Nq, L) mask -> (Nq, L, H) encoded tokens; ``frame_branch``: CSA's encoder."""
        proj, encoder = ((self.frame_branch_query_proj, self.frame_branch_query_encoder) if frame_branch
                         else (self.query_input_proj, self.query_encoder))
        return encoder(self.query_pos_embed(project_valid(proj, query_inputs, query_mask)),
                       query_mask)  # the two encoders share the positions

    def pool_query(self, h: Tensor, query_mask: Tensor) -> Tensor:
        """(Nq, L, H) encoded tokens -> (Nq, H) attention-pooled query vectors."""
        logits = self.modular_vector_mapping(h).squeeze(-1)  # (Nq, L)
        logits = logits * query_mask + (1.0 - query_mask) * -1e10
        return torch.einsum("ql,qlh->qh", logits.softmax(dim=-1), h)

    def encode_query_batch(self, query_inputs: Tensor, query_mask: Tensor) -> Tensor:
        """(Nq, L, Dq) tokens + (Nq, L) mask -> (Nq, H) attention-pooled query vectors."""
        return self.pool_query(self.encode_query_tokens(query_inputs, query_mask), query_mask)

    def encode_query_inputs(self, query_inputs: Tensor, query_mask: Tensor) -> Tensor | EncodedQueries:
        """Preprocessed, collated queries -> what ``score`` takes: (Nq, H) vectors or (CSA) EncodedQueries."""
        vectors = self.encode_query_batch(query_inputs, query_mask)
        if not self.cfg.csa:
            return vectors
        return EncodedQueries(vectors, self.encode_query_tokens(query_inputs, query_mask, frame_branch=True),
                              query_mask)

    def encode_clip_units(self, clip_inputs: Tensor) -> Tensor:
        """(B, M, Dv) clip inputs -> (B, M, H) encoded clip units (no mask: all M units are real)."""
        return self.clip_encoder(self.clip_pos_embed(self.clip_input_proj(clip_inputs)))

    def encode_frames(self, frame_inputs: Tensor, frame_mask: Tensor) -> Tensor:
        """(B, L, Dv) frame inputs + (B, L) mask -> (B, L, H) encoded frames."""
        projected = project_valid(self.frame_input_proj, frame_inputs, frame_mask)
        return self.frame_encoder(self.frame_pos_embed(projected), frame_mask)

    def proposals_from_units(self, units: Tensor) -> tuple[Tensor, Tensor]:
        """(B, M, H) clip units -> proposals (B, P, H) and their window indices (B, P)."""
        proposals = window_proposals(units)  # (B, 528, H)
        if not self.cfg.clusters:
            index = torch.arange(proposals.shape[1], device=units.device)
            return proposals, index.expand(len(units), -1)
        # MS-SL++: cluster (no gradient) on [proposal, length code], with dropout in training as official
        dropout = self.cfg.input_drop if self.training else 0.0
        index = length_aware_kmedoids(proposals, self.cfg.clusters, dropout)  # (B, k)
        return proposals.gather(1, index[..., None].expand(-1, -1, proposals.shape[-1])), index

    def _attend(self, frames: Tensor, frame_mask: Tensor, key_clips: Tensor) -> tuple[Tensor, Tensor]:
        """key_clip_attention with W_k / W_v over frames (Nv, L, H), key_clips (Nv, J, H) -> z, alpha.

        The one hook ``attend`` and ``score`` pass to the shared scoring functions.
        """
        keys, values = self.mapping_linear[0](frames), self.mapping_linear[1](frames)
        return key_clip_attention(keys, values, frame_mask, key_clips)

    @torch.no_grad()
    def key_attention(self, frames: Sequence[np.ndarray], key_clips: np.ndarray) -> list[np.ndarray]:
        """``_attend``'s alpha alone (what results show) for one key clip per video (key_clips (V, H)) over
        its frames (L_i, H): W_k folded into the key clips, c . (W_k f) = (c W_k) . f, in one product,
        instead of projecting every frame."""
        weight = self.mapping_linear[0].weight
        folded = torch.from_numpy(np.ascontiguousarray(key_clips, np.float32)).to(weight.device) @ weight
        return frame_attention(frames, folded.cpu().numpy())

    # ---- inference on raw features
    @torch.no_grad()
    def encode_videos(self, frames_list: Sequence[ArrayLike], batch_size: int = 64) -> EncodedVideos:
        """Raw per-video rows (n_i, Dv) -> EncodedVideos; each video's result is independent of the batch."""
        if len(frames_list) == 0:
            raise ValueError("encode_videos: got no videos")
        parts = []
        for c in chunks(len(frames_list), batch_size):
            raw = [check_rows(x, f"video {i}", self.cfg.visual_dim)
                   for i, x in enumerate(frames_list[c], c.start)]
            clips = torch.stack([clip_input(x, self.cfg.map_size) for x in raw])
            frames, mask = pad([frame_input(x, self.cfg.max_ctx_l) for x in raw])
            parts.append(self.encode_video_inputs(clips, frames, mask))
        L = max(p.frames.shape[1] for p in parts)
        return EncodedVideos(
            clip_units=torch.cat([p.clip_units for p in parts]),
            proposals=torch.cat([p.proposals for p in parts]),
            proposal_index=torch.cat([p.proposal_index for p in parts]),
            frames=torch.cat([F.pad(p.frames, (0, 0, 0, L - p.frames.shape[1])) for p in parts]),
            frame_mask=torch.cat([F.pad(p.frame_mask, (0, L - p.frame_mask.shape[1])) for p in parts]),
        )

    @torch.no_grad()
    def encode_video_inputs(self, clip_inputs: Tensor, frame_inputs: Tensor,
                            frame_mask: Tensor) -> EncodedVideos:
        """Preprocessed, collated videos (B, 32, Dv) + (B, L, Dv) + (B, L) -> EncodedVideos."""
        frame_inputs, frame_mask = frame_inputs.to(self.device), frame_mask.to(self.device)
        units = self.encode_clip_units(clip_inputs.to(self.device))
        proposals, index = self.proposals_from_units(units)
        frames = self.encode_frames(frame_inputs, frame_mask) * frame_mask.unsqueeze(-1)  # batch-independent
        return EncodedVideos(units, proposals, index, frames, frame_mask)

    @torch.no_grad()
    def encode_queries(self, tokens_list: Sequence[ArrayLike],
                       batch_size: int = 256) -> Tensor | EncodedQueries:
        """Raw per-query token features (L_j, Dq) -> (Nq, H) query vectors (CSA: EncodedQueries)."""
        if len(tokens_list) == 0:
            raise ValueError("encode_queries: got no queries")
        out = []
        for c in chunks(len(tokens_list), batch_size):
            raw = [check_rows(x, f"query {i}", self.cfg.query_dim)
                   for i, x in enumerate(tokens_list[c], c.start)]
            tokens, mask = pad([query_input(x, self.cfg.max_desc_l) for x in raw])
            out.append(self.encode_query_inputs(tokens.to(self.device), mask.to(self.device)))
        return cat_queries(out)

    @torch.no_grad()
    def attend(self, videos: EncodedVideos, proposal_idx: Tensor) -> tuple[Tensor, Tensor]:
        """Key-clip-guided attention for proposals (Nv, J) (indices into videos.proposals) -> z, alpha."""
        return attend_proposals(videos, proposal_idx, self._attend)

    @torch.no_grad()
    def score(self, queries: Tensor | EncodedQueries, videos: EncodedVideos) -> Scores:
        """Inference scores for every (query, video) pair: key clip and z are computed per pair (or CSA)."""
        queries = queries.to(self.device)
        weights = (self.cfg.clip_scale_w, self.cfg.frame_scale_w)
        if not self.cfg.csa:
            return two_branch_scores(queries, videos, self._attend, weights)
        if not isinstance(queries, EncodedQueries):
            raise TypeError("this model scores frames with CSA, which needs the queries' frame-branch "
                            "tokens: pass what encode_queries returns (EncodedQueries), not a tensor")
        clip, key_idx = clip_scale(queries.vectors, videos.proposals)
        frame = ral.csa_scores(self.text_weight_fc, queries.tokens, queries.token_mask, videos.frames,
                               videos.frame_mask, pad_to=self.cfg.max_ctx_l)
        return branch_scores(clip, key_idx, frame, videos, weights)

    @torch.no_grad()
    def encode_rows(self, rows: ArrayLike, start: ArrayLike, end: ArrayLike) -> tuple:
        """One video's raw rows + [start, end) seconds -> encoded frames (n', H), unit float32 numpy, with
        their seconds; n' = min(n, max_ctx_l) (longer videos are re-binned as frame_input does)."""
        x = frame_input(check_rows(rows, "encode_rows", self.cfg.visual_dim), self.cfg.max_ctx_l)[None]
        frames = self.encode_frames(x.to(self.device), torch.ones(x.shape[:2], device=self.device))[0]
        start, end = (torch.as_tensor(t, dtype=torch.float64) for t in (start, end))
        if len(start) > self.cfg.max_ctx_l:
            bins = clip_unit_rows(len(start), self.cfg.max_ctx_l, torch.float64)
            start, end = start[bins[:, 0]], end[bins[:, 1] - 1]
        return F.normalize(frames, dim=-1).float().cpu().numpy(), start.float().numpy(), end.float().numpy()

    # ---- training
    def loss(
        self,
        clip_inputs: Tensor,
        frame_inputs: Tensor,
        frame_mask: Tensor,
        query_inputs: Tensor,
        query_mask: Tensor,
        query_labels: Tensor,
        hard_negative_pool: int | None = None,
    ) -> dict[str, Tensor]:
        """Official training losses on a collated batch; ``hard_negative_pool`` None = random negatives.

        Enabled extensions replace the frame losses (CSA) or add terms (MSRA, ICE, IRM, TCP); "total" sums.
        """
        margin, pool = self.cfg.margin, hard_negative_pool
        units = self.encode_clip_units(clip_inputs)  # (Nv, M, H)
        proposals, _ = self.proposals_from_units(units)  # (Nv, P, H)
        frames = self.encode_frames(frame_inputs, frame_mask)  # (Nv, L, H)
        tokens = self.encode_query_tokens(query_inputs, query_mask)  # (Nq, Lq, H)
        q = self.pool_query(tokens, query_mask)  # (Nq, H)
        clip_cos, key_idx, clip_raw = clip_scale_with_raw(q, proposals)  # (Nq, Nv) each; raw for the NCE
        rows = torch.arange(len(q), device=q.device)
        key_clips = proposals[query_labels, key_idx[rows, query_labels]]  # (Nq, H), in each query's own video
        # word features for CSA and MSRA: RAL's frame-branch query encoder when CSA is on, else the query's
        words = tokens if not self.cfg.csa else self.encode_query_tokens(query_inputs, query_mask, True)
        out = {
            "clip_nce": 0.02 * losses.clip_nce(clip_raw, query_labels),
            "clip_trip": losses.clip_triplet(clip_cos, query_labels, margin, pool),
        }
        if self.cfg.csa:  # RAL: both frame losses on the (Nq, Nv) CSA scores, in the clip losses' form
            csa = (self.text_weight_fc, words, query_mask, frames, frame_mask)
            csa_raw = ral.csa_scores(*csa, normalize=False, pad_to=self.cfg.max_ctx_l)
            out["frame_nce"] = 0.04 * losses.clip_nce(csa_raw, query_labels)
            csa_cos = ral.csa_scores(*csa, pad_to=self.cfg.max_ctx_l)
            out["frame_trip"] = losses.clip_triplet(csa_cos, query_labels, margin, pool)
        else:  # training attends only within each query's own video: one z per query
            z = self._attend_own(frames, frame_mask, key_clips, query_labels)  # (Nq, H)
            frame_cos = F.normalize(q, dim=-1) @ F.normalize(z, dim=-1).t()  # (Nq, Nq), diagonal positive
            out["frame_nce"] = 0.04 * losses.frame_nce(q @ z.t())
            out["frame_trip"] = losses.frame_triplet(frame_cos, margin, pool)
        if self.cfg.msra:
            mil, kl = self.msra(words, query_mask, query_labels, frames, frame_mask)
            out["msra_mil"], out["msra_kl"] = self.cfg.msra_mil_w * mil, self.cfg.msra_kl_w * kl
        if self.cfg.ice:  # the pseudo-positive pairs are moment-level: the clip branch's NCE weight
            ice, _ = regularizers.ice_loss(units, q, query_labels, self.cfg.ice_threshold, margin, 0.02, pool)
            out["ice"] = self.cfg.ice_w * ice
        if self.cfg.irm:
            irm = regularizers.irm_loss(self.irm, frames, frame_mask, q, query_labels, key_clips, clip_cos,
                                        clip_raw, margin, 0.02, pool)
            out["irm"] = self.cfg.irm_w * irm
        if self.cfg.tcp:
            out["tcp"] = self.cfg.tcp_w * self._tcp_loss(clip_inputs, units, frame_inputs, frame_mask, frames)
        out["total"] = sum(out.values())
        return out

    def _attend_own(self, frames: Tensor, frame_mask: Tensor, key_clips: Tensor, labels: Tensor) -> Tensor:
        """Each query's key clip attending over its own video's frames: (Nq, H) key clips -> z (Nq, H)."""
        # queries are laid out per video as (Nv, J, H), so W_k / W_v and the attention run once per video
        # instead of on a per-query copy of the frames (Nq, L, H)
        counts = torch.bincount(labels, minlength=len(frames))
        order = torch.argsort(labels, stable=True)
        slot = torch.empty_like(labels)
        first = counts.cumsum(0) - counts  # each video's first position in ``order``
        slot[order] = torch.arange(len(labels), device=labels.device) - first[labels[order]]
        grid = key_clips.new_zeros(len(frames), int(counts.max()), key_clips.shape[-1])
        grid = grid.index_put((labels, slot), key_clips)  # (Nv, J, H); empty slots attend harmlessly
        z, _ = self._attend(frames, frame_mask, grid)
        return z[labels, slot]

    def _tcp_loss(self, clip_inputs: Tensor, units: Tensor, frame_inputs: Tensor, frame_mask: Tensor,
                  frames: Tensor) -> Tensor:
        """TCP on both branches: group prediction on the encoded original and partly shuffled inputs."""
        encode_frames = functools.partial(self.encode_frames, frame_mask=frame_mask)
        groups, fraction = self.cfg.tcp_groups, self.cfg.tcp_shuffle
        unit_mask = units.new_ones(units.shape[:2])
        return (regularizers.tcp_loss(self.tcp.frame, encode_frames, frame_inputs, frame_mask, frames, groups,
                                      fraction)
                + regularizers.tcp_loss(self.tcp.clip, self.encode_clip_units, clip_inputs, unit_mask, units,
                                        groups, fraction))

    @property
    def dims(self) -> tuple[int, int]:
        """(width of a video's raw rows, width of a query's token features): what the model reads."""
        return int(self.cfg.visual_dim), int(self.cfg.query_dim)

    # ---- identity and checkpoints
    def fingerprint(self) -> str:
        """sha256 over the config JSON and every weight's name, dtype, shape and bytes."""
        digest = hashlib.sha256(json.dumps(self.cfg.to_dict(), sort_keys=True).encode())
        for name, t in sorted(self.state_dict().items()):
            t = t.detach().cpu().contiguous()
            digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    @classmethod
    def from_official(cls, state_dict: Mapping[str, Tensor], official_config: Mapping) -> MSSL:
        """Build from an official state_dict (``module.`` prefix allowed) and its config; strict load."""
        model = cls(MSSLConfig.from_official(official_config))
        state = {k.removeprefix("module."): v for k, v in state_dict.items()}
        model.load_state_dict(state, strict=True)
        return model
