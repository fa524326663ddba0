"""The feature extractor the app runs, chosen once at start and handed down as an object.

    extractor = choose_extractor(profile)   # prvr.serve.model_choice: in the main thread, before launch()
    extractor.cost(info)            -> GpuPlan | None  # the GPU seconds a video will ask for (None: no quota)
    extractor.extract(path, info, sha256, work, report) -> VideoFeatures
    with extractor.at_start() as cpu: ...              # start-up work (demo, folder, bucket), no GPU quota

Two kinds: ``InProcess`` (here: ``VideoExtractor`` in this process on the default device, CUDA when
present) and, on ZeroGPU hardware, ``prvr.serve.zerogpu.ZeroGpuExtractor`` (frames prepared on the CPU,
the backbones in GPU slots). ``prvr.serve.model_choice.choose_extractor`` is the only place that picks
(there, not here: ``zerogpu`` builds on this module); nothing below ``serve/`` knows about Spaces.

``report(fraction, words)``: the fraction of the extraction done (0 to 1) and what is happening, in words
("extracting features: 12 of 60 s of video"), called in the caller's thread.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from extract.decode import VideoInfo
from extract.features import VideoFeatures
from extract.pipeline import VideoExtractor
from extract.profiles import Profile

log = logging.getLogger(__name__)

Report = Callable[[float, str], None]  # (fraction of the extraction done, what is happening in words)


class GpuUnavailable(RuntimeError):
    """The GPU was refused (quota, queue) or failed for good; the message is for the person who waits."""


class Extractor(Protocol):
    """What the ingest service asks of an extractor (see the module docstring)."""

    profile: Profile

    def cost(self, info: VideoInfo) -> object | None:
        """The GPU plan of a video (``prvr.serve.zerogpu.GpuPlan``: seconds asked, slots), or None."""

    def extract(self, path: Path, info: VideoInfo | None, sha256: str, work: Path,
                report: Report) -> VideoFeatures:
        """Features of one video; MediaError for unusable media, GpuUnavailable when the GPU is refused.
        ``work``: an empty folder on local disk for temporary files (the caller deletes it)."""

    def at_start(self) -> contextlib.AbstractContextManager[Extractor]:
        """The extractor for start-up work outside any visitor's request, for the length of a block."""

    def quota_words(self) -> str:
        """What an upload asks of a visitor's GPU quota, for the upload page ("": nothing)."""


def seconds_words(done_s: float, total_s: float) -> str:
    """Extraction progress in words: "extracting features: 12 of 60 s of video"."""
    return f"extracting features: {done_s:.0f} of {total_s:.0f} s of video"


class InProcess:
    """``VideoExtractor`` in this process (decoding overlapped with the backbones), no GPU quota."""

    def __init__(self, models: VideoExtractor) -> None:
        self.models = models
        self.profile = models.profile

    def cost(self, info: VideoInfo) -> None:
        """No GPU quota is spent here."""
        return None

    def extract(self, path: Path, info: VideoInfo | None, sha256: str, work: Path,
                report: Report) -> VideoFeatures:
        """``VideoExtractor.extract`` with its progress in words (``work`` is not needed)."""
        def seconds(done_s: float, total_s: float) -> None:
            report(done_s / max(total_s, 1e-9), seconds_words(done_s, total_s))

        return self.models.extract(path, sha256=sha256, info=info, progress=seconds)

    @contextlib.contextmanager
    def at_start(self) -> Iterator[InProcess]:
        """The same models: nothing to spare at start."""
        yield self

    def quota_words(self) -> str:
        """Uploads spend no GPU quota here."""
        return ""
