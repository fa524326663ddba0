"""Prepared frames on local disk, between the CPU half of extraction and the model half in another process.

``FrameFile.create(path, windows, frame_shape)`` makes one ``.npy`` file of whole windows, (windows, F, S,
S, 3) uint8, memory-mapped; ``fill(stream)`` writes a ``VideoExtractor.frames`` stream into it in order
(run it in a thread) while ``wait(n)`` blocks a consumer until the first ``n`` windows are there. Any
process on the same machine reads a range by the file's path (``read_windows``): a ZeroGPU slot gets a
path and two numbers, never the frames in a pickle, and never opens the video itself.

Size: one 224 px window of one frame is 147 KB, so a 30-minute video at one frame a second is 265 MB; the
file is deleted with its work folder once the video is extracted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np


class FrameFile:
    """A ``.npy`` of prepared windows written in order by one thread, read by window range by anyone."""

    def __init__(self, path: Path, array: np.memmap) -> None:
        self.path, self.array = Path(path), array
        self.written = 0  # windows written so far (a prefix of the file)
        self.done = False  # the writer has stopped (finished, or failed: ``error``)
        self.error: BaseException | None = None
        self._changed = threading.Condition()

    @classmethod
    def create(cls, path: Path, windows: int, frame_shape: tuple[int, ...]) -> FrameFile:
        """A new file for ``windows`` windows of ``frame_shape`` (F, S, S, 3) uint8 frames."""
        array = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(windows, *frame_shape))
        return cls(path, array)

    def fill(self, stream: Iterable[np.ndarray], progress: Callable[[int], None] | None = None,
             stop: threading.Event | None = None) -> None:
        """Write every array of whole windows that ``stream`` yields, in order; ``progress(windows
        written)`` after each; stops early once ``stop`` is set (the consumer gave up). An error of the
        stream is kept for ``wait`` to raise; never raises."""
        batches = iter(stream)
        try:
            for windows in batches:
                if stop is not None and stop.is_set():
                    break
                lo = self.written
                self.array[lo : lo + len(windows)] = windows
                with self._changed:
                    self.written = lo + len(windows)
                    self._changed.notify_all()
                if progress is not None:
                    progress(self.written)
        except BaseException as error:  # handed to the consumer, in its own thread
            with self._changed:
                self.error = error
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # a stopped stream ends its decoding thread now
            with self._changed:
                self.done = True
                self._changed.notify_all()

    def wait(self, windows: int, timeout: float | None = None) -> int:
        """Block until the first ``windows`` windows are written or the writer stopped (or ``timeout``
        seconds passed); the windows written, at most ``windows``. Re-raises the writer's error."""
        with self._changed:
            self._changed.wait_for(lambda: self.written >= windows or self.done, timeout)
            if self.error is not None:
                raise self.error
            return min(self.written, windows)


def read_windows(path: str | Path, lo: int, hi: int) -> np.ndarray:
    """Windows ``lo`` to ``hi`` (exclusive) of a frame file, read into memory (no copy of the rest)."""
    return np.array(np.load(path, mmap_mode="r")[lo:hi])
