"""Opening a gallery: the one place that chooses a backend for ``--index`` or a data directory."""

from __future__ import annotations

from pathlib import Path

from prvr.index.gallery import Gallery
from prvr.index.ingest import ReferenceQueries
from prvr.index.qdrant import QdrantIndex
from prvr.index.qdrant_store import QdrantTarget
from prvr.index.schema import SCHEMA_VERSION
from prvr.index.video_index import IndexConfig, VideoIndex


def gallery_dir(data_dir: Path, profile: str, model) -> Path:
    """The built-in index's directory for this model in a data dir: one per model and index schema, so an
    index written by an older release (or for another model) is left alone."""
    return Path(data_dir) / "indexes" / f"{profile}-{model.fingerprint()[:12]}-v{SCHEMA_VERSION}"


def open_gallery(model, references: ReferenceQueries | None, *, url: str | None = None,
                 data_dir: Path | None = None, profile: str = "") -> Gallery:
    """The shared gallery: the Qdrant collection at ``url`` (``qdrant://HOST:PORT/NAME``,
    ``qdrant+local://DIR``) when given, else the built-in index for this model in ``data_dir``; opened, or
    created when there is none. A gallery made for another model, profile or reference bank is refused."""
    if url:
        return QdrantIndex.open_or_create(QdrantTarget.parse(url), model, references=references)
    if data_dir is None:
        raise ValueError("open_gallery needs a Qdrant url or a data directory")
    return VideoIndex.open_or_create(gallery_dir(data_dir, profile, model), model, IndexConfig(), references)
