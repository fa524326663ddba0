"""Real media with words for the words tests, built at test time from the shared real clips (../shared):
videos with subtitle tracks muxed in (as ``ffmpeg -c copy`` does), with a text card rendered onto real frames,
and the subtitle files themselves. Nothing here is copied into the repository."""

from __future__ import annotations

import struct
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
NASA = SHARED / "videos_dev" / "torchcodec__nasa_13013.mp4"  # real narration, an English mov_text track
FOOTAGE = SHARED / "videos" / "mmaction2__tests_data_test.mp4"  # cleaning a pool: no text, no subtitles


def need(path: Path) -> Path:
    """The shared clip, or the test skipped with the reason."""
    if not path.is_file():
        pytest.skip(f"{path} is absent (the project's shared real clips, ../shared, are not here)")
    return path


SRT = """1
00:00:01,000 --> 00:00:02,500
The <i>reactor</i> is overheating

2
00:00:03,000 --> 00:00:04,000
Open the valve
on the left
"""

VTT = """WEBVTT

00:00:00.500 --> 00:00:01.500
<v Ada>Coolant &amp; pressure</v>

00:00:02.000 --> 00:00:03.250 align:start
Check <b>gauge</b> seven
"""

STYLE_FIELDS = ("Name, Fontname, Fontsize, PrimaryColour, SecondaryColour, OutlineColour, BackColour, Bold, "
                "Italic, Underline, StrikeOut, ScaleX, ScaleY, Spacing, Angle, BorderStyle, Outline, Shadow, "
                "Alignment, MarginL, MarginR, MarginV, Encoding")
ASS = "\n".join([
    "[Script Info]", "ScriptType: v4.00+", "PlayResX: 384", "PlayResY: 288", "",
    "[V4+ Styles]", f"Format: {STYLE_FIELDS}",
    "Style: Default,Arial,16,&Hffffff,&Hffffff,&H0,&H0,0,0,0,0,100,100,0,0,1,1,0,2,10,10,10,0", "",
    "[Events]", "Format: Layer, Start, End, Style, Name, MarginL, MarginR, MarginV, Effect, Text",
    r"Dialogue: 0,0:00:01.00,0:00:02.00,Default,,0,0,0,,{\b1}Quarterly{\b0} revenue\Nup twelve percent",
    r"Dialogue: 0,0:00:04.00,0:00:05.50,Default,,0,0,0,,{\pos(10,10)\c&H00FF00&}Thank you"
    r"{\p1}m 0 0 l 100 0 100 100{\p0}", ""])


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    """A subtitle file with these contents."""
    path.write_bytes(text.encode(encoding))
    return path


def mux(out: Path, video: Path, subtitle_files: list[Path], seconds: float = 6.0) -> Path:
    """``video``'s first ``seconds`` of pictures (packets copied) with each subtitle file as a track (packets
    copied from FFmpeg's own demuxer of the file), into ``out`` (.mkv)."""
    import av

    with av.open(str(video)) as source, av.open(str(out), "w") as target:
        picture = target.add_stream_from_template(source.streams.video[0])
        inputs = [av.open(str(f)) for f in subtitle_files]
        tracks = [target.add_stream_from_template(i.streams[0]) for i in inputs]
        for packet in source.demux(source.streams.video[0]):
            if packet.dts is None or packet.pts is None:
                continue
            if packet.pts * packet.time_base > seconds:
                break
            packet.stream = picture
            target.mux(packet)
        for i, track in zip(inputs, tracks, strict=True):
            with i:
                for packet in i.demux(i.streams[0]):
                    if packet.dts is not None:
                        packet.stream = track
                        target.mux(packet)
    return out


def mov_text_mp4(out: Path, lines: list[tuple[float, float, bytes]]) -> Path:
    """The NASA clip's pictures with a mov_text track (its own track's setup) carrying ``lines``: (start,
    duration, raw text bytes), each packet a 2-byte big-endian length then the bytes (mov_text's layout)."""
    import av

    with av.open(str(need(NASA))) as source, av.open(str(out), "w") as target:
        picture = target.add_stream_from_template(source.streams.video[0])
        track = target.add_stream_from_template(source.streams.subtitles[0])
        for packet in source.demux(source.streams.video[0]):
            if packet.dts is not None:
                packet.stream = picture
                target.mux(packet)
        for start, length, raw in lines:
            packet = av.Packet(struct.pack(">H", len(raw)) + raw)
            packet.stream, packet.time_base = track, Fraction(1, 1000)
            packet.pts = packet.dts = round(start * 1000)
            packet.duration = round(length * 1000)
            target.mux(packet)
    return out


def bitmap_track(out: Path, video: Path) -> Path:
    """``video``'s pictures with a DVD (bitmap) subtitle track beside a subrip one, in an mkv."""
    import av

    srt = write(out.with_suffix(".tmp.srt"), SRT)
    with av.open(str(video)) as source, av.open(str(out), "w") as target, av.open(str(srt)) as text:
        picture = target.add_stream_from_template(source.streams.video[0])
        dvd = target.add_stream("dvd_subtitle")
        track = target.add_stream_from_template(text.streams[0])
        for packet in source.demux(source.streams.video[0]):
            if packet.dts is not None:
                packet.stream = picture
                target.mux(packet)
        for packet in text.demux(text.streams[0]):
            if packet.dts is not None:
                packet.stream = track
                target.mux(packet)
        packet = av.Packet(bytes(64))  # never decoded: the track is refused by its codec
        packet.stream, packet.time_base = dvd, Fraction(1, 1000)
        packet.pts = packet.dts = 1000
        packet.duration = 1000
        target.mux(packet)
    srt.unlink()
    return out


def card_video(out: Path, text: str | None, seconds: float = 6.0, card: tuple[float, float] = (2.0, 4.0),
               fps: int = 10) -> Path:
    """Real footage (FOOTAGE) at 640x360 with ``text`` on a caption card from card[0] to card[1] s (none when
    ``text`` is None), encoded as H.264 mp4 without audio."""
    import av
    from PIL import ImageDraw, ImageFont

    frames = []
    with av.open(str(need(FOOTAGE))) as source:
        for frame in source.decode(video=0):
            if frame.time is not None and frame.time < seconds:
                frames.append((frame.time, frame.to_image().resize((640, 360))))
    times = np.array([t for t, _ in frames])
    font = ImageFont.truetype("DejaVuSans.ttf", 30) if _has_dejavu() else ImageFont.load_default(size=30)
    with av.open(str(out), "w") as target:
        stream = target.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 640, 360, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "14"}
        for i in range(round(seconds * fps)):
            image = frames[int(np.abs(times - i / fps).argmin())][1].copy()
            if text is not None and card[0] <= i / fps < card[1]:
                draw = ImageDraw.Draw(image)
                draw.rectangle((30, 250, 610, 320), fill=(15, 15, 60))
                draw.text((45, 266), text, font=font, fill=(255, 255, 255))
            picture = av.VideoFrame.from_image(image)
            picture.pts, picture.time_base = i, Fraction(1, fps)
            for packet in stream.encode(picture):
                target.mux(packet)
        for packet in stream.encode():
            target.mux(packet)
    return out


def _has_dejavu() -> bool:
    """Whether PIL finds the DejaVu font (most Linux machines); else its built-in font is used."""
    from PIL import ImageFont

    try:
        ImageFont.truetype("DejaVuSans.ttf", 10)
        return True
    except OSError:
        return False
