"""Progress that moves: what a person waiting on an upload sees, from the ingest service's stages.

``Progress = (fraction of this video done, stage in words)``. ``LiveProgress`` repeats the latest stage with
the seconds it has taken whenever nothing new came for a second (a slow batch on a busy machine);
``Throttled`` maps an extraction's own progress onto a span of the bar, at most four reports a second.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable

Progress = Callable[[float, str], None]  # (fraction of this video done, stage in words)


class LiveProgress:
    """An upload's progress callback that never goes quiet: whenever ``every`` seconds pass without news
    (a slow batch on a busy machine), the latest stage is reported again with the seconds it has taken, so
    the bar's text moves at least once a second while the seconds of video done move per batch.

    The repeat runs in a thread, in the caller's context (Gradio finds the event's progress bar there).
    """

    def __init__(self, report: Progress, every: float = 1.0) -> None:
        self.report, self.every = report, every
        self.lock = threading.Lock()
        self.latest: tuple[float, str] | None = None
        self.sent = self.stage_t0 = time.monotonic()
        self.context = contextvars.copy_context()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._repeat, name="upload-progress", daemon=True)
        self.thread.start()

    def __call__(self, fraction: float, stage: str) -> None:
        with self.lock:
            now = time.monotonic()
            if self.latest is None or stage.split(":")[0] != self.latest[1].split(":")[0]:
                self.stage_t0 = now  # a new stage (not the same stage's next numbers)
            self.latest, self.sent = (fraction, stage), now
            self.report(fraction, stage)

    def _repeat(self) -> None:
        while not self.stopped.wait(0.2):
            with self.lock:
                now = time.monotonic()
                if self.latest is None or now - self.sent < self.every or self.stopped.is_set():
                    continue
                fraction, stage = self.latest
                self.sent = now
                self.context.run(self.report, fraction, f"{stage} (working: {now - self.stage_t0:.0f} s)")

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


class Throttled:
    """An extraction's ``report(fraction, words)`` as the upload's progress from ``start`` to ``end`` of the
    bar, at most one report per ``every`` seconds (the last one, at 1.0, always goes through)."""

    def __init__(self, report: Progress, start: float = 0.3, end: float = 0.9, every: float = 0.25) -> None:
        self.report, self.start, self.end, self.every = report, start, end, every
        self.last = 0.0

    def __call__(self, fraction: float, words: str) -> None:
        now = time.monotonic()
        if now - self.last < self.every and fraction < 1.0:
            return
        self.last = now
        self.report(min(self.end, self.start + (self.end - self.start) * fraction), words)
