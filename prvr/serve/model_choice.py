"""Which model the app serves, loaded, and its search kernels prepared at start-up.

``load_model(settings)`` returns a trained MS-SL checkpoint when one is given, else a training-free model:
the ``clip`` profile's where its weights load (a host with hub access, or ``--weights clip=DIR``), else
the ``lite`` profile's bridge, with the reason for the choice (``ModelInfo.why``) in the log and the UI.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from extract.backbones import get_backbone_cfg
from extract.profiles import get_profile
from prvr.index import Gallery, GalleryVideo, private_gallery
from prvr.models import bridge, zero_shot
from prvr.models.checkpoint import load_checkpoint
from prvr.results.search import search
from prvr.serve.settings import AppSettings, on_zerogpu

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelInfo:
    """What the info panel says about the model in use."""

    name: str
    description: str
    metrics: dict | None = None
    why: str = ""  # why this model serves: an explicit flag, or the automatic choice and any fallback


TRAINING_FREE = ("clip", "lite")  # profiles with a training-free model: the first that loads serves


def load_model(settings: AppSettings) -> tuple[object, ModelInfo, str]:
    """(model, its description, feature profile name): the checkpoint if given, else a training-free model.

    With no --profile: ``clip`` where its weights load (a host with hub access, or --weights clip=DIR),
    else ``lite``; a failed load is logged with the model, the cause and the fallback.
    """
    if settings.checkpoint is None:
        return _training_free(settings)
    return _checkpoint(settings)


def _training_free(settings: AppSettings) -> tuple[object, ModelInfo, str]:
    """The clip profile's zero-shot model where it loads (or was asked for), else the lite bridge."""
    choice = settings.profile
    if choice not in (None, *TRAINING_FREE):
        known = " or ".join(map(repr, TRAINING_FREE))
        raise ValueError(f"the training-free models read the {known} profile, not {choice!r}; give a "
                         f"--checkpoint trained on {choice!r}")
    fallback = ""
    if choice in (None, "clip"):
        spec = settings.weight_specs().get("clip")
        try:
            model = zero_shot.ZeroShotModel.from_pretrained(spec, device=search_device())
        except Exception as err:  # any failed load falls back (an explicit choice re-raises)
            if choice == "clip":
                raise
            fallback = (f"the clip profile's model {model_source(spec)} did not load ({err}); serving the "
                        "offline default, the lite profile's bridge, instead")
            log.warning("%s", fallback)
        else:
            why = ("chosen with --profile clip" if choice else
                   "chosen automatically: no --profile was given and the clip profile's weights loaded")
            log.info("model: %s from %s (%s)", zero_shot.NAME, model.source, why)
            about = (f"No PRVR training: the image and text embeddings of one CLIP-family model "
                     f"({model.source}), scored with MS-SL's clip-scale and frame-scale branches. Give "
                     "`--checkpoint` to use a trained MS-SL model.")
            return model, ModelInfo(zero_shot.NAME, about, why=why), zero_shot.PROFILE
    if set(settings.weight_specs()) & {b for b, _ in get_profile(bridge.PROFILE).weights}:
        raise ValueError(f"the {bridge.PROFILE!r} training-free model uses its packaged weights; --weights "
                         "applies to the clip profile or to a checkpoint's profile")
    model = bridge.BridgeModel.from_pretrained(cache_dir=settings.data_dir / "bridge", device=search_device())
    why = "chosen with --profile lite" if choice else f"chosen automatically: {fallback}"
    # the fallback's reason is the warning above, not said twice
    log.info("model: %s (%s)", bridge.NAME, "chosen automatically, as the warning above says" if fallback
             else why)
    about = ("No PRVR training: EfficientNet-Lite0's ImageNet classes mapped into MiniLM's sentence "
             "space, scored with MS-SL's clip-scale and frame-scale branches. Give `--checkpoint` to use "
             "a trained MS-SL model.")
    return model, ModelInfo(bridge.NAME, about, why=why), bridge.PROFILE


def model_source(spec: str | None) -> str:
    """The clip profile's weights in words: the given spec, or the registry's default hub id."""
    return spec or get_backbone_cfg("clip").weights


def profile_weights(settings: AppSettings, profile: str) -> dict[str, str]:
    """The --weights that concern this profile's backbones (others are for another profile)."""
    names = {b for b, _ in get_profile(profile).weights}
    return {b: spec for b, spec in settings.weight_specs().items() if b in names}


def _checkpoint(settings: AppSettings) -> tuple[object, ModelInfo, str]:
    """A trained MS-SL checkpoint and the profile it was trained on."""

    model = load_checkpoint(settings.checkpoint, map_location=search_device()).eval()
    meta = getattr(model, "checkpoint_meta", None) or {}
    profile = (model.profile or {}).get("name") or settings.profile
    if profile is None:
        raise ValueError(f"checkpoint {settings.checkpoint} records no feature profile; give --profile")
    if settings.profile and settings.profile != profile:
        raise ValueError(f"checkpoint {settings.checkpoint} was trained on profile {profile!r}, "
                         f"not {settings.profile!r}")
    epoch = f", epoch {meta['epoch']}" if meta.get("epoch") is not None else ""
    info = ModelInfo(f"MS-SL checkpoint {settings.checkpoint.name}",
                     f"Trained MS-SL model from `{settings.checkpoint}`{epoch}.", meta.get("metrics"),
                     why="chosen with --checkpoint")
    return model, info, profile


def search_device() -> str:
    """Where searches run (the served model, query encoding): the CPU on ZeroGPU (its CUDA is emulated
    outside a GPU slot, and a search must spend no visitor's quota), else CUDA when present. The one
    answer to "which device searches"."""
    return "cpu" if on_zerogpu() else ("cuda" if torch.cuda.is_available() else "cpu")


class OtherThreads(logging.Filter):
    """Passes the records of every thread but the one that made it (concurrent real work still logs)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


def warm_search_kernels(model: object) -> threading.Thread:
    """Compile (first start in a checkout, about a minute on 2 cores) or load the index's numba search
    kernels in a background thread, by searching a throwaway two-video index of random rows of the served
    model's widths. Not a daemon: the interpreter waits for it rather than killing it inside compiled code."""
    visual_dim, text_dim = model.dims

    def run() -> None:
        t0 = time.perf_counter()
        log.info("preparing the search kernels in the background (about a minute on a checkout's first "
                 "start, while numba compiles them; about a second once cached)")
        rng = np.random.default_rng(0)
        quiet = OtherThreads()  # the throwaway index's "indexed 2 videos" is no event of the app's
        logging.getLogger(Gallery.__module__).addFilter(quiet)
        try:
            with tempfile.TemporaryDirectory(prefix="prvr-kernels-") as tmp:
                index = private_gallery(model, None, Path(tmp) / "index")
                videos = []
                for i, n in enumerate((40, 70)):
                    rows = np.abs(rng.normal(size=(n, visual_dim))).astype(np.float32)
                    times = np.arange(n, dtype=np.float64)
                    videos.append(GalleryVideo(f"warm{i}", rows, times, times + 1.0, float(n)))
                index.add(videos)
                search([index], rng.normal(size=(6, text_dim)).astype(np.float32), k=1)
        except Exception:  # only a head start: the first real search compiles instead
            log.exception("warming the search kernels failed; the first search will compile them")
            return
        finally:
            logging.getLogger(Gallery.__module__).removeFilter(quiet)
        log.info("search kernels ready in %.1f s", time.perf_counter() - t0)

    thread = threading.Thread(target=run, name="warm-search-kernels")
    thread.start()
    return thread
