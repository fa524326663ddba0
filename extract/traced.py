"""Text models traced to TorchScript, and kept between processes.

A traced forward runs in C++ without holding Python's GIL (``TextBackbone.trace``). Tracing needs the eager
model, and loading a Hugging Face model costs a start about 2 s, most of it importing its modelling code; a
trace saved once loads in about 0.1 s without that import. So the app keeps the trace in its data dir
(``<data dir>/traced/``, through ``extract.backbones.loaded_once``), and its next starts load it instead of
the model. ``PRVR_TRACED_DIR`` names another folder for every process (several data dirs, or a test session,
sharing one); set empty, nothing is kept.

A file's name is a digest of everything that decides what the trace computes: the backbone, its weights (for
local files and installed packages: each file's name, size and modification time), its token limit and
width, and the torch and transformers versions. Weights named by a hub tag (their content can change under
the same name) and random weights are not kept. A file that does not load is ignored (the model is loaded
and traced again, and the new trace replaces it).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import os
import threading
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from torch import nn

from extract.weights import Weights, files_state

log = logging.getLogger(__name__)

FORMAT = 1  # bumped when what a kept file holds changes
LEFTOVER_S = 600  # a temporary file this old was left by a process that died while saving


class TracedText:
    """A text model traced to TorchScript, called like the model with the tokenizer's tensors; ``keys``: the
    inputs its ``forward`` names (others, which a ``**kwargs`` would swallow, cannot be traced)."""

    def __init__(self, module: torch.jit.ScriptModule, keys: tuple[str, ...]) -> None:
        self.module, self.keys = module, keys

    @classmethod
    def of(cls, model: nn.Module, example: dict[str, torch.Tensor]) -> TracedText:
        """Trace ``model`` on the tokenizer's tensors ``example``."""
        named = inspect.signature(model.forward).parameters
        keys = tuple(k for k in example if k in named and named[k].kind in
                     (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))
        module = torch.jit.trace(model, example_kwarg_inputs={k: example[k] for k in keys}, strict=False)
        return cls(module, keys)

    @classmethod
    def load(cls, path: Path) -> TracedText:
        """A trace ``save`` wrote, on the CPU."""
        sweep(path.parent)
        extra = {"keys.json": ""}
        module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
        return cls(module, tuple(json.loads(extra["keys.json"])))

    def save(self, path: Path) -> None:
        """Write the trace to ``path`` atomically (a temporary file, synced, then renamed over it)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep(path.parent)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            torch.jit.save(self.module, str(tmp), _extra_files={"keys.json": json.dumps(self.keys)})
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def __call__(self, **inputs: torch.Tensor) -> object:
        """The traced model's output (a dict) for the tokenizer's tensors."""
        return self.module(**{k: inputs[k] for k in self.keys})


def sweep(folder: Path) -> None:
    """Remove the temporary files of saves that were killed midway: their process is gone, or they are older
    than ``LEFTOVER_S`` (the process id in their name may have been reused)."""
    for leftover in folder.glob(".*.tmp"):
        with contextlib.suppress(OSError, ValueError, IndexError):  # another process may be sweeping too
            pid = int(leftover.name.split(".")[-3])
            if not _alive(pid) or time.time() - leftover.stat().st_mtime > LEFTOVER_S:
                leftover.unlink()


def _alive(pid: int) -> bool:
    """Whether a process with this id exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        pass
    return True


def traces_dir(default: Path | None) -> Path | None:
    """The folder traces are kept in: ``PRVR_TRACED_DIR`` where set (empty: None), else ``default``."""
    chosen = os.environ.get("PRVR_TRACED_DIR")
    if chosen is None:
        return default
    return Path(chosen).expanduser() if chosen.strip() else None


def cache_path(root: Path | None, name: str, weights: Weights, max_tokens: int, dim: int) -> Path | None:
    """The file in ``root`` a trace of backbone ``name`` with these weights is kept in; None where none is
    kept (no folder, hub or random weights, weights that cannot be read)."""
    if root is None or weights.kind not in ("file", "dir"):
        return None
    try:
        state = files_state(Path(weights.location))
    except OSError:
        return None
    key = [FORMAT, name, weights.identity, state, max_tokens, dim, torch.__version__,
           _version("transformers")]
    return root / f"{name}-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]}.pt"


def _version(package: str) -> str:
    """An installed package's version ("" when it is not installed)."""
    try:
        return version(package)
    except PackageNotFoundError:
        return ""
