"""benchmarks/gpu_check.py, the GPU measurement script, runs here in its small CPU mode (the CUDA run needs a
GPU machine): every measurement is taken, through the same code paths, and the JSON says what it measured."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from extract.profiles import get_profile


def test_the_quick_cpu_run_measures_every_step(capsys: pytest.CaptureFixture, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import gpu_check
    from prvr.serve.zerogpu import SlotRule

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the run makes its clip and models
    result = gpu_check.main(["--device", "cpu", "--quick", "--seconds", "8"])
    assert not list(tmp_path.glob("gpu_check_*"))  # its clip, frames and models are gone (~600 MB a run)
    assert json.loads(capsys.readouterr().out) == result  # one JSON object on stdout
    assert result["device"] == "cpu" and result["clip"]["seconds"] == 8.0
    for profile in ("lite", "clip"):
        assert result["models"][profile]["frames_per_s"] > 0
        run = result["extraction"][profile]
        assert run["same_rows"] and run["slots"] == 1 and run["model_s_per_frame"] > 0
        assert run["gpu_seconds_asked"] == SlotRule().plan(get_profile(profile), 8.0).total_s
        assert result["rule"]["implied"]["per_frame_s"][profile] == pytest.approx(
            gpu_check.FRAME_MARGIN * run["model_s_per_frame"], abs=1e-4)
    assert result["decode"]["sampled_frames_per_s"] > 0 and result["decode"]["frame_file_mb"] > 0
    assert result["rule"]["in_use"]["per_frame_s"] == dict(SlotRule().per_frame_s)
    assert result["start"]["clip_load_and_first_batch_s"] > 0
