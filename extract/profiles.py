"""Feature profiles: named, versioned recipes (``profiles/*.json``) saying how a video becomes rows.

A profile names the visual backbones whose outputs are concatenated per row, how many frames each sees
in every ``window_s``-second window, the decoded frame size and the text backbone. ``identity()`` is
stored in every feature file, checkpoint and index; two identities that differ mean the features are not
interchangeable (``check_identity`` refuses them, naming both).

JSON layout (open_clip's model_configs): ``{"name", "version", "description", "window_s", "frame_size",
"frame_fit" (optional), "visual": [{"backbone", "frames"}], "text", "max_tokens" (optional)}``. Dimensions
and default weights come from the backbone registry, so a profile cannot disagree with its backbones.

``frame_fit`` says how a frame becomes the backbone's square input:
  ``squash`` (default)  decoded straight to ``frame_size`` x ``frame_size``, the whole frame (``lite``,
                        ``paper``)
  ``crop``              decoded at its display size; the image-text model's own image processor resizes the
                        shortest side and takes the centre crop, as its authors do (``clip``)
  ``whole``             decoded at its display size; the model's processor resizes the whole frame to its
                        square input, keeping the edges (a departure from the reference, ``clip_whole``;
                        off by default until real weights show it helps)
A profile whose fit is not ``squash`` has ``frame_size`` null and records its fit in ``identity()``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from extract.backbones import get_backbone_cfg
from extract.weights import Weights

PROFILE_DIR = Path(__file__).parent / "profiles"
FRAME_FITS = ("squash", "crop", "whole")


class ProfileMismatch(ValueError):
    """Features, checkpoints or indexes made with different profiles."""


@dataclass(frozen=True)
class Profile:
    """How videos and captions become feature rows (docs/design.md, Contract 1)."""

    name: str
    version: int
    visual: tuple[str, ...]  # visual backbones, concatenated per row in this order
    text: str  # text backbone
    window_s: float  # one feature row per window of this many seconds
    visual_dim: int  # row width: sum of the visual backbones' dims
    text_dim: int  # token feature width
    frames: tuple[int, ...]  # frames each visual backbone sees per window (clip backbones: clip_len)
    frame_size: int | None  # squash: frames decoded to frame_size x frame_size; None: at display size
    max_tokens: int  # captions are cut to this many tokens, special tokens included
    weights: tuple[tuple[str, str], ...]  # (backbone, weights identity) for every backbone
    description: str = ""
    frame_fit: str = "squash"  # squash | crop | whole (module docstring)
    # resolved (``extract.pipeline.resolve_profile``): the given weights of its backbones, resolved once
    # (others load their defaults); None: a recipe, not yet resolved. Not in the identity or in equality.
    sources: tuple[tuple[str, Weights], ...] | None = dataclasses.field(default=None, compare=False,
                                                                          repr=False)

    @property
    def frames_per_window(self) -> int:
        """Frames decoded per window; each backbone takes an evenly spread subset of them."""
        return max(self.frames)

    @property
    def fps(self) -> float:
        """Decoded frames per second of video."""
        return self.frames_per_window / self.window_s

    @property
    def resolved(self) -> bool:
        """Whether the weights of this profile are resolved (``extract.pipeline.resolve_profile``)."""
        return self.sources is not None

    def source(self, backbone: str) -> Weights | None:
        """The resolved weights given for ``backbone`` (None: its default)."""
        return dict(self.sources or ()).get(backbone)

    def identity(self) -> dict:
        """JSON-able identity: name, version, dims, backbones, sampling and weights (and the frame fit, where
        it is not the squash every older profile used: their stored identities stay what they were)."""
        fit = {} if self.frame_fit == "squash" else {"frame_fit": self.frame_fit}
        return {"name": self.name, "version": self.version, "visual": list(self.visual), "text": self.text,
                "window_s": self.window_s, "visual_dim": self.visual_dim, "text_dim": self.text_dim,
                "frames": list(self.frames), "frame_size": self.frame_size, "max_tokens": self.max_tokens,
                "weights": dict(self.weights), **fit}

    def with_weights(self, identities: dict[str, str]) -> Profile:
        """The same recipe with other weights (e.g. a local --weights file) for some backbones."""
        unknown = set(identities) - {b for b, _ in self.weights}
        if unknown:
            raise KeyError(f"profile {self.name} has no backbone {sorted(unknown)}")
        # other identities: no longer the resolved sources (resolve_profile sets them again)
        return dataclasses.replace(self, weights=tuple((b, identities.get(b, w)) for b, w in self.weights),
                                   sources=None)


def check_identity(expected: dict, found: dict, what: str) -> None:
    """Raise ProfileMismatch naming both profiles when two identities differ."""
    if json.dumps(expected, sort_keys=True) != json.dumps(found, sort_keys=True):
        diff = sorted(k for k in set(expected) | set(found) if expected.get(k) != found.get(k))
        raise ProfileMismatch(f"{what} was made with feature profile {_describe(found)}, not "
                              f"{_describe(expected)} (they differ in {', '.join(diff)}); features from "
                              "different profiles cannot be mixed: re-extract with one profile.")


def _describe(identity: dict) -> str:
    """'name v<version> (<dims>)' for error messages."""
    return (f"'{identity.get('name')}' v{identity.get('version')} ({identity.get('visual_dim')}-d video, "
            f"{identity.get('text_dim')}-d text, weights {identity.get('weights')})")


def profile_from_dict(spec: dict) -> Profile:
    """Validate a JSON profile spec and derive dims and default weights from the backbone registry."""
    try:
        visual = tuple(v["backbone"] for v in spec["visual"])
        frames = tuple(int(v["frames"]) for v in spec["visual"])
        name, text, window_s = spec["name"], spec["text"], float(spec["window_s"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"profile spec {spec.get('name', spec)!r} lacks field {e}") from e
    cfgs = [get_backbone_cfg(b) for b in visual]
    text_cfg = get_backbone_cfg(text)
    for backbone, cfg, n in zip(visual, cfgs, frames, strict=True):
        if cfg.kind not in ("frame", "clip"):
            raise ValueError(f"profile {name}: {backbone} is a {cfg.kind} backbone, not a visual one")
        if n < 1 or (cfg.kind == "clip" and n != cfg.clip_len):
            needed = cfg.clip_len if cfg.kind == "clip" else ">= 1"
            raise ValueError(f"profile {name}: {backbone} needs {needed} frames per window, got {n}")
    if text_cfg.kind != "text":
        raise ValueError(f"profile {name}: {text} is not a text backbone")
    if window_s <= 0:
        raise ValueError(f"profile {name}: window_s must be positive, got {window_s}")
    fit = spec.get("frame_fit", "squash")
    if fit not in FRAME_FITS:
        raise ValueError(f"profile {name}: frame_fit must be one of {', '.join(FRAME_FITS)}, got {fit!r}")
    if fit != "squash" and (len(cfgs) != 1 or not cfgs[0].sized_by_weights):
        raise ValueError(f"profile {name}: frame_fit {fit!r} needs one image-text backbone (its own image "
                         f"processor prepares the frames), not {', '.join(visual)}")
    frame_size = None if fit != "squash" else int(spec.get("frame_size", 224))
    weights = tuple((b, get_backbone_cfg(b).weights) for b in (*visual, text))
    return Profile(name, int(spec.get("version", 1)), visual, text, window_s, sum(c.dim for c in cfgs),
                   text_cfg.dim, frames, frame_size, int(spec.get("max_tokens", text_cfg.max_tokens)),
                   weights, spec.get("description", ""), fit)


_PROFILES: dict[str, Profile] = {}


def register_profile(source: str | Path | dict) -> Profile:
    """Add a profile from a JSON file or a dict (replacing one with the same name)."""
    spec = source if isinstance(source, dict) else json.loads(Path(source).read_text())
    profile = profile_from_dict(spec)
    _PROFILES[profile.name] = profile
    return profile


def list_profiles() -> list[str]:
    """Names of the registered profiles."""
    return sorted(_PROFILES)


def get_profile(name: str | Profile) -> Profile:
    """A registered profile by name (or a path to a profile JSON file)."""
    if isinstance(name, Profile):
        return name
    if name in _PROFILES:
        return _PROFILES[name]
    if name.endswith(".json") and Path(name).is_file():
        return register_profile(name)
    raise KeyError(f"unknown feature profile {name!r}; known: {', '.join(list_profiles())}")


for _path in sorted(PROFILE_DIR.glob("*.json")):
    register_profile(_path)
