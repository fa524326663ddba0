"""Video extraction shaped for Hugging Face ZeroGPU: one module-level GPU function with small arguments.

How ZeroGPU runs a ``@spaces.GPU`` function (``spaces`` 0.51.3, read from its source):

- ``spaces/zero/decorator.py`` ``GPU``/``_GPU``: off ZeroGPU (env ``SPACES_ZERO_GPU`` not true) the
  decorator returns the function itself. On ZeroGPU it wraps it with ``spaces/zero/wrappers.py``
  ``regular_function_wrapper``, or ``generator_function_wrapper`` for generator functions: each yielded
  value is pickled back as it comes, which ``_gpu_rows`` uses to stream progress (coroutines are refused).
- A call (``gradio_handler``) computes ``duration`` (a callable gets the call's own arguments), asks the
  scheduler for a GPU (``spaces/zero/client.py`` ``schedule``: the visitor's quota, identified by the
  Gradio request's ``X-IP-Token`` header, is checked against that duration; a duration above the maximum is
  refused with "ZeroGPU illegal duration"), then pickles ``(args, kwargs)`` into a queue read by a worker
  process ``fork``ed from the main process (``Worker``, kept and reused while idle). The worker calls
  ``client.allow``, un-patches torch, initialises the real CUDA device and moves every tensor that the
  main process put on ``cuda`` onto it (``worker_init``), runs the function in a thread and pickles its
  return value back. A result or argument that does not pickle fails the call (``PicklingError``).
- An exception inside the worker reaches the caller as a ``gr.Error`` whose message is only the exception's
  class name (``exception_result`` / "ZeroGPU worker error"); a dead worker gives "GPU task aborted".
  A ``gr.Error`` is pickled back whole, so ``_gpu_rows`` raises only ``WorkerFailure`` (a ``gr.Error``
  carrying the original exception) and ``extract_video`` re-raises the original (a ``MediaError`` keeps
  its class and its message for the user).
- A call outside a Gradio request has no request, so no visitor token: it is scheduled all the same, as a
  token-less call (whose over-quota refusal reads "Space app has reached its GPU limit"), and before
  ``launch()`` even ZeroGPU's start-up report (``spaces/zero/__init__.py`` ``startup``, run by the patched
  ``gr.Blocks.launch``) has not been sent and the models are not packed. Start-up indexing therefore
  never goes through ``spaces.GPU``: ``startup=True`` runs it in-process on CPU models.
- Outside ``@spaces.GPU`` the main process runs with CUDA emulated (``spaces/zero/torch/patching.py``):
  ``torch.cuda.is_available()`` is True, tensors moved to ``cuda`` keep their data on the CPU (main thread
  only: the emulation is a thread-local torch function mode) and at ``launch()`` they are packed to disk
  (``pack``), after which running them in the main process fails ("disk-offloaded Tensor"). So the models
  of the GPU function are built once, at start, in the main thread (``prepare``), and everything that runs
  in the main process after launch (text encoding for search, start-up extraction) uses CPU models
  (``search_device``, ``startup=True``).

Public API: ``prepare``, ``extract_video``, ``gpu_seconds_for``, ``fits_gpu_slot``, ``check_gpu_slot``,
``max_video_seconds``, ``on_zerogpu``, ``search_device``, ``extractor_for``, ``forget``,
``GPU_MAX_SECONDS``. Off ZeroGPU (no ``spaces``
package, or ``spaces`` whose decorator is a no-op) ``extract_video`` is ``VideoExtractor(profile,
weights).extract`` in-process on the default device (CUDA when present), exactly as before.

GPU seconds per video (``gpu_seconds_for``), against a visitor's daily ZeroGPU quota (free account 5 min
= 300 s, PRO 40 min = 2,400 s, unauthenticated 2 min). The quota is checked against the *requested*
duration and charged for the time the call really took. Requested, with the estimates below (0.1 s a
sampled frame for ``lite`` and ``clip``, one frame a second, plus 10 s of start, times 1.5): a 1-minute
video 24 s (a free visitor can start about 12 a day, PRO about 100); a 5-minute video 60 s (free 5, PRO
40); the longest video one slot of ``GPU_MAX_SECONDS`` = 120 s accepts is ``max_video_seconds`` = 700 s
(11.7 min), 2 a day for a free visitor and 20 for PRO. Inside the slot the video is decoded on the Space's
CPU while the GPU runs the models, so the cost per frame is the decoding: measured on this project's
2-core CPU machine at 12-16 ms a sampled frame for 270p-480p H.264 and 80-160 ms for 1080p (decord,
frames resized to 224 px); GPU inference (EfficientNet-Lite0, CLIP ViT-B/32: under 5 ms a frame at
batch 32 on an H200 or RTX Pro 6000) is an *estimate*: no ZeroGPU hardware was available to measure it.
Hence the 1.5x margin: a slot that runs out is aborted. Note that ``spaces`` itself multiplies the
duration it sends to the scheduler by the hardware's ``duration_factor`` (``spaces/zero/configs.json``:
1.0 on an H200, 1.5 on the RTX Pro 6000 that ZeroGPU now runs; ``client.get_duration_seconds``), so on
that card the quota check sees 1.5x the seconds above.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import queue
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from extract.decode import TooLong, VideoInfo, probe
from extract.features import VideoFeatures
from extract.pipeline import VideoExtractor, gpu_task
from extract.profiles import get_profile

log = logging.getLogger(__name__)

# ZeroGPU does not document its longest allowed duration; Spaces report 120 s as the limit that always
# passes (longer requests are refused for some visitors with "ZeroGPU illegal duration").
GPU_MAX_SECONDS = 120
GPU_START_SECONDS = 10.0  # fork the worker, initialise CUDA, move the weights to the GPU (estimate)
GPU_MARGIN = 1.5  # on top of the estimate: the slot is killed when it runs out
# Seconds of slot time per sampled frame: decoding (measured here: 12-16 ms at 270p-480p, 80-160 ms at
# 1080p a sampled frame, on this project's 2-core CPU machine; it runs on the Space's CPU inside the slot,
# overlapped with inference) or GPU inference (estimated: under 5 ms a frame at batch 32), whichever is
# longer. Profiles not listed (e.g. ``paper``: ResNet-152 + I3D, 16-frame clips) use the default. CPU-only
# cost, for comparison (``benchmarks/extract_speed.py``, RESULTS.md): lite 0.08 s, clip ViT-B/32 0.37 s.
GPU_SECONDS_PER_FRAME = {"lite": 0.1, "clip": 0.1}
GPU_SECONDS_PER_FRAME_DEFAULT = 0.2

WeightsArg = str | Mapping[str, str] | None
_WeightsKey = str | tuple[tuple[str, str], ...] | None

_MAIN_PID = os.getpid()  # the process that imported this module first (a ZeroGPU worker is a fork of it)
_EXTRACTORS: dict[tuple, VideoExtractor] = {}
_LOCK = threading.Lock()


def _reset_lock() -> None:  # a fork taken while another thread held the lock must not inherit it held
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock)


class GpuTaskError(RuntimeError):
    """An error inside the GPU worker whose exception could not be carried back as itself."""


# ----------------------------------------------------------------------------- where we run
def on_zerogpu() -> bool:
    """True on a ZeroGPU Space (``SPACES_ZERO_GPU`` set, as ``spaces`` reads it, and ``spaces`` installed)."""
    if os.environ.get("SPACES_ZERO_GPU", "").lower() not in ("1", "t", "true"):
        return False
    try:
        import spaces  # noqa: F401  - importing it patches torch (CUDA emulation): before any model
    except ImportError:
        return False
    return True


def search_device() -> str | None:
    """The device for everything that runs in the main process after start (query text encoding, the search
    model): ``"cpu"`` on ZeroGPU (models there on ``cuda`` are emulated and offloaded at launch), else None
    (the default: CUDA when present)."""
    return "cpu" if on_zerogpu() else None


# ----------------------------------------------------------------------------- models, once per process
def _weights_key(weights: WeightsArg) -> _WeightsKey:
    if weights is None or isinstance(weights, str):
        return weights
    return tuple(sorted(weights.items()))


def _weights_arg(key: _WeightsKey) -> WeightsArg:
    return dict(key) if isinstance(key, tuple) else key


def extractor_for(profile: str, weights: WeightsArg = None, device: str | None = None) -> VideoExtractor:
    """The process's ``VideoExtractor`` for (profile, weights, device), built on first use and kept."""
    key = (profile, _weights_key(weights), device)
    with _LOCK:
        extractor = _EXTRACTORS.get(key)
        if extractor is None:
            extractor = _EXTRACTORS[key] = VideoExtractor(profile, _weights_arg(key[1]), device=device)
    return extractor


def prepare(profile: str, weights: WeightsArg = None) -> VideoExtractor:
    """Build the extractor that ``extract_video`` uses, at start: on ZeroGPU call it in the main thread
    before ``launch()``, so its models sit on (emulated) ``cuda``, are packed at launch and are moved to the
    real GPU in each worker, instead of being loaded inside every GPU slot. Elsewhere it only warms the
    cache. Returns the extractor (its ``.profile`` carries the weights' identity)."""
    on_zerogpu()  # import spaces first where it is present: torch must be patched before the models
    return extractor_for(profile, weights)


def forget(profile: str, weights: WeightsArg = None, device: str | None = "cpu") -> None:
    """Drop a cached extractor (e.g. the CPU one used for start-up indexing on ZeroGPU, once done)."""
    with _LOCK:
        _EXTRACTORS.pop((profile, _weights_key(weights), device), None)


# ----------------------------------------------------------------------------- GPU seconds
def frames_for(duration_s: float, profile: str = "lite") -> int:
    """Frames sampled from a video of ``duration_s`` seconds (as ``decode.window_times`` places them)."""
    p = get_profile(profile)
    return max(1, int(duration_s / p.window_s + 0.5)) * p.frames_per_window


def _raw_seconds(duration_s: float, profile: str) -> float:
    per_frame = GPU_SECONDS_PER_FRAME.get(get_profile(profile).name, GPU_SECONDS_PER_FRAME_DEFAULT)
    return (GPU_START_SECONDS + frames_for(duration_s, profile) * per_frame) * GPU_MARGIN


def gpu_seconds_for(duration_s: float, profile: str = "lite") -> int:
    """Seconds of GPU slot requested to extract a video of ``duration_s`` seconds, at most GPU_MAX_SECONDS."""
    return min(GPU_MAX_SECONDS, math.ceil(_raw_seconds(duration_s, profile)))


def fits_gpu_slot(duration_s: float, profile: str = "lite") -> bool:
    """Whether one GPU slot (GPU_MAX_SECONDS) is enough for a video of ``duration_s`` seconds."""
    return _raw_seconds(duration_s, profile) <= GPU_MAX_SECONDS


def max_video_seconds(profile: str = "lite") -> float:
    """The longest video (s) that fits one GPU slot, for telling visitors before they upload."""
    p = get_profile(profile)
    per_frame = GPU_SECONDS_PER_FRAME.get(p.name, GPU_SECONDS_PER_FRAME_DEFAULT)
    frames = (GPU_MAX_SECONDS / GPU_MARGIN - GPU_START_SECONDS) / per_frame
    return math.floor(frames / p.frames_per_window + 1e-9) * p.window_s  # whole windows that fit


def check_gpu_slot(path: str | Path, duration_s: float, profile: str = "lite") -> None:
    """Raise ``TooLong`` (a MediaError, message for a person) when the video does not fit one GPU slot."""
    if not fits_gpu_slot(duration_s, profile):
        limit = max_video_seconds(profile)
        raise TooLong(path, f"{duration_s / 60:.1f} minutes is longer than one GPU slot of this Space allows "
                            f"(about {limit / 60:.0f} minutes).", "Cut the video into shorter parts.")


# ----------------------------------------------------------------------------- the GPU function
@dataclass
class _Failure:
    """An exception raised in the worker, carried back as a value (see the module docstring)."""

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


try:  # spaces pickles a gradio.Error raised in the worker back whole (other exceptions: class name only)
    from gradio import Error as _WorkerErrorBase
except ImportError:  # no gradio, hence no spaces: never raised across processes
    _WorkerErrorBase = RuntimeError


class WorkerFailure(_WorkerErrorBase):
    """Carries a ``_Failure`` out of the GPU worker (and releases the slot as failed); ``extract_video``
    unwraps it into the original exception."""

    def __init__(self, message: str = "", failure: _Failure | None = None) -> None:
        if _WorkerErrorBase is RuntimeError:
            super().__init__(message)
        else:
            super().__init__(message, print_exception=False)
        self.failure = failure


def _gpu_rows(path: str, info: VideoInfo, profile: str, weights: _WeightsKey) -> Iterator[tuple]:
    """The GPU function: rows of one video with the process's cached models. Plain, small arguments (a few
    hundred bytes pickled). A generator (spaces streams each yielded value back as it comes): yields
    ``("progress", done_s, total_s)`` after each decoded batch, then ``("rows", rows float32 (n, D),
    warnings)``. Raises only ``WorkerFailure``."""
    try:
        if os.getpid() != _MAIN_PID:
            # a forked worker: GNU OpenMP is not fork-safe; a multi-threaded CPU op that the parent already
            # ran hangs in the child when the forking thread runs it again, unless the child uses one thread
            # (measured here: 7x7 convolution). spaces runs the task in a new thread of the worker, where
            # the op did not hang in our trials; one thread is kept anyway, as the cheap guarantee (on the
            # CPU it costs the worker's extra cores, on a GPU nothing: decoding is not OpenMP).
            torch.set_num_threads(1)
        extractor = extractor_for(profile, _weights_arg(weights))
        updates: queue.SimpleQueue = queue.SimpleQueue()
        outcome: dict = {}

        def run() -> None:  # the extraction reports progress through a callback: turn it into yields
            try:
                outcome["rows"] = extractor.rows(path, info, progress=lambda *update: updates.put(update))
            except BaseException as error:  # re-raised below, in the generator
                outcome["error"] = error
            finally:
                updates.put(None)

        thread = threading.Thread(target=run, name="zerogpu-extract", daemon=True)
        thread.start()
        while (update := updates.get()) is not None:
            yield ("progress", *update)
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        yield ("rows", *outcome["rows"])
    except Exception as error:
        failure = _Failure.of(error)
        raise WorkerFailure(f"{failure.kind}: {failure.message}", failure) from None


def _gpu_duration(path: str, info: VideoInfo, profile: str, weights: _WeightsKey) -> int:
    """``spaces.GPU``'s duration: called with the same arguments as ``_gpu_rows``."""
    return gpu_seconds_for(info.duration, profile)


_gpu_rows_in_slot = gpu_task(_gpu_rows, duration=_gpu_duration)  # decorated at import: before launch()


def extract_video(path: str | Path, profile: str, weights: WeightsArg = None, *, sha256: str | None = None,
                  startup: bool = False, info: VideoInfo | None = None,
                  progress: Callable[[float, float], None] | None = None) -> VideoFeatures:
    """Features of one video, as ``VideoExtractor(profile, weights).extract(path, sha256)``.

    On ZeroGPU: refuses a video longer than one GPU slot (``TooLong``) before asking for a GPU, then runs
    the decoding and the models in a GPU slot sized by ``gpu_seconds_for``. With ``startup=True`` (indexing
    at start, outside any visitor's request) it runs in-process on CPU models instead, spending no GPU
    quota. Off ZeroGPU ``startup`` changes nothing: in-process on the default device.
    ``progress(done_s, total_s)`` is called (in the caller's process) after each decoded batch, also from
    the GPU worker. Raises a MediaError for unusable media (the same class and message as in-process);
    ZeroGPU's own refusals (quota, queue, aborted slot) arrive as ``gradio.Error``. ``info``: the file's
    probe, where the caller has it (probed here otherwise).
    """
    path = Path(path)
    zero = on_zerogpu()
    if not zero:
        return extractor_for(profile, weights).extract(path, sha256=sha256, info=info, progress=progress)
    if startup:
        return extractor_for(profile, weights, device="cpu").extract(path, sha256=sha256, info=info,
                                                                    progress=progress)
    extractor = _EXTRACTORS.get((profile, _weights_key(weights), None))  # here only its profile is read
    if extractor is None:  # building it now (after launch, maybe off the main thread) would not work
        raise RuntimeError(f"call extract.zerogpu.prepare({profile!r}, weights) at start, in the main thread "
                           "and before launch(), on ZeroGPU")
    info = info or probe(path, extractor.limits)
    check_gpu_slot(path, info.duration, profile)
    log.info("%s: %.0f s of video, asking ZeroGPU for %d s", path.name, info.duration,
             gpu_seconds_for(info.duration, profile))
    try:
        for item in _gpu_rows_in_slot(str(path), info, profile, _weights_key(weights)):
            if item[0] == "progress":
                if progress is not None:
                    progress(item[1], item[2])
            else:
                _, rows, warnings = item
    except Exception as error:
        failure = getattr(error, "failure", None)
        if isinstance(failure, _Failure):
            raise failure.error() from None
        raise
    return extractor.features(path, info, rows, warnings, sha256)
