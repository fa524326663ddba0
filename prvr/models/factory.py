"""One place that makes a model: ``create_model(profile, weights, checkpoint, device) -> LoadedModel``.

    loaded = create_model()                      # no profile: clip where its weights load, else lite
    loaded = create_model("clip", {"clip": DIR}) # a registered training-free model, asked for by profile
    loaded = create_model(checkpoint=CKPT)       # a trained MS-SL checkpoint, on the profile it records
    loaded.model; loaded.profile (resolved: its weights' identity); loaded.info (what the page says)
    loaded.text_encoder(device); loaded.video_extractor(device); loaded.seconds_per_frame (ZeroGPU)

The registry (as timm's and open_clip's) maps a profile name to the training-free model that reads it
(``ModelEntry``: its class, its name and description, its ZeroGPU seconds per frame). The profile is resolved
once (``extract.pipeline.resolve_profile``: the given weights resolved, the dims they decide) and that one
``Profile`` flows to the model, its text encoder and its video extractor. ``weights`` maps backbone names to
specs; those of other profiles' backbones are ignored (one ``--weights`` list serves whichever model loads).
Nothing here knows the web app: the device is a parameter.

Adding a model: docs/design.md, "Adding a model" (the profile's JSON and one ``register_model`` line).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from extract.pipeline import TextEncoder, VideoExtractor, as_resolved
from extract.profiles import Profile, ProfileMismatch, check_identity, get_profile
from prvr.models import bridge, zero_shot
from prvr.models.checkpoint import load_checkpoint
from prvr.models.training_free import TrainingFreeModel

log = logging.getLogger(__name__)

AUTOMATIC = ("clip", "lite")  # with no profile and no checkpoint: the first whose model loads serves
# ZeroGPU slot seconds per decoded frame of a profile with no entry (paper's ResNet-152 + I3D: 1.0 ms a frame
# measured on an H200, 3x that is 0.003; room for a heavier profile of one's own)
DEFAULT_SECONDS_PER_FRAME = 0.01


@dataclass(frozen=True)
class ModelInfo:
    """What the info panel says about the model in use."""

    name: str
    description: str
    metrics: dict | None = None
    why: str = ""  # why this model serves: an explicit choice, or the automatic choice and any fallback


@dataclass(frozen=True)
class ModelEntry:
    """A training-free model in the registry, keyed by the feature profile it reads."""

    profile: str  # the registered feature profile (extract/profiles/<profile>.json)
    model: type[TrainingFreeModel]  # its class: ``resolve(profile, weights)`` then ``build(profile, ...)``
    name: str  # what the page calls it
    about: Callable[[TrainingFreeModel], str]  # the page's description of a loaded one
    kind: str = "model"  # a short noun for log lines and reasons ("the lite profile's bridge")
    # ZeroGPU slot seconds per decoded frame (prvr.serve.zerogpu.SlotRule): the profile's visual backbones
    # on a shared GPU, frame file read and copy included, with a margin (measured: benchmarks/gpu_check.py)
    seconds_per_frame: float = DEFAULT_SECONDS_PER_FRAME


_MODELS: dict[str, ModelEntry] = {}


def register_model(entry: ModelEntry) -> ModelEntry:
    """Add a training-free model for ``entry.profile`` (replacing one for the same profile); the profile
    must be registered first (``extract.profiles``)."""
    get_profile(entry.profile)  # an unknown profile fails here, naming the known ones
    if entry.seconds_per_frame <= 0:
        raise ValueError(f"model entry {entry.profile}: seconds_per_frame must be positive")
    _MODELS[entry.profile] = entry
    return entry


def training_free_profiles() -> list[str]:
    """The profiles a training-free model reads, sorted."""
    return sorted(_MODELS)


def model_entry(profile: str) -> ModelEntry:
    """The registry's entry for ``profile``; ValueError naming the registered ones for any other name."""
    if profile not in _MODELS:
        names = [repr(p) for p in training_free_profiles()]
        known = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        raise ValueError(f"the training-free models read the {known} profile, not {profile!r}; give a "
                         f"--checkpoint trained on {profile!r}")
    return _MODELS[profile]


def seconds_per_frame(profile: str) -> float:
    """ZeroGPU slot seconds per decoded frame of ``profile`` (a trained checkpoint's profile reads the same
    backbones as the training-free model of that name; a profile with no entry gets the default)."""
    entry = _MODELS.get(profile)
    return entry.seconds_per_frame if entry else DEFAULT_SECONDS_PER_FRAME


def per_frame_table() -> tuple[tuple[str, float], ...]:
    """(profile, seconds per frame) of every entry, in profile order."""
    return tuple((p, _MODELS[p].seconds_per_frame) for p in training_free_profiles())


@dataclass(frozen=True)
class LoadedModel:
    """A model made by ``create_model``: itself, its resolved profile, what the page says about it, and the
    text encoder and video extractor that read the same profile."""

    model: object  # Contract 3 (docs/design.md): MSSL or a TrainingFreeModel
    profile: Profile  # resolved: the identity of the weights in use (and the dims they decide)
    info: ModelInfo

    @classmethod
    def of(cls, model: object, profile: str | Profile, weights: Mapping[str, str] | None = None,
           info: ModelInfo | None = None) -> LoadedModel:
        """A model made elsewhere (a test's, a variant built from another's parts) on ``profile`` resolved
        with ``weights``, checked against the profile the model records."""
        resolved = as_resolved(profile, dict(weights) if weights else None)
        check_features(resolved, model)
        return cls(model, resolved, info or ModelInfo(type(model).__name__, ""))

    @property
    def seconds_per_frame(self) -> float:
        """ZeroGPU slot seconds per decoded frame of its profile."""
        return seconds_per_frame(self.profile.name)

    def text_encoder(self, device: str | torch.device | None = None) -> TextEncoder:
        """The profile's text encoder (queries, captions) on ``device``."""
        return TextEncoder(self.profile, device=device)

    def video_extractor(self, device: str | torch.device | None = None, **options) -> VideoExtractor:
        """The profile's video extractor on ``device`` (``options``: ``VideoExtractor``'s batch_frames,
        limits)."""
        return VideoExtractor(self.profile, device=device, **options)


def create_model(profile: str | Profile | None = None, weights: Mapping[str, str] | None = None,
                 checkpoint: str | Path | None = None, device: str | torch.device | None = None,
                 cfg: object | None = None, cache_dir: str | Path | None = None) -> LoadedModel:
    """The model for a (profile, weights, checkpoint, device) choice (module docstring).

    ``checkpoint``: a trained MS-SL model (our directory or an official model.ckpt) on the profile it records
    (``profile``, if given, must agree; it names the profile of a checkpoint that records none). Otherwise
    the training-free model registered for ``profile``; with no profile, ``AUTOMATIC``'s first that loads
    (a failed load is logged with the model, the cause and the fallback; an explicit choice re-raises).
    ``cfg``: a training-free model's config (default: its class's); ``cache_dir``: where it may keep files
    derived from its weights (the bridge's class-name embeddings).
    """
    weights = dict(weights or {})
    if cfg is not None and (profile is None or checkpoint is not None):
        raise ValueError("cfg is a training-free model's config: give the profile of that model")
    if checkpoint is not None:
        return _checkpoint(Path(checkpoint), profile, weights, device)
    if profile is not None:
        name = profile.name if isinstance(profile, Profile) else profile
        entry = model_entry(name)
        why = f"chosen with --profile {name}"
        return _training_free(entry, profile, weights, device, cfg, cache_dir, why)
    fallback = ""
    for number, name in enumerate(AUTOMATIC):
        entry, last = model_entry(name), number == len(AUTOMATIC) - 1
        why = (f"chosen automatically: {fallback}" if fallback else "chosen automatically: no --profile was "
               f"given and the {name} profile's weights loaded")
        try:
            return _training_free(entry, name, weights, device, cfg, cache_dir, why,
                                  quiet=bool(fallback))
        except Exception as err:  # any failed load falls back to the next (the last re-raises)
            if last:
                raise
            fallback = (f"the {name} profile's {entry.kind} {_source(name, weights)} did not load ({err}); "
                        f"serving the offline default, the {AUTOMATIC[-1]} profile's "
                        f"{model_entry(AUTOMATIC[-1]).kind}, instead")
            log.warning("%s", fallback)
    raise AssertionError("unreachable: the last automatic choice returns or raises")


def _training_free(entry: ModelEntry, profile: str | Profile, weights: dict[str, str],
                   device: str | torch.device | None, cfg: object | None, cache_dir: str | Path | None,
                   why: str, quiet: bool = False) -> LoadedModel:
    """The entry's model on its profile resolved once with the weights that concern it."""
    if isinstance(profile, Profile) and profile.resolved:
        resolved = profile
    else:
        recipe = get_profile(profile)
        resolved = entry.model.resolve(recipe, _own(recipe, weights))
    model = entry.model.build(resolved, cfg, device, cache_dir)
    source = getattr(model, "source", "")
    # the fallback's reason is the warning already given, not said twice
    log.info("model: %s%s (%s)", entry.name, f" from {source}" if source else "",
             "chosen automatically, as the warning above says" if quiet else why)
    return LoadedModel(model, resolved, ModelInfo(entry.name, entry.about(model), why=why))


def _checkpoint(path: Path, profile: str | Profile | None, weights: dict[str, str],
                device: str | torch.device | None) -> LoadedModel:
    """A trained MS-SL checkpoint on the profile it was trained on, resolved with the weights given for it."""
    model = load_checkpoint(path, map_location=device).eval()
    meta = getattr(model, "checkpoint_meta", None) or {}
    asked = profile.name if isinstance(profile, Profile) else profile
    name = (model.profile or {}).get("name") or asked
    if name is None:
        raise ValueError(f"checkpoint {path} records no feature profile; give --profile")
    if asked and asked != name:
        raise ValueError(f"checkpoint {path} was trained on profile {name!r}, not {asked!r}")
    resolved = (profile if isinstance(profile, Profile) and profile.resolved else
                as_resolved(name, _own(get_profile(name), weights) or None))
    check_features(resolved, model)
    epoch = f", epoch {meta['epoch']}" if meta.get("epoch") is not None else ""
    info = ModelInfo(f"MS-SL checkpoint {path.name}", f"Trained MS-SL model from `{path}`{epoch}.",
                     meta.get("metrics"), why="chosen with --checkpoint")
    return LoadedModel(model, resolved, info)


def check_features(profile: Profile, model: object) -> None:
    """Refuse a model made for other features than ``profile``'s (ProfileMismatch naming both)."""
    if getattr(model, "profile", None) is not None:  # features of other weights would be meaningless
        try:
            check_identity(profile.identity(), model.profile, "the model")
        except ProfileMismatch as err:
            raise ProfileMismatch(f"{err} Pass the weights the model was made with (--weights).") from None


def _own(profile: Profile, weights: Mapping[str, str]) -> dict[str, str]:
    """The weights that concern this profile's backbones (others are for another profile)."""
    names = {b for b, _ in profile.weights}
    return {b: spec for b, spec in weights.items() if b in names}


def _source(profile: str, weights: Mapping[str, str]) -> str:
    """A profile's model weights in words: those given for its first visual backbone, else its default."""
    recipe = get_profile(profile)
    backbone = recipe.visual[0]
    return weights.get(backbone) or dict(recipe.weights)[backbone]


def _bridge_about(model: TrainingFreeModel) -> str:
    """The page's words for the lite profile's bridge."""
    return ("No PRVR training: EfficientNet-Lite0's ImageNet classes mapped into MiniLM's sentence space, "
            "scored with MS-SL's clip-scale and frame-scale branches. Give `--checkpoint` to use a trained "
            "MS-SL model.")


def _zero_shot_about(model: TrainingFreeModel) -> str:
    """The page's words for a CLIP-family model, naming its weights."""
    return (f"No PRVR training: the image and text embeddings of one CLIP-family model ({model.source}), "
            "scored with MS-SL's clip-scale and frame-scale branches. Give `--checkpoint` to use a trained "
            "MS-SL model.")


# the registry: a profile's JSON (extract/profiles/) and one line here make a model (docs/design.md)
# ZeroGPU seconds a frame (benchmarks/gpu_check.py on an H200, RESULTS "session 31"): lite 3x its measured
# 0.26 ms; clip 4x 3x the default ViT-B/32's 0.77 ms, for a --weights clip= tower up to 4x its cost
register_model(ModelEntry("lite", bridge.BridgeModel, bridge.NAME, _bridge_about, "bridge", 0.001))
register_model(ModelEntry("clip", zero_shot.ZeroShotModel, zero_shot.NAME, _zero_shot_about, "model", 0.01))
register_model(ModelEntry("clip_whole", zero_shot.ZeroShotModel, zero_shot.NAME, _zero_shot_about, "model",
                          0.01))
