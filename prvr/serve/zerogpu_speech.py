"""Speech on Hugging Face ZeroGPU: the CPU decodes and prepares the audio, GPU slots run only Whisper.

On a ZeroGPU Space the words reader's recogniser is ``SlotSpeech`` (``load_in_slots``, chosen by
``prvr.serve.bootstrap.words_reader`` and loaded there, before ``launch()``, so that ZeroGPU packs its weights
with the frames' models); pocketsphinx, the offline default, stays on the CPU. ``SlotSpeech.transcribe`` does
on the CPU what ``extract.words.speech.Whisper.transcribe`` does there (16 kHz samples, the voice activity
detector's stretches, the processor's log-mel features, written to a file per slot); the GPU function
(``_slot_lines``) reads one slot's features, runs ``generate`` and gives back the timed lines, never opening
the video. The audio is cut into consecutive slots of equal length within ZeroGPU's 60 s (``SpeechRule.plan``,
as frames are cut by windows); only the slots where speech is heard are asked for (music and silence ask for
nothing), and the lines are kept where speech is heard (``extract.words.speech.heard``).

GPU seconds a slot asks for: ``START_SECONDS`` plus ``SECONDS_PER_AUDIO_S`` per second of the slot's audio,
for whisper-base's six decoder layers (scaled by the model's decoder depth: decoding, one step per token
through every decoder layer, is most of the time), told to the visitor before the upload starts (an upper
bound: the whole video as speech) and said in its outcome (what was asked: ``SlotSpeech.spent``); ``/info``
names the rule. A slot ZeroGPU refuses or that fails skips the speech with one line (the video is still
indexed by its pictures and its other words). How the rate was set: benchmarks/RESULTS.md, "Issue #43,
Session 19", measured in session 31 (``benchmarks/gpu_check.py --speech-weights``).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from extract.words.audio import RATE
from extract.words.segment import WordSegment, WordsUnavailable
from extract.words.speech import (
    Progress,
    SpeechRecognizer,
    Whisper,
    at_rate,
    heard,
    load_speech,
    speech_stretches,
)
from prvr.serve.settings import on_zerogpu
from prvr.serve.zerogpu import (
    SLOT_SECONDS,
    START_SECONDS,
    GpuPlan,
    WorkerFailure,
    error_message,
    gpu_task,
    one_thread_in_worker,
    worker_error,
)

# GPU seconds per second of audio for whisper-base (6 decoder layers), 5x real speech's on an H200
# (benchmarks/gpu_check.py): 5.6 ms a decoder step, 3.7 steps a second of narration (0.021 s); the worst
# case, every 30 s window decoded to Whisper's 448-token limit (random weights run to it), took 0.11 s.
# whisper-small took 1.5x base's time: the 2x the rule gives its 12 layers covers it
BASE_DECODER_LAYERS = 6
SECONDS_PER_AUDIO_S = 0.1


@dataclass(frozen=True)
class SpeechRule:
    """How many GPU seconds speech asks for: ``start_s`` per slot plus ``per_audio_s`` per second of audio,
    in consecutive slots of equal length of at most ``slot_s`` seconds each."""

    start_s: float = START_SECONDS
    per_audio_s: float = SECONDS_PER_AUDIO_S
    slot_s: int = SLOT_SECONDS

    @classmethod
    def for_model(cls, whisper: Whisper) -> SpeechRule:
        """The default rule scaled to the model's decoder depth (whisper-small's 12 layers: twice base's)."""
        layers = int(getattr(whisper.network.config, "decoder_layers", BASE_DECODER_LAYERS))
        return cls(per_audio_s=SECONDS_PER_AUDIO_S * max(1.0, layers / BASE_DECODER_LAYERS))

    def seconds(self, audio_s: float) -> int:
        """The duration one slot asks for to transcribe ``audio_s`` seconds of audio."""
        return math.ceil(self.start_s + audio_s * self.per_audio_s - 1e-9)

    def plan(self, duration_s: float) -> GpuPlan:
        """The slots for ``duration_s`` seconds of audio: as few as fit, of equal length."""
        fit = (self.slot_s - self.start_s) / self.per_audio_s  # seconds of audio one slot holds
        if fit <= 0:
            raise ValueError(f"a {self.slot_s} s slot cannot hold any audio after its {self.start_s} s start")
        if duration_s <= 0:
            return GpuPlan((), ())
        count = math.ceil(duration_s / fit - 1e-9)
        size = duration_s / count
        slots = tuple((round(n * size, 3), round(duration_s if n == count - 1 else (n + 1) * size, 3))
                      for n in range(count))
        return GpuPlan(slots, tuple(self.seconds(hi - lo) for lo, hi in slots))

    def words(self) -> str:
        """The rule for a person: "10 s a slot + 0.1 s per second of audio heard"."""
        return f"{self.start_s:g} s a slot + {self.per_audio_s:g} s per second of audio heard"


# ----------------------------------------------------------------------------- the GPU function
# The slots' Whisper models, registered at start in the main process (a forked worker inherits them): a
# slot is called with the key, never with the model.
_SPEECH: dict[int, tuple[Whisper, SpeechRule]] = {}


def _slot_lines(features: str, seconds: float, key: int) -> list[WordSegment]:
    """The GPU function: Whisper on one slot's features (an ``.npz`` of the processor's ``input_features``
    and ``attention_mask``): its timed lines, times from the slot's start. Plain, small arguments (a path,
    the slot's seconds of audio, a key). Raises only ``WorkerFailure``."""
    try:
        one_thread_in_worker()
        whisper, _ = _SPEECH[key]
        with np.load(features) as saved:
            inputs = {name: torch.from_numpy(saved[name]) for name in ("input_features", "attention_mask")}
        return whisper.segments(whisper.generate(inputs))
    except Exception as error:
        raise WorkerFailure.of(error) from None


def _slot_seconds(features: str, seconds: float, key: int) -> int:
    """``spaces.GPU``'s duration: called with the same arguments as ``_slot_lines``."""
    return _SPEECH[key][1].seconds(seconds)


# decorated at import, before launch(); off ZeroGPU the function is called as it is (in this process)
_slot_in_gpu = gpu_task(_slot_lines, duration=_slot_seconds) if on_zerogpu() else _slot_lines


# ----------------------------------------------------------------------------- the recogniser
class SlotSpeech:
    """Whisper with its model call in ZeroGPU slots, the rest on the CPU (see the module docstring); a
    ``SpeechRecognizer``. One transcription at a time (the words reader's own lock)."""

    name = "whisper"

    def __init__(self, whisper: Whisper, rule: SpeechRule | None = None) -> None:
        self.whisper, self.rule = whisper, rule or SpeechRule.for_model(whisper)
        self.key = len(_SPEECH)
        _SPEECH[self.key] = (whisper, self.rule)
        self.model = f"{whisper.model} in ZeroGPU slots ({self.rule.words()})"
        self.asked: list[int] = []  # the last transcription's slots: the seconds each asked for

    def cost(self, duration_s: float) -> GpuPlan:
        """The most a video of ``duration_s`` seconds asks for: every slot, as if all of it were speech."""
        return self.rule.plan(duration_s)

    def transcribe(self, audio: np.ndarray, rate: int = RATE,
                   progress: Progress | None = None) -> list[WordSegment]:
        """Timed lines of the speech in ``audio``; the slots where speech is heard run Whisper on the GPU."""
        samples = at_rate(audio, rate)
        stretches = speech_stretches(samples)
        plan = self.rule.plan(len(samples) / RATE)
        chosen = [(lo, hi) for lo, hi in plan.slots if any(a < hi and lo < b for a, b in stretches)]
        self.asked = []
        found: list[WordSegment] = []
        with tempfile.TemporaryDirectory(prefix="prvr-speech-") as work:
            for n, (lo, hi) in enumerate(chosen):
                prepared = self.whisper.features(samples[int(round(lo * RATE)) : int(round(hi * RATE))])
                path = Path(work) / f"slot-{n}.npz"
                np.savez(path, input_features=prepared["input_features"].numpy(),
                         attention_mask=prepared["attention_mask"].numpy())
                self.asked.append(self.rule.seconds(hi - lo))
                try:
                    lines = _slot_in_gpu(str(path), hi - lo, self.key)
                except Exception as error:
                    raise WordsUnavailable(f"ZeroGPU did not run the speech model: "
                                           f"{error_message(worker_error(error))}") from None
                found += shifted(lines, lo)
                if progress is not None:
                    progress((n + 1) / len(chosen))
        return heard(found, stretches)

    def spent(self) -> str:
        """What the last transcription asked of ZeroGPU ("" where no speech was heard: nothing)."""
        if not self.asked:
            return ""
        n = len(self.asked)
        return (f"its speech asked ZeroGPU for {sum(self.asked)} GPU seconds ({n} slot{'s' if n > 1 else ''} "
                f"of at most {max(self.asked)} s)")


def shifted(lines: Sequence[WordSegment], offset: float) -> list[WordSegment]:
    """Lines timed from a slot's start, timed from the audio's start."""
    return [WordSegment(s.source, round(s.start + offset, 3), round(s.end + offset, 3), s.text, s.score)
            for s in lines]


def load_in_slots(weights: str | None, device: str | None = None) -> SpeechRecognizer:
    """The words reader's loader on ZeroGPU (``WordsConfig.load_speech``): ``load_speech(weights)`` with
    Whisper on the default device ((emulated) CUDA: call before ``launch()``) in GPU slots; pocketsphinx as it
    is, on the CPU. ``device`` (the reader's search device, the CPU on ZeroGPU) is not used: the slots'
    model goes where ZeroGPU moves it."""
    recognizer = load_speech(weights)
    return SlotSpeech(recognizer) if isinstance(recognizer, Whisper) else recognizer


def announced(recognizer: object | None, duration_s: float) -> str:
    """What an upload's words ask of ZeroGPU, told with the frames' seconds before it starts: Whisper in
    slots gives the most it may ask; a recogniser on the CPU (or none loaded) asks for none."""
    if isinstance(recognizer, SlotSpeech):
        return f"; its speech, where there is any, up to {recognizer.cost(duration_s).words()} more"
    return "; its words are read on the CPU, which asks for none"


def quota_words(recognizer: object | None) -> str:
    """The speech's rule for the upload page, after the frames' (``ZeroGpu.quota_words``): "" where the
    words are read on the CPU."""
    if isinstance(recognizer, SlotSpeech):
        return f" A video's speech, where there is any, asks for more: {recognizer.rule.words()}."
    return ""
