"""A video's sound as the speech recognisers hear it: one audio stream decoded by PyAV, resampled to mono
float32 at the recogniser's rate. Plain CPU work, kept apart from the models (on ZeroGPU only the model call
runs in a GPU slot)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

from extract.words.segment import WordsUnavailable

RATE = 16000  # what pocketsphinx's en-us model and Whisper's feature extractor expect


def decode_audio(path: str | Path, rate: int = RATE) -> np.ndarray | None:
    """The file's audio, mono float32 in [-1, 1] at ``rate`` Hz; None when it has no audio stream.

    The stream is the one FFmpeg itself would play (``streams.best("audio")``: with several, e.g. an 8 kHz
    and a 16 kHz copy of the same narration, the better one). Audio that cannot be decoded (a truncated file,
    an unknown codec, a file that is not media) raises WordsUnavailable with one line naming the file.
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
            audio = _decode(container, stream, rate)
        except (av.FFmpegError, ValueError, OSError) as err:
            raise WordsUnavailable(f"audio of {name} ({codec}) cannot be decoded: {one_line(err)}") from None
    if not len(audio):
        raise WordsUnavailable(f"audio of {name} ({codec}) cannot be decoded: no samples in its stream")
    return audio


def _decode(container: av.container.InputContainer, stream: av.AudioStream, rate: int) -> np.ndarray:
    """Every frame of ``stream`` through one resampler (s16 planar avoided: float mono at ``rate``)."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    chunks = []
    for frame in container.decode(stream):
        for out in resampler.resample(frame):
            chunks.append(out.to_ndarray().reshape(-1))
    for out in resampler.resample(None):  # what the resampler still holds at the end
        chunks.append(out.to_ndarray().reshape(-1))
    if not chunks:
        return np.zeros(0, np.float32)
    # some encoders overshoot [-1, 1] slightly (AAC's decoded peaks); the contract is [-1, 1]
    return np.clip(np.concatenate(chunks).astype(np.float32, copy=False), -1.0, 1.0)


def one_line(err: BaseException) -> str:
    """An exception's message on one line (FFmpeg's can span several)."""
    text = " ".join(str(err).split())
    return text or type(err).__name__
