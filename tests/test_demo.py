"""The demo gallery of real footage: H.264 videos built from the shipped clips, whose annotations match what
they show; the shipped clips and their credits; the stored examples; its evaluation."""

import json
from pathlib import Path

import numpy as np
import pytest

import prvr  # noqa: F401  - applies the compatibility fix first

# four videos that play all eleven clips between them: built, extracted and evaluated in well under a minute
from prvr.demo import compose
from prvr.demo import gallery as demo
from prvr.evaluate import annotated
from prvr.evaluate import demo as demo_set
from prvr.evaluate.__main__ import main as evaluate_main

SMALL = ["demo01", "demo02", "demo03", "demo06"]
MANIFEST = Path(__file__).resolve().parents[2] / "shared" / "videos_dev" / "manifest.json"


@pytest.fixture(scope="session")
def small_gallery(tmp_path_factory: pytest.TempPathFactory) -> demo.DemoGallery:
    return demo.build_demo_gallery(tmp_path_factory.mktemp("demo-small"), video_ids=SMALL)


@pytest.fixture(scope="session")
def spec() -> dict:
    return demo.load_spec()


@pytest.fixture(scope="session")
def clip_pictures(spec: dict) -> dict[str, np.ndarray]:
    """Every shipped clip, decoded: key -> (frames, height * 3/2, width) yuv420p."""
    cfg = compose.RenderConfig()
    return {key: np.stack(list(compose.clip_pictures(compose.clip_path(key), compose.clip_frame_count(c, cfg),
                                                     cfg)))
            for key, c in spec["clips"].items()}


def luma(picture: np.ndarray) -> np.ndarray:
    """The Y plane of a yuv420p picture, as floats."""
    return picture[:compose.RenderConfig().height].astype(float)


def closest_clip(picture: np.ndarray, index: int, clip_pictures: dict) -> str:
    """Which clip's frame ``index`` (wrapped round a shorter clip) looks most like the yuv420p ``picture``."""
    errors = {key: np.abs(luma(frames[index % len(frames)]) - luma(picture)).mean()
              for key, frames in clip_pictures.items()}
    return min(errors, key=errors.get)


def test_default_recipe_durations_scene_counts_and_reuse(spec: dict) -> None:
    videos = spec["videos"]
    assert 5 <= len(videos) <= 10 and [v["id"] for v in videos] == [f"demo{i:02d}" for i in range(1, 9)]
    shown: dict[str, set] = {}
    for video in videos:
        scenes = demo.timeline(video, compose.RenderConfig().transition_s)
        assert 40 <= scenes[-1].end <= 90, video["id"]
        clips = [s for s in scenes if s.clip is not None]
        assert 3 <= len(clips) <= 5, video["id"]
        assert any(s.clip is None for s in scenes[1:-1]), f"{video['id']} has no filler between scenes"
        for s in clips:
            shown.setdefault(s.clip, set()).add(video["id"])
    assert set(shown) == set(spec["clips"])  # every shipped clip is shown
    assert sum(len(v) > 1 for v in shown.values()) >= 3  # some clips reused across videos on purpose
    assert all(2 <= len(c["captions"]) <= 3 for c in spec["clips"].values())


def test_shipped_clips_are_small_credited_and_shippable(spec: dict) -> None:
    import av

    cfg = compose.RenderConfig()
    files = sorted(compose.CLIPS_DIR.glob("*.mp4"))
    assert {f.stem for f in files} == set(spec["clips"])  # nothing else is shipped
    assert sum(f.stat().st_size for f in files) <= 15e6
    credits = (compose.CLIPS_DIR / "CREDITS.md").read_text()
    for key, clip in spec["clips"].items():
        source = clip["source"]
        assert all(str(source[k]) in credits for k in ("repo", "path", "commit")), key
        assert f"| {key}.mp4 |" in credits and source["license"] in credits
        with av.open(str(compose.clip_path(key))) as container:
            assert not container.streams.audio
            stream = container.streams.video[0]
            assert (stream.width, stream.height, stream.codec_context.name) == (cfg.width, cfg.height, "h264")
            assert stream.average_rate == cfg.fps
    if not MANIFEST.exists():
        pytest.skip(f"{MANIFEST} is absent: cannot check that every source is marked may_ship")
    manifest = {c["file"]: c for c in json.loads(MANIFEST.read_text())}
    for key, clip in spec["clips"].items():
        entry = manifest[clip["source"]["file"]]
        assert entry["may_ship"] is True, key
        assert (entry["source_repo"], entry["path"], entry["commit"]) == (
            clip["source"]["repo"], clip["source"]["path"], clip["source"]["commit"]), key
        assert all(0 <= a < b <= entry["duration_s"] + 0.05 for a, b in clip["segments"]), key


def test_default_annotations_match_the_composed_pictures(spec: dict, clip_pictures: dict) -> None:
    # Every scene of every default video, without encoding: the picture at a third and at two thirds of the
    # scene is its clip's own frame (exactly), and no other clip is closer; cards are plain.
    cfg = compose.RenderConfig()
    frames = {key: len(p) for key, p in clip_pictures.items()}
    for video in spec["videos"]:
        scenes = demo.timeline(video, cfg.transition_s)
        pictures = list(compose.Composer(scenes, frames, cfg).pictures())
        assert len(pictures) == round(scenes[-1].end * cfg.fps)
        for scene in scenes:
            for u in (1 / 3, 2 / 3):
                k = round((scene.start + u * (scene.end - scene.start)) * cfg.fps)
                picture = pictures[k]
                if scene.clip is None:
                    assert picture[:cfg.height].std() == 0
                    assert picture[0, 0] == compose.CARD_LUMA[scene.colour]
                else:
                    index = (k - round(scene.start * cfg.fps)) % frames[scene.clip]
                    assert np.array_equal(picture, clip_pictures[scene.clip][index]), (video["id"], k)
                    assert closest_clip(picture, index, clip_pictures) == scene.clip
        # a scene plays its clip from its first frame to its last
        for scene in scenes:
            if scene.clip is not None:
                first, last = round(scene.start * cfg.fps), round(scene.end * cfg.fps) - 1
                assert np.array_equal(pictures[first], clip_pictures[scene.clip][0])
                assert np.array_equal(pictures[last], clip_pictures[scene.clip][-1])


def test_cross_fades_blend_linearly_between_scenes(spec: dict, clip_pictures: dict) -> None:
    cfg = compose.RenderConfig()
    scenes = demo.timeline(spec["videos"][0], cfg.transition_s)
    pictures = list(compose.Composer(scenes, {k: len(p) for k, p in clip_pictures.items()}, cfg).pictures())
    before, after = scenes[0], scenes[1]
    end, n_fade = round(before.end * cfg.fps), round(cfg.transition_s * cfg.fps)
    a, b = clip_pictures[before.clip][-1].astype(int), clip_pictures[after.clip][0].astype(int)
    middle = pictures[end + n_fade // 2]  # alpha 8/16: the mean of the two pictures
    assert np.abs(middle - (a + b) / 2).max() <= 1
    assert np.abs(pictures[end + n_fade // 2] - a).mean() > 5
    assert round(after.start * cfg.fps) == end + n_fade


def test_captions_list_every_video_playing_the_clip(spec: dict, tmp_path: Path) -> None:
    gallery = demo.build_demo_gallery(tmp_path, video_ids=[])  # no building: just the annotations
    assert gallery.videos == () and gallery.captions == () and gallery.examples == ()
    scenes = {v["id"]: demo.timeline(v, 1.0) for v in spec["videos"]}
    videos = [demo.DemoVideo(vid, "", Path(), s[-1].end,
                             tuple(demo.Moment(vid, x.clip, x.start, x.end) for x in s if x.clip))
              for vid, s in scenes.items()]
    captions = demo.caption_list(spec, videos)
    rabbit = [c for c in captions if c.clip == "rabbit"]
    assert len(rabbit) == len(spec["clips"]["rabbit"]["captions"])
    assert set(rabbit[0].relevant) == {"demo01", "demo04", "demo07"}
    # 7.8 s of clip: after crystal (11.8 s) and a fade; after 9 + 10 s of looped clips, a card and 19 s
    assert {(m.video_id, m.start, m.end) for m in rabbit[0].moments} == {
        ("demo01", 12.8, 20.6), ("demo04", 45.0, 52.8), ("demo07", 41.0, 48.8)}
    assert rabbit[0].clip == "rabbit"


def test_videos_are_h264_yuv420p_with_the_annotated_duration(small_gallery: demo.DemoGallery) -> None:
    import av

    cfg = compose.RenderConfig()
    for video in small_gallery.videos:
        with av.open(str(video.path)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "h264"
            assert stream.codec_context.pix_fmt == "yuv420p"
            assert stream.codec_context.profile in ("High", "Main")  # what every browser decodes
            assert (stream.width, stream.height) == (cfg.width, cfg.height)
            assert abs(float(stream.frames / stream.average_rate) - video.duration) < 0.2
            assert not container.streams.audio
        data = video.path.read_bytes()
        assert data.find(b"moov") < data.find(b"mdat")  # index first: browsers start playing at once


def test_decoded_frames_show_the_annotated_clip(small_gallery: demo.DemoGallery, clip_pictures: dict) -> None:
    import av
    import decord

    cfg = compose.RenderConfig()
    for video in small_gallery.videos:
        reader = decord.VideoReader(str(video.path))
        assert abs(len(reader) / reader.get_avg_fps() - video.duration) < 0.2
        for moment in video.moments:
            k = round((moment.start + moment.end) / 2 * cfg.fps)
            index = (k - round(moment.start * cfg.fps)) % len(clip_pictures[moment.clip])
            rgb = reader[k].asnumpy()
            picture = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p").to_ndarray()
            assert closest_clip(picture, index, clip_pictures) == moment.clip, (video.id, k)
        gaps = [(a.end + 0.5, b.start - 0.5) for a, b in zip(video.moments, video.moments[1:], strict=False)
                if b.start - a.end > 2 * cfg.transition_s]  # a card between two clips
        for a, b in gaps:
            frame = reader[round((a + b) / 2 * cfg.fps)].asnumpy().astype(float)
            assert frame.std() < 3, (video.id, a, b)


def test_gallery_is_cached_and_rebuilt_deterministically(small_gallery: demo.DemoGallery) -> None:
    from extract.decode import sha256_file

    path = small_gallery.video("demo01").path
    before, sha = path.stat().st_mtime_ns, sha256_file(path)
    again = demo.build_demo_gallery(small_gallery.root, video_ids=SMALL)
    assert again.video("demo01").path.stat().st_mtime_ns == before  # reused, not rebuilt
    assert [m.clip for m in again.video("demo01").moments] == ["crystal", "rabbit", "pig", "flower"]
    assert {c.clip for c in again.captions} == set(demo.load_spec()["clips"])
    manifest = json.loads((small_gallery.root / "gallery.json").read_text())
    manifest["demo01"] = "stale"
    (small_gallery.root / "gallery.json").write_text(json.dumps(manifest))
    demo.build_demo_gallery(small_gallery.root, video_ids=["demo01"])
    assert path.stat().st_mtime_ns != before  # rebuilt ...
    assert sha256_file(path) == sha  # ... into the very same bytes


def test_bytes_do_not_depend_on_leftover_memory(tmp_path: Path) -> None:
    # x264's macroblock tree read uninitialised memory: the same video came out differently from run to run.
    # glibc's MALLOC_PERTURB_ fills freed and fresh memory with a given byte: the bytes must not change.
    import os
    import subprocess
    import sys

    from extract.decode import sha256_file

    code = ("import sys; from prvr.demo.gallery import build_demo_gallery; "
            "build_demo_gallery(sys.argv[1], ['demo03'])")
    shas = []
    for n in (1, 2):
        root = tmp_path / str(n)
        subprocess.run([sys.executable, "-c", code, str(root)], check=True,
                       cwd=Path(__file__).resolve().parents[1], env={**os.environ, "MALLOC_PERTURB_": str(n)})
        shas.append(sha256_file(root / "demo03.mp4"))
    assert shas[0] == shas[1]


def test_bad_recipes_and_ids_are_rejected(tmp_path: Path, spec: dict) -> None:
    with pytest.raises(KeyError, match="nope"):
        demo.build_demo_gallery(tmp_path, video_ids=["nope"])
    for path, value, message in [(("videos", 0, "scenes", 0, "clip"), "unicorn", "unicorn"),
                                 (("videos", 0, "scenes", 2, "colour"), "pink", "pink"),
                                 (("clips", "rabbit", "segments"), [[3, 1]], "rabbit")]:
        broken = json.loads(json.dumps(spec))
        target = broken
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        (tmp_path / "bad.json").write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=message):
            demo.load_spec(tmp_path / "bad.json")


def test_examples_are_stored_captions_with_the_measured_recall(spec: dict,
                                                               small_gallery: demo.DemoGallery) -> None:
    captions = {c: key for key, clip in spec["clips"].items() for c in clip["captions"]}
    examples = demo.example_captions()
    assert examples and set(examples) <= set(captions) and len(set(examples)) == len(examples)
    measured = spec["measured"]
    assert measured["command"] == "python -m prvr.evaluate --gallery demo --json"
    assert measured["captions"] == len(captions) and measured["videos"] == len(spec["videos"])
    assert measured["examples_rank1"] == len(examples)
    assert measured["R@1"] == pytest.approx(100 * len(examples) / len(captions), abs=0.05)
    assert measured["R@1"] > measured["random_R@1"] and measured["profile"] == "lite"
    # a gallery of some videos offers the examples it shows, in the stored order
    shown = {c.text for c in small_gallery.captions}
    assert small_gallery.examples == tuple(e for e in examples if e in shown)


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
        evaluate_main(["--gallery", "demo", "--root", str(small_gallery.root), "--demo-videos", *SMALL,
                       "--json"])
    return json.loads(out.getvalue())


def test_evaluation_reports_every_variant_and_beats_random(evaluation: dict,
                                                          small_gallery: demo.DemoGallery) -> None:
    metrics = evaluation["metrics"]
    assert set(metrics) == {"two_branch", "clip", "frame", "random"}
    moment_keys = {"key_moment_acc", "key_moment_inside"}
    for name, row in metrics.items():
        extra = set() if name == "random" else {"key_clip_acc", "key_clip_inside"}
        assert set(row) == {"R@1", "R@5", "R@10", "SumR"} | moment_keys | extra
        assert row["SumR"] == pytest.approx(row["R@1"] + row["R@5"] + row["R@10"])
    relevant = [len(c.relevant) for c in small_gallery.captions]  # pig and greenwall: in two of the four
    assert evaluation["gallery"] == {"root": evaluation["gallery"]["root"], "videos": 4, "captions": 28,
                                     "relevant_per_caption": pytest.approx(np.mean(relevant))}
    assert metrics["random"]["R@1"] == pytest.approx(100 * np.mean(relevant) / 4)
    assert metrics["two_branch"]["R@1"] > metrics["random"]["R@1"] + 20
    assert metrics["two_branch"]["SumR"] > metrics["random"]["SumR"] + 20
    assert metrics["two_branch"]["key_moment_inside"] > metrics["random"]["key_moment_inside"]
    assert evaluation["model"]["profile"] == "lite"
    # the key moment covers the scene: far more IoU >= 0.5 hits than MS-SL's raw key clip or chance
    local = evaluation["localisation"]
    assert set(local) == {"key_moment", "key_clip", "random"}
    assert local["key_moment"]["iou>=0.5"] == pytest.approx(metrics["two_branch"]["key_moment_acc"])
    assert local["key_clip"]["iou>=0.5"] == pytest.approx(metrics["two_branch"]["key_clip_acc"])
    assert local["key_moment"]["iou>=0.5"] >= 35  # measured 42.9 (12 of 28) with the lite default
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
    from prvr.index.encoding import bank_vectors
    from prvr.models.bridge import BridgeModel
    from prvr.results.moments import MomentConfig, find_moments
    from prvr.temporal.hubness import bank_stats
    from prvr.temporal.propagation import propagate_finest
    from prvr.temporal.segments import resample, segment_video

    aset = demo_set.annotated_set(small_gallery)
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
    # the small gallery's videos as a plain folder, annotated from the recipe (a third of the captions)
    folder = tmp_path / "videos"
    folder.mkdir()
    entries = []
    for video in small_gallery.videos:
        (folder / video.path.name).symlink_to(video.path)
        captions = [c for c in small_gallery.captions if video.id in c.relevant]
        entries.append({"file": video.path.name, "queries": [
            {"text": c.text, "start": m.start, "end": m.end} for c in captions[::3] for m in c.moments
            if m.video_id == video.id]})
    moments = tmp_path / "moments.json"
    moments.write_text(json.dumps({"videos": entries}))
    report = evaluate_main(["--videos", str(folder), "--moments", str(moments), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"] == report["metrics"] and out["videos"] == 4
    assert out["queries"] == len({q["text"] for e in entries for q in e["queries"]})  # equal texts: one query
    assert out["metrics"]["two_branch"]["R@10"] == 100.0
    assert out["localisation"]["key_moment"]["mean_iou"] > out["localisation"]["random"]["mean_iou"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"videos": [{"file": "nope.mp4", "queries": []}]}))
    with pytest.raises(ValueError, match="nope.mp4"):
        evaluate_main(["--videos", str(folder), "--moments", str(bad)])
    bad.write_text(json.dumps({"videos": [{"file": "demo01.mp4", "queries": [{"text": "x", "start": 5,
                                                                             "end": 2}]}]}))
    with pytest.raises(ValueError, match="start < end"):
        evaluate_main(["--videos", str(folder), "--moments", str(bad)])


def test_features_are_extracted_once(small_gallery: demo.DemoGallery, evaluation: dict,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import extract.pipeline

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("features were re-extracted although the videos did not change")

    monkeypatch.setattr(extract.pipeline, "VideoExtractor", refuse)
    monkeypatch.setattr(extract.pipeline, "TextEncoder", refuse)
    path = demo_set.extract_demo_features(small_gallery)
    from extract.features import FeatureFile

    with FeatureFile(path) as ff:
        assert sorted(ff.video_ids()) == sorted(SMALL)
        assert len(ff.video("demo01").features) == 43  # one 1280-d row per second
        assert len(ff.caption_ids()) == len(small_gallery.captions)
