"""A video's sound as the speech recognisers hear it: one audio stream decoded by PyAV, resampled to mono
float32 at the recogniser's rate. Plain CPU work, kept apart from the models (on ZeroGPU only the model call
runs in a GPU slot)."""

from __future__ import annotations

import logging
from pathlib import Path

import av
import numpy as np

from extract.words.segment import WordsUnavailable

log = logging.getLogger(__name__)

RATE = 16000  # what pocketsphinx's en-us model and Whisper's feature extractor expect


def decode_audio(path: str | Path, rate: int = RATE) -> np.ndarray | None:
    """The file's audio, mono float32 in [-1, 1] at ``rate`` Hz, sample i at i / rate s of the video; None
    when it has no audio stream.

    The stream is the one FFmpeg itself would play (``streams.best("audio")``: with several, e.g. an 8 kHz
    and a 16 kHz copy of the same narration, the better one). Damaged packets are skipped and their time
    left silent, so the words after them keep their times; a file cut short gives what was recorded before
    the cut. Audio of which nothing can be decoded (a lost index, an unknown codec, a file that is not
    media) raises WordsUnavailable with one line naming the file.
    """
    name = Path(path).name
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError) as err:
        raise WordsUnavailable(f"audio of {name}: cannot open the file ({one_line(err)})") from None
    with container:
        stream = container.streams.best("audio")
        if stream is None:
            return None
        codec = stream.codec_context.name if stream.codec_context else "unknown codec"
        try:
            audio, decoded, damaged = _decode(container, stream, rate)
        except (av.FFmpegError, ValueError, OSError) as err:  # no decoder, or one that cannot be set up
            raise WordsUnavailable(f"audio of {name} ({codec}) cannot be decoded: {one_line(err)}") from None
    if not decoded:
        why = one_line(damaged[0]) if damaged else "no samples in its stream"
        raise WordsUnavailable(f"audio of {name} ({codec}) cannot be decoded: {why}")
    if damaged:
        log.warning("audio of %s (%s): %d damaged packets left silent (%s)", name, codec, len(damaged),
                    one_line(damaged[0]))
    return audio


GAP_S = 0.05  # a hole in the audio's timeline longer than this (damaged packets, a late start) stays silent


def _decode(container: av.container.InputContainer, stream: av.AudioStream,
            rate: int) -> tuple[np.ndarray, int, list[Exception]]:
    """(samples on the video's timeline, how many were decoded, the errors of damaged packets): every
    packet of ``stream`` through one resampler (float mono at ``rate``), holes filled with silence."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    chunks: list[np.ndarray] = []
    have = decoded = 0
    damaged: list[Exception] = []
    packets = container.demux(stream)
    while True:
        try:
            packet = next(packets)
        except StopIteration:
            break
        except av.FFmpegError as err:  # the container is cut or broken here: keep what came before
            damaged.append(err)
            break
        try:
            frames = packet.decode()
        except av.FFmpegError as err:  # one damaged packet: its time stays silent, the rest is kept
            damaged.append(err)
            continue
        for frame in frames:
            if frame.time is not None and (gap := int(round(frame.time * rate)) - have) > GAP_S * rate:
                chunks.append(np.zeros(gap, np.float32))
                have += gap
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray().reshape(-1))
                have += len(chunks[-1])
                decoded += len(chunks[-1])
    for out in resampler.resample(None):  # what the resampler still holds at the end
        chunks.append(out.to_ndarray().reshape(-1))
        decoded += len(chunks[-1])
    if not chunks:
        return np.zeros(0, np.float32), 0, damaged
    # some encoders overshoot [-1, 1] slightly (AAC's decoded peaks); the contract is [-1, 1]
    audio = np.clip(np.concatenate(chunks).astype(np.float32, copy=False), -1.0, 1.0)
    return audio, decoded, damaged


def one_line(err: BaseException) -> str:
    """An exception's message on one line (FFmpeg's can span several)."""
    text = " ".join(str(err).split())
    return text or type(err).__name__
