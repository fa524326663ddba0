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
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(suffix=".mp4", dir=dst.parent, prefix=f".{dst.stem}.")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _encode(src, tmp, settings, progress=progress)
        tmp.replace(dst)
    except av.error.FFmpegError as err:
        raise TranscodeError(src, f"re-encoding to H.264 failed ({err.strerror or err}).",
                             "Convert it to an H.264 MP4 yourself and upload that.") from err
    finally:
        tmp.unlink(missing_ok=True)


def _encode(src: Path, dst: Path, settings: EncodeSettings, *, progress: Progress | None = None) -> None:
    """Decode every frame of ``src`` and encode it into ``dst`` at the source's average frame rate."""
    with av.open(str(src)) as inp, av.open(str(dst), "w", format="mp4") as out:
        vin = inp.streams.video[0]
        ain = inp.streams.audio[0] if inp.streams.audio else None
        rate = vin.average_rate or vin.guessed_rate or 25
        vout = out.add_stream("libx264", rate=rate)
        # Even sizes: yuv420p subsamples chroma by 2 in each direction, so x264 refuses odd ones.
        size = even_size(vin.codec_context.width, vin.codec_context.height, settings.max_height)
        vout.width, vout.height = size
        vout.pix_fmt = "yuv420p"
        vout.options = {"crf": str(settings.crf), "preset": settings.preset}
        # Constant frame rate, frames numbered in presentation order: AVI demuxers report decode-order
        # timestamps as pts (1, 2, 4, 3, ...), which the mp4 muxer rejects. Features are extracted from
        # this output, so index times always match what the player shows.
        frame_time_base = vout.time_base = Fraction(1) / rate  # kept: the muxer rewrites vout.time_base
        aout = resampler = None
        if ain is not None:
            aout = out.add_stream("aac", rate=ain.codec_context.sample_rate or 44100)
            aout.bit_rate = settings.audio_bitrate
            resampler = av.AudioResampler(format="fltp", layout="stereo", rate=aout.codec_context.sample_rate)
        n_frames = 0
        total_s = float(inp.duration / av.time_base) if inp.duration else 0.0
        if progress is not None:  # first and last reports whatever the machine's speed; between, by the clock
            progress(0.0, total_s)
        reported = time.monotonic()
        for frame in inp.decode(*[s for s in (vin, ain) if s is not None]):
            if isinstance(frame, av.VideoFrame):
                image = frame.reformat(width=vout.width, height=vout.height, format="yuv420p")
                image.pts, image.time_base = n_frames, frame_time_base
                n_frames += 1
                out.mux(vout.encode(image))
                if progress is not None and time.monotonic() - reported >= 0.5:
                    done_s = float(frame.time) if frame.time is not None else n_frames / float(rate)
                    progress(min(done_s, total_s or done_s), total_s or done_s)
                    reported = time.monotonic()
            elif aout is not None and resampler is not None:
                frame.pts = None  # let the encoder number audio samples continuously
                for chunk in resampler.resample(frame):
                    out.mux(aout.encode(chunk))
        out.mux(vout.encode(None))
        if aout is not None:
            out.mux(aout.encode(None))
        if progress is not None:
            end_s = total_s or n_frames / float(rate)
            progress(end_s, end_s)
