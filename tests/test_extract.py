"""extract/: decoding, media errors, the extraction pipeline, feature files, the official export, the CLI.

Clips are encoded by the tests with PyAV (small and short, so the file runs in well under a minute);
the real clips in ../shared/videos are used when present.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import h5py
import numpy as np
import pytest

import extract  # noqa: F401  - the torchvision fix, before any backbone
from extract.__main__ import main
from extract.decode import (
    BadDimensions,
    CorruptVideo,
    DecodeLimits,
    EmptyFile,
    FileMissing,
    FrameBatch,
    FrameReader,
    ImageNotVideo,
    NotAVideo,
    NoVideoStream,
    TooLong,
    _DecoderFailed,
    probe,
    read_frames,
    sha256_file,
    window_times,
)
from extract.features import FeatureFile, FeatureWriter, VideoFeatures, export_official
from extract.pipeline import VideoExtractor, _whole_windows
from extract.profiles import ProfileMismatch, get_profile
from tests.clips import marked, write_audio, write_clip

SHARED_VIDEOS = Path(__file__).resolve().parents[2] / "shared" / "videos"


def encode(path: Path, seconds: float = 3.0, fps: int = 10, size: tuple[int, int] = (64, 48), **kw) -> Path:
    """An H.264 clip whose frame i has red = 8*i (so tests can tell frames apart) and a green block in the
    top-left quarter (so tests can tell orientation); see tests/clips.py."""
    return write_clip(path, round(seconds * fps), fps, size, picture=marked, **kw)


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Good, odd and broken media files, made once for the module."""
    d = tmp_path_factory.mktemp("media")
    files = {
        "clip": encode(d / "clip.mp4"),
        "rotated": encode(d / "rotated.mp4", seconds=1, rotation=90),
        "odd": encode(d / "odd.mp4", seconds=1, size=(33, 17)),
        "portrait": encode(d / "portrait.mp4", seconds=1, size=(36, 64)),
        # variable frame rate: 10 fps for 1 s, then one frame every 0.5 s
        "vfr": encode(d / "vfr.mp4", pts_ms=[*range(0, 1000, 100), 1000, 1500, 2000, 2500]),
        "audio": write_audio(d / "audio.m4a"),
        "long": encode(d / "long.mp4", seconds=10, fps=10, container_options={"movflags": "+faststart"}),
    }
    data = files["long"].read_bytes()
    for name, fraction in (("cut99", 0.99), ("cut40", 0.4)):  # 99% of the bytes: 9 of 10 s decode
        files[name] = d / f"{name}.mp4"
        files[name].write_bytes(data[: int(len(data) * fraction)])
    files["noindex"] = d / "noindex.mp4"  # moov atom at the end, cut off: an incomplete download
    files["noindex"].write_bytes(encode(d / "tmp.mp4", seconds=1).read_bytes()[:-400])
    files["random"] = d / "random.mp4"
    files["random"].write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    files["text"] = d / "notes.mp4"
    files["text"].write_text("this is not a video\n" * 20)
    files["empty"] = d / "empty.mp4"
    files["empty"].write_bytes(b"")
    return files


# ----------------------------------------------------------------------------- decoding
def test_probe_reads_container_facts(media: dict[str, Path]) -> None:
    info = probe(media["clip"])
    assert (info.width, info.height, info.codec, info.rotation) == (64, 48, "h264", 0)
    assert info.duration == pytest.approx(3.0, abs=0.11) and info.fps == pytest.approx(10)
    assert info.has_video and not info.has_audio
    rotated = probe(media["rotated"])
    assert rotated.rotation == 90 and rotated.display_size == (48, 64)


def test_frames_are_sampled_by_timestamp(media: dict[str, Path]) -> None:
    reader = read_frames(media["clip"], fps=2, size=(32, 32), batch_size=4)
    batches = list(reader)
    times = np.concatenate([b.times for b in batches])
    np.testing.assert_allclose(times, np.arange(6) * 0.5 + 0.25)
    assert max(len(b.times) for b in batches) <= 4  # bounded batches
    red = np.concatenate([b.frames for b in batches])[:, :, :, 0].mean(axis=(1, 2))
    np.testing.assert_allclose(red, 8 * np.floor(times * 10), atol=6)  # frame shown at t is floor(10 t)


def test_variable_frame_rate_uses_timestamps(media: dict[str, Path]) -> None:
    times = np.array([0.15, 0.95, 1.2, 1.7, 2.6])
    frames = np.concatenate([b.frames for b in read_frames(media["vfr"], times=times, size=(16, 16))])
    # frames: 0..9 every 0.1 s, then 10 @1.0 s, 11 @1.5 s, 12 @2.0 s, 13 @2.5 s (index/fps would be wrong)
    np.testing.assert_allclose(frames[..., 0].mean(axis=(1, 2)), 8 * np.array([1, 9, 10, 11, 13]), atol=6)


def test_rotation_odd_and_portrait_sizes(media: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    frame = next(iter(read_frames(media["rotated"], fps=1))).frames[0]
    assert frame.shape == (64, 48, 3)  # display orientation: coded 64x48 turned by 90 degrees
    green = frame[..., 1] > 128  # coded top-left block, after a 90 degree CCW turn: bottom-left
    assert green[40:, :20].mean() > 0.9 and green[:24].mean() < 0.1
    monkeypatch.setattr(FrameReader, "_decord_batches", _decord_fails)  # the PyAV reader turns frames too
    pyav_frame = next(iter(read_frames(media["rotated"], fps=1))).frames[0]
    assert pyav_frame.shape == (64, 48, 3) and np.abs(pyav_frame.astype(int) - frame).mean() < 8
    assert next(iter(read_frames(media["odd"], fps=1))).frames.shape[1:] == (17, 33, 3)
    portrait = next(iter(read_frames(media["portrait"], fps=1, size=(24, 24)))).frames
    assert portrait.shape[1:] == (24, 24, 3)


def _decord_fails(self: FrameReader):  # stands in for FrameReader._decord_batches
    raise _DecoderFailed("test: decord unavailable")
    yield


def test_window_times_cover_the_video() -> None:
    start, end, times = window_times(10.3, 1.5, 2)
    assert len(start) == 7 and end[-1] == pytest.approx(10.3) and start[-1] == pytest.approx(9.0)
    assert np.all(times.reshape(7, 2) > start[:, None]) and np.all(times.reshape(7, 2) < end[:, None])
    assert len(window_times(0.4, 1.0, 1)[0]) == 1  # a video shorter than a window still gets a row


@pytest.mark.parametrize(("name", "error"), [
    ("random", NotAVideo), ("text", NotAVideo), ("empty", EmptyFile), ("audio", NoVideoStream),
    ("noindex", CorruptVideo),
])
def test_bad_media_raise_typed_errors(media: dict[str, Path], name: str, error: type) -> None:
    with pytest.raises(error) as info:
        probe(media[name])
    assert media[name].name in str(info.value) and len(info.value.reason) > 20  # names the file, explains


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF"])
def test_an_image_renamed_mp4_is_called_an_image(tmp_path: Path, fmt: str) -> None:
    from PIL import Image

    path = tmp_path / "holiday.mp4"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(path, fmt)
    with pytest.raises(ImageNotVideo) as info:
        probe(path)
    message = str(info.value)
    assert message.startswith("holiday.mp4: this is a") and "image, not a video" in message
    assert "remux" not in message and "damaged" not in message


def test_an_animated_gif_is_still_a_video(tmp_path: Path) -> None:
    from PIL import Image

    frames = [Image.new("RGB", (64, 48), (10 * i, 0, 0)) for i in range(12)]
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:], duration=100)
    assert probe(tmp_path / "anim.gif").duration == pytest.approx(1.2, abs=0.15)


def test_missing_file_and_limits(media: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(FileMissing, match="nothere.mp4"):
        probe(tmp_path / "nothere.mp4")
    with pytest.raises(TooLong, match="limit"):
        probe(media["clip"], DecodeLimits(max_duration_s=1.0))
    with pytest.raises(BadDimensions, match="64x48"):
        probe(media["clip"], DecodeLimits(max_pixels=1000))


def test_truncated_video_keeps_most_or_raises(media: dict[str, Path], caplog: pytest.LogCaptureFixture,
                                              ) -> None:
    reader = read_frames(media["cut99"], fps=1, size=(16, 16))
    with caplog.at_level(logging.WARNING):
        n = sum(len(b.times) for b in reader)
    assert 8 <= n < 10 and reader.decoded_until >= 8
    assert any("damaged" in w for w in reader.warnings) and "damaged" in caplog.text
    with pytest.raises(CorruptVideo, match="damaged"):
        list(read_frames(media["cut40"], fps=1, size=(16, 16)))
    lenient = read_frames(media["cut40"], fps=1, limits=DecodeLimits(min_decoded_fraction=0.05))
    assert 1 <= sum(len(b.times) for b in lenient) <= 4  # the limit is configurable


@pytest.mark.skipif(not SHARED_VIDEOS.is_dir(), reason="../shared/videos (real clips) not present")
def test_real_clips_probe_and_decode() -> None:
    clips = sorted(p for p in SHARED_VIDEOS.iterdir() if p.suffix in (".mp4", ".avi"))
    assert len(clips) >= 10
    for clip in clips:
        info = probe(clip)
        assert info.duration > 0 and info.width > 0, clip
    avi = SHARED_VIDEOS / "mmaction2__tools_data_skeleton_S001C001P001R001A001_rgb.avi"
    batch = next(iter(read_frames(avi, fps=2, size=(64, 64))))
    assert batch.frames.shape[1:] == (64, 64, 3) and batch.frames.std() > 5  # real content, not blank


# ----------------------------------------------------------------------------- pipeline
@pytest.fixture(scope="module")
def lite() -> VideoExtractor:
    return VideoExtractor("lite", device="cpu")


def test_lite_rows_are_backbone_features_of_sampled_frames(lite: VideoExtractor, media: dict) -> None:
    video = lite.extract(media["clip"])
    assert video.features.shape == (3, 1280) and video.features.dtype == np.float32
    np.testing.assert_allclose(video.start, [0, 1, 2]) and np.testing.assert_allclose(video.end, [1, 2, 3])
    assert video.sha256 == sha256_file(media["clip"]) and video.source == "clip.mp4" and not video.warnings
    frames = np.concatenate([b.frames for b in read_frames(media["clip"], fps=1, size=(224, 224))])
    np.testing.assert_allclose(video.features, lite.backbones[0].embed(frames), rtol=1e-4, atol=1e-4)
    assert lite.backbones[0].classify(video.features).shape == (3, 1000)  # the bridge's class head


def test_paper_recipe_concatenates_mean_frame_and_clip_features(media: dict[str, Path]) -> None:
    extractor = VideoExtractor("paper_test", device="cpu")
    video = extractor.extract(media["clip"])
    assert video.features.shape == (2, 2048 + 256)  # round(3.0 / 1.5) windows; resnet152_test + i3d_r50_test
    np.testing.assert_allclose(video.end, [1.5, 3.0])
    times = window_times(3.0, 1.5, 4)[2][:4]  # window 0: 4 frames; resnet takes frames 1 and 3
    frames = next(iter(read_frames(media["clip"], times=times, size=(64, 64)))).frames
    resnet, i3d = extractor.backbones
    tol = {"rtol": 1e-3, "atol": 1e-4}
    np.testing.assert_allclose(video.features[0, :2048], resnet.embed(frames[[1, 3]]).mean(0), **tol)
    np.testing.assert_allclose(video.features[0, 2048:], i3d.embed(frames[None])[0], **tol)


def test_damaged_video_keeps_decoded_windows(lite: VideoExtractor, media: dict[str, Path]) -> None:
    video = lite.extract(media["cut99"])
    assert 8 <= len(video.features) < 10 and video.duration == pytest.approx(video.end[-1])
    assert any("damaged" in w for w in video.warnings)
    with pytest.raises(NoVideoStream):
        lite.extract(media["audio"])


def test_batches_are_regrouped_into_whole_windows() -> None:
    batches = [FrameBatch(np.full((n, 1, 1, 3), i, np.uint8), np.zeros(n)) for i, n in enumerate([5, 3, 9])]
    out = list(_whole_windows(iter(batches), 4))  # 17 frames: 4 whole windows of 4, one frame left over
    assert [len(o) for o in out] == [4, 4, 8]
    assert out[1][:, 0, 0, 0].tolist() == [0, 1, 1, 1]  # the carried frame leads the next group


@pytest.mark.skipif(not SHARED_VIDEOS.is_dir(), reason="../shared/videos (real clips) not present")
def test_lite_on_a_real_clip(lite: VideoExtractor) -> None:
    video = lite.extract(SHARED_VIDEOS / "mmaction2__demo_demo_skeleton.mp4")
    assert video.features.shape == (3, 1280) and np.isfinite(video.features).all()
    assert video.features.std(0).mean() > 0.01  # rows differ: the scene moves


# ----------------------------------------------------------------------------- feature files
def _video(n: int, dim: int, seed: int) -> VideoFeatures:
    rng = np.random.default_rng(seed)
    return VideoFeatures(rng.normal(size=(n, dim)), np.arange(n), np.arange(n) + 1.0, float(n),
                         f"{seed:064x}", f"v{seed}.mp4", ["note"] if seed else [])


def test_feature_file_round_trip_resume_and_interrupted_writes(tmp_path: Path) -> None:
    profile, path = get_profile("paper_test"), tmp_path / "f.h5"
    with FeatureWriter(path, profile) as w:
        w.add_video("show/ep1%", _video(5, 2304, 1))
        w.add_caption("show/ep1%#enc#0", "a man talks", np.ones((4, 32)), "show/ep1%")
    with FeatureWriter(path, profile) as w:  # append (resume)
        assert w.has_sha256(f"{1:064x}")
        w.add_video("b", _video(2, 2304, 0))
        w._h5["videos"].create_group("half-written")  # an interrupted write: no `complete` attribute
    with FeatureFile(path) as f:
        assert f.video_ids() == ["show/ep1%", "b"] and f.profile == profile.identity()
        v = f.video("show/ep1%")
        np.testing.assert_array_equal(v.features, _video(5, 2304, 1).features)
        assert v.warnings == ["note"] and v.source == "v1.mp4" and v.duration == 5.0
        text, tokens = f.caption("show/ep1%#enc#0")
        assert text == "a man talks" and tokens.shape == (4, 32) and f.caption_video_id("show/ep1%#enc#0")
        assert f.has_sha256(f"{0:064x}") and not f.has_sha256("0" * 63 + "f")
    with pytest.raises(ProfileMismatch, match="'lite'.*'paper_test'|'paper_test'.*'lite'"):
        FeatureWriter(path, get_profile("lite"))
    with pytest.raises(ValueError, match="1280-d rows"):
        FeatureWriter(tmp_path / "g.h5", profile).add_video("x", _video(2, 1280, 3))


def test_export_official_round_trip(tmp_path: Path) -> None:
    profile, path = get_profile("paper_test"), tmp_path / "f.h5"
    videos = {"vid_a": _video(3, 2304, 1), "vid_b": _video(2, 2304, 2)}
    caps = {"vid_a#enc#0": "first", "vid_b#enc#0": "second", "vid_a#enc#1": "third"}
    with FeatureWriter(path, profile) as w:
        for vid, v in videos.items():
            w.add_video(vid, v)
        for i, (cap, text) in enumerate(caps.items()):
            w.add_caption(cap, text, np.full((i + 2, 32), i, np.float32), cap.split("#")[0])
    (tmp_path / "train.txt").write_text("".join(f"{c} {t}\n" for c, t in caps.items()))
    (tmp_path / "test.txt").write_text("vid_b#enc#0 second\n")
    root = export_official(path, {"train": tmp_path / "train.txt", "test": tmp_path / "test.txt"},
                           tmp_path / "out", "mine", "feat")
    # a minimal BigFile reader, as the official code reads it
    folder = root / "FeatureData" / "feat"
    n, dim = map(int, (folder / "shape.txt").read_text().split())
    ids = (folder / "id.txt").read_bytes().decode("iso-8859-1").split()
    rows = np.fromfile(folder / "feature.bin", dtype="<f4").reshape(n, dim)
    video2frames = ast.literal_eval((folder / "video2frames.txt").read_text())
    assert (n, dim) == (5, 2304) and list(video2frames) == ["vid_a", "vid_b"]
    for vid, v in videos.items():
        np.testing.assert_array_equal(rows[[ids.index(r) for r in video2frames[vid]]], v.features)
    with h5py.File(root / "TextData" / "roberta_mine_query_feat.hdf5", "r") as h5:
        assert h5["vid_a#enc#1"].shape == (4, 32) and float(h5["vid_a#enc#1"][0, 0]) == 2.0
    assert (root / "TextData" / "minetest.caption.txt").read_text() == "vid_b#enc#0 second\n"
    (tmp_path / "bad.txt").write_text("vid_c#enc#0 unknown video\n")
    with pytest.raises(KeyError, match="vid_c"):
        export_official(path, tmp_path / "bad.txt", tmp_path / "out2", "mine", "feat")


# ----------------------------------------------------------------------------- CLI
def test_cli_videos_resume_failures_and_profile_refusal(media: dict[str, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("clip", "odd", "text"):
        (folder / media[name].name).write_bytes(media[name].read_bytes())
    out = tmp_path / "f.h5"
    assert main(["videos", str(folder), "--profile", "lite", "--out", str(out), "--device", "cpu"]) == 1
    printed = capsys.readouterr().out
    assert "2 extracted" in printed and "FAILED" in printed and "notes.mp4" in printed
    assert sorted(FeatureFile(out).video_ids()) == ["clip", "odd"]
    assert main(["videos", str(folder / "clip.mp4"), "--out", str(out), "--device", "cpu"]) == 0
    assert "1 already in" in capsys.readouterr().out
    assert main(["videos", str(folder / "clip.mp4"), "--profile", "paper_test", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "'lite'" in err and "'paper_test'" in err


def test_cli_captions_and_export(tmp_path: Path) -> None:
    out, caps = tmp_path / "f.h5", tmp_path / "caps.txt"
    caps.write_text("clip#enc#0 a red square fades in\nclip#enc#1 green block\n")
    with FeatureWriter(out, get_profile("paper_test")) as w:
        w.add_video("clip", _video(2, 2304, 1))
    assert main(["captions", str(caps), "--profile", "paper_test", "--out", str(out)]) == 0
    with FeatureFile(out) as f:
        assert f.caption_ids() == ["clip#enc#0", "clip#enc#1"] and f.caption_video_id("clip#enc#1") == "clip"
        assert f.caption("clip#enc#0")[1].shape[1] == 32
    assert main(["export", str(out), "--captions", str(caps), "--out", str(tmp_path / "o"),
                 "--collection", "c", "--feature-name", "paper_test"]) == 0
    assert (tmp_path / "o" / "c" / "FeatureData" / "paper_test" / "shape.txt").read_text() == "2 2304"
    assert main(["captions", str(caps), "--profile", "lite", "--out", str(out)]) == 2  # other profile
