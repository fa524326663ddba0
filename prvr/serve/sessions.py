"""One browser session's private uploads: a small index in a temporary directory, deleted with the session."""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from prvr.index import Gallery, ReferenceQueries, private_gallery
from prvr.plural import counted

log = logging.getLogger(__name__)


@dataclass
class SessionGallery:
    """One browser session's private uploads: a small index in a temp dir, deleted with the session."""

    root: Path
    index: Gallery  # over the same model as the shared gallery
    uploads: int = 0  # uploads accepted so far (the per-session limit counts these)

    @property
    def media(self) -> Path:
        """Where the session's playable copies live."""
        return self.root / "media"

    def close(self) -> None:
        """Delete the session's videos and index."""
        log.info("deleting session gallery %s (%s)", self.root, counted(self.uploads, "upload"))
        shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def close_if_any(session: SessionGallery | None) -> None:
        """``gr.State`` delete callback: the state may never have been set."""
        if session is not None:
            session.close()


def open_session(sessions_dir: Path, model, references: ReferenceQueries | None) -> SessionGallery:
    """A new, empty session gallery under ``sessions_dir`` (the built-in index: sessions never persist)."""
    sessions_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="session-", dir=sessions_dir))
    return SessionGallery(root, private_gallery(model, references, root / "index"))
