"""Make the PyPI torchvision/pytorchvideo wheels importable on a CPU-only torch.

Imported (through ``import extract``) by every entry point before torchvision, transformers or
pytorchvideo. On a machine where torchvision's compiled extension loads (a matching CUDA or CPU
build) it changes nothing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

import torch

_LIBRARY: torch.library.Library | None = None  # kept alive: dropping it unregisters the schemas


def _torchvision_ops_missing() -> bool:
    """True when torchvision's C++ extension has not registered its operators."""
    try:
        torch.ops.torchvision.nms  # noqa: B018 - attribute lookup is the check
    except (AttributeError, RuntimeError):
        return True
    return False


def _register_placeholder_schemas() -> None:
    """Declare the two op schemas torchvision's fake-op registration assumes exist."""
    global _LIBRARY
    # torchvision.ops registers fake kernels for nms/qnms at import; without a schema that import
    # fails with "operator torchvision::nms does not exist". Declaring the schema (no kernel) lets
    # models and transforms import; calling the ops themselves still fails, which is honest.
    _LIBRARY = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        _LIBRARY.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolve ``torchvision.transforms.functional_tensor`` (removed upstream, still imported by
    pytorchvideo) to its private successor, lazily: nothing is imported until someone asks."""

    OLD, NEW = "torchvision.transforms.functional_tensor", "torchvision.transforms._functional_tensor"

    def find_spec(self, name, path=None, target=None):  # importlib protocol
        if name != self.OLD:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return importlib.import_module(self.NEW)

    def exec_module(self, module) -> None:
        pass


def _load_torchvision_extension() -> None:
    """Try to load torchvision's compiled ops library without importing torchvision itself."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    for folder in spec.submodule_search_locations:
        for lib in sorted(Path(folder).glob("_C*.so")) + sorted(Path(folder).glob("_C*.pyd")):
            try:
                torch.ops.load_library(str(lib))
            except (OSError, RuntimeError):  # built against another torch/CUDA: fix below
                pass
            return


def apply() -> None:
    """Apply the fixes once; safe to call repeatedly."""
    if _LIBRARY is None and "torchvision" not in sys.modules and importlib.util.find_spec("torchvision"):
        if _torchvision_ops_missing():
            _load_torchvision_extension()
        if _torchvision_ops_missing():
            _register_placeholder_schemas()
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())  # appended: a torchvision that still has the module wins


apply()
