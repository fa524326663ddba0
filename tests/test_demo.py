"""The generated demo gallery: real H.264 videos whose annotations match what they show; its evaluation."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prvr  # noqa: F401  - applies the compatibility fix first
from prvr import annotated, demo, render

# four short videos (12 photos, no photo twice): rendered, extracted and evaluated in well under a minute
SMALL = ["demo01", "demo03", "demo06", "demo07"]


@pytest.fixture(scope="session")
def small_gallery(tmp_path_factory: pytest.TempPathFactory) -> demo.DemoGallery:
    return demo.build_demo_gallery(tmp_path_factory.mktemp("demo-small"), video_ids=SMALL)


@pytest.fixture(scope="session")
def spec() -> dict:
    return demo.load_spec()


@pytest.fixture(scope="session")
def photos(spec: dict) -> dict:
    """Every gallery photo, loaded and converted to the renderer's planes once."""
    return {name: render.photo_planes(render.load_photo(p["source"], p.get("index")), render.RenderConfig())
            for name, p in spec["photos"].items()}


def renderer_for(video: dict, photos: dict) -> render.Renderer:
    """A renderer for one recipe video that knows every gallery photo (to compare against)."""
    cfg = render.RenderConfig()
    return render.Renderer(demo.timeline(video, cfg.transition_s), photos, cfg)


def rgb(frame: np.ndarray) -> np.ndarray:
    """A rendered yuv420p frame as (height, width, 3) RGB, converted the way a decoder shows it."""
    import av

    return av.VideoFrame.from_ndarray(frame, format="yuv420p").to_ndarray(format="rgb24")


def closest_photo(renderer: render.Renderer, scene: render.Scene, t: float, frame: np.ndarray) -> str:
    """Which photo, shot with this scene's camera motion at time t, looks most like the RGB ``frame``."""
    errors = {
        name: np.abs(rgb(renderer.scene_frame(replace(scene, photo=name), t)).astype(float) - frame).mean()
        for name in renderer.photos
    }
    return min(errors, key=errors.get)


def test_default_recipe_durations_scene_counts_and_reuse(spec: dict) -> None:
    videos = spec["videos"]
    assert 5 <= len(videos) <= 10
    shown: dict[str, set] = {}
    for video in videos:
        scenes = demo.timeline(video, render.RenderConfig().transition_s)
        assert 30 <= scenes[-1].end <= 90, video["id"]
        photos = [s for s in scenes if s.photo is not None]
        assert 3 <= len(photos) <= 5, video["id"]
        assert any(s.photo is None for s in scenes[1:-1]), f"{video['id']} has no filler between scenes"
        for s in photos:
            shown.setdefault(s.photo, set()).add(video["id"])
    assert sum(len(v) > 1 for v in shown.values()) >= 3  # some photos reused across videos on purpose
    assert all(2 <= len(p["captions"]) <= 3 for p in spec["photos"].values())


def test_default_annotations_match_rendered_frames(spec: dict, photos: dict) -> None:
    # Every moment of every default video: the frame at its midpoint shows that photo, not another.
    for video in spec["videos"]:
        renderer = renderer_for(video, photos)
        for scene in renderer.scenes:
            t = (scene.start + scene.end) / 2
            frame = rgb(renderer.frame(t))
            if scene.photo is None:
                assert frame.std() < 10, f"{video['id']} filler at {t}s is not a plain card"
            else:
                assert closest_photo(renderer, scene, t, frame) == scene.photo, (video["id"], t)


def test_captions_list_every_video_showing_the_photo(spec: dict, tmp_path: Path) -> None:
    gallery = demo.build_demo_gallery(tmp_path, video_ids=[])  # no rendering: just the annotations
    assert gallery.videos == () and gallery.captions == ()
    scenes = {v["id"]: demo.timeline(v, 1.0) for v in spec["videos"]}
    videos = [demo.DemoVideo(vid, "", Path(), s[-1].end,
                             tuple(demo.Moment(vid, x.photo, x.start, x.end) for x in s if x.photo))
              for vid, s in scenes.items()]
    captions = demo.caption_list(spec, videos)
    chelsea = [c for c in captions if c.photo == "chelsea"]
    assert len(chelsea) == len(spec["photos"]["chelsea"]["captions"])
    assert set(chelsea[0].relevant) == {"demo01", "demo04", "demo08"}
    assert {(m.video_id, m.start, m.end) for m in chelsea[0].moments} == {
        ("demo01", 13.0, 25.0), ("demo04", 29.0, 41.0), ("demo08", 40.0, 50.0)}


def test_videos_are_h264_yuv420p_with_the_annotated_duration(small_gallery: demo.DemoGallery) -> None:
    import av

    cfg = render.RenderConfig()
    for video in small_gallery.videos:
        with av.open(str(video.path)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "h264"
            assert stream.codec_context.pix_fmt == "yuv420p"
            assert stream.codec_context.profile in ("High", "Main")  # what every browser decodes
            assert (stream.width, stream.height) == (cfg.width, cfg.height)
            assert abs(float(stream.frames / stream.average_rate) - video.duration) < 0.2
        data = video.path.read_bytes()
        assert data.find(b"moov") < data.find(b"mdat")  # index first: browsers start playing at once


def test_decoded_frames_show_the_annotated_photo(
    small_gallery: demo.DemoGallery, spec: dict, photos: dict
) -> None:
    import decord

    for video in small_gallery.videos:
        recipe = next(v for v in spec["videos"] if v["id"] == video.id)
        renderer = renderer_for(recipe, photos)
        reader = decord.VideoReader(str(video.path))
        assert abs(len(reader) / reader.get_avg_fps() - video.duration) < 0.2
        for scene in renderer.scenes:
            t = (scene.start + scene.end) / 2
            frame = reader[round(t * render.RenderConfig().fps)].asnumpy().astype(float)
            if scene.photo is None:
                assert frame.std() < 12, (video.id, t)
            else:
                assert closest_photo(renderer, scene, t, frame) == scene.photo, (video.id, t)


def test_photos_are_converted_to_yuv_like_libswscale() -> None:
    # flat colour patches: the Y, Cb, Cr planes drawn directly match libswscale's rgb24 -> yuv420p
    import av

    colours = np.array([(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255), (0, 0, 0), (128, 64, 200)])
    image = np.repeat(np.repeat(colours[None].astype(np.uint8), 16, axis=0), 16, axis=1)  # (16, 96, 3)
    planes = [np.asarray(p).astype(int) for p in render.yuv_planes(Image.fromarray(image))]
    reference = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p").to_ndarray()
    flat = reference.reshape(-1).astype(int)  # rows of Y, then the Cb plane, then the Cr plane
    expected = [flat[:1536].reshape(16, 96), flat[1536:1920].reshape(8, 48), flat[1920:].reshape(8, 48)]
    assert [p.shape for p in planes] == [(16, 96), (8, 48), (8, 48)]
    for ours, theirs in zip(planes, expected, strict=True):
        assert np.abs(ours - theirs).max() <= 1
    assert planes[0][0, 0] > planes[0][0, 32] and planes[2][0, 0] > 200  # red: brighter than blue, high Cr
    with pytest.raises(ValueError, match="even"):
        scenes = demo.timeline(demo.load_spec()["videos"][0], 1.0)
        render.Renderer(scenes, {}, render.RenderConfig(height=271))


def test_magnify_matches_pils_bilinear_resize_and_fades_blend_linearly(spec: dict, photos: dict) -> None:
    # the integer kernel samples the same pixel centres as PIL's box resize (magnifying: no antialiasing)
    source = np.random.default_rng(0).integers(0, 256, (120, 200), dtype=np.uint8)
    out = np.empty((90, 160), np.uint8)
    for box in [(0, 0, 160, 90), (10.3, 5.7, 130.1, 73.2), (40.5, 20.25, 200, 110.25)]:
        render._magnify(source, *box, out)
        reference = np.asarray(Image.fromarray(source).resize((160, 90), Image.BILINEAR, box=box))
        assert np.abs(out.astype(int) - reference).max() <= 1, box
    # photo planes are shrunk so that every crop of the camera magnifies
    cfg = render.RenderConfig()
    for planes in photos.values():
        height, width = planes[0].shape
        assert min(width, height * cfg.width / cfg.height) <= cfg.width + 1
    # halfway through a cross-fade, the frame is the mean of the two scenes' pictures
    renderer = renderer_for(spec["videos"][0], photos)
    before, after = renderer.scenes[0], renderer.scenes[1]
    t = (before.end + after.start) / 2
    mean = (renderer.scene_frame(before, t).astype(int) + renderer.scene_frame(after, t)) / 2
    assert np.abs(renderer.frame(t) - mean).max() <= 1
    assert np.abs(renderer.frame(t) - renderer.scene_frame(before, t).astype(int)).mean() > 5


def test_gallery_is_cached_and_rebuilt_deterministically(small_gallery: demo.DemoGallery) -> None:
    from extract.decode import sha256_file

    path = small_gallery.video("demo01").path
    before, sha = path.stat().st_mtime_ns, sha256_file(path)
    again = demo.build_demo_gallery(small_gallery.root, video_ids=SMALL)
    assert again.video("demo01").path.stat().st_mtime_ns == before  # reused, not re-rendered
    assert [m.photo for m in again.video("demo01").moments] == ["coffee", "chelsea", "page"]
    assert {c.photo for c in again.captions} == {
        "coffee", "chelsea", "page", "motorcycle", "gravel", "brick", "hubble", "moon", "rocket", "tissue",
        "retina", "handwriting"}
    manifest = json.loads((small_gallery.root / "gallery.json").read_text())
    manifest["demo01"] = "stale"
    (small_gallery.root / "gallery.json").write_text(json.dumps(manifest))
    demo.build_demo_gallery(small_gallery.root, video_ids=["demo01"])
    assert path.stat().st_mtime_ns != before  # re-rendered ...
    assert sha256_file(path) == sha  # ... into the very same bytes


def test_bad_recipes_and_ids_are_rejected(tmp_path: Path, spec: dict) -> None:
    with pytest.raises(KeyError, match="nope"):
        demo.build_demo_gallery(tmp_path, video_ids=["nope"])
    broken = json.loads(json.dumps(spec))
    broken["videos"][0]["scenes"][0]["photo"] = "unicorn"
    (tmp_path / "bad.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="unicorn"):
        demo.load_spec(tmp_path / "bad.json")


def test_proposal_spans_follow_the_official_binning() -> None:
    start = np.arange(40, dtype=np.float32)
    spans = annotated.proposal_spans(start, start + 1)
    assert spans.shape == (528, 2)
    assert spans[0].tolist() == [0, 1] and spans[527].tolist() == [0, 40]  # first unit; the whole video
    assert spans[32].tolist() == [0, 2] and spans[33].tolist() == [1, 4]  # length-2 windows; edges 0, 1, 2, 4
    assert annotated.span_iou(np.array([0, 10]), [(5, 15)])[0] == pytest.approx(5 / 15)
    assert annotated.span_iou(np.array([[0, 10], [20, 30]]), [(40, 50), (0, 5)]).tolist() == [0.5, 0.0]
    assert annotated.centre_inside(np.array([[0, 10], [20, 30]]), [(4, 6)]).tolist() == [True, False]


def test_first_relevant_rank_and_random_expectation() -> None:
    scores = np.array([[0.9, 0.5, 0.7, 0.1], [0.1, 0.2, 0.3, 0.4]])
    relevant = np.array([[False, True, True, False], [True, False, False, False]])
    ranks, best = annotated.first_relevant_ranks(scores, relevant)
    assert ranks.tolist() == [2, 4] and best.tolist() == [2, 0]
    assert annotated.recall_metrics(ranks) == {"R@1": 0.0, "R@5": 100.0, "R@10": 100.0, "SumR": 200.0}
    expected = annotated.random_recalls(4, np.array([2, 1]))  # R@1: (2/4 + 1/4) / 2
    assert expected["R@1"] == pytest.approx(37.5) and expected["R@5"] == 100.0


@pytest.fixture(scope="session")
def evaluation(small_gallery: demo.DemoGallery) -> dict:
    """The evaluation CLI's JSON on the small gallery (features extracted with the real lite profile)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        demo.main(["evaluate", "--root", str(small_gallery.root), "--videos", *SMALL, "--json"])
    return json.loads(out.getvalue())


def test_evaluation_reports_every_variant_and_beats_random(evaluation: dict) -> None:
    metrics = evaluation["metrics"]
    assert set(metrics) == {"two_branch", "clip", "frame", "random"}
    moment_keys = {"key_moment_acc", "key_moment_inside"}
    for name, row in metrics.items():
        extra = set() if name == "random" else {"key_clip_acc", "key_clip_inside"}
        assert set(row) == {"R@1", "R@5", "R@10", "SumR"} | moment_keys | extra
        assert row["SumR"] == pytest.approx(row["R@1"] + row["R@5"] + row["R@10"])
    assert evaluation["gallery"] == {"root": evaluation["gallery"]["root"], "videos": 4, "captions": 26,
                                     "relevant_per_caption": 1.0}
    assert metrics["random"]["R@1"] == pytest.approx(25.0)  # one relevant video among four
    assert metrics["two_branch"]["R@1"] > metrics["random"]["R@1"] + 20
    assert metrics["two_branch"]["SumR"] > metrics["random"]["SumR"] + 20
    assert metrics["two_branch"]["key_moment_inside"] > metrics["random"]["key_moment_inside"]
    assert evaluation["model"]["profile"] == "lite"
    # the key moment covers the scene: far more IoU >= 0.5 hits than MS-SL's raw key clip or chance
    local = evaluation["localisation"]
    assert set(local) == {"key_moment", "key_clip", "random"}
    assert local["key_moment"]["iou>=0.5"] == pytest.approx(metrics["two_branch"]["key_moment_acc"])
    assert local["key_clip"]["iou>=0.5"] == pytest.approx(metrics["two_branch"]["key_clip_acc"])
    assert local["key_moment"]["iou>=0.5"] >= 50
    assert local["key_moment"]["iou>=0.5"] > local["key_clip"]["iou>=0.5"] + 20
    assert local["key_moment"]["mean_iou"] > local["random"]["mean_iou"] + 0.2
    for row in local.values():
        assert row["iou>=0.3"] >= row["iou>=0.5"] >= row["iou>=0.7"] and 0 <= row["mean_iou"] <= 1


def test_evaluation_through_search_equals_scoring_the_model_directly(small_gallery: demo.DemoGallery,
                                                                     evaluation: dict) -> None:
    """The evaluation runs the search path users get (an index, ``search``); its numbers are those of the
    model's own scores and of ``find_moments`` on freshly encoded rows with their reference bank statistics
    (the index's float16 copies and stored segments change nothing)."""
    from extract.features import FeatureFile
    from prvr.bridge import BridgeModel
    from prvr.hubness import bank_stats
    from prvr.index.ingest import bank_vectors
    from prvr.moments import MomentConfig, find_moments
    from prvr.propagation import propagate_finest
    from prvr.segments import resample, segment_video

    aset = demo.annotated_set(small_gallery)
    model = BridgeModel.from_pretrained()
    bank = bank_vectors(annotated.reference_bank(model))
    with FeatureFile(annotated.extract_features(aset)) as ff:
        ids = [vid for vid, _ in aset.videos]
        rows = [ff.video(vid) for vid in ids]
        tokens = [ff.caption(q.id)[1] for q in aset.queries]
    queries = model.encode_queries(tokens)
    scores = model.score(queries, model.encode_videos([r.features for r in rows]))
    relevant = np.array([[vid in q.moments for vid in ids] for q in aset.queries])
    ranks, best = annotated.first_relevant_ranks(scores.total.numpy(), relevant)
    row = evaluation["metrics"]["two_branch"]
    assert {k: row[k] for k in ("R@1", "R@5", "R@10")} == pytest.approx(
        {k: v for k, v in annotated.recall_metrics(ranks).items() if k != "SumR"})
    hits = []
    for i, j in enumerate(best):
        vectors, start, end = model.encode_rows(rows[j].features, rows[j].start, rows[j].end)
        segments = resample(segment_video(rows[j].features), rows[j].start, start)
        context = propagate_finest(vectors, segments, MomentConfig().propagation_beta)
        banks = {"row_bank": bank_stats(vectors, bank), "context_bank": bank_stats(context, bank)}
        key = find_moments(queries[i].numpy(), vectors, start, end, segments, context=context,
                           **banks)["key_moment"]
        truth = aset.queries[i].moments[ids[j]]
        hits.append(annotated.span_iou(np.array([key["start"], key["end"]]), truth)[0] >= annotated.IOU_HIT)
    assert row["key_moment_acc"] == pytest.approx(100.0 * np.mean(hits))


def test_any_annotated_folder_evaluates_through_the_cli(small_gallery: demo.DemoGallery, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    from prvr import evaluate

    # the small gallery's videos as a plain folder, annotated from the recipe (a third of the captions)
    folder = tmp_path / "videos"
    folder.mkdir()
    entries = []
    for video in small_gallery.videos:
        (folder / video.path.name).symlink_to(video.path)
        captions = [c for c in small_gallery.captions if video.id in c.relevant]
        entries.append({"file": video.path.name, "queries": [
            {"text": c.text, "start": m.start, "end": m.end} for c in captions[::3] for m in c.moments]})
    moments = tmp_path / "moments.json"
    moments.write_text(json.dumps({"videos": entries}))
    report = evaluate.main(["--videos", str(folder), "--moments", str(moments), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"] == report["metrics"] and out["videos"] == 4
    assert out["queries"] == sum(len(e["queries"]) for e in entries)
    assert out["metrics"]["two_branch"]["R@10"] == 100.0
    assert out["localisation"]["key_moment"]["mean_iou"] > out["localisation"]["random"]["mean_iou"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"videos": [{"file": "nope.mp4", "queries": []}]}))
    with pytest.raises(ValueError, match="nope.mp4"):
        evaluate.main(["--videos", str(folder), "--moments", str(bad)])
    bad.write_text(json.dumps({"videos": [{"file": "demo01.mp4", "queries": [{"text": "x", "start": 5,
                                                                             "end": 2}]}]}))
    with pytest.raises(ValueError, match="start < end"):
        evaluate.main(["--videos", str(folder), "--moments", str(bad)])


def test_features_are_extracted_once(small_gallery: demo.DemoGallery, evaluation: dict,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import extract.pipeline

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("features were re-extracted although the videos did not change")

    monkeypatch.setattr(extract.pipeline, "VideoExtractor", refuse)
    monkeypatch.setattr(extract.pipeline, "TextEncoder", refuse)
    path = demo.extract_demo_features(small_gallery)
    from extract.features import FeatureFile

    with FeatureFile(path) as ff:
        assert sorted(ff.video_ids()) == sorted(SMALL)
        assert len(ff.video("demo01").features) == 40  # one 1280-d row per second
        assert len(ff.caption_ids()) == len(small_gallery.captions)
