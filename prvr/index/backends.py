"""Opening a gallery: the one place that chooses a store for ``--index`` or a data directory (where the
built-in index of the previous schema is upgraded on first open: ``prvr.index.upgrade``), and makes a
private one (a browser session's uploads, a throwaway warm-up)."""

from __future__ import annotations

from pathlib import Path

from prvr.index import store
from prvr.index.encoding import ReferenceQueries
from prvr.index.gallery import Gallery, gallery_identity
from prvr.index.qdrant import QdrantIndex
from prvr.index.qdrant_store import QdrantTarget
from prvr.index.schema import SCHEMA_VERSION
from prvr.index.upgrade import PREVIOUS, upgraded_into
from prvr.index.video_index import IndexConfig, VideoIndex


def gallery_dir(data_dir: Path, profile: str, model, schema: int = SCHEMA_VERSION) -> Path:
    """The built-in index's directory for this model in a data dir: one per model and index schema, so an
    index written by an older release (or for another model) is left alone."""
    return Path(data_dir) / "indexes" / f"{profile}-{model.fingerprint()[:12]}-v{schema}"


def open_gallery(model, references: ReferenceQueries | None, *, url: str | None = None,
                 data_dir: Path | None = None, profile: str = "") -> Gallery:
    """The shared gallery: the Qdrant collection at ``url`` (``qdrant://HOST:PORT/NAME``,
    ``qdrant+local://DIR``) when given, else the built-in index for this model in ``data_dir``; opened, or
    created when there is none. A gallery made for another model, profile or reference bank is refused."""
    if url:
        return QdrantIndex.open_or_create(QdrantTarget.parse(url), model, references=references)
    if data_dir is None:
        raise ValueError("open_gallery needs a Qdrant url or a data directory")
    root, cfg = gallery_dir(data_dir, profile, model), IndexConfig()
    if not (root / store.MANIFEST).exists():  # a previous release's index of this model: brought over
        identity = gallery_identity(model, references, cfg.mode)
        for schema in PREVIOUS:  # the newest first
            if upgraded_into(gallery_dir(data_dir, profile, model, schema), root,
                             lambda aside: VideoIndex.create(aside, model, cfg, references), identity):
                break
    return VideoIndex.open_or_create(root, model, cfg, references)


def private_gallery(model, references: ReferenceQueries | None, directory: Path) -> Gallery:
    """A new, empty gallery of its own in ``directory`` (the built-in store, which the caller deletes with the
    directory): a browser session's uploads, a throwaway gallery."""
    return VideoIndex.create(directory, model, IndexConfig(), references)
