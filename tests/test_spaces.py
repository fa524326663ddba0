"""ZeroGPU-shaped extraction (extract/zerogpu.py) through the real ``spaces`` package.

The ZeroGPU path runs in a fresh process (tests/zerogpu_stand_in.py): importing ``spaces`` with
``SPACES_ZERO_GPU=true`` patches torch for the whole process. There the call goes through
``spaces.zero.wrappers`` for real (duration, schedule, fork, pickled arguments and results, release) with a
local stand-in for the scheduling client and no GPU.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from extract import zerogpu
from extract.decode import CorruptVideo, TooLong
from extract.pipeline import VideoExtractor
from tests.clips import write_clip

HERE = Path(__file__).resolve().parent


def stand_in(out: Path, *args: str) -> None:
    """Run tests/zerogpu_stand_in.py on "ZeroGPU" in a fresh process, with a timeout."""
    env = dict(os.environ, SPACES_ZERO_GPU="true", SPACES_ZERO_DEVICE_API_URL="http://127.0.0.1:9",
               ZEROGPU_OFFLOAD_DIR=str(out / "offload"), GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, str(HERE / "zerogpu_stand_in.py"), str(out), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # a hang (e.g. OpenMP in the forked worker) fails, never blocks
        os.killpg(proc.pid, signal.SIGKILL)  # the stand-in and its forked worker: its own process group
        _, stderr = proc.communicate()
        pytest.fail(f"the ZeroGPU stand-in did not finish in 120 s:\n{stderr[-4000:]}")
    assert proc.returncode == 0, stderr[-4000:]


@pytest.fixture(scope="module")
def zero(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """Run the stand-in once: its result.json and the folder holding its arrays."""
    out = tmp_path_factory.mktemp("zerogpu")
    stand_in(out)
    return json.loads((out / "result.json").read_text()), out


def test_gpu_call_runs_in_a_forked_worker_with_small_pickled_arguments(zero: tuple[dict, Path]) -> None:
    result, out = zero
    assert result["on_zerogpu"]
    assert result["worker_pid"] != result["main_pid"]  # the rows were computed in the forked worker
    assert len(result["arg_sizes"]) == 1 and result["arg_sizes"][0] < 1 << 20  # one call, well under 1 MB
    # the slot asked for the duration computed from the video's length, and was released as a success
    assert result["slot_calls"] == [["schedule", result["expected_seconds"]], ["release", False]]
    assert 0 < result["expected_seconds"] <= zerogpu.GPU_MAX_SECONDS
    local, slot = np.load(out / "local.npy"), np.load(out / "slot.npy")
    assert slot.shape == local.shape == (6, 1280) and result["slot_start"] == result["local_start"]
    # the same features as in-process extraction (float32 sums in another order: the worker runs 1 thread)
    np.testing.assert_allclose(slot, local, rtol=1e-5, atol=1e-5)
    assert result["slot_sha"]
    # progress streamed out of the worker (spaces' generator wrapper), ending at the whole video
    assert result["progress"] and result["progress"][-1][0] == pytest.approx(result["progress"][-1][1])


def test_an_upload_through_a_gpu_slot_becomes_searchable(zero: tuple[dict, Path]) -> None:
    """The app's upload path under the real wrapper: one slot, the rows from the forked worker, then a
    search on the CPU (no slot) finds the upload."""
    result, _ = zero
    upload = result["upload"]
    assert upload["outcome"]["status"] == "added", upload["outcome"]
    assert "my holiday.mp4" in upload["outcome"]["message"]
    assert [c[0] for c in upload["slot_calls"]] == ["schedule", "release"]
    assert upload["slot_calls"][1][1] is False  # released as a success
    assert upload["worker_pid"] != result["main_pid"]
    assert upload["found"] == [upload["outcome"]["video_id"]] and upload["search_calls"] == []
    assert any(s.startswith("extracting features") for s in upload["stages"])


def test_startup_extraction_runs_in_process_without_a_slot(zero: tuple[dict, Path]) -> None:
    result, out = zero
    assert result["startup_calls"] == [] and result["startup_pid"] == result["main_pid"]
    np.testing.assert_allclose(np.load(out / "startup.npy"), np.load(out / "local.npy"), atol=1e-5)


def test_errors_in_the_worker_reach_the_caller_as_themselves(zero: tuple[dict, Path]) -> None:
    result, _ = zero
    damaged = result["damaged"]
    assert damaged["type"] == "extract.decode.CorruptVideo"  # a MediaError keeps its class and message
    assert damaged["message"] == "damaged.mp4: stand-in damage found inside the GPU worker. Re-encode it."
    assert damaged["pid"] != result["main_pid"]
    assert damaged["calls"][-1] == ["release", True]  # the slot is released as failed
    assert "raised in the GPU worker" in damaged["notes"][0] and "rows_recording_pid" in damaged["notes"][0]
    strange = result["strange"]  # an exception that does not pickle: type and message, not a PicklingError
    assert strange["type"] == "extract.zerogpu.GpuTaskError"
    assert strange["message"].startswith("builtins.RuntimeError: ('an error holding a lock'")
    assert strange["calls"][-1] == ["release", True]
    assert result["unprepared"].startswith("call extract.zerogpu.prepare('paper_test', weights) at start")


def test_after_launch_the_main_process_runs_only_cpu_models(tmp_path: Path) -> None:
    """ZeroGPU's CUDA emulation as it is: models that ``prepare`` put on ``cuda`` are offloaded at launch and
    cannot run in the main process any more; start-up extraction and query encoding still do, on the CPU."""
    stand_in(tmp_path, "emulated")
    result = json.loads((tmp_path / "emulated.json").read_text())
    assert result["emulated_cuda"] and result["param_device"] == "cuda:0" and result["emulated_equal"]
    assert result["packed_bytes"] > 10 << 20  # EfficientNet-Lite0's weights went to the pack
    assert "disk-offloaded" in result["after_pack"]
    assert result["startup_equal"] and result["search_device"] == "cpu" and result["query_shape"][1] == 384


def test_gpu_seconds_grow_with_the_video_and_stop_at_one_slot() -> None:
    for profile in ("lite", "clip", "paper"):
        seconds = [zerogpu.gpu_seconds_for(d, profile) for d in (1, 60, 300, 600, 3600)]
        assert seconds == sorted(seconds) and seconds[-1] == zerogpu.GPU_MAX_SECONDS
        longest = zerogpu.max_video_seconds(profile)
        assert zerogpu.fits_gpu_slot(longest, profile)
        assert not zerogpu.fits_gpu_slot(longest + 2 * zerogpu.get_profile(profile).window_s, profile)
    assert zerogpu.gpu_seconds_for(60, "lite") == 24  # (10 s start + 60 frames x 0.1 s) x 1.5
    assert zerogpu.max_video_seconds("lite") == 700
    zerogpu.check_gpu_slot("short.mp4", 600, "lite")
    with pytest.raises(TooLong, match=r"long.mp4: 20.0 minutes is longer than one GPU slot.*about 12 min"):
        zerogpu.check_gpu_slot("long.mp4", 1200, "lite")


def test_media_errors_pickle_as_themselves() -> None:
    error = CorruptVideo("/x/a.mp4", "it is damaged.", "Re-encode it.")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is CorruptVideo and str(again) == str(error) and again.path == error.path


def test_off_zerogpu_nothing_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """spaces installed but not on ZeroGPU: its decorator is a no-op, extraction is in-process as before."""
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    import spaces

    assert not zerogpu.on_zerogpu() and zerogpu.search_device() is None
    assert zerogpu._gpu_rows_in_slot is zerogpu._gpu_rows  # spaces.GPU returned the function itself
    video = write_clip(tmp_path / "v.mp4", 40, 10)
    calls = []
    monkeypatch.setattr(spaces, "GPU", lambda *a, **k: calls.append(a))  # never consulted per call
    features = zerogpu.extract_video(video, "lite", startup=False)
    again = zerogpu.extract_video(video, "lite", startup=True)
    reference = VideoExtractor("lite", device="cpu").extract(video)
    assert not calls
    np.testing.assert_array_equal(features.features, reference.features)
    np.testing.assert_array_equal(again.features, reference.features)
    assert zerogpu.extractor_for("lite") is zerogpu.prepare("lite")  # one set of models per process
