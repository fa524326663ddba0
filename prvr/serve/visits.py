"""What a browser visit leaves on the server, and when it goes: a session's private gallery shortly after its
tab closes (``ClosedSessions``), Gradio's copy of each upload once it is handled (``discard_upload_copy``).

Gradio keeps a closed session's state for an hour, and ``time_to_live`` counts from the session's start:
without this, a visitor's private uploads would outlive the tab by up to the session's whole lifetime.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

from gradio import Request  # at run time: Gradio reads close_later's hints to hand it the request
from gradio.utils import get_upload_folder

from prvr.serve.sessions import SessionGallery

CLOSED_SESSION_GRACE_S = 120.0  # a closed browser tab's private uploads are deleted this long after


class ClosedSessions:
    """Deletes a browser session's private uploads shortly after its tab closes (Gradio itself keeps a
    closed session's state for an hour, and ``time_to_live`` counts from the session's start)."""

    def __init__(self, grace_s: float = CLOSED_SESSION_GRACE_S) -> None:
        self.grace_s, self._lock = grace_s, threading.Lock()
        self._galleries: dict[str, SessionGallery] = {}

    def track(self, request: Request | None, gallery: SessionGallery | None) -> SessionGallery | None:
        """Remember which browser session owns ``gallery`` (None: shared uploads, nothing to track)."""
        if gallery is not None and request is not None and request.session_hash:
            with self._lock:
                self._galleries[request.session_hash] = gallery
        return gallery

    def galleries(self) -> list[SessionGallery]:
        """The live tracked galleries (those deleted by their time-to-live are forgotten here)."""
        with self._lock:
            for key in [k for k, g in self._galleries.items() if not g.root.exists()]:
                del self._galleries[key]
            return list(self._galleries.values())

    def close_later(self, request: Request) -> None:
        """``demo.unload`` handler: delete the closed session's uploads after the grace period."""
        with self._lock:
            gallery = self._galleries.pop(request.session_hash, None) if request.session_hash else None
        if gallery is not None:
            timer = threading.Timer(self.grace_s, gallery.close)
            timer.daemon = True
            timer.start()


def discard_upload_copy(path: str) -> None:
    """Delete Gradio's cached copy of an upload once handled: the index keeps its own playable copy, and
    Gradio's would otherwise stay until its cache sweep (hours), doubling the disk an upload takes."""
    cache = Path(get_upload_folder()).resolve()
    copy = Path(path).resolve()
    if copy.is_relative_to(cache) and copy.parent != cache:
        copy.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            copy.parent.rmdir()  # Gradio's per-upload folder, once empty
