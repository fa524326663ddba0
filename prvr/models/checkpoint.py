"""MS-SL checkpoints on disk: our directory format and the official ``model.ckpt`` files.

Our format is a directory holding ``config.json`` (format tag, model config, training options, feature
profile identity, metrics, epoch) and ``model.safetensors`` (the state dict, official parameter names).
An official checkpoint is a torch pickle ``{"model": state_dict, "model_cfg": EasyDict, "epoch"}``, read
with the restricted (``weights_only``) unpickler.

    save_checkpoint(model, path, train=..., profile=..., metrics=..., epoch=...)
    load_checkpoint(path, map_location) -> MSSL       # either format; ``MSSL.from_checkpoint`` calls this
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import OrderedDict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from prvr.models.mssl import MSSL, MSSLConfig

log = logging.getLogger(__name__)

FORMAT, VERSION = "prvr-mssl", 1
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


def save_checkpoint(model: MSSL, path: str | Path, *, train: dict | None = None, profile: dict | None = None,
                    metrics: dict | None = None, epoch: int | None = None) -> None:
    """Write a checkpoint directory (each file atomically: written to a temp name, then renamed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "format_version": VERSION, "model": model.cfg.to_dict(), "train": train,
            "profile": profile if profile is not None else model.profile, "metrics": metrics, "epoch": epoch}
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    with tempfile.NamedTemporaryFile(dir=path, suffix=".tmp", delete=False) as tmp:
        pass
    save_file(weights, tmp.name)
    os.replace(tmp.name, path / WEIGHTS_FILE)
    with tempfile.NamedTemporaryFile("w", dir=path, suffix=".tmp", delete=False) as tmp:
        tmp.write(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    os.replace(tmp.name, path / CONFIG_FILE)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> MSSL:
    """Load our checkpoint directory or an official ``{"model", "model_cfg", "epoch"}`` file."""
    path = Path(path)
    if path.is_dir():
        model = _from_directory(path)
    elif path.is_file():
        ckpt = load_official(path, map_location)
        model = MSSL.from_official(ckpt["model"], ckpt["model_cfg"])
        model.checkpoint_meta = {"train": dict(ckpt["model_cfg"]), "profile": None, "metrics": None,
                                 "epoch": ckpt.get("epoch")}
    else:
        raise FileNotFoundError(f"no checkpoint at {path}")
    log.info("loaded MS-SL checkpoint %s (%s)", path, model.fingerprint()[:12])
    return model.to(map_location)


def _from_directory(path: Path) -> MSSL:
    """Read a directory written by ``save_checkpoint``."""
    config_file, weights_file = path / CONFIG_FILE, path / WEIGHTS_FILE
    for f in (config_file, weights_file):
        if not f.is_file():
            raise FileNotFoundError(f"checkpoint directory {path} lacks {f.name}")
    meta = json.loads(config_file.read_text())
    if meta.get("format") != FORMAT or meta.get("format_version") != VERSION:
        found = f"{meta.get('format')!r} version {meta.get('format_version')}"
        raise ValueError(f"{config_file}: expected format {FORMAT!r} version {VERSION}, got {found}")
    model = MSSL(MSSLConfig.from_dict(meta["model"]))
    model.load_state_dict(load_file(str(weights_file)), strict=True)
    model.profile = meta.get("profile")
    model.checkpoint_meta = {k: meta.get(k) for k in ("train", "profile", "metrics", "epoch")}
    return model


def load_official(path: Path, map_location: str | torch.device = "cpu") -> dict:
    """torch.load an official checkpoint with the restricted (weights_only) unpickler, no easydict needed."""
    # the config is a pickled easydict.EasyDict (a dict subclass); rebuilding it as an OrderedDict keeps the
    # restricted unpickler (no arbitrary code) and works whether or not easydict is installed
    with torch.serialization.safe_globals([(OrderedDict, "easydict.EasyDict")]):
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(ckpt, dict) or not {"model", "model_cfg"} <= set(ckpt):
        keys = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(f"{path}: not an official MS-SL checkpoint (expected keys model, model_cfg; "
                         f"got {keys})")
    ckpt["model_cfg"] = dict(ckpt["model_cfg"])
    return ckpt
