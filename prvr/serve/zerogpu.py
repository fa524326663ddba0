"""Extraction on Hugging Face ZeroGPU: the CPU decodes, the GPU slots run only the model.

``ZeroGpuExtractor.extract`` (``prvr.serve.extraction.Extractor``) decodes the sampled frames and cuts them to
the model's input on the Space's CPU, outside any GPU slot, into a frame file (``extract.frames.FrameFile``).
The windows are split into consecutive slots within ZeroGPU's default 60 s (``SlotRule.plan``), each started
as soon as its windows are on disk; the GPU function (``_slot_rows``) reads its window range, runs the
backbones and streams the rows back, never opening the video. A failed or aborted slot is asked for again for
the windows whose rows did not come back (``SlotRule.retries``); ZeroGPU's own refusals end the upload with
its message (``GpuUnavailable``). GPU seconds asked per slot: ``START_SECONDS`` plus the model factory's
seconds per frame (``prvr.models.factory.ModelEntry``) for each frame, told to the visitor first: 3x or
more what ``benchmarks/gpu_check.py`` measured on an H200 (RESULTS.md, session 31). ``_slot_in_gpu`` is
decorated at import (ZeroGPU counts decorated functions before ``launch()``), and start-up work runs on CPU
models built for it (``at_start``): the ``cuda`` models cannot run in the main process after launch.
Speech (Whisper) runs in slots of its own: ``prvr.serve.zerogpu_speech``.
How ``spaces`` 0.51.3 runs a slot: benchmarks/RESULTS.md, "Issue #42: history moved from module docstrings"
(``prvr/serve/zerogpu.py``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import pickle
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import gradio
import numpy as np
import torch

from extract.decode import MediaError, VideoInfo, probe, window_times
from extract.features import VideoFeatures
from extract.frames import FrameFile, read_windows
from extract.pipeline import FrameStream, VideoExtractor, as_resolved
from extract.profiles import Profile, get_profile
from prvr.models.factory import DEFAULT_SECONDS_PER_FRAME, per_frame_table
from prvr.serve.extraction import GpuUnavailable, InProcess, Report, seconds_words
from prvr.serve.settings import on_zerogpu

log = logging.getLogger(__name__)

SLOT_SECONDS = 60  # ZeroGPU's default duration (longer is refused for some visitors): a slot's most
START_SECONDS = 10.0  # per slot: worker fork, CUDA initialisation (0.1 s on an H200), weights to the GPU
WORKER_ERROR = "ZeroGPU worker error"  # spaces' title for a slot that ran and failed or was aborted


@dataclass(frozen=True)
class GpuPlan:
    """The GPU slots one video asks for: window ranges and the seconds each asks for."""

    # [first, end) of each slot: windows of frames, consecutive (seconds of audio for speech, which asks
    # only for the slots where speech is heard: prvr.serve.zerogpu_speech)
    slots: tuple[tuple[int, int], ...] | tuple[tuple[float, float], ...]
    seconds: tuple[int, ...]  # the duration each slot asks ZeroGPU for

    @property
    def total_s(self) -> int:
        """GPU seconds asked for in all."""
        return sum(self.seconds)

    def words(self) -> str:
        """The plan for a person: "28 GPU seconds (1 slot of at most 28 s)"."""
        n = len(self.slots)
        return (f"{self.total_s} GPU seconds ({n} slot{'s' if n > 1 else ''} of at most "
                f"{max(self.seconds)} s)")


@dataclass(frozen=True)
class SlotRule:
    """How many GPU seconds extraction asks for: ``start_s`` per slot plus ``per_frame_s`` per frame, in
    consecutive slots of at most ``slot_s`` each; a failed or aborted slot is asked for again (for the
    windows whose rows did not come back) at most ``retries`` times per video."""

    start_s: float = START_SECONDS
    # (profile name, seconds a frame): the model factory's registry when the rule is made (module docstring)
    per_frame_s: tuple[tuple[str, float], ...] = field(default_factory=per_frame_table)
    default_per_frame_s: float = DEFAULT_SECONDS_PER_FRAME
    slot_s: int = SLOT_SECONDS
    retries: int = 2

    def frame_seconds(self, profile: Profile) -> float:
        """Seconds of slot per decoded frame for this profile."""
        return dict(self.per_frame_s).get(profile.name, self.default_per_frame_s)

    def seconds(self, profile: Profile, windows: int) -> int:
        """The duration one slot asks for to embed ``windows`` windows."""
        frames = windows * profile.frames_per_window
        return math.ceil(self.start_s + frames * self.frame_seconds(profile) - 1e-9)

    def plan(self, profile: Profile, duration_s: float) -> GpuPlan:
        """The slots for a video of ``duration_s`` seconds: as few as fit, of equal size."""
        windows = len(window_times(duration_s, profile.window_s, 1)[0])
        per_window = profile.frames_per_window * self.frame_seconds(profile)
        fit = math.floor((self.slot_s - self.start_s) / per_window + 1e-9)  # windows one slot holds
        if fit < 1:
            raise ValueError(f"a {self.slot_s} s slot cannot hold one window of profile {profile.name}")
        count = math.ceil(windows / fit)
        size = math.ceil(windows / count)
        slots = tuple((lo, min(lo + size, windows)) for lo in range(0, windows, size))
        return GpuPlan(slots, tuple(self.seconds(profile, hi - lo) for lo, hi in slots))


def minutes_table(profile: Profile, rule: SlotRule | None = None,
                  minutes: tuple[float, ...] = (1, 5, 10, 30, 60)) -> list[tuple[float, int, int]]:
    """(minutes, GPU seconds asked, slots) for videos of these lengths (README's quota table)."""
    rule = rule or SlotRule()
    return [(m, (p := rule.plan(profile, 60 * m)).total_s, len(p.slots)) for m in minutes]


# ----------------------------------------------------------------------------- the GPU function
# The slots' models, registered at start in the main process (a forked worker inherits them): a slot is
# called with the key of its extractor, never with the models themselves or the names to build them again.
_SLOTS: dict[int, tuple[VideoExtractor, SlotRule]] = {}
_MAIN_PID = os.getpid()  # the process that imported this module first (a ZeroGPU worker is a fork of it)


class GpuTaskError(RuntimeError):
    """An error inside the GPU worker whose exception could not be carried back as itself."""


@dataclass
class _Failure:
    """An exception raised in the worker, carried back as a value: ZeroGPU would give the caller only its
    class name (only a ``gradio.Error`` is pickled back whole)."""

    pickled: bytes | None  # the exception itself, when it pickles and unpickles
    kind: str
    message: str
    trace: str

    @classmethod
    def of(cls, error: Exception) -> _Failure:
        try:
            blob = pickle.dumps(error)
            pickle.loads(blob)
        except Exception:
            blob = None
        return cls(blob, f"{type(error).__module__}.{type(error).__qualname__}", str(error),
                   "".join(traceback.format_exception(error)))

    def error(self) -> Exception:
        error = pickle.loads(self.pickled) if self.pickled is not None else \
            GpuTaskError(f"{self.kind}: {self.message}")
        error.add_note(f"raised in the GPU worker:\n{self.trace}")
        return error


class WorkerFailure(gradio.Error):
    """Carries a ``_Failure`` out of the GPU worker (spaces pickles a ``gradio.Error`` back whole, other
    exceptions as their class name only) and releases the slot as failed; the caller unwraps it into the
    original exception."""

    def __init__(self, message: str = "", failure: _Failure | None = None) -> None:
        super().__init__(message, print_exception=False)
        self.failure = failure

    @classmethod
    def of(cls, error: Exception) -> WorkerFailure:
        """What a GPU function raises for ``error`` raised in it (``worker_error`` unwraps it)."""
        failure = _Failure.of(error)
        return cls(f"{failure.kind}: {failure.message}", failure)


def one_thread_in_worker() -> None:
    """In a forked worker, torch's CPU ops on one thread: GNU OpenMP is not fork-safe; a multi-threaded CPU
    op that the parent already ran hangs in the child when the forking thread runs it again, unless the
    child uses one thread (docs: environment.md). On a GPU the models do not run OpenMP: it costs nothing
    there. In the main process (off ZeroGPU) nothing changes."""
    if os.getpid() != _MAIN_PID:
        torch.set_num_threads(1)


def _slot_rows(frames: str, lo: int, hi: int, key: int) -> Iterator[tuple[int, np.ndarray]]:
    """The GPU function: the backbones on windows [lo, hi) of the frame file ``frames``; yields ``(first
    window, rows (w, D) float32)`` after each batch (spaces streams yields back as they come). Plain, small
    arguments (a path and three numbers). Raises only ``WorkerFailure``."""
    try:
        one_thread_in_worker()
        models, _ = _SLOTS[key]
        for first in range(lo, hi, models.batch_windows):
            yield first, models.embed(read_windows(frames, first, min(hi, first + models.batch_windows)))
    except Exception as error:
        raise WorkerFailure.of(error) from None


def _slot_seconds(frames: str, lo: int, hi: int, key: int) -> int:
    """``spaces.GPU``'s duration: called with the same arguments as ``_slot_rows``."""
    models, rule = _SLOTS[key]
    return rule.seconds(models.profile, hi - lo)


def gpu_task(fn: Callable, duration: int | Callable) -> Callable:
    """``fn`` under ``spaces.GPU(duration=...)`` (the ``spaces`` package is imported here)."""
    import spaces

    return spaces.GPU(duration=duration)(fn)


# decorated at import, before launch(); off ZeroGPU the function is called as it is (in this process)
_slot_in_gpu = gpu_task(_slot_rows, duration=_slot_seconds) if on_zerogpu() else _slot_rows


# ----------------------------------------------------------------------------- the extractor
class ZeroGpuExtractor:
    """Frames prepared on the CPU, the backbones in GPU slots (see the module docstring)."""

    def __init__(self, models: VideoExtractor, build_cpu: Callable[[], VideoExtractor],
                 rule: SlotRule | None = None) -> None:
        self.models, self.profile, self.rule = models, models.profile, rule or SlotRule()
        self.key = len(_SLOTS)
        _SLOTS[self.key] = (models, self.rule)
        self._build_cpu = build_cpu
        self.start_models: VideoExtractor | None = None  # CPU models, only while ``at_start`` lasts

    @classmethod
    def build(cls, profile: str | Profile, weights: str | Mapping[str, str] | None = None,
              rule: SlotRule | None = None) -> ZeroGpuExtractor:
        """The slots' models on the default device ((emulated) CUDA on ZeroGPU), built now: call in the main
        thread before ``launch()``. ``profile``: a resolved one (the model factory's), or a name with
        ``weights``."""
        profile = as_resolved(profile, weights, get_profile(profile).visual)  # once, for both sets of models
        return cls(VideoExtractor(profile), lambda: VideoExtractor(profile, device="cpu"), rule)

    def cost(self, info: VideoInfo) -> GpuPlan:
        """The slots and GPU seconds this video will ask for."""
        return self.rule.plan(self.profile, info.duration)

    def quota_words(self) -> str:
        """The rule with examples, for the upload page: " Each video asks ZeroGPU for ... "."""
        examples = ", ".join(f"{s} s for {m:g} minute{'s' if m > 1 else ''}"
                             for m, s, _ in minutes_table(self.profile, self.rule, (1, 10, 30)))
        return (f" On this Space the features are extracted on a GPU, which spends your daily ZeroGPU quota "
                f"(5 minutes with a free account, 40 with PRO): a video asks for {examples} of video; you "
                "are told before it starts.")

    @contextlib.contextmanager
    def at_start(self) -> Iterator[InProcess]:
        """Start-up work runs outside any visitor's request, so in this process, on CPU models built for the
        block and released at its end (they would otherwise hold their memory for the app's life)."""
        self.start_models = self._build_cpu()
        try:
            yield InProcess(self.start_models)
        finally:
            self.start_models = None
            gc.collect()

    def extract(self, path: Path, info: VideoInfo | None, sha256: str, work: Path,
                report: Report) -> VideoFeatures:
        """Decode into a frame file while consecutive GPU slots embed it (see the module docstring)."""
        info = info or probe(path, self.models.limits)
        plan = self.cost(info)
        log.info("%s: %.0f s of video, asking ZeroGPU for %s", Path(path).name, info.duration, plan.words())
        stream = self.models.frames(path, info)
        frames = FrameFile.create(Path(work) / "frames.npy", stream.windows, stream.frame_shape)
        run = _Run(stream, self.profile.visual_dim, plan, frames, report)
        writer = threading.Thread(target=frames.fill, args=(stream,), kwargs={"stop": run.stopped},
                                  name="zerogpu-frames", daemon=True)
        writer.start()
        try:
            for number, (lo, hi) in enumerate(plan.slots, 1):
                hi = run.wait_for(hi)  # fewer windows only at the end of a damaged video
                if hi <= lo:
                    break
                self._slot(frames.path, lo, hi, run, number)
            n = run.wait_for(stream.windows)  # every window written (or the video's damage found)
        finally:
            run.stopped.set()
            writer.join(timeout=30)
        return self.models.features(path, info, run.rows[:n], stream.warnings, sha256)

    def _slot(self, frames: Path, lo: int, hi: int, run: _Run, number: int) -> None:
        """Rows of windows [lo, hi) from GPU slots: asked again from the first window without rows after a
        failed or aborted slot, at most ``rule.retries`` times per video."""
        while lo < hi:
            run.say(f"GPU slot {number} of {len(run.plan.slots)}")
            try:
                for first, rows in _slot_in_gpu(str(frames), lo, hi, self.key):
                    run.rows[first : first + len(rows)] = rows
                    lo = run.gpu_done = first + len(rows)
                    run.say(f"GPU slot {number} of {len(run.plan.slots)}")
            except Exception as error:
                error = worker_error(error)
                if isinstance(error, MediaError):
                    raise error from None
                if not _retryable(error):
                    raise GpuUnavailable(f"ZeroGPU did not run the model: {error_message(error)}") from None
                if run.retries >= self.rule.retries:
                    raise GpuUnavailable(f"the GPU slot failed {run.retries + 1} times "
                                         f"({error_message(error)}); try again later") from None
                run.retries += 1
                log.warning("GPU slot %d ended early (%s); asking again for windows %d-%d (retry %d of %d)",
                            number, error_message(error), lo, hi, run.retries, self.rule.retries)


class _Run:
    """One video's extraction in progress: its rows so far, what is decoded, what the visitor is told."""

    def __init__(self, stream: FrameStream, dim: int, plan: GpuPlan, frames: FrameFile,
                 report: Report) -> None:
        self.stream, self.plan, self.frames, self.report = stream, plan, frames, report
        self.rows = np.zeros((stream.windows, dim), np.float32)
        self.gpu_done = 0  # windows whose rows came back (a prefix: slots run in order)
        self.retries = 0
        self.stopped = threading.Event()  # tells the frame writer to stop (the extraction ended early)
        self.where = "preparing frames on the CPU"

    def wait_for(self, windows: int) -> int:
        """Block until ``windows`` windows are prepared (telling the visitor every quarter second); fewer
        only when the writer stopped early. Raises the writer's error."""
        while self.frames.wait(windows, timeout=0.25) < windows and not self.frames.done:
            self.say(self.where)
        return self.frames.wait(windows)

    def say(self, where: str) -> None:
        """Report both halves: windows prepared on the CPU and windows embedded on the GPU."""
        self.where = where
        decoded, total = self.frames.written, max(self.stream.windows, 1)
        gpu_s, cpu_s = self.stream.seconds_done(self.gpu_done), self.stream.seconds_done(decoded)
        self.report((decoded + self.gpu_done) / (2 * total),
                    f"{seconds_words(gpu_s, self.stream.duration)} on the GPU ({where}; frames prepared on "
                    f"the CPU: {cpu_s:.0f} s; {self.plan.words()} asked)")


def worker_error(error: Exception) -> Exception:
    """The exception raised in the worker, where it came back wrapped in a ``WorkerFailure``."""
    failure = getattr(error, "failure", None)
    return failure.error() if isinstance(failure, _Failure) else error


def error_message(error: Exception) -> str:
    """An error's message for a person (a ``gradio.Error``'s own message, not its repr)."""
    message = getattr(error, "message", None)
    return message if isinstance(message, str) and message else str(error)


def _retryable(error: Exception) -> bool:
    """A slot that ran and failed or was aborted (asked again), not a refusal by the scheduler (quota,
    queue, illegal duration: a ``gradio.Error`` with another title, whose message ends the upload)."""
    return not isinstance(error, gradio.Error) or getattr(error, "title", None) == WORKER_ERROR
