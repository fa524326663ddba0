"""Which model the app serves, and its extractor, chosen once at start-up; its search kernels prepared.

``load_model(settings)`` is the model factory's (``prvr.models.factory.create_model``) with the app's flags:
a trained MS-SL checkpoint when one is given, else a training-free model: the ``clip`` profile's where its
weights load (a host with hub access, or ``--weights clip=DIR``), else the ``lite`` profile's bridge, with
the reason for the choice (``ModelInfo.why``) in the log and the UI. ``choose_extractor`` picks the feature
extractor (in-process, or ZeroGPU's) for the profile the model reads.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from extract.pipeline import VideoExtractor
from extract.profiles import Profile
from prvr.index import Gallery, GalleryVideo, private_gallery
from prvr.models.factory import LoadedModel, ModelInfo, create_model
from prvr.results.search import search
from prvr.serve.extraction import Extractor, InProcess
from prvr.serve.settings import AppSettings, on_zerogpu

log = logging.getLogger(__name__)

__all__ = ["LoadedModel", "ModelInfo", "choose_extractor", "load_model", "search_device",
           "warm_search_kernels"]


def load_model(settings: AppSettings) -> LoadedModel:
    """The model the flags ask for, on the search device (``create_model``: --checkpoint, else --profile's
    training-free model, else clip where its weights load, else lite); the bridge's class-name embeddings are
    cached in the data dir."""
    return create_model(settings.profile, settings.weight_specs(), settings.checkpoint,
                        device=search_device(), cache_dir=settings.data_dir / "bridge")


def choose_extractor(profile: str | Profile, weights: str | Mapping[str, str] | None = None) -> Extractor:
    """ZeroGPU's extractor on ZeroGPU hardware (``settings.on_zerogpu``), else in-process, for ``profile`` (a
    resolved one, ``LoadedModel.profile``, or a name with ``weights``). Call it in the main thread before
    ``launch()``: on ZeroGPU the models go to (emulated) CUDA now and are moved to the real GPU in each
    slot's worker."""
    if on_zerogpu():
        from prvr.serve.zerogpu import ZeroGpuExtractor  # imports spaces: torch is patched before any model

        log.info("ZeroGPU: uploads are extracted in GPU slots (frames prepared on the CPU first)")
        return ZeroGpuExtractor.build(profile, weights)
    return InProcess(VideoExtractor(profile, weights))


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
