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


def test_the_speech_step_measures_whisper_as_a_slot_runs_it(capsys: pytest.CaptureFixture,
                                                            tmp_path: Path) -> None:
    """``--speech-weights``: Whisper (a tiny random one with the real tokenizer) on the NASA narration,
    looped; its decoder steps and seconds, and the rule's rate implied from the steps real speech takes (the
    clip's own subtitle track, counted in Whisper's tokens)."""
    from benchmarks import gpu_check
    from extract.words.subtitles import subtitle_tracks
    from prvr.serve.zerogpu_speech import SpeechRule
    from tests.full_size_whisper import TINY_WHISPER, make_whisper_base

    if not gpu_check.NASA.exists():
        pytest.skip(f"the NASA clip is not at {gpu_check.NASA}")
    from transformers import GenerationConfig

    whisper = str(make_whisper_base(tmp_path / "whisper", config=TINY_WHISPER))
    shorter = GenerationConfig.from_pretrained(whisper)  # at most 24 steps a window, not 448: seconds saved
    shorter.max_new_tokens = 24
    shorter.save_pretrained(whisper)
    result = gpu_check.main(["--device", "cpu", "--quick", "--seconds", "4", "--profiles", "lite",
                             "--speech-weights", whisper, "--speech-seconds", "5"])
    capsys.readouterr()
    run, speech = result["speech"][whisper], result["speech"]
    assert run["audio_s"] == 5.0 and run["decoder_layers"] == 1 and run["decoder_steps"] > 0
    per_step = 1000 * run["generate_s"] / run["decoder_steps"]  # generate_s is rounded to 0.1 ms
    assert run["ms_per_step"] == pytest.approx(per_step, rel=1e-3, abs=0.001 + 0.05 / run["decoder_steps"])
    cues = subtitle_tracks(gpu_check.NASA)  # 4 lines of narration over 16.4 s: 2-6 steps a second
    assert len(cues) == 4 and 2 < speech["real_speech_steps_per_s"] < 6
    assert run["real_speech_gpu_s_per_audio_s"] == pytest.approx(
        run["ms_per_step"] / 1000 * speech["real_speech_steps_per_s"], rel=0.01, abs=1e-4)
    rule = result["rule"]["speech"]
    assert rule["in_use"]["per_audio_s"] == SpeechRule().per_audio_s
    assert rule["implied"] == {"from": "real_speech_gpu_s_per_audio_s", "per_audio_s": pytest.approx(
        gpu_check.FRAME_MARGIN * run["real_speech_gpu_s_per_audio_s"], abs=1e-3)}
