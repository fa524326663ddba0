"""Streaming video decoding: ``probe()`` a file, then ``read_frames()`` the frames a profile samples.

Decoding uses decord (random access, resize at decode time, per-frame timestamps). PyAV reads the
container facts decord does not expose (codec, audio, rotation) and decodes sequentially when decord
cannot go on: decord refuses to open or stops on some damaged files that still hold most of a video.

Every problem with the media itself raises a ``MediaError`` subclass whose message names the file, says
what is wrong and what to do; callers (the app, the CLI) show it as is and carry on with the next file.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_TOLERANCE_S = 0.1  # slack when comparing sample times with frame timestamps

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts", ".flv", ".wmv")


class MediaError(Exception):
    """A media file that cannot be turned into features; the message is meant for a person."""

    def __init__(self, path: str | Path, problem: str, advice: str = "") -> None:
        self.path, self.reason = str(path), problem + (f" {advice}" if advice else "")
        super().__init__(f"{Path(path).name}: {self.reason}")

    def __reduce__(self) -> tuple:
        """Pickle as ``cls(path, reason)``: the default (``cls(message)``) fails to unpickle, and these
        errors cross a process boundary on ZeroGPU (``prvr.serve.zerogpu``)."""
        return self.__class__, (self.path, self.reason)


class FileMissing(MediaError):
    """The path does not exist or is not a file."""


class EmptyFile(MediaError):
    """The file has zero bytes."""


class NotAVideo(MediaError):
    """The file is not a media container at all (text, random bytes, an image...)."""


class ImageNotVideo(NotAVideo):
    """A still image (PNG, JPEG, WebP...), whatever its file name says."""


class NoVideoStream(MediaError):
    """A media file without a video stream (audio only)."""


class CorruptVideo(MediaError):
    """The video stream is damaged and too little of it decodes."""


class NoFrames(MediaError):
    """The container opens but not a single frame decodes."""


class BadDimensions(MediaError):
    """Frame size is zero, unknown or above the configured pixel limit."""


class TooLong(MediaError):
    """Duration above the configured limit."""


@dataclass(frozen=True)
class DecodeLimits:
    """What the decoder accepts; raise the limits for trusted batch jobs, keep them for uploads."""

    max_duration_s: float = 4 * 3600.0  # longer videos are refused before any decoding
    max_pixels: int = 7680 * 4320  # 8K; larger frames are almost always a broken header
    min_decoded_fraction: float = 0.8  # a damaged video is kept only if this much of it decodes


@dataclass(frozen=True)
class VideoInfo:
    """Container facts read without decoding the whole video."""

    path: str
    duration: float  # seconds
    fps: float  # average frame rate (variable-rate videos: use the timestamps, not this)
    num_frames: int  # from the container index; 0 when the container does not say
    width: int  # coded frame size, before rotation
    height: int
    rotation: int  # degrees counter-clockwise the player turns the frame (0, 90, 180, 270)
    codec: str
    has_video: bool
    has_audio: bool

    @property
    def display_size(self) -> tuple[int, int]:
        """(width, height) as shown, after rotation."""
        return (self.height, self.width) if self.rotation in (90, 270) else (self.width, self.height)


@dataclass
class FrameBatch:
    """Decoded RGB frames and the time (s) each was sampled for."""

    frames: np.ndarray  # (b, H, W, 3) uint8, display orientation
    times: np.ndarray  # (b,) float64 requested sample times


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks (videos can be many GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _check_file(path: Path) -> None:
    """Raise FileMissing / EmptyFile before any decoder sees the path."""
    if not path.is_file():
        raise FileMissing(path, "file not found.", "Check the path; directories are scanned only by the CLI.")
    if path.stat().st_size == 0:
        raise EmptyFile(path, "the file is empty (0 bytes).", "The upload or copy probably failed; retry.")


def probe(path: str | Path, limits: DecodeLimits | None = None) -> VideoInfo:
    """Read duration, frame rate, size, rotation and codec; raise a MediaError for unusable files."""
    import av  # PyAV: container facts (codec, audio, display matrix) decord does not report

    path, limits = Path(path), limits or DecodeLimits()
    _check_file(path)
    image = image_signature(path)
    if image:
        raise _image_error(path, image)
    try:
        container = av.open(str(path))
    except av.error.FFmpegError as e:
        kind = _container_signature(path)
        if kind:  # the header says video container: damaged (typically an incomplete download)
            raise CorruptVideo(path, f"this {kind} file is damaged or incomplete and cannot be opened "
                                     f"({e.strerror or e}).", "Re-download or re-encode it.") from e
        raise NotAVideo(path, f"not a video file that FFmpeg can read ({e.strerror or e}).",
                        "Upload an MP4, MKV, MOV, WebM or AVI video.") from e
    with container:
        has_audio = bool(container.streams.audio)
        if not container.streams.video:
            what = "an audio-only file" if has_audio else "a media file without any video stream"
            raise NoVideoStream(path, f"{what}; there are no pictures to index.", "Upload a video file.")
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        fps = float(stream.average_rate or stream.guessed_rate or 0.0)
        duration = _duration(container, stream)
        rotation = _rotation(container, stream)
        codec = stream.codec_context.name
        num_frames = int(stream.frames or 0)
        demuxer = container.format.name
    if demuxer.endswith("_pipe") or demuxer == "image2" or (demuxer == "gif" and num_frames <= 1):
        raise _image_error(path, codec.upper())  # FFmpeg reads a still image as a one-frame "video"
    if width <= 0 or height <= 0 or width * height > limits.max_pixels:
        raise BadDimensions(path, f"frame size {width}x{height} is not usable (limit {limits.max_pixels} "
                                  "pixels).", "Re-encode the video at a normal resolution.")
    if duration <= 0 and fps > 0 and num_frames > 0:
        duration = num_frames / fps
    if duration <= 0:
        raise CorruptVideo(path, "the container does not say how long the video is.",
                           "Re-encode or remux the file (e.g. with ffmpeg -c copy).")
    if duration > limits.max_duration_s:
        raise TooLong(path, f"{duration / 60:.1f} minutes is longer than the limit of "
                            f"{limits.max_duration_s / 60:.1f} minutes.", "Cut the video into shorter parts.")
    return VideoInfo(str(path), duration, fps, num_frames, width, height, rotation, codec, True, has_audio)


_IMAGE_SIGNATURES = ((0, b"\x89PNG\r\n\x1a\n", "PNG"), (0, b"\xff\xd8\xff", "JPEG"), (8, b"WEBP", "WebP"),
                     (0, b"BM", "BMP"), (0, b"II*\x00", "TIFF"), (0, b"MM\x00*", "TIFF"),
                     (0, b"\x00\x00\x01\x00", "ICO"), (8, b"heic", "HEIC"), (8, b"heix", "HEIC"),
                     (8, b"mif1", "HEIF"), (8, b"avif", "AVIF"))


def image_signature(path: str | Path) -> str:
    """The still-image format its first bytes announce (PNG, JPEG, WebP...), or "" for anything else."""
    with open(path, "rb") as f:
        head = f.read(16)
    return next((kind for at, magic, kind in _IMAGE_SIGNATURES if head[at : at + len(magic)] == magic), "")


def _image_error(path: Path, kind: str) -> ImageNotVideo:
    """The message for a still image given where a video was expected."""
    return ImageNotVideo(path, f"this is a {kind} image, not a video; there is no moment in it to find.",
                         "Upload a video file (MP4, MKV, MOV, WebM or AVI).")


_SIGNATURES = ((4, b"ftyp", "MP4/MOV"), (0, b"\x1aE\xdf\xa3", "MKV/WebM"), (0, b"RIFF", "AVI"),
               (0, b"FLV", "FLV"), (0, b"\x00\x00\x01\xba", "MPEG"), (0, b"OggS", "Ogg"))


def _container_signature(path: Path) -> str:
    """The container kind its first bytes announce, or "" when they match no video container."""
    with open(path, "rb") as f:
        head = f.read(16)
    return next((kind for at, magic, kind in _SIGNATURES if head[at : at + len(magic)] == magic), "")


def _duration(container, stream) -> float:  # PyAV objects
    """Duration in seconds from the stream, else the container, else 0 (unknown)."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration:
        return container.duration / 1e6  # AV_TIME_BASE
    return 0.0


def _rotation(container, stream) -> int:  # PyAV objects
    """Display rotation in degrees CCW, 0/90/180/270, from the first frame's display matrix."""
    # PyAV exposes the stream display matrix only through decoded frames; one frame is cheap.
    import av

    try:
        frame = next(container.decode(stream))
        degrees = int(round(getattr(frame, "rotation", 0) or 0))
    except (StopIteration, av.error.FFmpegError):
        degrees = 0
    if not degrees:  # older muxers wrote a 'rotate' tag (clockwise degrees) instead of a matrix
        degrees = -int(stream.metadata.get("rotate", 0) or 0)
    return degrees % 360


def window_times(duration: float, window_s: float, frames_per_window: int) -> tuple[np.ndarray, ...]:
    """Split [0, duration) into windows and place ``frames_per_window`` sample times in each.

    Returns ``(start (n,), end (n,), times (n*frames_per_window,))``. There are ``round(duration /
    window_s)`` windows (at least one); the last one absorbs the remainder so the rows cover the whole
    video. Samples sit at the centres of equal sub-intervals of their window.
    """
    n = max(1, int(duration / window_s + 0.5))
    start = np.arange(n, dtype=np.float64) * window_s
    end = start + window_s
    end[-1] = max(duration, start[-1] + 1e-3)
    offsets = (np.arange(frames_per_window) + 0.5) / frames_per_window  # (F,)
    times = start[:, None] + offsets[None, :] * (end - start)[:, None]  # (n, F)
    return start, end, times.reshape(-1)


@dataclass
class FrameReader:
    """Iterate ``FrameBatch``es for sorted sample ``times``; bounded memory, stops cleanly on damage.

    ``size`` is the (width, height) frames are resized to at decode time (None keeps the display size).
    After iteration ``decoded_until`` is the time (s) up to which frames decoded cleanly and ``warnings``
    says what was skipped. A damaged video that decodes for less than ``limits.min_decoded_fraction`` of
    its duration raises ``CorruptVideo`` (possibly after some batches were yielded: discard them).
    """

    path: str
    times: np.ndarray
    size: tuple[int, int] | None = None
    batch_size: int = 32
    limits: DecodeLimits = field(default_factory=DecodeLimits)
    info: VideoInfo | None = None
    warnings: list[str] = field(default_factory=list)
    decoded_until: float = 0.0

    def __post_init__(self) -> None:
        self.info = self.info or probe(self.path, self.limits)
        if np.any(np.diff(self.times) < 0):
            raise ValueError(f"sample times for {self.path} must be sorted ascending")

    def __iter__(self) -> Iterator[FrameBatch]:
        """Decode with decord; on failure continue sequentially with PyAV from the first missing time."""
        done = 0
        try:
            for batch in self._decord_batches():
                done += len(batch.times)
                yield batch
        except _DecoderFailed as failure:
            self.warnings.append(f"decord stopped ({failure}); decoded the rest with PyAV")
            log.warning("%s: decord stopped (%s); continuing with PyAV", self.path, failure)
            for batch in self._pyav_batches(self.times[done:]):
                done += len(batch.times)
                yield batch
        self.decoded_until = max(self.decoded_until, float(self.times[done - 1]) if done else 0.0)
        self._check_coverage(done)

    def _check_coverage(self, done: int) -> None:
        """Raise NoFrames/CorruptVideo, or record a warning, when not every sample time decoded."""
        if done == len(self.times):
            return
        duration = self.info.duration or float(self.times[-1])
        if done == 0:
            raise NoFrames(self.path, "no frame could be decoded.", "The video stream is damaged; re-encode.")
        fraction = self.decoded_until / duration
        if fraction < self.limits.min_decoded_fraction:
            problem = f"the video is damaged: only {self.decoded_until:.1f} s of {duration:.1f} s decode."
            raise CorruptVideo(self.path, problem, "Re-encode or re-download the file.")
        message = (f"video damaged after {self.decoded_until:.1f} s of {duration:.1f} s "
                   f"({100 * fraction:.0f}%); kept the part that decoded")
        self.warnings.append(message)
        log.warning("%s: %s", self.path, message)

    def _decord_batches(self) -> Iterator[FrameBatch]:
        """Random-access decoding of only the frames the sample times need."""
        import decord

        width, height = self.size or (-1, -1)
        try:
            # decord applies the display matrix itself; width/height are in display orientation
            reader = decord.VideoReader(self.path, width=width, height=height, num_threads=0)  # 0: auto
            stamps = reader.get_frame_timestamp(range(len(reader)))  # (n, 2) start/end s, variable rate safe
        except (decord.DECORDError, RuntimeError) as e:
            raise _DecoderFailed(f"cannot open: {_first_line(e)}") from e
        if not len(stamps):
            raise _DecoderFailed("its frame index is empty")
        # a damaged index can end early: samples past its last frame are missing, not the last frame
        available = int(np.searchsorted(self.times, stamps[-1, 1] + _TOLERANCE_S, side="right"))
        index = frame_index(stamps[:, 0], self.times[:available])
        for lo in range(0, available, self.batch_size):
            wanted = index[lo : lo + self.batch_size]
            unique, inverse = np.unique(wanted, return_inverse=True)  # duplicates: sample rate > video rate
            try:
                frames = reader.get_batch(unique.tolist()).asnumpy()
            except (decord.DECORDError, RuntimeError) as e:
                raise _DecoderFailed(f"at {self.times[lo]:.1f} s: {_first_line(e)}") from e
            yield FrameBatch(frames[inverse], self.times[lo : lo + len(wanted)])
        if available < len(self.times):
            raise _DecoderFailed(f"its frame index ends at {stamps[-1, 1]:.1f} s")

    def _pyav_batches(self, times: np.ndarray) -> Iterator[FrameBatch]:
        """Sequential decoding from the keyframe before ``times[0]``; ends at the first broken packet."""
        import av

        frames: list[np.ndarray] = []
        k, last, last_time = 0, None, -1.0  # next sample; newest decoded frame and its time
        try:
            with av.open(self.path) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                if len(times) and times[0] > 0 and stream.time_base:
                    container.seek(int(times[0] / stream.time_base), stream=stream, backward=True)
                for frame in container.decode(stream):
                    if frame.time is None:
                        continue
                    rgb = self._pyav_rgb(frame)
                    while k < len(times) and frame.time > times[k]:  # times[k] was showing the previous frame
                        frames.append(rgb if last is None else last)
                        k += 1
                    last, last_time = rgb, float(frame.time)
                    if len(frames) >= self.batch_size or k == len(times):
                        yield FrameBatch(np.stack(frames), times[k - len(frames) : k])
                        frames = []
                    if k == len(times):
                        return
        except av.error.FFmpegError as e:
            log.warning("%s: PyAV stopped: %s", self.path, _first_line(e))
        # the newest frame stays on screen for one frame period, or to the end when decoding finished
        period = 1.0 / self.info.fps if self.info.fps else _TOLERANCE_S
        finished = last_time >= self.info.duration - 2 * period
        self.decoded_until = last_time + period  # the end of the last frame that decoded
        while last is not None and k < len(times) and (finished or times[k] <= last_time + period):
            frames.append(last)
            k += 1
        if frames:
            yield FrameBatch(np.stack(frames), times[k - len(frames) : k])

    def _pyav_rgb(self, frame) -> np.ndarray:  # av.VideoFrame
        """RGB array of a PyAV frame, resized and turned to display orientation like decord does."""
        turns = (self.info.rotation // 90) % 4
        width, height = self.size or self.info.display_size
        if turns % 2:
            width, height = height, width  # resize in coded orientation, then rotate
        rgb = frame.reformat(width=width, height=height, format="rgb24").to_ndarray()
        return np.ascontiguousarray(np.rot90(rgb, k=turns)) if turns else rgb


class _DecoderFailed(Exception):
    """decord could not continue; internal signal to switch decoders."""


def _first_line(error: Exception) -> str:
    """decord errors carry C++ source locations and backtraces; keep the first message for people."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"^(\[[\d:]+\]\s+\S+:\d+:\s*)+", "", text)[:200]


def frame_index(frame_starts: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Index of the frame shown at each time: the last frame whose start is <= t (variable rate safe)."""
    index = np.searchsorted(frame_starts, times, side="right") - 1
    return np.clip(index, 0, len(frame_starts) - 1)


def read_frames(path: str | Path, fps: float | None = None, times: np.ndarray | None = None,
                size: tuple[int, int] | None = None, batch_size: int = 32,
                limits: DecodeLimits | None = None) -> FrameReader:
    """Frames sampled at ``fps`` (centre of each 1/fps interval) or at explicit ``times`` (seconds)."""
    limits = limits or DecodeLimits()
    info = probe(path, limits)
    if (fps is None) == (times is None):
        raise ValueError("read_frames needs exactly one of fps= or times=")
    if times is None:
        if fps <= 0 or not math.isfinite(fps):
            raise ValueError(f"fps must be positive, got {fps}")
        times = window_times(info.duration, 1.0 / fps, 1)[2]
    return FrameReader(str(path), np.asarray(times, dtype=np.float64), size, batch_size, limits, info)


def find_videos(paths: list[str | Path]) -> list[Path]:
    """Files as given plus video files found (recursively, sorted) in the given directories."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in VIDEO_SUFFIXES)
        else:
            found.append(p)
    return found
