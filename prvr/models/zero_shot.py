"""The training-free model of the ``clip`` profile: MS-SL's two branches on a CLIP-family model's embeddings.

The bridge's structure (``prvr.models.training_free``) without its ImageNet detour, since a CLIP or SigLIP
model embeds images and text in one space: a 1 s frame row (the pooled, projected image embedding) and a
query (the model's own pooled text embedding: its text head on the last row ``clip_text`` returns,
``extract.clip``) are L2-normalised and scored by MS-SL's clip-scale and frame-scale branches.

Settings (``ZeroShotConfig``, all in ``fingerprint()``, which an index stores):
- ``temperature`` 0.05: the bridge's, fixed by its criterion (>= 90 % of key-clip attention on the key clip's
  own scene); not re-measured on CLIP, whose weights cannot be downloaded on the development machine. CLIP's
  own logit scale (0.01) is fitted to image-text cosines, a much narrower range than frame-frame cosines;
- ``clip_scale_w`` / ``frame_scale_w`` 0.7 / 0.3: MS-SL's default weights.

The weights load from the ``clip`` backbone's hub id or a local folder holding both towers
(``--weights clip=DIR``); ``extract.clip`` says which default model and why.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from extract.backbones import default_device, get_backbone_cfg
from extract.clip import load_pair, tower_dims
from extract.pipeline import as_resolved
from extract.profiles import Profile, get_profile
from extract.weights import WeightsUnavailable, hub_offline_reason, in_hub_cache, resolve_weights
from prvr.models.mssl import DictConfig
from prvr.models.training_free import TrainingFreeModel
from prvr.temporal.propagation import BETA

log = logging.getLogger(__name__)

NAME = "training-free CLIP-family model (image and text embeddings of one model)"
PROFILE = "clip"  # the feature profile whose rows and tokens this model reads


@dataclass(frozen=True)
class ZeroShotConfig(DictConfig):
    temperature: float = 0.05  # key-clip attention logits are divided by this (module docstring)
    clip_scale_w: float = 0.7  # MS-SL's default score weights
    frame_scale_w: float = 0.3
    map_size: int = 32  # clip units per video, as MS-SL
    max_ctx_l: int = 128  # frame rows kept per video, as MS-SL
    # TF-PRVR segment propagation (prvr.temporal.propagation); off: no CLIP weights load here, so it cannot
    # be measured on the real dev set, and for the bridge the dev set's tuning half did not support it
    # (prvr.models.bridge); the burden is on the extra mechanism
    propagation: bool = False
    propagation_beta: float = BETA

    def __post_init__(self) -> None:
        """Refuse settings the scoring cannot run with, naming the field."""
        if not 0 <= self.propagation_beta < 1:
            raise ValueError(f"ZeroShotConfig.propagation_beta must be in [0, 1), got "
                             f"{self.propagation_beta}")
        if self.temperature <= 0:
            raise ValueError(f"ZeroShotConfig.temperature must be positive, got {self.temperature}")
        if not 1 <= self.map_size <= self.max_ctx_l:
            raise ValueError(f"ZeroShotConfig.map_size {self.map_size} must be in [1, max_ctx_l "
                             f"{self.max_ctx_l}]")


class ZeroShotModel(TrainingFreeModel):
    """Contract 3 over a CLIP-family model's image rows and pooled text embeddings; no PRVR training."""

    def __init__(self, text_head: nn.Linear, image_dim: int, cfg: ZeroShotConfig = ZeroShotConfig(),
                 profile: dict | None = None, source: str = "") -> None:
        if text_head.out_features != image_dim:
            raise ValueError(f"text embeddings are {text_head.out_features}-d but image rows {image_dim}-d: "
                             "not one image-text space")
        self.cfg, self.profile, self.source = cfg, profile, source
        self.text_head, self.image_dim = text_head.eval(), image_dim

    @classmethod
    def from_pretrained(cls, weights: str | None = None, cfg: ZeroShotConfig = ZeroShotConfig(),
                        device: str | torch.device | None = None,
                        profile: str | Profile = PROFILE) -> ZeroShotModel:
        """Load the ``clip`` profile's model (its default hub id, or ``weights``: a folder or hf-hub:ID);
        ``profile``: another profile of the same towers (e.g. ``clip_whole``, another frame fit), or one
        ``resolve`` returned (then no ``weights``).

        A hub id on a host that cannot reach the hub loads from the local cache or fails within seconds
        (``WeightsUnavailable`` naming the model and the cause), never after network time-outs.
        """
        profile = get_profile(profile)
        if profile.resolved and weights is not None:
            raise ValueError(f"profile {profile.name} is already resolved with its weights; give them once")
        if not profile.resolved:
            profile = cls.resolve(profile, {profile.visual[0]: weights} if weights else {})
        return cls.build(profile, cfg, device)

    @classmethod
    def resolve(cls, profile: Profile, weights: Mapping[str, str]) -> Profile:
        """The profile with its image-text model's weights (given for its image tower, else the registry's
        hub id), loaded here: their config sizes the profile (dims, context length), and a model that does
        not load fails before anything else is built."""
        if profile.visual != (PROFILE,) or profile.text != "clip_text":
            raise ValueError(f"profile {profile.name!r} reads {profile.visual} + {profile.text}; the "
                             "CLIP-family model reads the clip and clip_text towers")
        tower = profile.visual[0]
        if set(weights) - {tower}:
            raise ValueError(f"the CLIP-family model reads both towers from one folder: give --weights "
                             f"{tower}=..., not {', '.join(sorted(set(weights) - {tower}))}")
        spec = weights.get(tower) or get_backbone_cfg(tower).weights
        resolved = resolve_weights(spec)
        offline = hub_offline_reason() if resolved.kind == "hub" else None
        if offline and not in_hub_cache(resolved):
            raise WeightsUnavailable(f"cannot load {spec}: {offline}, and the model is not in the local "
                                     "Hugging Face cache; pass a local copy with --weights clip=DIR")
        load_pair(resolved, local_only=offline is not None)
        # the identity VideoExtractor/TextEncoder record for these very weights, so indexes can compare
        return as_resolved(profile, {tower: resolved}, profile.visual)

    @classmethod
    def build(cls, profile: Profile, cfg: ZeroShotConfig | None = None,
              device: str | torch.device | None = None, cache_dir: str | Path | None = None) -> ZeroShotModel:
        """The model on a profile ``resolve`` returned (``cache_dir`` is not used: nothing is derived)."""
        resolved = profile.source(profile.visual[0])
        if resolved is None:
            raise ValueError(f"profile {profile.name} is not resolved with its model's weights: "
                             "ZeroShotModel.resolve(profile, weights) first")
        head = load_pair(resolved).text_head()
        copy = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
        copy.load_state_dict({k: v.float() for k, v in head.state_dict().items()})
        return cls(copy.to(default_device(device)), tower_dims(resolved).image, cfg or ZeroShotConfig(),
                   profile.identity(), resolved.location)

    @property
    def device(self) -> torch.device:
        """Where the text head lives (inputs are moved here)."""
        return self.text_head.weight.device

    @property
    def dims(self) -> tuple[int, int]:
        """(visual row width, text token width) this model reads."""
        return self.image_dim, self.text_head.in_features

    def describe(self) -> dict:
        """What the app and README show about the model in use."""
        return {"name": NAME, "profile": (self.profile or {}).get("name", PROFILE), "weights": self.source,
                "settings": self.cfg.to_dict(),
                "fingerprint": self.fingerprint()}

    def fingerprint(self) -> str:
        """sha256 of the config, the profile identity (weights included) and the text head."""
        digest = hashlib.sha256(json.dumps([NAME, self.cfg.to_dict(), self.profile], sort_keys=True).encode())
        for t in self.text_head.state_dict().values():
            digest.update(t.detach().float().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()

    def rows_to_space(self, rows: Tensor) -> Tensor:
        """Image embeddings are already in the joint space: L2-normalised."""
        return F.normalize(rows, dim=-1)

    @torch.no_grad()
    def query_vectors(self, tokens_list: Sequence[np.ndarray | Tensor]) -> Tensor:
        """Token rows (L_j, Dq), the pooled one last -> (Nq, H): the text head of that row, L2-normalised."""
        pooled = []
        for i, tokens in enumerate(tokens_list):
            tokens = torch.as_tensor(tokens, dtype=torch.float32)
            if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] != self.dims[1]:
                raise ValueError(f"text {i}: token features of shape {tuple(tokens.shape)}, expected "
                                 f"(L, {self.dims[1]})")
            pooled.append(tokens[-1])
        return F.normalize(self.text_head(torch.stack(pooled).to(self.device)), dim=-1)
