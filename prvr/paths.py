"""Where prvr keeps its files when not told otherwise: one place, so that every cache agrees."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$XDG_CACHE_HOME/prvr/<parts>`` (``~/.cache/prvr/<parts>`` when the variable is unset)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).joinpath("prvr", *parts)


def default_data_dir() -> Path:
    """The app's data directory: ``/data/prvr`` on a host with writable persistent storage (HF Spaces),
    else ``cache_dir()``."""
    if Path("/data").is_dir() and os.access("/data", os.W_OK):
        return Path("/data/prvr")
    return cache_dir()
