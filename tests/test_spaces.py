"""ZeroGPU extraction (prvr/serve/zerogpu.py): frames prepared on the CPU, the model in GPU slots.

The ZeroGPU path runs in a fresh process (tests/zerogpu_stand_in.py): importing ``spaces`` with
``SPACES_ZERO_GPU=true`` patches torch for the whole process. There the calls go through
``spaces.zero.wrappers`` for real (duration, schedule, fork, pickled arguments and streamed results, a dead
worker, release) with a local stand-in for the scheduling client and no GPU. The slot rule and the
orchestration off ZeroGPU are tested here, in process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from extract.pipeline import VideoExtractor
from extract.profiles import get_profile
from prvr.serve import zerogpu
from prvr.serve.zerogpu import SlotRule, ZeroGpuExtractor
from tests.clips import write_clip

HERE = Path(__file__).resolve().parent
LITE, CLIP = get_profile("lite"), get_profile("clip")


def stand_in(out: Path, *args: str) -> subprocess.Popen:
    """Start tests/zerogpu_stand_in.py on "ZeroGPU" in a fresh process (``finished`` waits for it)."""
    env = dict(os.environ, SPACES_ZERO_GPU="true", SPACES_ZERO_DEVICE_API_URL="http://127.0.0.1:9",
               ZEROGPU_OFFLOAD_DIR=str(out / "offload"), GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")
    return subprocess.Popen([sys.executable, str(HERE / "zerogpu_stand_in.py"), str(out), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finished(proc: subprocess.Popen) -> None:
    """Wait for a stand-in, with a timeout: it must exit 0."""
    try:
        _, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:  # a hang (e.g. OpenMP in the forked worker) fails, never blocks
        os.killpg(proc.pid, signal.SIGKILL)  # the stand-in and its forked workers: its own process group
        _, stderr = proc.communicate()
        pytest.fail(f"the ZeroGPU stand-in did not finish in 300 s:\n{stderr[-4000:]}")
    assert proc.returncode == 0, stderr[-4000:]


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[subprocess.Popen, Path]]]:
    """The frames' stand-in run and the speech's (where the shared real clip is), started together so that
    they overlap; each is waited for by the fixture that reads it, and stopped at the end if it was not."""
    runs = {"frames": tmp_path_factory.mktemp("zerogpu")}
    if NASA.is_file():
        runs["speech"] = tmp_path_factory.mktemp("zerogpu-speech")
    started = {name: (stand_in(out, *(("speech", str(NASA)) if name == "speech" else ())), out)
               for name, out in runs.items()}
    yield started
    for proc, _ in started.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


@pytest.fixture(scope="module")
def zero(stand_ins: dict) -> tuple[dict, Path]:
    """The frames' stand-in run: its result.json and the folder holding its arrays."""
    proc, out = stand_ins["frames"]
    finished(proc)
    return json.loads((out / "result.json").read_text()), out


def in_main(result: dict, events: list) -> list[str]:
    """The recorded events that happened in the main process."""
    return [what for pid, what in events if pid == result["main_pid"]]


def test_slots_run_only_the_model_on_frames_from_a_file(zero: tuple[dict, Path]) -> None:
    """Decoding happens in the main process, the model only in forked workers, which get a path and a
    window range (bytes, not frames) and never open the video; two consecutive slots give the rows of
    in-process extraction."""
    result, out = zero
    run = result["slots"]
    assert result["on_zerogpu"] and result["search_device"] == "cpu"
    assert result["plan"] == [[0, 3], [3, 6]]  # three windows a slot under the test's rule
    assert run["calls"] == [["schedule", 4], ["release", False], ["schedule", 4], ["release", False]]
    assert len(run["arg_sizes"]) == 2 and all(size < 1024 for size in run["arg_sizes"])  # no frames
    opened = [what for _, what in run["events"] if what.startswith("open")]
    embedded = [(pid, what) for pid, what in run["events"] if what.startswith("embed")]
    assert opened and opened == in_main(result, [e for e in run["events"] if e[1].startswith("open")])
    assert len(embedded) == 6 and all(pid != result["main_pid"] for pid, _ in embedded)
    local, slots = np.load(out / "local.npy"), np.load(out / "slots.npy")
    assert slots.shape == local.shape == (6, 1280)
    # the same features as in-process extraction (float32 sums in another order: the worker runs 1 thread)
    np.testing.assert_allclose(slots, local, rtol=1e-5, atol=1e-5)
    # progress streamed from both halves, ending with every window embedded
    fractions = [f for f, _ in run["reports"]]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert "6 of 6 s of video on the GPU (GPU slot 2 of 2" in run["reports"][-1][1]


def test_an_aborted_slot_is_asked_again_from_the_first_window_without_rows(zero: tuple[dict, Path]) -> None:
    """The worker dies in the second slot after its first window's rows came back: spaces answers "GPU task
    aborted", the slot is released as failed, and the next slot asks only for the two windows left."""
    result, out = zero
    run = result["resumed"]
    assert "error" not in run, run.get("error")
    assert run["calls"] == [["schedule", 4], ["release", False], ["schedule", 4], ["release", True],
                            ["schedule", 3], ["release", False]]  # 1 s + 2 frames x 1 s: windows 4 and 5
    np.testing.assert_allclose(np.load(out / "resumed.npy"), np.load(out / "local.npy"), rtol=1e-5, atol=1e-5)


def test_errors_in_the_worker_reach_the_caller_as_themselves(zero: tuple[dict, Path]) -> None:
    result, _ = zero
    damaged = result["damaged"]["error"]
    assert damaged["type"] == "extract.decode.CorruptVideo"  # a MediaError keeps its class and message
    assert damaged["message"] == "damaged.mp4: stand-in damage found inside the GPU worker. Re-encode it."
    assert "raised in the GPU worker" in damaged["notes"][0] and "embed_recording" in damaged["notes"][0]
    assert result["damaged"]["calls"] == [["schedule", 4], ["release", True]]  # not asked again
    strange = result["strange"]  # an exception that does not pickle: type and message, asked again twice
    assert strange["error"]["type"] == "prvr.serve.extraction.GpuUnavailable"
    assert "failed 3 times (builtins.RuntimeError: ('an error holding a lock'" in strange["error"]["message"]
    assert strange["calls"] == [["schedule", 4], ["release", True]] * 3


def test_an_upload_through_a_gpu_slot_becomes_searchable(zero: tuple[dict, Path]) -> None:
    """The app's upload path (assemble chose ZeroGPU's extractor) under the real wrapper: one slot asking
    10 s + 8 frames x 0.05 s, the rows from the forked worker, then a search on the CPU (no slot)."""
    result, _ = zero
    upload = result["upload"]
    assert upload["extractor"] == "ZeroGpuExtractor"
    assert upload["outcome"]["status"] == "added", upload["outcome"]
    assert upload["outcome"]["message"].startswith("my holiday.mp4: added")
    assert ("It asked ZeroGPU for 11 GPU seconds (1 slot of at most 11 s); its words are read on the CPU, "
            "which asks for none.") in upload["outcome"]["message"]  # issue #43: words: none
    assert upload["slot_calls"] == [["schedule", 11], ["release", False]]
    assert all(pid != result["main_pid"] for pid, what in upload["events"] if what.startswith("embed"))
    assert upload["found"] == [upload["outcome"]["video_id"]] and upload["search_calls"] == []
    told = next(i for i, s in enumerate(upload["stages"]) if "will ask ZeroGPU for 11 GPU seconds" in s)
    extracting = next(i for i, s in enumerate(upload["stages"]) if s.startswith("extracting features"))
    assert told < extracting


def test_a_30_minute_upload_is_accepted_and_asks_at_most_180_gpu_seconds(zero: tuple[dict, Path]) -> None:
    """Half an hour of video through the app's upload path, default settings and rule (the model's rows
    stubbed): accepted, in one slot of 12 GPU seconds (10 s of start, 1,800 frames at 0.001 s), told before
    the slot."""
    result, _ = zero
    long = result["long"]
    assert long["outcome"]["status"] == "added", long["outcome"] and long["duration"] == 1800
    asked = [seconds for kind, seconds in long["calls"] if kind == "schedule"]
    assert asked == [12] and sum(asked) <= 180 and max(asked) <= 60
    assert [fail for kind, fail in long["calls"] if kind == "release"] == [False]
    told = next(i for i, t in enumerate(long["timeline"]) if "will ask ZeroGPU for 12 GPU seconds" in t)
    assert told < long["timeline"].index("schedule")


def test_after_launch_the_main_process_runs_only_cpu_models(tmp_path: Path) -> None:
    """ZeroGPU's CUDA emulation as it is: the slots' models go to ``cuda`` and are offloaded at launch, and
    cannot run in the main process any more; start-up extraction (on CPU models released after the start)
    and query encoding still run, on the CPU."""
    finished(stand_in(tmp_path, "emulated"))
    result = json.loads((tmp_path / "emulated.json").read_text())
    assert result["kind"] == "ZeroGpuExtractor"
    assert result["emulated_cuda"] and result["param_device"] == "cuda:0" and result["emulated_equal"]
    assert result["packed_bytes"] > 10 << 20  # EfficientNet-Lite0's weights went to the pack
    assert "disk-offloaded" in result["after_pack"]
    assert result["startup_equal"] and result["start_models_released"]
    assert result["search_device"] == "cpu" and result["query_shape"][1] == 384


# ------------------------------------------------------------------------------------------------ the rule
def test_gpu_seconds_come_from_frames_and_slots_and_any_length_fits() -> None:
    rule = SlotRule()
    for profile in (LITE, CLIP, get_profile("paper")):
        for minutes in (0.05, 1, 10, 30, 60, 240):
            plan = rule.plan(profile, 60 * minutes)
            windows = [w for lo, hi in plan.slots for w in range(lo, hi)]
            assert windows == list(range(len(windows))) and max(plan.seconds) <= rule.slot_s
            frames = len(windows) * profile.frames_per_window
            per_frame = rule.frame_seconds(profile)
            assert plan.total_s >= len(plan.slots) * rule.start_s + frames * per_frame - 1e-6
            assert plan.total_s <= len(plan.slots) * (rule.start_s + 1) + frames * per_frame
    assert zerogpu.minutes_table(LITE) == [(1, 11, 1), (5, 11, 1), (10, 11, 1), (30, 12, 1), (60, 14, 1)]
    assert zerogpu.minutes_table(CLIP) == [(1, 11, 1), (5, 13, 1), (10, 16, 1), (30, 28, 1), (60, 46, 1)]
    half_hour = rule.plan(get_profile("paper"), 1800.0)  # paper: 0.01 s a frame, 5.3 frames a second
    assert half_hour.total_s <= 180 and rule.plan(CLIP, 1800.0).total_s <= 180
    assert half_hour.words() == "116 GPU seconds (2 slots of at most 58 s)"
    with pytest.raises(ValueError, match="cannot hold one window"):
        SlotRule(start_s=60.0).plan(LITE, 10)


def test_slots_resume_after_a_failed_one_off_zerogpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The orchestration in process (spaces not involved): a slot that fails with ZeroGPU's worker error
    after one batch is asked again from the next window; a scheduler refusal (quota) ends the extraction
    with ZeroGPU's words; an extraction that gives up stops decoding."""
    import gradio

    from prvr.serve.extraction import GpuUnavailable

    video = write_clip(tmp_path / "v.mp4", 60, 10)
    rule = SlotRule(start_s=1.0, per_frame_s=(("lite", 1.0),), slot_s=4)
    extractor = ZeroGpuExtractor(VideoExtractor("lite", device="cpu", batch_frames=1),
                                 lambda: VideoExtractor("lite", device="cpu"), rule)
    asked: list[tuple[int, int]] = []
    real = zerogpu._slot_rows

    def failing_once(frames: str, lo: int, hi: int, key: int):
        asked.append((lo, hi))
        for n, item in enumerate(real(frames, lo, hi, key)):
            if (lo, hi) == (3, 6) and n == 1 and len(asked) == 2:
                raise gradio.Error("GPU task aborted", title=zerogpu.WORKER_ERROR, print_exception=False)
            yield item

    monkeypatch.setattr(zerogpu, "_slot_in_gpu", failing_once)
    work = tmp_path / "work"
    work.mkdir()
    features = extractor.extract(video, None, "0" * 64, work, lambda *_: None)
    assert asked == [(0, 3), (3, 6), (4, 6)]  # window 3 came back before the failure: asked from 4
    reference = VideoExtractor("lite", device="cpu").extract(video).features
    np.testing.assert_allclose(features.features, reference, atol=1e-5)

    def refused(frames: str, lo: int, hi: int, key: int):
        raise gradio.Error("You have exceeded your free ZeroGPU quota (4s requested vs. 0s left).",
                           title="ZeroGPU quota exceeded", print_exception=False)
        yield

    monkeypatch.setattr(zerogpu, "_slot_in_gpu", refused)
    with pytest.raises(GpuUnavailable, match=r"ZeroGPU did not run the model: You have exceeded your free"):
        extractor.extract(video, None, "0" * 64, work, lambda *_: None)


def test_off_zerogpu_the_app_extracts_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """spaces installed but not on ZeroGPU: the in-process extractor is chosen, searches use the default
    device, and spaces.GPU is never applied."""
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    from prvr.serve.extraction import InProcess
    from prvr.serve.model_choice import choose_extractor, search_device
    from prvr.serve.settings import on_zerogpu

    assert not on_zerogpu() and search_device() == ("cuda" if __import__("torch").cuda.is_available()
                                                    else "cpu")
    assert zerogpu._slot_in_gpu is zerogpu._slot_rows  # imported off ZeroGPU: never decorated
    extractor = choose_extractor("lite")
    assert isinstance(extractor, InProcess) and extractor.cost(None) is None and extractor.quota_words() == ""
    with extractor.at_start() as start:
        assert start is extractor  # nothing to spare at start in process
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert on_zerogpu() and search_device() == "cpu"  # one answer each, read where asked


def test_gpu_task_wraps_with_spaces_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def work(x: int) -> int:
        return x + 1

    calls = []
    fake = types.SimpleNamespace(GPU=lambda duration: lambda fn: calls.append(duration) or (lambda x: -fn(x)))
    monkeypatch.setitem(sys.modules, "spaces", fake)
    wrapped = zerogpu.gpu_task(work, duration=zerogpu._slot_seconds)
    assert wrapped(1) == -2 and calls == [zerogpu._slot_seconds]


def test_media_errors_pickle_as_themselves() -> None:
    import pickle

    from extract.decode import CorruptVideo

    error = CorruptVideo("/x/a.mp4", "it is damaged.", "Re-encode it.")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is CorruptVideo and str(again) == str(error) and again.path == error.path


def test_clip_towers_for_two_devices_never_move_each_other(tmp_path: Path) -> None:
    """On ZeroGPU the slots' CLIP image tower goes to (emulated) CUDA while the query encoder and the start-up
    extractor stay on the CPU, all from one model loaded once per process: a tower built for one device must
    not move the others ("meta" stands for the GPU here; before, the CPU text tower failed to build, its
    weights moved away by the image tower)."""
    from extract.pipeline import TextEncoder
    from tests.tiny_clip import make_tiny_model

    weights = {"clip": str(make_tiny_model(tmp_path / "clip"))}
    slots = VideoExtractor("clip", weights, device="meta")
    text = TextEncoder("clip", weights, device="cpu")
    start = VideoExtractor("clip", weights, device="cpu")
    assert {p.device.type for p in slots.backbones[0].net.parameters()} == {"meta"}
    assert {p.device.type for p in start.backbones[0].net.parameters()} == {"cpu"}
    assert {p.device.type for p in text.backbone.model.parameters()} == {"cpu"}
    assert text.encode(["a cat"])[0].shape[1] == text.profile.text_dim
    assert start.extract(write_clip(tmp_path / "v.mp4", 30, 10)).features.shape[0] == 3


# ------------------------------------------------------------------------------------------------ speech
NASA = HERE.parents[1] / "shared" / "videos_dev" / "torchcodec__nasa_13013.mp4"  # real narration, 13 s


@pytest.fixture(scope="module")
def zero_speech(stand_ins: dict) -> dict:
    """The stand-in's speech run (issue #43): its speech.json."""
    if "speech" not in stand_ins:
        pytest.skip(f"{NASA} is absent (the project's shared real clips, ../shared, are not here)")
    proc, out = stand_ins["speech"]
    finished(proc)
    return json.loads((out / "speech.json").read_text())


def test_whisper_runs_in_gpu_slots_and_hears_what_it_hears_in_process(zero_speech: dict) -> None:
    """On "ZeroGPU" the app's words reader (--speech-weights a Whisper) runs the model call in a GPU slot:
    the worker gets a path and two numbers, never the audio, and the lines equal the same model's in
    process; the slot asks 10 s + 0.1 s per second of audio (13.056 s: 12 s); silence asks for nothing; /info
    says so."""
    result = zero_speech
    assert result["kind"] == "SlotSpeech"
    assert result["info_speech"].endswith("in ZeroGPU slots (10 s a slot + 0.1 s per second of audio heard)")
    # the upload page's quota lines name both rules (issue #43: they named the frames' only)
    assert result["quota"].startswith(" On this Space the features are extracted on a GPU"), result["quota"]
    assert result["quota"].endswith(" A video's speech, where there is any, asks for more: 10 s a slot + "
                                    "0.1 s per second of audio heard."), result["quota"]
    assert result["lines"] and result["lines"] == result["reference"]
    direct = result["direct"]
    assert result["audio_s"] == pytest.approx(13.056)
    assert direct["calls"] == [["schedule", 12], ["release", False]]
    assert direct["arg_sizes"] and all(size < 1024 for size in direct["arg_sizes"])  # no audio, no features
    generated = [pid for pid, what in direct["events"] if what.startswith("generate")]
    assert len(generated) == 1 and result["main_pid"] not in generated
    assert direct["spent"] == "its speech asked ZeroGPU for 12 GPU seconds (1 slot of at most 12 s)"
    assert result["silence"] == {"lines": 0, "calls": [], "spent": ""}


def test_an_upload_is_told_its_speech_gpu_seconds_as_its_frames(zero_speech: dict) -> None:
    """The upload path: told before it starts what the frames and (at most) the speech will ask, both run in
    slots (frames 11 s, speech 12 s), and the outcome says what the speech asked."""
    upload = zero_speech["upload"]
    outcome = upload["outcome"]
    assert outcome["status"] == "added" and outcome["words"]["state"] == "joined", outcome
    assert "speech" in outcome["words"]["sources"]
    assert ("It asked ZeroGPU for 11 GPU seconds (1 slot of at most 11 s); its speech, where there is any, "
            "up to 12 GPU seconds (1 slot of at most 12 s) more.") in outcome["message"]
    assert "Its speech asked ZeroGPU for 12 GPU seconds (1 slot of at most 12 s)." in outcome["message"]
    assert upload["calls"] == [["schedule", 11], ["release", False], ["schedule", 12], ["release", False]]
    generated = [pid for pid, what in upload["events"] if what.startswith("generate")]
    assert generated and zero_speech["main_pid"] not in generated
    told = next(i for i, s in enumerate(upload["stages"]) if "its speech, where there is any, up to 12" in s)
    assert told < next(i for i, s in enumerate(upload["stages"]) if s.startswith("extracting features"))


def test_speech_slots_are_equal_consecutive_and_fit_60_s() -> None:
    """The speech rule: any length of audio in consecutive equal slots of at most 60 s each (500 s of audio
    a slot at 0.1 s a second after a 10 s start), deeper decoders asking more per second."""
    from prvr.serve.zerogpu_speech import SpeechRule

    rule = SpeechRule()
    for seconds in (0.5, 13.056, 500.0, 501.0, 1800.0, 4 * 3600.0):
        plan = rule.plan(seconds)
        assert plan.slots[0][0] == 0 and plan.slots[-1][1] == pytest.approx(seconds)
        assert all(a[1] == b[0] for a, b in zip(plan.slots, plan.slots[1:], strict=False))
        assert max(plan.seconds) <= 60 and len(plan.slots) == -(-seconds // 500)
    assert rule.plan(1800.0).words() == "220 GPU seconds (4 slots of at most 55 s)"
    assert rule.plan(0.0).slots == ()
    with pytest.raises(ValueError, match="cannot hold any audio"):
        SpeechRule(start_s=60.0).plan(10)


def test_a_process_forked_during_an_index_write_does_not_keep_its_lock(tmp_path: Path) -> None:
    """A GPU worker forked while another thread writes the index (the words of an upload joining it) would
    share the writer's flock for as long as it lives: the fork waits for the write, and later writes go on
    while the child lives."""
    import threading
    import time

    from prvr.index.store import writer_lock

    writing, forked = threading.Event(), []

    def writer() -> None:
        with writer_lock(tmp_path, timeout=5):
            writing.set()
            time.sleep(0.5)

    thread = threading.Thread(target=writer)
    thread.start()
    writing.wait(5)
    began = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: lives on for 3 s, as a ZeroGPU worker outlives its task
        time.sleep(3)
        os._exit(0)
    forked.append(time.monotonic() - began)
    try:
        thread.join()
        with writer_lock(tmp_path, timeout=1):  # the child still lives: it must not hold the lock
            pass
    finally:
        os.waitpid(pid, 0)
    assert forked[0] >= 0.3  # the fork waited for the write to end
