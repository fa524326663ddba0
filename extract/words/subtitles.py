"""Subtitles as timed words: the text subtitle tracks inside a video file and a sidecar .srt / .vtt beside it.

Tracks are read with PyAV: every text subtitle codec FFmpeg decodes (mov_text, subrip, webvtt, ass/ssa and
the rarer text formats) comes out of its decoder as an ASS event, so one path reads them all; styling,
override tags and markup are stripped (``plain_text``). Bitmap subtitles (DVD, PGS, DVB: pictures of text)
and codecs this FFmpeg does not know are refused with a ``WordsUnavailable`` naming the track and codec.

Sidecar files are read with pysubs2. Their bytes must be UTF-8 (with or without a byte-order mark) or UTF-16
with a byte-order mark: those say what they are. Anything else is refused with a one-line reason rather than
guessed: a legacy 8-bit encoding (Windows-1252, -1251, ...) decodes without error in every other 8-bit
encoding too, so a fallback would index mojibake silently; the line tells the person to save it as UTF-8.
"""

from __future__ import annotations

import bisect
import codecs
import html
import re
from collections.abc import Callable
from pathlib import Path

from extract.words.segment import WordSegment, WordsUnavailable

SIDECAR_SUFFIXES = (".srt", ".vtt")  # what find_sidecar looks for and read_sidecar reads
MAX_SIDECAR_BYTES = 20 << 20  # a feature film's .srt is ~100 KB; anything this big is not a subtitle file

# suffix -> (pysubs2's format, what people call it)
_FORMATS = {".srt": ("srt", "SRT"), ".vtt": ("vtt", "WebVTT")}
_BLOCK = re.compile(r"\{[^{}]*\}")  # an ASS override block: {\b1}, {\pos(10,10)}, {\p1}
_DRAWING = re.compile(r"\\p(\d+)")  # \p1 .. \pN start vector drawing (shape commands, not text); \p0 ends it
_MARKUP = re.compile(r"</?[A-Za-z][^<>]*>|<\d+:[\d:.]+>")  # <i>, <font ...>, <v Name>, <c.cls>; <00:01.000>
_SPACE = re.compile(r"\s+")


def plain_text(event: str, entities: bool = False) -> str:
    """One line of readable text from a subtitle event: ASS override blocks, drawings and SRT/WebVTT markup
    removed, ASS line breaks and hard spaces made spaces; ``entities``: WebVTT's &amp; &lt; ... decoded."""
    kept, drawing = [], False
    for piece in re.split(r"(\{[^{}]*\})", event):
        if _BLOCK.fullmatch(piece):
            for level in _DRAWING.findall(piece):  # the last \p in a block wins, as in renderers
                drawing = int(level) > 0
            continue
        if not drawing:
            kept.append(piece)
    text = "".join(kept).replace("\\N", " ").replace("\\n", " ").replace("\\h", " ")
    text = _MARKUP.sub("", text)
    if entities:
        text = html.unescape(text)
    return _SPACE.sub(" ", text).strip()


def subtitle_tracks(video_path: str | Path,
                    on_skip: Callable[[str], None] | None = None) -> list[WordSegment]:
    """The lines of every text subtitle track in the file, sorted by time (a line repeated exactly by another
    track once).

    A track that cannot be read (bitmap or unknown codec, damaged or non-UTF-8 lines) raises WordsUnavailable
    naming it; with ``on_skip`` its one-line reason goes there instead and the other tracks are still read.
    A file without subtitle tracks gives [].
    """
    import av

    path = Path(video_path)
    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, OSError) as e:
        raise WordsUnavailable(f"subtitle tracks of {path.name} cannot be read ({_reason(e)})") from None
    problems: list[str] = []
    with container:
        offset = container.start_time / 1e6 if container.start_time else 0.0  # times as players show them
        readable = []
        for stream in container.streams.subtitles:
            refusal = _refusal(stream)
            if refusal:
                problems.append(refusal)
            else:
                readable.append(stream)
        lines: dict[int, list[tuple[float, float | None, str]]] = {s.index: [] for s in readable}
        damaged = {s.index: 0 for s in readable}
        if readable:
            try:
                for packet in container.demux(readable):
                    text = _packet_text(packet)
                    stamp = packet.pts if packet.pts is not None else packet.dts  # subtitles: dts = pts
                    if text is None:
                        damaged[packet.stream.index] += 1
                    elif text and stamp is not None and packet.time_base:
                        start = float(stamp * packet.time_base) - offset
                        length = float(packet.duration * packet.time_base) if packet.duration else None
                        lines[packet.stream.index].append((start, length, text))
            except av.error.FFmpegError as e:  # the container breaks off: keep the lines read before it
                problems.append(f"subtitle tracks of {path.name} are damaged ({_reason(e)}); "
                                "kept the lines read before it")
        end_of_video = container.duration / 1e6 if container.duration else None
        for stream in readable:
            if damaged[stream.index]:
                problems.append(f"{_track(stream)}: skipped {damaged[stream.index]} damaged or non-UTF-8 "
                                f"line{'s' if damaged[stream.index] != 1 else ''}")
        # while the container is open: a closed container's streams no longer know their index
        segments = [seg for s in readable for seg in _segments(lines[s.index], end_of_video)]
    if problems:
        if on_skip is None:
            raise WordsUnavailable("; ".join(problems))
        for problem in problems:
            on_skip(problem)
    return by_time(segments)


def by_time(segments: list[WordSegment]) -> list[WordSegment]:
    """Subtitle lines sorted by time, each line once (two tracks, or a track and a sidecar, often repeat one
    another exactly)."""
    return sorted(dict.fromkeys(segments), key=lambda s: (s.start, s.end, s.text))


def _refusal(stream) -> str:  # av.SubtitleStream
    """Why a subtitle track cannot be read as text, or "" when it can."""
    context = stream.codec_context
    if context is None:
        return f"{_track(stream)} has a subtitle codec this FFmpeg does not know; it cannot be read"
    if context.codec.bitmap_sub or not context.codec.text_sub:
        return f"{_track(stream)} holds pictures of text (a bitmap codec), not text; it cannot be read"
    return ""


def _track(stream) -> str:  # av.SubtitleStream
    """How a report names a track: "track 2 (subrip, eng)"."""
    context = stream.codec_context
    facts = [context.codec.name if context is not None else "unknown codec"]
    language = stream.metadata.get("language")
    if language and language != "und":
        facts.append(language)
    return f"track {stream.index} ({', '.join(facts)})"


def _packet_text(packet) -> str | None:  # av.Packet
    """The plain text a subtitle packet shows ("" for an empty cue), or None when it does not decode as
    UTF-8 text."""
    import av

    if not packet.size:
        return ""
    try:
        events = packet.stream.decode(packet)
    except (av.error.FFmpegError, ValueError):  # FFmpeg refuses non-UTF-8 text ("Invalid UTF-8 ...")
        return None
    texts = []
    for event in events:
        try:
            texts.append(plain_text(bytes(event.dialogue).decode("utf-8")))
        except (AttributeError, UnicodeDecodeError):  # a bitmap rect or bytes that are not UTF-8
            return None
    return " ".join(t for t in texts if t)


def _segments(lines: list[tuple[float, float | None, str]], end_of_video: float | None) -> list[WordSegment]:
    """WordSegments of one track's (start, duration or None, text) lines; a line without a duration lasts
    until the next one starts (or the video ends); lines before 0 are clipped, empty ones dropped."""
    lines = sorted(lines, key=lambda line: line[0])
    starts = [start for start, _, _ in lines]
    segments = []
    for start, length, text in lines:
        if length is not None:
            end = start + length
        else:
            later = bisect.bisect_right(starts, start)  # the first line that starts after this one
            end = starts[later] if later < len(starts) else max(end_of_video or start, start)
        start, end = round(max(0.0, start), 3), round(max(0.0, end), 3)  # ms: the times' own precision
        if end > start and text:
            segments.append(WordSegment("subtitles", start, end, text))
    return segments


def find_sidecar(video_path: str | Path) -> Path | None:
    """The subtitle file beside a video with its stem (talk.mp4 -> talk.srt, then talk.vtt; the suffix's
    case ignored), or None."""
    video = Path(video_path)
    if not video.parent.is_dir():
        return None
    beside = [p for p in video.parent.iterdir() if p.stem == video.stem and p.is_file()]
    for suffix in SIDECAR_SUFFIXES:
        found = sorted(p for p in beside if p.suffix.lower() == suffix)
        if found:
            return found[0]
    return None


def read_sidecar(path: str | Path) -> list[WordSegment]:
    """The lines of a .srt or .vtt file, sorted by time; WordsUnavailable (one line) for a missing, empty,
    oversized, mis-encoded or unparseable file or one without a single timed line."""
    import pysubs2

    path = Path(path)
    name = f"sidecar {path.name}"
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise WordsUnavailable(f"{name}: not a subtitle file (expected {' or '.join(SIDECAR_SUFFIXES)})")
    try:
        size = path.stat().st_size
        if size > MAX_SIDECAR_BYTES:
            raise WordsUnavailable(f"{name} is {size / (1 << 20):.0f} MB; subtitle files over "
                                   f"{MAX_SIDECAR_BYTES >> 20} MB are not read")
        data = path.read_bytes()
    except OSError as e:
        raise WordsUnavailable(f"{name} cannot be read ({e.strerror or e})") from None
    text = _decode(data, name)
    if not text.strip():  # no bytes, blank lines, or a byte-order mark alone
        raise WordsUnavailable(f"{name} is empty")
    try:
        subs = pysubs2.SSAFile.from_string(text, format_=kind[0])
    except (pysubs2.Pysubs2Error, ValueError, IndexError, KeyError) as e:
        raise WordsUnavailable(f"{name} is not a valid {kind[1]} file ({_reason(e)})") from None
    segments = []
    for event in subs:
        line = plain_text(event.text, entities=kind[0] == "vtt")
        start, end = max(0, event.start) / 1000.0, max(0, event.end) / 1000.0
        if not event.is_comment and line and end > start:
            segments.append(WordSegment("subtitles", start, end, line))
    if not segments:
        raise WordsUnavailable(f"{name} has no timed subtitle lines; is it a {kind[1]} file?")
    return by_time(segments)


def _decode(data: bytes, name: str) -> str:
    """Text of a subtitle file: UTF-8 (a BOM allowed) or BOM-marked UTF-16; otherwise one line saying so."""
    boms = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
    encoding = next((name for bom, name in boms if data.startswith(bom)), "utf-8")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise WordsUnavailable(f"{name} is not valid {encoding.upper().removesuffix('-SIG')} (byte "
                               f"0x{data[e.start]:02x} at {e.start}); save it as UTF-8") from None


def _reason(error: Exception) -> str:
    """The first line of an error, for a report."""
    text = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return str(text).strip().splitlines()[0][:200]
