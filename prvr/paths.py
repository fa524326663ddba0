"""Where prvr keeps its files when not told otherwise: one place, so that every cache agrees."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$XDG_CACHE_HOME/prvr/<parts>`` (``~/.cache/prvr/<parts>`` when the variable is unset)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).joinpath("prvr", *parts)


def default_data_dir() -> Path:
    """The app's working directory (index, features, caches): ``cache_dir()`` on local disk, on a Space too.
    Spaces' disk is ephemeral and their persistent storage is a bucket of write-once files, where an index
    that writes in place and locks cannot live: what must survive a restart goes to ``--persist``."""
    return cache_dir()
