"""The on-disk layout of a video index: immutable segments named by an atomically replaced manifest.

```
<index>/manifest.json        format, schema_version, generation, model fingerprint, profile identity, mode,
                             dims, and every live segment: its files (bytes, sha256), its video count and
                             the rows removed from it
<index>/seg-<uuid>/*.npy     one segment per add: per-video arrays, written once, never modified
<index>/seg-<uuid>/videos.json   the segment's video records (id, title, path, duration, sha256, source)
<index>/lock                 writers hold an exclusive flock on it; readers never take it
```

Atomicity: a writer writes a new segment's files, fsyncs them and the directory, then writes the new
manifest to a temporary file, fsyncs it and ``os.replace``s it over ``manifest.json`` (then fsyncs the
directory). A reader reads the manifest once and opens only the segments it names, so a process killed at
any point leaves either the old or the new index; a segment directory that no manifest names is debris of
such a kill and the next writer deletes it. Removals are manifest-only (rows listed as removed); compaction
rewrites live rows into new segment files and swaps the manifest the same way.

Readers take no lock, so a segment that a commit stops naming may still be opened by a reader that read the
manifest just before: the manifest lists such segments under ``retired`` with the time they were retired,
and a writer deletes them only ``RETIRE_GRACE_S`` later (a reader maps its files long before that, and a
mapping outlives the file's deletion).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import mmap
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from prvr.index.schema import SCHEMA_VERSION

log = logging.getLogger(__name__)

FORMAT = "prvr-index"  # the schema version is prvr.index.schema's, one for both backends
MANIFEST, LOCK = "manifest.json", "lock"
RETIRE_GRACE_S = 600.0  # seconds a segment no longer named by the manifest is kept for lock-free readers


class IndexStoreError(RuntimeError):
    """The index directory cannot be used as it is (corrupt, foreign, or locked)."""


class IndexCorruptError(IndexStoreError):
    """A file named by the manifest is missing or differs from what the manifest recorded."""


class IndexLockedError(IndexStoreError):
    """Another writer holds the index lock."""


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (new, renamed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> dict:
    """Write bytes to a new file and fsync it; return its manifest entry (bytes, sha256)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _npy_bytes(array: np.ndarray) -> bytes:
    """The .npy serialisation of an array."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def write_segment(root: Path, arrays: dict[str, np.ndarray], videos: list[dict]) -> dict:
    """Write a new segment directory (durably) and return its manifest entry."""
    name = f"seg-{uuid.uuid4().hex[:16]}"
    directory = root / name
    directory.mkdir()
    files = {f"{key}.npy": _write_durable(directory / f"{key}.npy", _npy_bytes(a))
             for key, a in arrays.items()}
    files["videos.json"] = _write_durable(directory / "videos.json", json.dumps(videos).encode())
    _fsync_dir(directory)
    _fsync_dir(root)
    return {"name": name, "count": len(videos), "removed": [], "files": files}


def commit_manifest(root: Path, manifest: dict, previous: dict | None = None) -> None:
    """Atomically replace the manifest (temp file, fsync, os.replace, fsync the directory); the segments of
    ``previous`` (the manifest it replaces) that it no longer names are listed as retired from now."""
    named, now = {s["name"] for s in manifest["segments"]}, time.time()
    retired = [r for r in (previous or {}).get("retired", [])
               if r["name"] not in named and now - r["since"] < RETIRE_GRACE_S]
    retired += [{"name": s["name"], "since": now} for s in (previous or {}).get("segments", [])
                if s["name"] not in named]
    manifest["retired"] = retired
    tmp = root / f".{MANIFEST}.{uuid.uuid4().hex[:8]}.tmp"
    _write_durable(tmp, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    os.replace(tmp, root / MANIFEST)
    _fsync_dir(root)


def read_manifest(root: Path) -> dict:
    """The current manifest; a clear error when the directory is not an index of this schema."""
    path = root / MANIFEST
    if not path.is_file():
        raise IndexStoreError(f"{root} is not a video index (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise IndexCorruptError(f"{path}: unreadable manifest ({e})") from None
    if manifest.get("format") != FORMAT or manifest.get("schema_version") != SCHEMA_VERSION:
        raise IndexStoreError(
            f"{path}: index format {manifest.get('format')!r} schema {manifest.get('schema_version')}, "
            f"this code reads {FORMAT!r} schema {SCHEMA_VERSION}; rebuild the index")
    return manifest


def file_sha256(path: Path) -> str:
    """Hex sha256 of a stored file."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify_file(path: Path, entry: dict, checksum: bool) -> None:
    """Check a file against its manifest entry (size always, sha256 when asked)."""
    if not path.is_file():
        raise IndexCorruptError(f"{path} is named by the manifest but missing")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise IndexCorruptError(f"{path}: {size} bytes, the manifest recorded {entry['bytes']}")
    if checksum and file_sha256(path) != entry["sha256"]:
        raise IndexCorruptError(f"{path}: sha256 differs from the manifest's (the file was modified)")


class Mapped(NamedTuple):
    """Where a mapped array's data lies: its file's mapping and the data's offset in it (the .npy header)."""

    map: mmap.mmap
    offset: int


def load_segment(root: Path, entry: dict, checksum: bool
                 ) -> tuple[dict[str, np.ndarray], list[dict], dict[str, Mapped]]:
    """A segment's arrays (memory-mapped: pages are read when a query touches them), its video records, and
    each array's mapping (for ``prefetch``)."""
    directory = root / entry["name"]
    for fname, fentry in entry["files"].items():
        verify_file(directory / fname, fentry, checksum)
    arrays, maps = {}, {}
    for fname in entry["files"]:
        if fname.endswith(".npy"):
            mapped = np.load(directory / fname, mmap_mode="r", allow_pickle=False)
            if isinstance(mapped, np.memmap) and mapped._mmap is not None:  # (an empty array maps nothing)
                maps[fname[:-4]] = Mapped(mapped._mmap, mapped.offset)
            # np.asarray drops the memmap subclass (its per-access overhead), keeping the mapping
            arrays[fname[:-4]] = np.asarray(mapped)
    return arrays, read_records(directory), maps


PAGE = mmap.PAGESIZE


def advise(mapping: Mapped, start: int, end: int, advice: int) -> None:
    """Advise the kernel about the byte range [start, end) of a mapped array's data (``mmap.madvise``):
    ``MADV_WILLNEED`` (read it now, in the background: a query that asks for every row it will read first
    then waits for one round of disk reads, not one read per page), ``MADV_POPULATE_READ`` (map its pages into
    the process now) or ``MADV_DONTNEED`` (this process is done with it: its pages leave the process's
    resident memory, not the page cache)."""
    first = (mapping.offset + start) // PAGE * PAGE
    last = min(len(mapping.map), mapping.offset + end)
    if last > first:
        try:
            mapping.map.madvise(advice, first, last - first)
        except (OSError, ValueError):  # advice only: a refusal changes nothing
            pass


def read_records(directory: Path) -> list[dict]:
    """The video records a segment directory stores (``videos.json``)."""
    return json.loads((directory / "videos.json").read_text())


def media_paths(root: Path) -> set[str] | None:
    """The media paths named by every record of a built-in index directory of any schema (every
    ``seg-*/videos.json``, debris and retired segments included: conservative), or None when the directory
    holds something this code cannot list (then nothing it may name should be deleted)."""
    root, paths = Path(root), set()
    files = sorted(root.glob("seg-*/videos.json"))
    if not files and any(p.is_dir() or p.suffix not in (".json", "") for p in root.iterdir()):
        return None
    for records in files:
        try:
            paths |= {v.get("path", "") for v in read_records(records.parent)}
        except (OSError, ValueError, AttributeError):
            log.warning("cannot read %s", records)
            return None
    return paths - {""}


def remove_debris(root: Path, manifest: dict, grace: float = RETIRE_GRACE_S) -> None:
    """Delete segment directories and temp files that the manifest does not name: at once those no manifest
    ever named (left by a killed writer), retired ones ``grace`` seconds after their retirement."""
    named = {s["name"] for s in manifest["segments"]}
    named |= {r["name"] for r in manifest.get("retired", []) if time.time() - r["since"] < grace}
    for p in root.iterdir():
        debris = p.name.startswith("seg-") and p.name not in named
        if debris or (p.name.startswith(f".{MANIFEST}.") and p.name.endswith(".tmp")):
            log.info("removing %s (not named by the manifest: left by an interrupted or superseded write)", p)
            shutil.rmtree(p) if p.is_dir() else p.unlink()


class _ForkGuard:
    """Writer locks and forks of this process exclude each other: a child forked while a writer holds its
    flock holds it too (the descriptor's copy shares the lock) for as long as it lives, and ZeroGPU's GPU
    workers, forked while the words of an upload join, outlive their task: every later write timed out. A
    fork waits for the writers to finish; writers wait while it forks (``os.register_at_fork``)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.writers = 0

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A writer holds its lock inside this block."""
        with self.cond:
            self.writers += 1
        try:
            yield
        finally:
            with self.cond:
                self.writers -= 1
                self.cond.notify_all()

    def before_fork(self) -> None:
        """Wait for the writers, and hold off new ones until the fork is done."""
        self.cond.acquire()
        while self.writers:
            self.cond.wait()

    def after_fork_in_parent(self) -> None:
        """Writers may start again."""
        self.cond.release()

    def after_fork_in_child(self) -> None:
        """The child starts with no writers (its copy of the condition is held by the forking thread)."""
        self.__init__()


_FORKS = _ForkGuard()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_FORKS.before_fork, after_in_parent=_FORKS.after_fork_in_parent,
                        after_in_child=_FORKS.after_fork_in_child)


@contextlib.contextmanager
def writer_lock(root: Path, timeout: float) -> Iterator[None]:
    """Hold the index's exclusive writer lock; IndexLockedError after ``timeout`` seconds of waiting. (No
    fork of this process happens meanwhile: ``_ForkGuard``.)"""
    with _FORKS.writing():
        with _flock(root, timeout):
            yield


@contextlib.contextmanager
def _flock(root: Path, timeout: float) -> Iterator[None]:
    """The writer lock's flock on ``root / LOCK``."""
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise IndexLockedError(f"{root} is being written by another process (lock held for more "
                                           f"than {timeout:g} s); try again when it has finished") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock
