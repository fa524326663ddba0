"""One owner per data dir: an OS lock on ``DATA_DIR/.owner.lock``, held while the app (or a script's
``Predictor``) uses the dir, released on exit or crash (the kernel drops it with the process).

Two processes writing one index and media dir would overwrite each other's updates and sweep each other's
uploads as leftovers; a second one is refused with a message naming the dir and the owning process.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

LOCK_NAME = ".owner.lock"


class DataDirBusy(RuntimeError):
    """Another live process owns the data dir."""


class DataDirLock:
    """An exclusive, non-blocking ``flock`` on the data dir's lock file; the file says who holds it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> DataDirLock:
        """Take the lock or raise ``DataDirBusy`` naming the dir and the owner (pid, since when)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._lock_or_refuse(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "started": time.time(),
                                  "command": _command()}).encode(), 0)
        self._fd = fd
        return self

    def check(self) -> None:
        """Raise ``DataDirBusy`` as ``acquire`` would if a live process holds the lock now; take nothing,
        write nothing (a dir without a lock file is free)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:  # no lock file: free; one that cannot be opened: ``acquire`` reports it, in its place
            return
        self._lock_or_refuse(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def _lock_or_refuse(self, fd: int) -> None:
        """Lock the open lock file ``fd``, or close it and raise ``DataDirBusy`` naming its owner."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            since = (f", running since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(owner['started']))}"
                     if isinstance(owner.get("started"), int | float) else "")
            who = f"process {owner['pid']}" if owner.get("pid") else "another process"
            raise DataDirBusy(f"the data dir {self.data_dir} is already in use by {who}{since}"
                              f"{' (' + owner['command'] + ')' if owner.get('command') else ''}. Stop it, or "
                              "give this one another dir with --data-dir DIR (or PRVR_DATA_DIR).") from None

    def release(self) -> None:
        """Give the lock up (also happens when the process ends, however it ends)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_owner(fd: int) -> dict:
    """What the owner wrote into the lock file ({} when unreadable: it may be writing it right now)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _command() -> str:
    """This process's command line, short (for the refusal message of a second one)."""
    try:
        args = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")
        text = " ".join(" ".join(a.decode(errors="replace").split()) for a in args if a)
    except OSError:
        return ""
    return text if len(text) <= 120 else text[:117] + "..."
