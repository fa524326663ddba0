"""Speech in a video as timed lines of text: offline pocketsphinx (English, its model inside the wheel) by
default, Whisper through transformers where its weights load (a local folder or a hub id).

The audio is decoded on the CPU (``extract.words.audio.decode_audio``); a recogniser's ``transcribe`` is the
model call alone, on an array, so a caller can run it where the model lives (a ZeroGPU slot, a worker):

    audio = decode_audio(video)                 # CPU, None when the file has no audio stream
    segments = load_speech(weights).transcribe(audio) if audio is not None else []

Both recognisers give words only where there is speech: pocketsphinx decodes only the stretches its voice
activity detector marks as speech and drops words it is unsure of; Whisper drops the windows its own
no-speech probability rejects (music and silence give no words).
"""

from __future__ import annotations

import logging
import math
import re
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import gcd
from typing import Protocol

import numpy as np

from extract.words.audio import RATE, decode_audio, one_line
from extract.words.segment import WordSegment, WordsUnavailable

log = logging.getLogger(__name__)

# Whisper where hubs reach: whisper-base (74 M parameters, multilingual, MIT): about a third of
# whisper-small's (244 M) compute per second of audio, the size a CPU Space's 2 cores can afford beside the
# pictures (its encoder: 2.3 s of CPU per 30 s window here); where a GPU is always there, whisper-small
# makes fewer errors (--weights speech=openai/whisper-small).
DEFAULT_WHISPER = "openai/whisper-base"
POCKETSPHINX = "pocketsphinx"

PAUSE_S = 0.3  # a silence this long between two words ends a line (where a person takes a breath)
MAX_LINE_S = 8.0  # a line is cut before it grows longer than this (a subtitle's reading time)

Progress = Callable[[float], None]


class SpeechRecognizer(Protocol):
    """What every speech recogniser offers: its name, the model it runs, and the model call on audio."""

    name: str  # "pocketsphinx" | "whisper"
    model: str  # what /info shows

    def transcribe(self, audio: np.ndarray, rate: int = RATE,
                   progress: Progress | None = None) -> list[WordSegment]:
        """Timed lines heard in ``audio`` (mono float32), source "speech"; none for music or silence."""
        ...

    def spent(self) -> str:
        """What the last ``transcribe`` asked of anything beyond this process's CPU, for the upload's report
        ("" for nothing: the recognisers here run in process; the app's ZeroGPU one says its GPU seconds)."""
        ...


@dataclass(frozen=True)
class Word:
    """One recognised word: its text, [start, end) seconds and the recogniser's confidence in [0, 1]."""

    text: str
    start: float
    end: float
    confidence: float


def at_rate(audio: np.ndarray, rate: int) -> np.ndarray:
    """``audio`` as mono float32 at the recognisers' 16 kHz (resampled when given at another rate)."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"audio of shape {audio.shape}: expected mono samples (one dimension)")
    if rate <= 0:
        raise ValueError(f"audio rate {rate}: expected a positive number of samples per second")
    if rate == RATE:
        return audio
    from scipy.signal import resample_poly

    step = gcd(RATE, rate)
    return resample_poly(audio, RATE // step, rate // step).astype(np.float32)


def lines(words: list[Word], pause: float = PAUSE_S, longest: float = MAX_LINE_S) -> list[WordSegment]:
    """Words in time order grouped into the lines a person reads: a new line at each pause of ``pause``
    seconds or more and before a line would last longer than ``longest``; a line's score is its words' mean
    confidence."""
    out: list[WordSegment] = []
    group: list[Word] = []

    def close() -> None:
        if group:
            text = " ".join(w.text for w in group)
            score = float(np.mean([w.confidence for w in group]))
            out.append(WordSegment("speech", round(group[0].start, 3), round(group[-1].end, 3), text,
                                   min(max(score, 0.0), 1.0)))
            group.clear()

    for word in words:
        if group and (word.start - group[-1].end >= pause or word.end - group[0].start > longest):
            close()
        group.append(word)
    close()
    return out


# ---------------------------------------------------------------------------------------------- pocketsphinx

# pocketsphinx's own tokens that are not words: sentence marks, silence, noise and filler models
_NOT_WORDS = re.compile(r"^(<.*>|\[.*\]|\+\+.*\+\+)$")
_ALTERNATE = re.compile(r"\(\d+\)$")  # "the(2)": the dictionary's second pronunciation of "the"


def speech_stretches(samples: np.ndarray, vad_mode: int = 3) -> list[tuple[float, float]]:
    """[start, end) seconds of each stretch of 16 kHz ``samples`` that WebRTC's voice activity detector
    (pocketsphinx's ``Endpointer``: speech begins and ends where 90 % of a 0.3 s window agrees) calls speech.
    ``vad_mode`` 0-3: how strict the detector is (3: the strictest, the least music taken for speech)."""
    from pocketsphinx import Endpointer

    pcm = pcm16(samples)
    ep = Endpointer(vad_mode=vad_mode, sample_rate=RATE)
    size = ep.frame_bytes
    out, start = [], 0.0
    for at in range(0, len(pcm), size):
        frame = pcm[at : at + size]
        was_in = ep.in_speech
        speech = ep.end_stream(frame) if len(frame) < size else ep.process(frame)
        if speech is None:
            continue
        if not was_in:
            start = ep.speech_start
        if not ep.in_speech:
            out.append((start, ep.speech_end))
    if ep.in_speech:  # speech to the very end of the audio
        out.append((start, len(samples) / RATE))
    return out


CHUNK_BYTES = 2 * RATE // 50  # 20 ms of 16-bit samples: one process_raw call


def pcm16(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] as little-endian 16-bit PCM (what pocketsphinx reads)."""
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


class PocketSphinx:
    """CMU pocketsphinx 5 with the US-English model inside its wheel, run only on the stretches of audio
    that the voice activity detector (``speech_stretches``) calls speech.

    Confidence: each word's posterior probability in the decoder's word lattice (pocketsphinx's
    forward-backward over the lattice, ``Segment.prob``): the share of the lattice's paths through that
    time that agree on the word; a line's score is its words' mean. What is not speech is dropped in two
    steps: words held longer than ``longest_word`` seconds (a sung or hummed note matched to one word), then
    a whole stretch whose words' mean posterior is under ``min_confidence``, that has fewer than
    ``min_words`` words, or fewer than ``min_rate`` words a second (people say 2-4; music, applause and
    barking, measured on real clips, decode to a few words the lattice does not agree on, held long).
    """

    name = "pocketsphinx"

    def __init__(self, vad_mode: int = 3, min_confidence: float = 0.4, longest_word: float = 1.2,
                 min_words: int = 2, min_rate: float = 1.0) -> None:
        import pocketsphinx

        self.vad_mode = vad_mode
        self.min_confidence = min_confidence
        self.longest_word = longest_word
        self.min_words = min_words
        self.min_rate = min_rate
        self.model = f"pocketsphinx {_version('pocketsphinx')} en-us"
        self._decoder = pocketsphinx.Decoder(samprate=RATE, loglevel="FATAL")
        self._frame_s = 1.0 / int(self._decoder.config["frate"])
        self._lock = threading.Lock()  # one decoder: one utterance at a time

    def decode(self, samples: np.ndarray, offset: float = 0.0) -> list[Word]:
        """Every word pocketsphinx hears in ``samples`` (one utterance), times shifted by ``offset`` s."""
        with self._lock:
            decoder = self._decoder
            decoder.start_utt()
            pcm = pcm16(samples)
            # pocketsphinx holds the GIL for as long as one call runs: fed 20 ms at a time, the other threads
            # (on-screen text, frame extraction, the web server) keep about half their speed beside it
            # instead of stopping until the whole stretch is decoded
            for at in range(0, len(pcm), CHUNK_BYTES):
                decoder.process_raw(pcm[at:at + CHUNK_BYTES], full_utt=False)
            decoder.end_utt()
            found = [(s.word, s.start_frame, s.end_frame, s.prob) for s in decoder.seg()]
        return [Word(_ALTERNATE.sub("", token), offset + first * self._frame_s,
                     offset + (last + 1) * self._frame_s, min(max(float(prob), 0.0), 1.0))
                for token, first, last, prob in found if not _NOT_WORDS.match(token)]

    def speech_words(self, samples: np.ndarray, offset: float = 0.0) -> list[Word]:
        """The words of one stretch of speech, or none when the stretch does not sound like speech."""
        words = [w for w in self.decode(samples, offset) if w.end - w.start <= self.longest_word]
        seconds = max(len(samples) / RATE, 1e-9)
        if (len(words) < self.min_words or len(words) / seconds < self.min_rate
                or np.mean([w.confidence for w in words]) < self.min_confidence):
            return []
        return words

    def transcribe(self, audio: np.ndarray, rate: int = RATE,
                   progress: Progress | None = None) -> list[WordSegment]:
        """Timed lines of the speech in ``audio``; none where the detector hears no speech."""
        samples = at_rate(audio, rate)
        stretches = speech_stretches(samples, self.vad_mode)
        total = sum(b - a for a, b in stretches) or 1.0
        done, words = 0.0, []
        for a, b in stretches:
            words += self.speech_words(samples[int(a * RATE) : int(math.ceil(b * RATE))], a)
            done += b - a
            if progress is not None:
                progress(done / total)
        return lines(words)

    def spent(self) -> str:
        """Nothing beyond this process."""
        return ""


def _version(package: str) -> str:
    """An installed package's version, or "" when unknown."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return ""


# --------------------------------------------------------------------------------------------------- Whisper


def heard(found: list[WordSegment], stretches: Sequence[tuple[float, float]]) -> list[WordSegment]:
    """The lines of ``found`` that overlap a stretch where speech was heard (Whisper writes text on music
    and silence too)."""
    return [s for s in found if any(s.start < b and a < s.end for a, b in stretches)]


@dataclass(frozen=True)
class Prepared:
    """Audio made ready for Whisper on the CPU: the stretches where speech is heard ([start, end) s) and the
    model's input features (None when there is no speech)."""

    stretches: tuple[tuple[float, float], ...]
    features: dict | None


class Whisper:
    """Whisper through transformers (``WhisperForConditionalGeneration`` + its processor), as transformers'
    own ``pipeline("automatic-speech-recognition", return_timestamps=True)`` runs it: the processor's log-mel
    features (audio over 30 s: all of it, for transformers' sequential 30 s windows) and ``generate`` with
    timestamps; each segment Whisper closes with a timestamp pair becomes a line.

    Confidence: a line's score is the geometric mean of the probabilities Whisper gave its tokens (exp of
    their mean log-probability, Whisper's own ``avg_logprob``). Where the voice activity detector hears no
    speech the model is not called, and lines outside the stretches it hears are dropped (Whisper writes
    text on music and silence too).
    """

    name = "whisper"

    def __init__(self, source: str, device: str | None = None, local_only: bool = False,
                 max_new_tokens: int | None = None) -> None:
        import torch
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = f"whisper {source}"
        kw = {"local_files_only": local_only}
        self.processor = WhisperProcessor.from_pretrained(source, **kw)
        self.network = WhisperForConditionalGeneration.from_pretrained(source, **kw).eval().to(self.device)
        # what generate is given besides the audio (tests give the same to transformers' pipeline): greedy
        # decoding, openai-whisper's own default (``transcribe`` without beam_size); timestamps for the lines
        self.generate_kwargs: dict = {"return_timestamps": True, "num_beams": 1}
        if max_new_tokens is not None:
            self.generate_kwargs["max_new_tokens"] = max_new_tokens
        self._lock = threading.Lock()

    def features(self, samples: np.ndarray) -> dict:
        """The processor's log-mel features of 16 kHz ``samples``, as the pipeline makes them (CPU work)."""
        extractor = self.processor.feature_extractor
        longer = len(samples) > extractor.n_samples  # over 30 s: unpadded, for the sequential windows
        kw = {"truncation": False, "padding": "longest"} if longer else {}
        return dict(extractor(samples, sampling_rate=RATE, return_tensors="pt", return_attention_mask=True,
                              **kw))

    def generate(self, features: dict) -> dict:
        """The model call on prepared features: generate's output with its segments and per-step scores
        (what a GPU slot runs)."""
        import torch

        dtype = next(self.network.parameters()).dtype
        inputs = {"input_features": features["input_features"].to(self.device, dtype),
                  "attention_mask": features["attention_mask"].to(self.device)}
        with self._lock, torch.inference_mode():
            return self.network.generate(**inputs, **self.generate_kwargs, return_segments=True,
                                         return_dict_in_generate=True, output_scores=True)

    def segments(self, output: dict) -> list[WordSegment]:
        """Generate's segments as lines: their text, absolute times and token confidence."""
        import torch

        tokenizer = self.processor.tokenizer
        out = []
        for seg in output["segments"][0]:
            text = tokenizer.decode(seg["tokens"], skip_special_tokens=True).strip()
            if not text:
                continue
            result, (first, last) = seg["result"], seg["idxs"]
            offset = len(result["sequences"]) - len(result["scores"])  # the decoder prompt's length
            logprobs = [torch.log_softmax(result["scores"][at - offset].float(), -1)[result["sequences"][at]]
                        for at in range(first, last)]
            score = math.exp(float(torch.stack(logprobs).mean())) if logprobs else 0.0
            start, end = float(seg["start"]), float(seg["end"])
            out.append(WordSegment("speech", round(start, 3), round(max(end, start), 3), text,
                                   min(max(score, 0.0), 1.0)))
        return out

    def prepare(self, audio: np.ndarray, rate: int = RATE) -> Prepared:
        """The CPU half: 16 kHz samples, where speech is heard, and the model's features (None: no speech,
        nothing for the model to do)."""
        samples = at_rate(audio, rate)
        stretches = tuple(speech_stretches(samples))
        return Prepared(stretches, self.features(samples) if stretches else None)

    def finish(self, prepared: Prepared, output: dict | None) -> list[WordSegment]:
        """The lines of ``generate``'s output that fall where speech was heard."""
        return heard(self.segments(output) if output is not None else [], prepared.stretches)

    def spent(self) -> str:
        """Nothing beyond this process."""
        return ""

    def transcribe(self, audio: np.ndarray, rate: int = RATE,
                   progress: Progress | None = None) -> list[WordSegment]:
        """Timed lines of the speech in ``audio``; none where the detector hears no speech. The three steps
        apart, for a caller that runs the model elsewhere (a ZeroGPU slot): ``prepare`` (CPU),
        ``generate(prepared.features)`` (the model call), ``finish``."""
        prepared = self.prepare(audio, rate)
        output = self.generate(prepared.features) if prepared.features is not None else None
        if progress is not None:
            progress(1.0)
        return self.finish(prepared, output)


# --------------------------------------------------------------------------------------------------- choosing


def whisper_source(weights: str) -> tuple[str, bool]:
    """(what ``from_pretrained`` takes, whether it is a hub id) for a local folder, ``hf-hub:ORG/NAME`` or a
    bare ``ORG/NAME``; a path that does not exist is an error naming it."""
    from pathlib import Path

    from extract.weights import WeightsUnavailable

    if weights.startswith("hf-hub:"):
        return weights.removeprefix("hf-hub:"), True
    path = Path(weights.removeprefix("local-dir:")).expanduser()
    if path.is_dir():
        return str(path.resolve()), False
    if weights.startswith(("/", ".", "~", "local-dir:")) or weights.count("/") != 1:
        raise WeightsUnavailable(f"speech weights {weights!r}: no such folder (expected a Whisper model "
                                 "folder, a hub id such as openai/whisper-base, or pocketsphinx)")
    return weights, True


def load_speech(weights: str | None = None, device: str | None = None) -> SpeechRecognizer:
    """The speech recogniser for ``weights``: None -> Whisper's default hub model where it loads, else
    pocketsphinx (the reason logged); "pocketsphinx" -> pocketsphinx; a local folder or hub id -> that
    Whisper (WeightsUnavailable naming it when it cannot load); ``device``: where Whisper runs (cuda when
    there is one). Where the hub cannot be reached, a hub id loads from the local Hugging Face cache only
    (seconds, not the hub client's retries)."""
    from extract.weights import WeightsUnavailable, hub_offline_reason

    if weights == POCKETSPHINX:
        return PocketSphinx()
    source, hub = whisper_source(weights or DEFAULT_WHISPER)
    offline = hub_offline_reason() if hub else None
    try:
        return Whisper(source, device, local_only=offline is not None)
    except (OSError, ValueError) as err:  # hub, file and format errors
        reason = f"{offline}; not in the local cache" if offline else one_line(err)[:300]
    if weights is None:
        log.warning("speech: %s did not load (%s); using pocketsphinx", source, reason)
        return PocketSphinx()
    where = "the hub" if hub else "its folder"
    raise WeightsUnavailable(f"speech weights {weights}: Whisper did not load from {where} ({reason})")


def main(argv: list[str] | None = None) -> int:
    """``python -m extract.words.speech FILE [--weights DIR|HUB_ID|pocketsphinx]``: the timed lines heard."""
    import argparse
    import time

    parser = argparse.ArgumentParser(prog="python -m extract.words.speech", description=main.__doc__)
    parser.add_argument("file", help="a video or audio file")
    parser.add_argument("--weights", default=None,
                        help="a Whisper folder or hub id, or pocketsphinx (default: Whisper's default model "
                             f"{DEFAULT_WHISPER} where it loads, else pocketsphinx)")
    parser.add_argument("--device", default=None, help="where Whisper runs (default: cuda when available)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from extract.weights import WeightsUnavailable

    try:
        audio = decode_audio(args.file)
        if audio is None:
            print(f"{args.file}: no audio stream")
            return 0
        recognizer = load_speech(args.weights, args.device)
        began = time.perf_counter()
        segments = recognizer.transcribe(audio)
    except (WordsUnavailable, WeightsUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    took = time.perf_counter() - began
    for s in segments:
        print(f"{s.start:7.2f} {s.end:7.2f}  {s.score:.2f}  {s.text}")
    seconds = len(audio) / RATE
    print(f"{recognizer.model}: {len(segments)} lines from {seconds:.1f} s of audio in {took:.1f} s "
          f"({took / max(seconds, 1e-9):.2f} s per second of audio)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
