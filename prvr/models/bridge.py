"""The training-free default: MS-SL's two branches run in MiniLM's text space, reached through ImageNet.

No PRVR checkpoint and no joint image-text model is available offline, so the ``lite`` profile's two feature
spaces are bridged: a 1 s frame row (EfficientNet-Lite0's pooled feature) goes through its own ImageNet
classifier, and the renormalised top-k class probabilities weight the MiniLM embeddings of the class names
(``prompt``, "a photo of a {}."); a query is the mean of its MiniLM token rows; both are L2-normalised.
MS-SL's clip-scale and frame-scale branches then score them unchanged (``prvr.models.training_free``).

Settings (``BridgeConfig``, all in ``fingerprint()``, which an index stores; none tuned on the demo captions):
- ``top_k`` 5: ImageNet's top-5; the long tail would pull every row towards a direction all videos share;
- ``fine_top_k`` None: localisation's rows (``encode_rows``) keep the full posterior, which tells vague scenes
  apart inside one video (it raises the key moment's centre-inside rate); the ranking never reads them;
- ``temperature`` 0.05: the largest that keeps >= 90 % of key-clip attention on the key clip's own scene
  (``python -m benchmarks.bridge_temperature``); ``clip_scale_w`` / ``frame_scale_w`` 0.7 / 0.3: MS-SL's;
- ``propagation`` off: the real dev set's tuning half does not support it (the burden is on the extra
  mechanism).
The measurements behind these settings and the alternatives dropped: benchmarks/RESULTS.md, "Issue #42:
history moved from module docstrings" (``prvr/models/bridge.py``) and "Session 13".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from extract.backbones import create_backbone, imagenet_classes
from extract.pipeline import as_resolved
from extract.profiles import Profile, get_profile
from prvr import paths
from prvr.models.branches import key_clip_attention
from prvr.models.mssl import DictConfig
from prvr.models.training_free import TrainingFreeModel
from prvr.temporal.propagation import BETA

log = logging.getLogger(__name__)

NAME = "training-free default (EfficientNet-Lite0 ImageNet classes -> MiniLM text space)"
PROFILE = "lite"  # the feature profile whose rows and tokens this model reads


@dataclass(frozen=True)
class BridgeConfig(DictConfig):
    prompt: str = "a photo of a {}."  # CLIP's standard ImageNet template
    top_k: int = 5  # classes kept per frame row (ImageNet's top-5), probabilities renormalised
    fine_top_k: int | None = None  # ... in encode_rows' rows (localisation's evidence); None: every class
    temperature: float = 0.05  # key-clip attention logits are divided by this (criterion: module docstring)
    clip_scale_w: float = 0.7  # MS-SL's default score weights
    frame_scale_w: float = 0.3
    map_size: int = 32  # clip units per video, as MS-SL
    max_ctx_l: int = 128  # frame rows kept per video, as MS-SL
    # rows -> TF-PRVR propagated segment features before scoring (prvr.temporal.propagation); off: the real
    # dev set's tuning half does not support it (module docstring)
    propagation: bool = False
    propagation_beta: float = BETA  # TF-PRVR's propagation strength

    def __post_init__(self) -> None:
        """Refuse a propagation strength the closed form cannot use or a class count below 1, naming the
        field."""
        if self.top_k < 1 or (self.fine_top_k is not None and self.fine_top_k < 1):
            raise ValueError(f"BridgeConfig: top_k {self.top_k} and fine_top_k {self.fine_top_k} must be "
                             ">= 1 (fine_top_k None: every class)")
        if not 0 <= self.propagation_beta < 1:
            raise ValueError(f"BridgeConfig.propagation_beta must be in [0, 1), got {self.propagation_beta}")


def sentence_vectors(tokens_list: Sequence[np.ndarray | Tensor], dim: int) -> Tensor:
    """Token rows (L_i, dim) per text -> (N, dim): mean over tokens, L2-normalised (MiniLM's pooling)."""
    if len(tokens_list) == 0:
        raise ValueError("got no texts")
    out = []
    for i, tokens in enumerate(tokens_list):
        tokens = torch.as_tensor(tokens, dtype=torch.float32)
        if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] != dim:
            raise ValueError(f"text {i}: token features of shape {tuple(tokens.shape)}, expected (L, {dim})")
        out.append(tokens.mean(dim=0))
    return F.normalize(torch.stack(out), dim=-1)


def class_embeddings(text_backbone, prompt: str, names: Sequence[str], cache_dir: Path) -> Tensor:
    """(C, D) prompt embeddings of the class names, computed once and cached per text model + prompt."""
    key = json.dumps([text_backbone.name, text_backbone.weights.identity, prompt, list(names)])
    path = Path(cache_dir) / f"classes-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npy"
    shape = (len(names), text_backbone.cfg.dim)
    if path.exists():
        table = np.load(path)
        if table.shape == shape:
            return torch.from_numpy(table)
        log.warning("recomputing %s: shape %s, expected %s", path, table.shape, shape)
    log.info("embedding %d class names with %s (once; cached in %s)", len(names), text_backbone.name, path)
    table = sentence_vectors(text_backbone.encode([prompt.format(n) for n in names]), text_backbone.cfg.dim)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.npy")
    np.save(tmp, table.numpy())
    os.replace(tmp, path)
    return table


class BridgeModel(TrainingFreeModel):
    """MS-SL's inference protocol (docs/design.md, Contract 3) with no trained weights."""

    def __init__(self, head: torch.nn.Linear, class_text: Tensor, cfg: BridgeConfig = BridgeConfig(),
                 profile: dict | None = None) -> None:
        if head.out_features != class_text.shape[0]:
            raise ValueError(f"classifier has {head.out_features} classes but {class_text.shape[0]} class "
                             "embeddings were given")
        self.cfg, self.profile = cfg, profile
        self.head = head.eval()
        self.class_text = class_text.to(head.weight.device, torch.float32)  # (C, D)

    @classmethod
    def from_pretrained(cls, cfg: BridgeConfig = BridgeConfig(), cache_dir: str | Path | None = None,
                        device: str | torch.device | None = None) -> BridgeModel:
        """Build from the ``lite`` profile's own backbones (EfficientNet-Lite0 head, MiniLM)."""
        return cls.build(cls.resolve(get_profile(PROFILE), {}), cfg, device, cache_dir)

    @classmethod
    def resolve(cls, profile: Profile, weights: Mapping[str, str]) -> Profile:
        """The profile with its packaged weights: weights given for its backbones are refused."""
        if set(weights) & {b for b, _ in profile.weights}:
            raise ValueError(f"the {profile.name!r} training-free model uses its packaged weights; --weights "
                             "applies to the clip profile or to a checkpoint's profile")
        return as_resolved(profile)

    @classmethod
    def build(cls, profile: Profile, cfg: BridgeConfig | None = None,
              device: str | torch.device | None = None, cache_dir: str | Path | None = None) -> BridgeModel:
        """The bridge on a resolved profile of EfficientNet-Lite0 + MiniLM (``cache_dir``: the class-name
        embeddings' cache, default ``prvr.paths.cache_dir("bridge")``)."""
        if tuple(profile.visual) != ("efficientnet_lite0",) or profile.text != "minilm":
            raise ValueError(f"profile {profile.name!r} uses {profile.visual} + {profile.text}; the bridge "
                             "needs ('efficientnet_lite0',) + minilm")
        cfg = cfg or BridgeConfig()
        visual, text = (create_backbone(name, profile.source(name), device=device)
                        for name in ("efficientnet_lite0", "minilm"))
        cache = Path(cache_dir or paths.cache_dir("bridge"))
        table = class_embeddings(text, cfg.prompt, imagenet_classes(), cache)
        # the identity VideoExtractor/TextEncoder record for these very weights, so indexes can compare
        profile = profile.with_weights({b.name: b.weights.identity for b in (visual, text)})
        return cls(visual.net.head, table, cfg, profile.identity())

    @property
    def device(self) -> torch.device:
        """Where the classifier lives (inputs are moved here)."""
        return self.head.weight.device

    @property
    def dims(self) -> tuple[int, int]:
        """(visual row width, text token width) this model reads."""
        return self.head.in_features, self.class_text.shape[1]

    def describe(self) -> dict:
        """What the app and README show about the model in use."""
        return {"name": NAME, "profile": PROFILE, "settings": self.cfg.to_dict(),
                "fingerprint": self.fingerprint()}

    def fingerprint(self) -> str:
        """sha256 of the config, the profile identity, the classifier and the class embeddings."""
        digest = hashlib.sha256(json.dumps([NAME, self.cfg.to_dict(), self.profile], sort_keys=True).encode())
        for t in (self.head.weight, self.head.bias, self.class_text):
            digest.update(t.detach().float().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()

    def to_text_space(self, rows: np.ndarray | Tensor) -> Tensor:
        """Visual rows (n, Dv) -> (n, D) unit vectors: top-k class probabilities x class embeddings."""
        return self.class_mix(rows, self.cfg.top_k)

    @torch.no_grad()
    def class_mix(self, rows: np.ndarray | Tensor, top_k: int | None) -> Tensor:
        """Visual rows (n, Dv) -> (n, D) unit vectors: the class embeddings weighted by the ``top_k`` largest
        class probabilities, renormalised (None: every class)."""
        rows = torch.as_tensor(rows, dtype=torch.float32).to(self.device)
        probs = self.head(rows).softmax(dim=-1)  # (n, C)
        if top_k is None or top_k >= probs.shape[-1]:
            return F.normalize(probs @ self.class_text, dim=-1)
        top = probs.topk(top_k, dim=-1)
        weights = torch.zeros_like(probs).scatter_(-1, top.indices, top.values)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return F.normalize(weights @ self.class_text, dim=-1)

    def rows_to_space(self, rows: Tensor) -> Tensor:
        """The frame rows in the text space (``to_text_space``)."""
        return self.to_text_space(rows)

    def fine_rows_to_space(self, rows: Tensor) -> Tensor:
        """The rows localisation reads: the class mix of ``fine_top_k`` classes (module docstring)."""
        return self.class_mix(rows, self.cfg.fine_top_k)

    def query_vectors(self, tokens_list: Sequence[np.ndarray | Tensor]) -> Tensor:
        """Raw per-query MiniLM token rows (L_j, D) -> (Nq, D) sentence vectors."""
        return sentence_vectors(tokens_list, self.dims[1])


def attention_focus(class_text: Tensor, temperature: float, scene_s: int = 8, n_scenes: int = 6,
                    classes_per_scene: int = 5, trials: int = 100, seed: int = 0) -> float:
    """Mean attention mass a scene's key clip puts on its own scene, on synthetic 1 s-per-row videos.

    Each scene's rows are random convex mixes of ``classes_per_scene`` random ImageNet classes in the text
    space (a photo under camera motion); the key clip is the mean of the scene's rows, as a clip-scale
    proposal covering it would be. This is the temperature criterion of the module docstring.
    """
    gen = torch.Generator().manual_seed(seed)
    mass = []
    for _ in range(trials):
        classes = torch.randperm(len(class_text), generator=gen)[: n_scenes * classes_per_scene]
        mix = torch.rand(n_scenes, scene_s, classes_per_scene, generator=gen)  # (S, T, k)
        scene_tables = class_text[classes].view(n_scenes, classes_per_scene, -1)  # (S, k, D)
        mix = mix / mix.sum(dim=-1, keepdim=True)
        rows = F.normalize(torch.einsum("stk,skd->std", mix, scene_tables), dim=-1)  # (S, T, D)
        key = rows.mean(dim=1)  # (S, D): one key clip per scene
        frames = rows.reshape(1, n_scenes * scene_s, -1)
        _, alpha = key_clip_attention(frames, frames, torch.ones(1, frames.shape[1]), key[None], temperature)
        own = alpha[0].view(n_scenes, n_scenes, scene_s).diagonal().sum(dim=0)  # (S,) mass on own scene
        mass.append(own.mean())
    return float(torch.stack(mass).mean())
