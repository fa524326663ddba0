"""A card's poster (``GET /prvr/poster/<id>?t=``, ``prvr.serve.posters``): the frame its player starts on, so
that the stand-in shows the moment, not a black box; bad input is refused in one line."""

from __future__ import annotations

import io
import logging
from urllib.parse import quote

import numpy as np
import pytest

from tests.test_moment_clips import at, difference, frames_of


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
    from tests.clips import write_clip

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
