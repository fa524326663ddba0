"""Make a video playable in every browser: H.264 / yuv420p video (even size) and AAC audio in mp4.

Browsers play mp4/H.264 but not AVI, MPEG-4 part 2, odd-sized frames or 4:4:4 chroma, which is what
OpenCV and many cameras write (gradio#1508, #9640). Uploads are re-encoded with PyAV (its wheel carries
FFmpeg with libx264), so no ffmpeg binary is needed; a file that already plays is used as it is.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from extract.decode import MediaError

log = logging.getLogger(__name__)

PLAYABLE_CONTAINERS = {"mov,mp4,m4a,3gp,3g2,mj2"}  # FFmpeg's demuxer name for mp4
PLAYABLE_AUDIO = {"aac", "mp3"}


class TranscodeError(MediaError):
    """The video could be read but not re-encoded into a browser-playable mp4."""


@dataclass(frozen=True)
class EncodeSettings:
    """How a non-playable video is re-encoded."""

    crf: int = 23  # x264 default quality: visually fine, small files
    preset: str = "veryfast"  # uploads wait on this; 'medium' is ~3x slower for ~10% smaller files
    audio_bitrate: int = 128_000
    max_height: int = 720  # taller videos are scaled down: 1080p encodes ~2x slower on a small CPU


def unplayable_reason(path: Path) -> str | None:
    """Why browsers cannot play ``path`` as it is (None when they can)."""
    with av.open(str(path)) as container:
        if container.format.name not in PLAYABLE_CONTAINERS:
            return f"container {container.format.name!r} is not mp4"
        if not container.streams.video:
            return "it has no video stream"
        video = container.streams.video[0].codec_context
        if video.name != "h264":
            return f"video codec {video.name!r} is not H.264"
        if video.pix_fmt != "yuv420p":
            return f"pixel format {video.pix_fmt!r} is not yuv420p"
        if video.width % 2 or video.height % 2:
            return f"odd frame size {video.width}x{video.height}"
        for audio in container.streams.audio:
            if audio.codec_context.name not in PLAYABLE_AUDIO:
                return f"audio codec {audio.codec_context.name!r} is not AAC/MP3"
    return None


def even_size(width: int, height: int, max_height: int) -> tuple[int, int]:
    """Frame size scaled to at most ``max_height`` rows (aspect kept), both sides rounded down to even."""
    scale = min(1.0, max_height / height)
    return max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2)


Progress = Callable[[float, float], None]  # (seconds of video done, seconds in total)


def ensure_browser_playable(src: str | Path, dst_dir: str | Path,
                            settings: EncodeSettings | None = None, *,
                            progress: Progress | None = None) -> Path:
    """Return ``src`` if browsers play it, else a re-encoded H.264 mp4 written into ``dst_dir``
    (``progress(done_s, total_s)`` is called at the start, at most twice a second while re-encoding, and at
    the end with ``done_s == total_s``)."""
    src = Path(src)
    try:
        reason = unplayable_reason(src)
    except av.error.FFmpegError as err:
        raise TranscodeError(src, f"cannot be opened as a video ({err.strerror or err}).",
                             "Upload an MP4, MKV, MOV, WebM or AVI video.") from err
    if reason is None:
        return src
    dst = Path(dst_dir) / f"{src.stem}.mp4"
    log.info("re-encoding %s to H.264 mp4 (%s)", src.name, reason)
    transcode(src, dst, settings or EncodeSettings(), progress=progress)
    return dst


def transcode(src: Path, dst: Path, settings: EncodeSettings, *, progress: Progress | None = None) -> None:
    """Re-encode ``src`` into ``dst`` (H.264/yuv420p + AAC), atomically: ``dst`` is whole or absent."""
    _write_whole(src, dst, lambda tmp: _encode(src, tmp, settings, progress=progress))


def cut(src: Path, dst: Path, start: float, end: float, settings: EncodeSettings) -> None:
    """The span ``[start, end)`` seconds of ``src`` (times as its video frames carry them) re-encoded into
    ``dst`` (H.264/yuv420p + AAC when it has audio), atomically: ``dst`` is whole or absent.

    Its first frame is the frame showing at ``start`` (the last one whose time is at most ``start``, as
    ``extract.decode`` samples frames): decoding starts at the keyframe before it and every frame in between
    is decoded and dropped, so the clip has no frozen head. Its audio is the source's samples of the span."""
    if not 0 <= start < end:
        raise ValueError(f"a span must have 0 <= start < end, got {start}-{end}")
    _write_whole(src, dst, lambda tmp: _encode_span(src, tmp, start, end, settings))


def _write_whole(src: Path, dst: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` into a temporary file beside ``dst``, then renamed into place (``dst`` whole or absent);
    a failure of FFmpeg is a ``TranscodeError`` naming ``src``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(suffix=".mp4", dir=dst.parent, prefix=f".{dst.stem}.")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        tmp.replace(dst)
    except av.error.FFmpegError as err:
        raise TranscodeError(src, f"re-encoding to H.264 failed ({err.strerror or err}).",
                             "Convert it to an H.264 MP4 yourself and upload that.") from err
    finally:
        tmp.unlink(missing_ok=True)


@dataclass
class _Streams:
    """An output file's streams, set up from an input's: H.264/yuv420p video at the input's average frame rate
    (each frame's pts in ``frame_time_base``) and, where the input has audio, AAC stereo."""

    vin: av.video.stream.VideoStream
    ain: av.audio.stream.AudioStream | None
    vout: av.video.stream.VideoStream
    aout: av.audio.stream.AudioStream | None
    resampler: av.AudioResampler | None
    frame_time_base: Fraction
    rate: Fraction
    audio_samples: int = 0  # samples encoded so far (the next one's pts)

    def encode_video(self, out: av.container.OutputContainer, frame: av.VideoFrame, pts: int) -> None:
        """Encode ``frame`` to show at ``pts`` (in ``frame_time_base``; increasing from frame to frame)."""
        image = frame.reformat(width=self.vout.width, height=self.vout.height, format="yuv420p")
        image.pts, image.time_base = pts, self.frame_time_base
        out.mux(self.vout.encode(image))

    def encode_audio(self, out: av.container.OutputContainer, frame: av.AudioFrame) -> None:
        """Encode ``frame``'s samples after the ones before it (numbered continuously from 0)."""
        frame.pts = None
        for chunk in self.resampler.resample(frame):
            self._encode_samples(out, chunk)

    def _encode_samples(self, out: av.container.OutputContainer, chunk: av.AudioFrame | None) -> None:
        """Encode resampled samples, each numbered (pts in samples from 0): given pts, the AAC encoder marks
        its priming samples (the first packet at -1024) and the muxer's edit list skips them, so the sound
        starts with the picture; unnumbered, a decoder plays the priming and the sound comes ~23 ms late."""
        if chunk is not None:
            chunk.pts, chunk.time_base = self.audio_samples, Fraction(1, chunk.sample_rate)
            self.audio_samples += chunk.samples
        out.mux(self.aout.encode(chunk))

    def flush(self, out: av.container.OutputContainer) -> None:
        """Write what the encoders still hold."""
        out.mux(self.vout.encode(None))
        if self.aout is not None:
            for chunk in self.resampler.resample(None):
                self._encode_samples(out, chunk)
            self._encode_samples(out, None)


def _streams(inp: av.container.InputContainer, out: av.container.OutputContainer, settings: EncodeSettings,
             time_base: Fraction | None = None) -> _Streams:
    """The output's streams for ``inp`` (see ``_Streams``), sized by ``settings.max_height``; frames' pts in
    ``time_base`` (default: one tick a frame at the input's average rate)."""
    vin = inp.streams.video[0]
    ain = inp.streams.audio[0] if inp.streams.audio else None
    rate = vin.average_rate or vin.guessed_rate or Fraction(25)
    vout = out.add_stream("libx264", rate=rate)
    # Even sizes: yuv420p subsamples chroma by 2 in each direction, so x264 refuses odd ones.
    size = even_size(vin.codec_context.width, vin.codec_context.height, settings.max_height)
    vout.width, vout.height = size
    vout.pix_fmt = "yuv420p"
    vout.options = {"crf": str(settings.crf), "preset": settings.preset}
    # Constant frame rate, frames numbered in presentation order: AVI demuxers report decode-order
    # timestamps as pts (1, 2, 4, 3, ...), which the mp4 muxer rejects. Features are extracted from
    # this output, so index times always match what the player shows.
    frame_time_base = vout.time_base = time_base or Fraction(1) / rate  # kept: the muxer rewrites it
    vout.codec_context.time_base = frame_time_base  # the encoder's ticks: a frame's pts is not rounded
    aout = resampler = None
    if ain is not None:
        aout = out.add_stream("aac", rate=ain.codec_context.sample_rate or 44100)
        aout.bit_rate = settings.audio_bitrate
        resampler = av.AudioResampler(format="fltp", layout="stereo", rate=aout.codec_context.sample_rate)
    return _Streams(vin, ain, vout, aout, resampler, frame_time_base, Fraction(rate))


def _encode(src: Path, dst: Path, settings: EncodeSettings, *, progress: Progress | None = None) -> None:
    """Decode every frame of ``src`` and encode it into ``dst`` at the source's average frame rate."""
    with av.open(str(src)) as inp, av.open(str(dst), "w", format="mp4") as out:
        streams = _streams(inp, out, settings)
        n_frames = 0
        total_s = float(inp.duration / av.time_base) if inp.duration else 0.0
        if progress is not None:  # first and last reports whatever the machine's speed; between, by the clock
            progress(0.0, total_s)
        reported = time.monotonic()
        for frame in inp.decode(*[s for s in (streams.vin, streams.ain) if s is not None]):
            if isinstance(frame, av.VideoFrame):
                streams.encode_video(out, frame, n_frames)
                n_frames += 1
                if progress is not None and time.monotonic() - reported >= 0.5:
                    done_s = float(frame.time) if frame.time is not None else n_frames / float(streams.rate)
                    progress(min(done_s, total_s or done_s), total_s or done_s)
                    reported = time.monotonic()
            elif streams.aout is not None:
                streams.encode_audio(out, frame)
        streams.flush(out)
        if progress is not None:
            end_s = total_s or n_frames / float(streams.rate)
            progress(end_s, end_s)


def _encode_span(src: Path, dst: Path, start: float, end: float, settings: EncodeSettings) -> None:
    """``cut``'s encoding: the video frames showing during ``[start, end)``, the audio samples of it."""
    with av.open(str(src)) as inp, av.open(str(dst), "w", format="mp4") as out:
        # each frame shows from its own time on (seconds after start, in fine ticks): a clip whose span starts
        # or ends inside a frame lasts the span, to within a frame, with its sound in step
        streams = _streams(inp, out, settings, Fraction(1, _TICKS_PER_S))
        vin, ain = streams.vin, streams.ain
        vin.thread_type = "AUTO"
        first = next(inp.decode(vin), None)  # the display matrix comes with decoded frames (a portrait)
        turn = int(round(getattr(first, "rotation", 0) or 0)) if first is not None else 0
        if turn:
            streams.vout.set_display_rotation(turn)
        # to the keyframe before start: the frames from it to start decode, unwritten
        at = int(start / vin.time_base) if start > 0 and vin.time_base else 0
        inp.seek(at, stream=vin, backward=True, any_frame=False)
        held: av.VideoFrame | None = None  # the newest frame at or before start, until a later one shows
        n_frames, pts, video_done = 0, -1, False
        audio = _AudioSpan(start, end) if streams.aout is not None else None
        for frame in inp.decode(*[s for s in (vin, ain) if s is not None]):
            if isinstance(frame, av.VideoFrame):
                if frame.time is None or video_done:
                    continue
                if frame.time <= start + _SAME_TIME_S:
                    held = frame
                    continue
                if frame.time >= end - _SAME_TIME_S:
                    video_done = True
                else:
                    for shown in ([held] if held is not None else []) + [frame]:
                        pts = max(pts + 1, round(max(0.0, shown.time - start) * _TICKS_PER_S))
                        streams.encode_video(out, shown, pts)
                        n_frames += 1
                    held = None
            elif audio is not None:
                for kept in audio.keep(frame):
                    streams.encode_audio(out, kept)
            if video_done and (audio is None or audio.done):
                break
        if held is not None:  # no frame after it before end (a span within one frame, or the video's tail)
            streams.encode_video(out, held, pts + 1)
            n_frames += 1
        if not n_frames:
            raise TranscodeError(src, f"no video frame shows between {start:g} and {end:g} s.")
        streams.flush(out)


_SAME_TIME_S = 1e-6  # times this close are the same instant (seconds from rational time bases, as floats)
_TICKS_PER_S = 90_000  # a clip's frame times: MPEG's clock, fine enough for any frame rate


class _AudioSpan:
    """The audio samples of ``[start, end)`` seconds, from decoded frames in order: frames cut at the bounds,
    and silence where the span begins before the first sample decoded (the clip's sound stays in step)."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.started = False  # a sample of the span was kept
        self.done = False  # the span's last sample was kept

    def keep(self, frame: av.AudioFrame) -> list[av.AudioFrame]:
        """The part of ``frame`` inside the span (with silence before it when it is the first and late)."""
        if self.done or frame.time is None or not frame.samples:
            return []
        rate, begin = frame.sample_rate, float(frame.time)
        finish = begin + frame.samples / rate
        if finish <= self.start:
            return []
        if begin >= self.end:
            self.done = True
            return []
        lo = max(0, round((self.start - begin) * rate))
        hi = min(frame.samples, round((self.end - begin) * rate))
        kept = []
        if not self.started and begin > self.start + 1 / rate:
            kept.append(_silence(frame, round((begin - self.start) * rate)))
        if hi > lo:
            kept.append(_samples(frame, lo, hi))
        self.started = True
        self.done = hi < frame.samples
        return kept


def _samples(frame: av.AudioFrame, lo: int, hi: int) -> av.AudioFrame:
    """Samples ``lo:hi`` of ``frame``, as a frame of its format, layout and rate."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    part = data[:, lo:hi] if frame.format.is_planar else data[:, lo * channels : hi * channels]
    out = av.AudioFrame.from_ndarray(np.ascontiguousarray(part), format=frame.format.name,
                                     layout=frame.layout.name)
    out.sample_rate = frame.sample_rate
    return out


def _silence(frame: av.AudioFrame, samples: int) -> av.AudioFrame:
    """``samples`` of silence in ``frame``'s format, layout and rate."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    shape = (data.shape[0], samples if frame.format.is_planar else samples * channels)
    out = av.AudioFrame.from_ndarray(np.zeros(shape, data.dtype), format=frame.format.name,
                                     layout=frame.layout.name)
    out.sample_rate = frame.sample_rate
    return out
