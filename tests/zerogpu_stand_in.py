"""Run ``prvr.serve.zerogpu`` through the real ``spaces`` package's ZeroGPU wrapper, with a local stand-in for
the scheduler; run by tests/test_spaces.py in a fresh process (importing ``spaces`` on "ZeroGPU" patches
torch for the whole process).

    SPACES_ZERO_GPU=true SPACES_ZERO_DEVICE_API_URL=http://127.0.0.1:9 \
        python tests/zerogpu_stand_in.py OUT_DIR [emulated | speech VIDEO]

What is real: ``spaces.GPU`` -> ``spaces.zero.wrappers.generator_function_wrapper`` (duration callable,
``client.schedule`` call, fork of the worker, pickling of the arguments and of every yielded batch of rows
through its queues, ``worker_init`` with ``torch.unpatch``, errors and a dead worker carried back,
``client.release``). What stands in: ``client.schedule/allow/release`` (no ZeroGPU API here) and
``torch.init/move`` (no GPU: the worker stays on the CPU, so the models are built on the CPU instead of
ZeroGPU's emulated ``cuda``); on a CPU build of torch three CUDA attributes that ``spaces`` reads when it
patches torch are given values. The stand-in's scheduler answers ``idle=False``, so every slot runs in a
newly forked worker (ZeroGPU may reuse one).

Recorded, in OUT_DIR: ``result.json`` (what the scheduler saw, the pickled sizes of the arguments, which
process decoded and which embedded, the progress reported) and the feature arrays as ``.npy``. The main
process runs a multi-threaded 7x7 convolution before the GPU calls and the worker runs it again (the GNU
OpenMP fork hazard; a hang fails the test by its timeout rather than blocking it). ``OUT_DIR/mode`` makes
the next embedding in a worker fail: ``damaged`` (a MediaError), ``strange`` (an exception that does not
pickle), ``abort-at N`` (the worker process dies before its N-th embedding call: an aborted slot), ``fast``
(rows from a stub instead of the model, for the 30-minute upload). With ``emulated``: ``main_emulated``
(ZeroGPU's CUDA emulation left as it is). With ``speech VIDEO``: ``main_speech`` (Whisper in GPU slots,
``prvr.serve.zerogpu_speech``), recorded in ``OUT_DIR/speech.json``.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import sys
import tempfile
import threading
import weakref
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
timeline: list[str] = []  # the scheduler's calls and the progress reports, in the order they happened


def schedule(task_id: int, request: object = None, duration: object = None, gpu_size: object = None,
             _first_attempt: bool = True) -> ScheduleResponse:
    calls.append(("schedule", duration.total_seconds() if duration is not None else None))
    timeline.append("schedule")
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

import av  # noqa: E402
import decord  # noqa: E402

from extract.decode import CorruptVideo  # noqa: E402
from extract.pipeline import VideoExtractor  # noqa: E402
from prvr.serve.zerogpu import SlotRule, ZeroGpuExtractor  # noqa: E402
from tests.clips import write_clip  # noqa: E402

_embed, _av_open, _video_reader = VideoExtractor.embed, av.open, decord.VideoReader


def event(text: str) -> None:
    """One line in OUT/events.txt, with the process it happened in."""
    with open(OUT / "events.txt", "a") as f:
        f.write(f"{os.getpid()} {text}\n")


def events() -> list[tuple[int, str]]:
    """The recorded events: (pid, what)."""
    path = OUT / "events.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(pid), what) for pid, what in (line.split(" ", 1) for line in lines)]


def opening_av(file: object, *args: object, **kwargs: object) -> object:
    event(f"open {Path(str(file)).name}")  # every PyAV open (probe, sequential decoding)
    return _av_open(file, *args, **kwargs)


def opening_decord(uri: str, *args: object, **kwargs: object) -> object:
    event(f"open {Path(str(uri)).name}")  # every decord open (random-access decoding)
    return _video_reader(uri, *args, **kwargs)


av.open, decord.VideoReader = opening_av, opening_decord


def seven_by_seven() -> None:
    """A CPU op that hangs when a forked child's forking thread reruns it after a multi-threaded run."""
    torch.nn.functional.conv2d(torch.ones(8, 3, 224, 224), torch.ones(64, 3, 7, 7), stride=2)


CHECKED: set[int] = set()  # the worker processes that ran ``seven_by_seven``


def embed_recording(self: VideoExtractor, windows: np.ndarray) -> np.ndarray:
    """VideoExtractor.embed, which records where it ran and fails as OUT/mode says."""
    counter = OUT / "embeds"
    n = int(counter.read_text() or 0) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    event(f"embed {len(windows)}")
    mode = (OUT / "mode").read_text() if (OUT / "mode").exists() else ""
    if os.getpid() != MAIN_PID:
        if os.getpid() not in CHECKED:  # the OpenMP fork hazard (see the module docstring) strikes at a
            CHECKED.add(os.getpid())  # forked worker's first multi-threaded op: once a worker (a 30-minute
            seven_by_seven()  # upload's 450 batches spent 25 s on it)
        if mode == "damaged":
            raise CorruptVideo("damaged.mp4", "stand-in damage found inside the GPU worker.", "Re-encode it.")
        if mode == "strange":
            raise RuntimeError("an error holding a lock", threading.Lock())  # does not pickle
        if mode == f"abort-at {n}":
            (OUT / "mode").write_text("")  # once
            os._exit(1)  # the worker dies: spaces answers "GPU task aborted"
    if mode == "fast":
        return np.random.default_rng(n).random((len(windows), self.profile.visual_dim), dtype=np.float32)
    return _embed(self, windows)


VideoExtractor.embed = embed_recording


def reset(mode: str = "") -> None:
    """A new run: the failure mode, empty records."""
    (OUT / "mode").write_text(mode)
    (OUT / "embeds").write_text("0")
    (OUT / "events.txt").write_text("")
    calls.clear()
    arg_sizes.clear()
    timeline.clear()


def run(name: str, extractor: ZeroGpuExtractor, video: Path, mode: str = "") -> dict:
    """One extraction through the slots: its features (saved as OUT/<name>.npy) or its error, and what the
    scheduler, the processes and the progress saw."""
    reset(mode)
    reports: list[tuple[float, str]] = []
    out: dict = {}
    with tempfile.TemporaryDirectory(dir=OUT) as work:
        try:
            features = extractor.extract(video, None, "0" * 64, Path(work), lambda *r: reports.append(r))
        except Exception as error:
            out["error"] = {"type": f"{type(error).__module__}.{type(error).__name__}", "message": str(error),
                            "notes": getattr(error, "__notes__", [])}
        else:
            np.save(OUT / f"{name}.npy", features.features)
            out["rows"] = len(features.features)
    return dict(out, calls=list(calls), arg_sizes=list(arg_sizes), events=events(), reports=reports)


def main() -> None:
    from prvr.serve.model_choice import search_device
    from prvr.serve.settings import on_zerogpu

    video = write_clip(OUT / "clip.mp4", 60, 10)  # 6 s: six 1 s windows of the lite profile
    result: dict = {"main_pid": MAIN_PID, "on_zerogpu": on_zerogpu(), "search_device": search_device()}
    # in-process first: the parent runs multi-threaded torch CPU ops before any fork (the OpenMP hazard)
    local = VideoExtractor("lite", device="cpu").extract(video)
    torch.set_num_threads(2)
    seven_by_seven()
    np.save(OUT / "local.npy", local.features)
    # three windows a slot (1 s + 3 frames x 1 s = 4 s asked), one window a batch: two slots of three batches
    rule = SlotRule(start_s=1.0, per_frame_s=(("lite", 1.0),), slot_s=4)
    extractor = ZeroGpuExtractor(VideoExtractor("lite", batch_frames=1),
                                 lambda: VideoExtractor("lite", device="cpu"), rule)
    result["plan"] = [list(s) for s in extractor.rule.plan(extractor.profile, 6.0).slots]
    runs = (("slots", ""), ("resumed", "abort-at 5"), ("damaged", "damaged"), ("strange", "strange"))
    for name, mode in runs:  # abort-at 5: the worker dies before window 4, its slot's second
        result[name] = run(name, extractor, video, mode)
    predictor = app_predictor(OUT / "data")
    result["upload"] = upload_through_the_app(predictor)
    result["long"] = thirty_minutes(predictor)
    (OUT / "result.json").write_text(json.dumps(result))


def app_predictor(data: Path, **options: object):
    """The app's parts on "ZeroGPU" (``assemble`` chooses the extractor: it must be ZeroGPU's; and the words
    reader); ``options``: more of the app's settings."""
    from prvr.models.factory import create_model
    from prvr.serve.bootstrap import assemble
    from prvr.serve.model_choice import search_device
    from prvr.serve.settings import AppSettings

    settings = AppSettings(data_dir=data, host="127.0.0.1", uploads="shared", **options)
    return assemble(settings, create_model("lite", device=search_device()))


def upload_through_the_app(predictor) -> dict:
    """The app's upload path (``Predictor.add_video``, the ingest service) under the wrapper: the upload is
    extracted in a GPU slot, indexed, and a search (on the CPU, no slot) finds it."""
    stages: list[str] = []
    reset()
    source = write_clip(OUT / "upload source.mp4", 80, 10)
    outcome = predictor.add_video(source, progress=lambda _, stage: stages.append(stage),
                                  name="my holiday.mp4")
    slot_calls, worker_events = list(calls), events()
    calls.clear()
    found = predictor.search("a red screen", k=1)
    return {"outcome": outcome, "slot_calls": slot_calls, "search_calls": list(calls),
            "events": worker_events, "found": [r["video_id"] for r in found.results], "stages": stages,
            "extractor": type(predictor.ingest.extractor).__name__}


def thirty_minutes(predictor) -> dict:
    """A 30-minute upload through the app's path with the default rule (the model's rows stubbed: the
    point is what is accepted and asked for): the visitor is told the GPU seconds before the first slot."""
    source = write_clip(OUT / "half an hour.mp4", 1800, 1, size=(32, 24))
    reset("fast")
    outcome = predictor.add_video(source, progress=lambda _, stage: timeline.append(stage),
                                  name="lecture.mp4")
    record = predictor.index.record(outcome["video_id"]) if outcome["video_id"] else None
    return {"outcome": outcome, "calls": list(calls), "timeline": list(timeline),
            "duration": record["duration"] if record else None}


def main_emulated() -> None:
    """ZeroGPU's CUDA emulation in the main process, untouched: the slots' models go to (emulated) ``cuda``
    and are packed to disk as at ``launch()``; start-up extraction and query encoding, which run in the
    main process, must keep working, on CPU models, which are released after the start-up."""
    from spaces.zero.torch import pack

    from extract.decode import probe
    from extract.pipeline import TextEncoder
    from prvr.serve.model_choice import choose_extractor, search_device

    video = write_clip(OUT / "clip.mp4", 60, 10)
    extractor = choose_extractor("lite")
    result = {"emulated_cuda": torch.cuda.is_available(), "kind": type(extractor).__name__,
              "param_device": str(next(extractor.models.backbones[0].net.parameters()).device)}
    with extractor.at_start() as start:
        before = start.models.extract(video).features
        start_models = weakref.ref(start.models)
    del start  # this script's own reference; the extractor must hold none after the block
    gc.collect()
    result["start_models_released"] = start_models() is None and extractor.start_models is None
    emulated, _ = extractor.models.rows(str(video), probe(video))  # before packing: emulated CUDA, CPU data
    result["emulated_equal"] = bool(np.allclose(emulated, before, atol=1e-5))
    result["packed_bytes"] = pack()  # what the patched launch() does first
    try:
        extractor.models.rows(str(video), probe(video))
        result["after_pack"] = "ran"
    except Exception as error:
        result["after_pack"] = str(error)[:80]
    with extractor.at_start() as start:
        after = start.models.extract(video).features
    result["startup_equal"] = bool(np.array_equal(after, before))
    result["search_device"] = search_device()
    encoder = TextEncoder("lite", device=search_device())
    result["query_shape"] = list(encoder.encode(["a cat"])[0].shape)
    (OUT / "emulated.json").write_text(json.dumps(result))


def main_speech(video: Path) -> None:
    """Speech on "ZeroGPU" (issue #43): the app's words reader, made by ``assemble`` with
    ``--speech-weights`` a tiny random Whisper (the real tokenizer), runs Whisper's model call in GPU slots
    through the real wrapper and hears what the same model hears in process; an upload of ``video`` (real
    narration) is told the speech's GPU seconds before it starts and what it asked when its words are in."""
    import time

    from extract.words.audio import RATE, decode_audio
    from extract.words.screen import ScreenSettings
    from extract.words.speech import Whisper
    from tests.full_size_whisper import TINY_WHISPER, make_whisper_base

    folder = make_whisper_base(OUT / "whisper", config=TINY_WHISPER)
    _generate = Whisper.generate

    def generate_recording(self: Whisper, features: dict) -> dict:
        event(f"generate {tuple(features['input_features'].shape)}")
        return _generate(self, features)

    Whisper.generate = generate_recording
    audio = decode_audio(video)
    # random weights: a few tokens tell as much as many (tests/test_whisper_fidelity.py), in seconds
    reference = Whisper(str(folder), device="cpu", local_only=True, max_new_tokens=8).transcribe(audio)
    predictor = app_predictor(OUT / "speech-data", speech_weights=str(folder))
    reader = predictor.ingest.words
    reader.config.screen = ScreenSettings(share=0.01)  # one frame of OCR: its cost is not the point here
    slot = reader.recognizer()
    slot.whisper.generate_kwargs["max_new_tokens"] = 8  # as the reference's (the forked workers inherit it)
    result: dict = {"main_pid": MAIN_PID, "audio_s": len(audio) / RATE, "reference": [
        s.to_dict() for s in reference], "kind": type(slot).__name__,
        "info_speech": predictor.describe()["words"]["models"].get("speech", ""),
        "quota": predictor.gpu_words()}
    reset()
    result["lines"] = [s.to_dict() for s in slot.transcribe(audio)]
    result["direct"] = {"calls": list(calls), "arg_sizes": list(arg_sizes), "events": events(),
                        "spent": slot.spent()}
    reset()
    silent = slot.transcribe(np.zeros(5 * RATE, np.float32))
    result["silence"] = {"lines": len(silent), "calls": list(calls), "spent": slot.spent()}
    reset()
    stages: list[str] = []
    outcome = predictor.add_video(video, progress=lambda _, stage: stages.append(stage), name="webb talk.mp4")
    deadline = time.monotonic() + 120
    while (outcome.get("words") or {}).get("state") == "following" and time.monotonic() < deadline:
        time.sleep(0.25)  # the words follow the pictures on 2 cores (prvr.serve.ingest.words_beside)
        outcome = predictor.upload_outcome(outcome["video_id"]) or outcome
    result["upload"] = {"outcome": outcome, "calls": list(calls), "stages": stages, "events": events()}
    (OUT / "speech.json").write_text(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[2:3] == ["speech"]:
        main_speech(Path(sys.argv[3]))
    else:
        main_emulated() if EMULATED else main()
