"""The app's copies of videos: browser-playable files under the data dir, stored by content hash.

A gallery stores a video's path relative to the data dir when the file is inside it (``portable``), so the
data dir can move; ``locate`` turns it back. ``sweep`` deletes what a crash left behind: work dirs of
interrupted uploads and stored files no index names.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from extract.transcode import EncodeSettings, transcode, unplayable_reason
from prvr.index import stored_media_paths
from prvr.plural import counted
from prvr.serve.progress import Progress

log = logging.getLogger(__name__)

KEEP_ALL = {Path("/")}  # what ``referenced`` answers when it cannot tell: delete nothing
# left among the data dir's indexes by a gallery this module cannot list (a Qdrant collection)
SHARED_MARKER = "media-named-by-a-qdrant-collection.txt"


class MediaStore:
    """Playable copies of uploads and folder videos in ``data_dir/media``; paths relative to ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.dir = self.data_dir / "media"

    def portable(self, path: Path) -> str:
        """The path a gallery stores: relative to the data dir when inside it, so the dir can move."""
        path = Path(path).resolve()
        data_dir = self.data_dir.resolve()
        return path.relative_to(data_dir).as_posix() if path.is_relative_to(data_dir) else str(path)

    def locate(self, stored: str) -> Path:
        """The file a stored path names (joins a relative path, keeps an absolute one)."""
        return self.data_dir.resolve() / stored

    @contextlib.contextmanager
    def work(self) -> Iterator[Path]:
        """An empty folder for one video's temporary files (a frame file), deleted after the block (and by
        ``sweep`` after a crash)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="work-", dir=self.dir))
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def store_playable(self, path: Path, sha: str, target_dir: Path, report: Progress) -> tuple[Path, bool]:
        """Copy (or re-encode) a video into ``target_dir`` as ``<sha>.mp4``, whole or not at all (an upload:
        Gradio deletes its own copy): (the stored file, whether it was re-encoded). Playability is judged
        once, here."""
        reason = unplayable_reason(path)
        report(0.1, f"re-encoding to H.264 ({reason})" if reason else "storing")
        target_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="upload-", dir=target_dir))
        try:
            def reencoded(done_s: float, total_s: float) -> None:  # re-encoding: 0.1 -> 0.3 of the upload
                report(min(0.3, 0.1 + 0.2 * done_s / max(total_s, 1e-9)),
                       f"re-encoding to H.264: {done_s:.0f} of {total_s:.0f} s of video")

            playable = path
            if reason:
                log.info("re-encoding %s to H.264 mp4 (%s)", path.name, reason)
                playable = work / f"{path.stem}.mp4"
                transcode(path, playable, EncodeSettings(), progress=reencoded)
            stored = target_dir / f"{sha[:16]}{playable.suffix.lower()}"
            if playable.parent != work:  # already playable: copy it in, then rename (whole or absent)
                playable = Path(shutil.copyfile(playable, work / f"copy{playable.suffix.lower()}"))
            os.replace(playable, stored)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return stored, reason is not None

    def referenced(self, galleries: list, own_index_dir: Path | None) -> set[Path]:
        """Every file in the media dir that a gallery names: the given galleries' videos, and
        (conservatively) any record of the other built-in indexes in the data dir, which may share it."""
        paths = {p for g in galleries for p in g.media_paths()}
        indexes = (self.data_dir / "indexes").glob("*")
        for other in [d for d in indexes if d.is_dir() and d != own_index_dir]:
            if (other / SHARED_MARKER).exists():
                log.info("a Qdrant collection (%s) names files in %s; keeping all media", other.name,
                         self.dir)
                return KEEP_ALL
            named = stored_media_paths(other)
            if named is None:
                log.info("index %s has a layout this release does not read; keeping all media", other)
                return KEEP_ALL
            paths |= named
        return {self.locate(p).resolve() for p in paths if p}

    def sweep(self, keep: set[Path]) -> None:
        """Delete ``upload-*`` and ``work-*`` folders, half-written copies, stored files not in ``keep``."""
        if not self.dir.is_dir() or keep == KEEP_ALL:
            return
        removed = 0
        for work in [*self.dir.glob("upload-*"), *self.dir.glob("work-*")]:
            shutil.rmtree(work, ignore_errors=True)
            removed += 1
        for path in sorted(self.dir.rglob("*"), key=lambda p: -len(p.parts)):  # files before dirs
            if path.is_file() and path.resolve() not in keep:
                path.unlink(missing_ok=True)
                removed += 1
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        if removed:
            log.info("removed %s of interrupted uploads from %s", counted(removed, "leftover"), self.dir)
