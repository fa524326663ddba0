"""The moment, taken away (issue #45, item 3): ``/clip(video_id, start, end)`` in the API, the MCP tool
``clip`` and the page's download links (``GET /prvr/clip/<id>?start=&end=``) give an MP4 of exactly that span:
its first frame is the frame at ``start`` (no frozen head from a keyframe cut), its length the span's, the
video's sound when it has some; bad input is refused in one line, and no work file is left behind. And a
card's poster (``GET /prvr/poster/<id>?t=``): the frame its player starts on, so that the stand-in shows the
moment, not a black box."""

from __future__ import annotations

import io
import logging
import time
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest

from tests.clips import marked, write_clip
from tests.servers import call_mcp

SHARED_VIDEOS = Path(__file__).resolve().parents[1] / ".." / "shared" / "videos"
WITH_SOUND = SHARED_VIDEOS / "univtg_charades.mp4"  # 30.7 s, 480x270, 29.97 fps, AAC; keyframes: 0, 16.7 s


def frames_of(path: Path) -> tuple[list[float], list[np.ndarray]]:
    """Every decoded frame of ``path``'s video (RGB) and its time."""
    import av

    with av.open(str(path)) as container:
        decoded = [(float(f.time), f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]
    return [t for t, _ in decoded], [f for _, f in decoded]


def at(times: list[float], t: float) -> int:
    """The index of the frame showing at ``t``: the last one whose time is at most ``t``."""
    return max(int(np.searchsorted(np.asarray(times), t + 1e-6, side="right")) - 1, 0)


def difference(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two pictures' pixels (0-255)."""
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def streams(path: Path) -> dict:
    """The clip's container: its length, video frame count and rate, and its audio stream (or None)."""
    import av

    with av.open(str(path)) as container:
        video = container.streams.video[0]
        audio = container.streams.audio[0] if container.streams.audio else None
        return {"duration": container.duration / av.time_base, "frames": video.frames,
                "rate": float(video.average_rate), "codec": video.codec_context.name,
                "pix_fmt": video.codec_context.pix_fmt,
                "audio": None if audio is None else {"codec": audio.codec_context.name,
                                                     "duration": float(audio.duration * audio.time_base)}}


def test_a_cut_starts_on_the_frame_at_start_not_at_a_keyframe(tmp_path: Path) -> None:
    """A keyframe every 12 frames: a span starting at frame 17 (or inside it) begins with frame 17 (red 136),
    where a cut at the keyframe would show frame 12 for 5 frames; it ends with the last frame before end."""
    from extract.transcode import EncodeSettings, cut

    source = write_clip(tmp_path / "marked.mp4", frames=32, fps=12, picture=marked)
    times, pictures = frames_of(source)
    for start, end in ((17 / 12, 30 / 12), (17 / 12 + 0.04, 30 / 12 + 0.01), (0.0, 1.0), (2.0, 2.05),
                       (2.2, 31 / 12)):  # (frames past 31 are all red 255)
        clip = cut_to(cut, source, tmp_path / f"{start:.3f}.mp4", start, end, EncodeSettings())
        first, last = at(times, start), at(times, end - 1e-3)
        got_times, got = frames_of(clip)
        assert len(got) == last - first + 1, (start, end, len(got))  # every frame showing in the span
        for shown, source_index in ((got[0], first), (got[-1], last)):  # the right frames, at the ends
            nearest = int(np.argmin([difference(shown, p) for p in pictures]))
            assert nearest == source_index, (start, end, nearest, source_index)
        info = streams(clip)
        assert abs(info["duration"] - (end - start)) <= 1 / 12 + 1e-3, (start, end, info)
        assert info["codec"] == "h264" and info["pix_fmt"] == "yuv420p" and info["audio"] is None
        assert got_times[0] == 0.0


def test_a_cut_keeps_the_display_rotation(tmp_path: Path) -> None:
    """A phone's portrait video (a display matrix) stays upright in its clips."""
    from extract.decode import probe
    from extract.transcode import EncodeSettings, cut

    source = write_clip(tmp_path / "portrait.mp4", frames=24, fps=12, size=(64, 48), rotation=90)
    for start in (0.0, 1.1):
        clip = cut_to(cut, source, tmp_path / f"clip{start}.mp4", start, 1.9, EncodeSettings())
        assert probe(clip).rotation == probe(source).rotation == 90
        assert probe(clip).display_size == (48, 64)


def cut_to(cut, source: Path, clip: Path, start: float, end: float, settings) -> Path:
    """``cut`` into ``clip``; the clip."""
    cut(source, clip, start, end, settings)
    return clip


@pytest.mark.skipif(not WITH_SOUND.exists(), reason="needs ../shared/videos (a real video with sound)")
def test_a_real_video_is_cut_with_its_sound_in_step(tmp_path: Path) -> None:
    """A real 30 fps video with AAC sound: the clip of 10.9-15.3 s starts on the frame at 10.9 s (not on the
    keyframe at 0 s, nor on a frame beside the right one), lasts 4.4 s (within a frame), and its sound is the
    source's sound of the span."""
    import av

    from prvr.serve.clips import CLIP_ENCODING, ClipRequest, make_clip

    start, end = 10.9, 15.3
    wanted = ClipRequest("charades", "a room: charades", WITH_SOUND, start, end)
    clip = make_clip(wanted, tmp_path)
    assert clip.name == "a_room_charades_10.90-15.30s.mp4" and clip.parent == tmp_path
    times, pictures = frames_of(WITH_SOUND)
    first = frames_of(clip)[1][0]
    with av.open(str(WITH_SOUND)) as container:  # the keyframe a cut without re-encoding would start on
        keys = [float(p.pts * p.time_base) for p in container.demux(video=0)
                if p.is_keyframe and p.pts is not None]
    keyframe = at(times, max(k for k in keys if k <= start))
    shown = at(times, start)
    exact = difference(first, pictures[shown])
    assert exact < 4.0, exact  # the same picture, re-encoded (CLIP_ENCODING: crf 20)
    assert exact < difference(first, pictures[keyframe]) - 4.0, (exact, keyframe)
    near = range(shown - 3, shown + 4)
    assert near[int(np.argmin([difference(first, pictures[i]) for i in near]))] == shown
    info = streams(clip)
    assert abs(info["duration"] - (end - start)) <= 1 / 30 + 0.03, info  # AAC's last frame pads a little
    assert info["audio"] is not None and info["audio"]["codec"] == "aac", info
    assert abs(info["audio"]["duration"] - (end - start)) < 0.05, info
    # the sound: its loudness over 10 ms windows follows the source's over the same seconds, in step (best
    # at no lag: the AAC encoder's priming, ~23 ms, is skipped by the edit list, not played)
    rate, window = 16000, 160
    source, cut = sound(WITH_SOUND, rate, start, end), sound(clip, rate, 0.0, end - start)
    n = min(len(source), len(cut)) // window * window
    loud = [np.sqrt((x[:n].reshape(-1, window) ** 2).mean(axis=1)) for x in (source, cut)]

    def alike(lag: int) -> float:
        """Correlation of the loudness curves with the clip's ``lag`` windows later."""
        x, y = (loud[0][: len(loud[0]) - lag], loud[1][lag:]) if lag >= 0 else (loud[0][-lag:], loud[1][:lag])
        return float(np.corrcoef(x, y)[0, 1])

    assert alike(0) > 0.99 and all(alike(0) > alike(lag) + 0.05 for lag in (-2, -1, 1, 2)), \
        [round(alike(lag), 3) for lag in range(-3, 4)]
    assert CLIP_ENCODING.max_height >= 270


def sound(path: Path, rate: int, start: float, end: float) -> np.ndarray:
    """``path``'s sound from ``start`` to ``end`` seconds, mono float at ``rate``."""
    import av

    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    chunks = []
    with av.open(str(path)) as container:
        for frame in container.decode(audio=0):
            chunks += [c.to_ndarray().reshape(-1) for c in resampler.resample(frame)]
    samples = np.concatenate(chunks)
    return samples[int(start * rate): int(end * rate)]


def work_folders(predictor) -> list[Path]:
    """The work folders left in the data dir's media area."""
    return sorted(predictor.media.dir.glob("work-*"))


def wait_for_no_work(predictor, timeout: float = 30.0) -> list[Path]:
    """The work folders left once the response's background removal has run (it runs after the last byte)."""
    deadline = time.monotonic() + timeout
    while work_folders(predictor) and time.monotonic() < deadline:
        time.sleep(0.05)
    return work_folders(predictor)


def test_the_api_clip_is_that_span_and_leaves_no_work_file(served: tuple) -> None:
    from gradio_client import Client

    url, predictor, _ = served
    video_id = predictor.index.ids[0]  # the served gradient clip: 24 frames at 12 fps, each frame distinct
    source = predictor.video_file(video_id)
    times, pictures = frames_of(source)
    client = Client(url, verbose=False)
    path = Path(client.predict(video_id, 0.55, 1.5, api_name="/clip"))
    assert path.suffix == ".mp4" and path.name.endswith("_0.55-1.50s.mp4"), path
    got_times, got = frames_of(path)
    assert int(np.argmin([difference(got[0], p) for p in pictures])) == at(times, 0.55) == 6
    assert len(got) == at(times, 1.5 - 1e-3) - 6 + 1 == 12
    assert not wait_for_no_work(predictor)  # removed once Gradio took its copy (the generator's last step:
    # the answer may reach the client first)


def test_the_clip_route_sends_an_attachment_and_removes_it(served: tuple) -> None:
    import httpx

    from prvr.serve.clips import clip_url

    url, predictor, _ = served
    video_id = predictor.index.ids[0]
    reply = httpx.get(url.rstrip("/") + clip_url(video_id, 1.0, 2.0), timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "video/mp4" and reply.content[4:8] == b"ftyp"
    assert reply.headers["content-disposition"].startswith("attachment") and "1.00-2.00s.mp4" in \
        reply.headers["content-disposition"]
    assert not wait_for_no_work(predictor)


def test_bad_spans_are_refused_in_one_line_everywhere(served: tuple, caplog: pytest.LogCaptureFixture,
                                                      capfd: pytest.CaptureFixture) -> None:
    import httpx
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    url, predictor, _ = served
    video_id = predictor.index.ids[0]  # 2.0 s long
    long = "'gradient' is 2.000 s long."
    cases = [((video_id, 1.0, 1.0), "The span 1-1 s is empty: end must be after start."),
             ((video_id, 1.5, 0.5), "The span 1.5-0.5 s is inverted: end must be after start."),
             ((video_id, -1.0, 1.0), "start must be 0 or more seconds, got -1."),
             ((video_id, 1.0, 2.5), f"The span 1-2.5 s ends after the video does: {long}"),
             ((video_id, 2.0, 3.0), f"The span 2-3 s starts after the video ends: {long}"),
             ((video_id, 0.0, 900.0), "The span 0-900 s is 900 s long; a clip is at most 600 s"),
             (("upload:nothere", 0.0, 1.0), "No video has the id 'upload:nothere' here"),
             ((video_id, None, 1.0), "start must be a number of seconds, got None."),
             (("", 0.0, 1.0), "video_id must be the id of a video")]
    client = Client(url, verbose=False)
    with caplog.at_level(logging.WARNING):
        for (vid, start, end), message in cases:
            with pytest.raises(AppError) as refused:
                client.predict(vid, start, end, api_name="/clip")
            assert str(refused.value).startswith(message) and "\n" not in str(refused.value), refused.value
            query = "&".join(f"{k}={v}" for k, v in (("start", start), ("end", end)) if v is not None)
            reply = httpx.get(f"{url}prvr/clip/{quote(vid)}?{query}", timeout=60)
            if vid:
                assert reply.status_code == (404 if vid != video_id else 400), (vid, reply.status_code)
                assert reply.text.startswith(message), reply.text
        for start, end, message in (("nan", "1", "start must be a finite number of seconds, got 'nan'."),
                                    ("0", "inf", "end must be a finite number of seconds, got 'inf'."),
                                    ("zero", "1", "start must be a number of seconds, got 'zero'.")):
            reply = httpx.get(f"{url}prvr/clip/{quote(video_id)}?start={start}&end={end}", timeout=60)
            assert reply.status_code == 400 and reply.text == message, reply.text
    refusals = [r for r in caplog.records if r.getMessage().startswith("clip refused")]
    assert len(refusals) >= len(cases) + 3 and not any(r.exc_info for r in refusals)
    assert "Traceback" not in capfd.readouterr().err
    assert not work_folders(predictor)  # nothing made for a refused span


def test_mcp_clip_answers_the_url_of_the_mp4(served: tuple) -> None:
    import httpx

    url, predictor, _ = served
    video_id = predictor.index.ids[0]
    made, refused = call_mcp(url, ("clip", {"video_id": video_id, "start": 0.25, "end": 1.75}),
                             ("clip", {"video_id": video_id, "start": 1.75, "end": 0.25}))
    assert not made.isError, made.content[0].text
    data = made.structuredContent
    assert data["clip_url"] == f"{url}prvr/clip/{quote(video_id)}?start=0.250&end=1.750", data
    assert (data["start"], data["end"], data["duration"]) == (0.25, 1.75, 1.5)
    reply = httpx.get(data["clip_url"], timeout=120)
    assert reply.status_code == 200 and reply.content[4:8] == b"ftyp"
    assert refused.isError and refused.content[0].text == \
        "The span 1.75-0.25 s is inverted: end must be after start."
    assert not wait_for_no_work(predictor)


def test_a_session_upload_is_clipped_only_in_its_session(served: tuple, tmp_path: Path) -> None:
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    url = served[0]
    mine, other = Client(url, verbose=False), Client(url, verbose=False)
    added = mine.predict(handle_file(str(write_clip(tmp_path / "mine.mp4", frames=30, size=(80, 48)))),
                         api_name="/add_video")
    assert added["status"] == "added", added
    assert Path(mine.predict(added["video_id"], 0.5, 2.0, api_name="/clip")).stat().st_size > 0
    with pytest.raises(AppError, match="No video has the id"):
        other.predict(added["video_id"], 0.5, 2.0, api_name="/clip")


def test_each_moment_on_a_card_has_its_download_link() -> None:
    from prvr.serve.page import card_html

    moments = [{"start": 4.0, "end": 9.0, "play_from": 4.5, "score": 0.3, "contrast": 4.0},
               {"start": 20.0, "end": 31.0, "play_from": 20.5, "score": 0.2, "contrast": 1.0}]
    result = {"rank": 1, "video_id": "upload:a b", "title": "t", "duration": 30.0, "score": 0.3,
              "clip_score": 0.3, "frame_score": 0.3, "confidence": "low", "confidence_label": "unconfirmed",
              "key_moment": moments[0], "moments": moments,
              "heatmap": {"start": [0.0], "end": [30.0], "score": [0.1]}}
    page = card_html(result, 0.7, (0.0, 1.0), "https://example.org")
    assert 'href="https://example.org/prvr/clip/upload%3Aa%20b?start=4.000&amp;end=9.000" download' in page
    assert 'href="https://example.org/prvr/clip/upload%3Aa%20b?start=20.000&amp;end=30.000" download' in page


def test_the_poster_is_the_frame_at_t(served: tuple) -> None:
    import httpx
    from PIL import Image

    from prvr.serve.posters import poster_url

    url, predictor, _ = served
    video_id = predictor.index.ids[0]  # the served gradient clip: 24 frames at 12 fps, each frame distinct
    times, pictures = frames_of(predictor.video_file(video_id))
    for t in (0.0, 0.55, 1.3, 2.0):
        reply = httpx.get(url.rstrip("/") + poster_url(video_id, t), timeout=60)
        assert reply.status_code == 200 and reply.headers["content-type"] == "image/jpeg", reply.text
        poster = np.asarray(Image.open(io.BytesIO(reply.content)).convert("RGB"))
        assert poster.shape == pictures[0].shape  # a small video keeps its size (never scaled up)
        assert int(np.argmin([difference(poster, p) for p in pictures])) == at(times, t), t
    again = httpx.get(url.rstrip("/") + poster_url(video_id, 0.55), timeout=60)
    assert again.content == httpx.get(url.rstrip("/") + poster_url(video_id, 0.55), timeout=60).content


def test_a_poster_is_at_most_480_pixels_wide_and_upright(tmp_path) -> None:
    from PIL import Image

    from prvr.serve.posters import POSTER_WIDTH, poster_jpeg

    wide = write_clip(tmp_path / "wide.mp4", size=(1280, 720))
    assert Image.open(io.BytesIO(poster_jpeg(wide, 1.0))).size == (POSTER_WIDTH, 270)
    turned = write_clip(tmp_path / "turned.mp4", size=(640, 360), rotation=90)  # shown 360 x 640
    assert Image.open(io.BytesIO(poster_jpeg(turned, 1.0))).size == (360, 640)


def test_bad_poster_requests_are_refused_in_one_line(served: tuple, caplog: pytest.LogCaptureFixture,
                                                     capfd: pytest.CaptureFixture) -> None:
    import httpx

    url, predictor, _ = served
    video_id = predictor.index.ids[0]  # 2.0 s long
    cases = [(video_id, "t=abc", 400, "t must be a number of seconds, got 'abc'."),
             (video_id, "", 400, "t must be a number of seconds, got None."),
             (video_id, "t=nan", 400, "t must be a finite number of seconds, got 'nan'."),
             (video_id, "t=2.5", 400, "t must be from 0 to 2.000 s (the video's length), got 2.5."),
             (video_id, "t=-1", 400, "t must be from 0 to 2.000 s (the video's length), got -1."),
             ("nothere", "t=1", 404, "No video has the id 'nothere' here.")]
    with caplog.at_level(logging.WARNING):
        for vid, query, status, message in cases:
            reply = httpx.get(f"{url}prvr/poster/{quote(vid)}?{query}", timeout=60)
            assert (reply.status_code, reply.text) == (status, message)
    refusals = [r for r in caplog.records if r.getMessage().startswith("poster refused")]
    assert len(refusals) == len(cases) and not any(r.exc_info for r in refusals)
    assert "Traceback" not in capfd.readouterr().err
