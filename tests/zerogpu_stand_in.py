"""Run ``extract.zerogpu`` through the real ``spaces`` package's ZeroGPU wrapper, with a local stand-in for
the scheduler; run by tests/test_spaces.py in a fresh process (importing ``spaces`` on "ZeroGPU" patches
torch for the whole process).

    SPACES_ZERO_GPU=true SPACES_ZERO_DEVICE_API_URL=http://127.0.0.1:9 \
        python tests/zerogpu_stand_in.py OUT_DIR [emulated]

What is real: ``spaces.GPU`` -> ``spaces.zero.wrappers.regular_function_wrapper`` (duration callable,
``client.schedule`` call, fork of the worker, pickling of the arguments and the result through its queues,
``worker_init`` with ``torch.unpatch``, results and errors carried back, ``client.release``). What stands
in: ``client.schedule/allow/release`` (no ZeroGPU API here) and ``torch.init/move`` (no GPU: the worker
stays on the CPU, so the models are built on the CPU instead of ZeroGPU's emulated ``cuda``); on a CPU
build of torch three CUDA attributes that ``spaces`` reads when it patches torch are given values. Writes
``OUT_DIR/result.json`` and the feature arrays as ``.npy``. The main process runs a multi-threaded 7x7
convolution before the GPU call and the worker runs it again (the GNU OpenMP fork hazard; with spaces'
worker thread it did not hang here even without ``torch.set_num_threads(1)``, but a hang would fail the
test by its timeout rather than block it). With ``emulated``: ``main_emulated`` (ZeroGPU's CUDA
emulation left as it is).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import torch


def not_in_bad_fork() -> bool:
    return False


if torch.version.cuda is None:  # a CPU build (the local stack): spaces reads the CUDA version, saves
    torch.version.cuda = "12.8"  # torch._C._cuda_init (absent) and pickles torch.cuda._is_in_bad_fork
    torch._C._cuda_init = getattr(torch._C, "_cuda_init", lambda: None)  # (a lambda in a CPU build)
    torch.cuda._is_in_bad_fork = not_in_bad_fork
import spaces  # noqa: E402,F401  - before any model, as on a Space: on "ZeroGPU" it patches torch
from spaces.utils import SimpleQueue  # noqa: E402
from spaces.zero import client  # noqa: E402
from spaces.zero import torch as zero_torch  # noqa: E402
from spaces.zero.api import ScheduleResponse  # noqa: E402

MAIN_PID = os.getpid()
OUT = Path(sys.argv[1])
calls: list[tuple] = []  # what the stand-in scheduler saw, in this (the main) process
arg_sizes: list[int] = []  # pickled size of each (args, kwargs) handed to a worker


def schedule(task_id: int, request: object = None, duration: object = None, gpu_size: object = None,
             _first_attempt: bool = True) -> ScheduleResponse:
    calls.append(("schedule", duration.total_seconds() if duration is not None else None))
    return ScheduleResponse(idle=False, nvidiaIndex=0, nvidiaUUID="GPU-stand-in", allowToken="stand-in")


def release(allow_token: str, *, fail: bool = False, allow_404: bool = False) -> None:
    calls.append(("release", fail))


client.schedule, client.release = schedule, release
client.allow = lambda allow_token: None  # called in the worker
zero_torch.init = lambda nvidia_uuid: None  # no GPU here: the worker keeps the CPU
zero_torch.move = lambda callback=None: None
EMULATED = sys.argv[2:] == ["emulated"]
if not EMULATED:
    torch.cuda.is_available = lambda: False  # ... and the main process builds its models on the CPU too

_put = SimpleQueue.put


def measured_put(self: SimpleQueue, obj: object) -> None:
    if os.getpid() == MAIN_PID:  # the parent's puts are the arguments; the worker's are results
        arg_sizes.append(len(pickle.dumps(obj)))
    _put(self, obj)


SimpleQueue.put = measured_put

import extract.pipeline  # noqa: E402
from extract import zerogpu  # noqa: E402
from extract.decode import CorruptVideo  # noqa: E402
from tests.clips import write_clip  # noqa: E402

_rows = extract.pipeline.VideoExtractor.rows


def seven_by_seven() -> None:
    """A CPU op that hangs when a forked child's forking thread reruns it after a multi-threaded run."""
    torch.nn.functional.conv2d(torch.ones(8, 3, 224, 224), torch.ones(64, 3, 7, 7), stride=2)


def rows_recording_pid(self: extract.pipeline.VideoExtractor, path: str, info: object,
                       **kwargs: object) -> tuple:
    """VideoExtractor.rows, which also records the process it ran in (and fails on request)."""
    (OUT / f"pid-{Path(path).stem}.txt").write_text(str(os.getpid()))
    seven_by_seven()  # the OpenMP fork hazard (see the module docstring)
    if "damaged" in Path(path).name:
        raise CorruptVideo(path, "stand-in damage found inside the GPU worker.", "Re-encode it.")
    if "strange" in Path(path).name:
        raise RuntimeError("an error holding a lock", threading.Lock())  # does not pickle
    return _rows(self, path, info, **kwargs)


extract.pipeline.VideoExtractor.rows = rows_recording_pid


def main() -> None:
    video = write_clip(OUT / "clip.mp4", 60, 10)
    result: dict = {"main_pid": MAIN_PID, "on_zerogpu": zerogpu.on_zerogpu()}
    zerogpu.prepare("lite")
    # in-process first: the parent runs multi-threaded torch CPU ops before any fork (the OpenMP hazard)
    local = zerogpu.extractor_for("lite").extract(video)
    torch.set_num_threads(2)
    seven_by_seven()
    np.save(OUT / "local.npy", local.features)

    calls.clear()
    progress: list[tuple[float, float]] = []
    slot = zerogpu.extract_video(video, "lite", progress=lambda done, total: progress.append((done, total)))
    result["progress"] = progress
    np.save(OUT / "slot.npy", slot.features)
    result.update(slot_calls=list(calls), arg_sizes=list(arg_sizes), slot_sha=slot.sha256 == local.sha256,
                  slot_start=slot.start.tolist(), local_start=local.start.tolist(),
                  expected_seconds=zerogpu.gpu_seconds_for(slot.duration, "lite"),
                  worker_pid=int((OUT / "pid-clip.txt").read_text()))

    calls.clear()
    startup = zerogpu.extract_video(video, "lite", startup=True)
    np.save(OUT / "startup.npy", startup.features)
    result.update(startup_calls=list(calls), startup_pid=int((OUT / "pid-clip.txt").read_text()))

    for name in ("damaged", "strange"):
        calls.clear()
        copy = OUT / f"{name}.mp4"
        copy.write_bytes(video.read_bytes())
        try:
            zerogpu.extract_video(copy, "lite")
        except Exception as error:
            result[name] = {"type": f"{type(error).__module__}.{type(error).__name__}", "message": str(error),
                            "notes": getattr(error, "__notes__", []), "calls": list(calls),
                            "pid": int((OUT / f"pid-{name}.txt").read_text())}
        else:
            result[name] = None
    try:
        zerogpu.extract_video(video, "paper_test")  # never prepared
    except RuntimeError as error:
        result["unprepared"] = str(error)
    result["upload"] = upload_through_the_app()
    (OUT / "result.json").write_text(json.dumps(result))


def upload_through_the_app() -> dict:
    """The app's upload path (``prvr.serve.uploads.Uploads``) under the wrapper: the upload is extracted in a
    GPU slot, indexed, and a search (on the CPU, no slot) finds it."""
    from extract.pipeline import TextEncoder
    from prvr.index import IndexConfig, VideoIndex
    from prvr.models.bridge import BridgeModel
    from prvr.results.search import search_text
    from prvr.serve.media import MediaStore
    from prvr.serve.settings import AppSettings
    from prvr.serve.uploads import Uploads

    model = BridgeModel.from_pretrained(device=zerogpu.search_device())
    gallery = VideoIndex.create(OUT / "index", model, IndexConfig())
    settings = AppSettings(data_dir=OUT / "data", host="127.0.0.1")
    uploads = Uploads(settings, "lite", None, gallery, MediaStore(settings.data_dir))
    stages: list[str] = []
    calls.clear()
    source = write_clip(OUT / "upload source.mp4", 80, 10)
    outcome = uploads.add(source, progress=lambda _, stage: stages.append(stage), name="my holiday.mp4")
    slot_calls = list(calls)
    calls.clear()
    text = TextEncoder("lite", device=zerogpu.search_device())
    found = search_text([gallery], "a red screen", text.encode, k=1)
    newest = max(OUT.glob("pid-*.txt"), key=lambda p: p.stat().st_mtime)
    return {"outcome": outcome, "slot_calls": slot_calls, "search_calls": list(calls),
            "worker_pid": int(newest.read_text()), "found": [r["video_id"] for r in found.results],
            "stages": stages}


def main_emulated() -> None:
    """ZeroGPU's CUDA emulation in the main process, untouched: the models of ``prepare`` go to (emulated)
    ``cuda`` and are packed to disk as at ``launch()``; start-up extraction and query encoding, which run in
    the main process, must keep working on their CPU models."""
    from spaces.zero.torch import pack

    from extract.decode import probe
    from extract.pipeline import TextEncoder

    video = write_clip(OUT / "clip.mp4", 60, 10)
    extractor = zerogpu.prepare("lite")
    result = {"emulated_cuda": torch.cuda.is_available(),
              "param_device": str(next(extractor.backbones[0].net.parameters()).device)}
    before = zerogpu.extract_video(video, "lite", startup=True).features
    emulated, _ = extractor.rows(str(video), probe(video))  # before packing: emulated CUDA, CPU data
    result["emulated_equal"] = bool(np.allclose(emulated, before, atol=1e-5))
    result["packed_bytes"] = pack()  # what the patched launch() does first
    try:
        extractor.rows(str(video), probe(video))
        result["after_pack"] = "ran"
    except Exception as error:
        result["after_pack"] = str(error)[:80]
    after = zerogpu.extract_video(video, "lite", startup=True).features
    result["startup_equal"] = bool(np.array_equal(after, before))
    result["search_device"] = zerogpu.search_device()
    encoder = TextEncoder("lite", device=zerogpu.search_device())
    result["query_shape"] = list(encoder.encode(["a cat"])[0].shape)
    (OUT / "emulated.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main_emulated() if EMULATED else main()
