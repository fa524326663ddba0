"""The clip profile: CLIP-family towers, the training-free ZeroShotModel, the app's choice, training on it.

Every model here is a tiny random CLIP or SigLIP made on the spot (tests/tiny_clip.py); no hub access.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import extract  # noqa: F401  - the torchvision fix, before transformers
from extract.__main__ import main as extract_main
from extract.backbones import create_backbone
from extract.clip import load_pair
from extract.features import FeatureFile
from extract.pipeline import TextEncoder, VideoExtractor
from extract.weights import WeightsUnavailable, resolve_weights
from prvr.models.zero_shot import ZeroShotConfig, ZeroShotModel
from tests.clips import marked, write_clip
from tests.servers import client, running_app
from tests.tiny_clip import DIMS, IMAGE_SIZE, make_tiny_model

FAMILIES = ("clip", "siglip")
TEXTS = ["a red square fades in", "a green block in the corner of the frame"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny model folder per family."""
    root = tmp_path_factory.mktemp("models")
    return {family: make_tiny_model(root / family, family) for family in FAMILIES}


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three short H.264 clips of 3, 5 and 4 s."""
    root = tmp_path_factory.mktemp("videos")
    return [write_clip(root / f"v{i}.mp4", 5 * s, 5, picture=marked) for i, s in enumerate((3, 5, 4))]


# ----------------------------------------------------------------------------- towers
@pytest.mark.parametrize("family", FAMILIES)
def test_image_rows_are_the_models_own_image_embeddings(models: dict, family: str) -> None:
    backbone = create_backbone("clip", str(models[family]), device="cpu")
    assert backbone.cfg.dim == DIMS[family][0] and backbone.cfg.input_size == IMAGE_SIZE
    frames = np.random.default_rng(0).integers(0, 256, (5, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    pair = load_pair(resolve_weights(str(models[family])))
    pixels = pair.image_processor(images=list(frames), do_resize=False, do_center_crop=False,
                                  return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        expected = pair.model.get_image_features(pixel_values=pixels).pooler_output.numpy()
    np.testing.assert_allclose(backbone.embed(frames), expected, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_query_is_the_models_own_text_embedding(models: dict, family: str) -> None:
    weights = {"clip": str(models[family])}
    tokens = TextEncoder("clip", weights, device="cpu").encode(TEXTS)
    assert all(t.shape[1] == DIMS[family][1] for t in tokens)
    if family == "siglip":  # trained on full-length text: every position is a token the model sees
        assert [len(t) for t in tokens] == [64, 64]
    model = ZeroShotModel.from_pretrained(str(models[family]), device="cpu")
    pair = load_pair(resolve_weights(str(models[family])))
    padding = {"padding": "max_length", "max_length": 64} if family == "siglip" else {"padding": True}
    inputs = pair.tokenizer(TEXTS, return_tensors="pt", **padding)
    mask = None if family == "siglip" else inputs["attention_mask"]
    with torch.no_grad():
        expected = pair.model.get_text_features(input_ids=inputs["input_ids"], attention_mask=mask)
    expected = expected.pooler_output
    torch.testing.assert_close(model.encode_queries(tokens), F.normalize(expected, dim=-1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_traced_text_tower_gives_the_eager_tokens(models: dict, family: str) -> None:
    encoder = TextEncoder("clip", {"clip": str(models[family])}, device="cpu")
    texts = [*TEXTS, "a much longer caption about a person who walks a dog along a beach at sunset"]
    eager = encoder.encode(texts)
    assert encoder.backbone.trace()  # the tower's forward names input_ids and attention_mask only
    for mine, theirs in zip(encoder.encode(texts), eager, strict=True):
        assert mine.shape == theirs.shape and np.allclose(mine, theirs, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_video_rows_one_per_second_deterministic(models: dict, videos: list[Path], family: str) -> None:
    weights = {"clip": str(models[family])}
    first = VideoExtractor("clip", weights, device="cpu").extract(videos[1])
    again = VideoExtractor("clip", weights, device="cpu", batch_frames=2).extract(videos[1])  # other batches
    assert first.features.shape == (5, DIMS[family][0])
    np.testing.assert_array_equal(first.start, [0, 1, 2, 3, 4])
    np.testing.assert_allclose(again.features, first.features, atol=1e-5)
    assert not np.allclose(first.features[0], first.features[-1])  # the red ramp changes the frames


# ----------------------------------------------------------------------------- the training-free model
def reference_scores(q: np.ndarray, rows: np.ndarray, temperature: float) -> tuple[float, float, int]:
    """MS-SL's inference on one video of exactly 32 unit rows, written out plainly: (clip, frame, key)."""
    units = rows  # 32 rows -> 32 clip units, one row each
    windows = [(k, s) for k in range(1, 33) for s in range(33 - k)]  # by length, then start
    means = np.stack([units[s : s + k].mean(0) for k, s in windows])
    cos = means @ q / np.linalg.norm(means, axis=1) / np.linalg.norm(q)
    key = int(cos.argmax())
    logits = rows @ means[key] / temperature
    alpha = np.exp(logits - logits.max())
    z = (alpha / alpha.sum()) @ rows
    return float(cos[key]), float(z @ q / np.linalg.norm(z) / np.linalg.norm(q)), key


def test_zero_shot_scores_are_ms_sl_inference_written_out(models: dict) -> None:
    model = ZeroShotModel.from_pretrained(str(models["clip"]), device="cpu")
    rng = np.random.default_rng(1)
    rows = [rng.normal(size=(32, DIMS["clip"][0])).astype(np.float32) for _ in range(3)]
    queries = model.encode_queries(TextEncoder("clip", {"clip": str(models["clip"])}, "cpu").encode(TEXTS))
    scores = model.score(queries, model.encode_videos(rows))
    for i in range(len(TEXTS)):
        for v, video in enumerate(rows):
            unit = video / np.linalg.norm(video, axis=1, keepdims=True)
            clip, frame, key = reference_scores(queries[i].numpy(), unit, model.cfg.temperature)
            assert scores.clip[i, v].item() == pytest.approx(clip, abs=1e-5)
            assert scores.frame[i, v].item() == pytest.approx(frame, abs=1e-4)
            assert scores.key_clip[i, v].item() == key
    torch.testing.assert_close(scores.total, 0.7 * scores.clip + 0.3 * scores.frame)


def test_encode_rows_and_attend(models: dict) -> None:
    model = ZeroShotModel.from_pretrained(str(models["siglip"]), device="cpu")
    rows = np.random.default_rng(2).normal(size=(9, DIMS["siglip"][0])).astype(np.float32)
    vectors, start, end = model.encode_rows(rows, np.arange(9.0), np.arange(1.0, 10.0))
    assert vectors.dtype == np.float32 and vectors.shape == rows.shape
    np.testing.assert_allclose(vectors, rows / np.linalg.norm(rows, axis=1, keepdims=True), atol=1e-6)
    np.testing.assert_array_equal(end, np.arange(1.0, 10.0))
    with pytest.raises(ValueError, match="9 rows but start"):
        model.encode_rows(rows, np.arange(8.0), np.arange(8.0))
    z, alpha = model.attend(model.encode_videos([rows]), torch.tensor([[0, 527]]))
    assert z.shape == (1, 2, DIMS["siglip"][0]) and alpha.shape[:2] == (1, 2)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(1, 2))


def test_fingerprint_and_bad_inputs(models: dict) -> None:
    clip = ZeroShotModel.from_pretrained(str(models["clip"]), device="cpu")
    other = ZeroShotModel.from_pretrained(str(models["clip"]), ZeroShotConfig(temperature=0.1), device="cpu")
    siglip = ZeroShotModel.from_pretrained(str(models["siglip"]), device="cpu")
    assert len({clip.fingerprint(), other.fingerprint(), siglip.fingerprint()}) == 3
    assert clip.profile["name"] == "clip" and clip.profile["weights"]["clip"].startswith("sha256:")
    with pytest.raises(ValueError, match=r"video 0: features of shape \(4, 7\)"):
        clip.encode_videos([np.zeros((4, 7), np.float32)])
    with pytest.raises(ValueError, match=r"text 0: token features of shape \(3, 5\)"):
        clip.encode_queries([np.zeros((3, 5), np.float32)])
    with pytest.raises(ValueError, match="temperature must be positive"):
        ZeroShotConfig(temperature=0)


def test_offline_hub_load_fails_in_seconds_naming_the_model() -> None:
    t0 = time.perf_counter()
    with pytest.raises(WeightsUnavailable, match="laion/CLIP-ViT-B-32.*--weights clip=DIR"):
        ZeroShotModel.from_pretrained()  # the default hub id; this machine cannot reach the hub
    assert time.perf_counter() - t0 < 10


# ----------------------------------------------------------------------------- feature files and indexes
def test_cli_writes_clip_features_and_refuses_another_model(models: dict, videos: list[Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    out, caps = tmp_path / "f.h5", tmp_path / "caps.txt"
    caps.write_text("v0#enc#0 a red square\nv1#enc#0 a green block\n")
    flags = ["--profile", "clip", "--weights", f"clip={models['clip']}", "--out", str(out), "--device", "cpu"]
    assert extract_main(["videos", str(videos[0]), str(videos[1]), *flags]) == 0
    assert extract_main(["captions", str(caps), *flags]) == 0
    with FeatureFile(out) as f:
        assert (f.profile["name"], f.profile["visual_dim"], f.profile["text_dim"]) == ("clip", *DIMS["clip"])
        assert f.profile["weights"]["clip"] == f.profile["weights"]["clip_text"] == \
            resolve_weights(str(models["clip"])).identity
        assert f.video("v1").features.shape == (5, DIMS["clip"][0])
        assert f.caption("v0#enc#0")[1].shape[1] == DIMS["clip"][1]
    capsys.readouterr()
    flags[3] = f"clip={models['siglip']}"  # the same file, another model
    assert extract_main(["videos", str(videos[2]), *flags]) == 2
    assert "differ in" in capsys.readouterr().err


def test_index_of_one_profile_is_never_searched_with_another(models: dict, videos: list[Path],
                                                            tmp_path: Path) -> None:
    from prvr.index import GalleryVideo, IndexConfig, IndexMismatchError, VideoIndex

    clip = ZeroShotModel.from_pretrained(str(models["clip"]), device="cpu")
    features = VideoExtractor("clip", {"clip": str(models["clip"])}, device="cpu").extract(videos[0])
    index = VideoIndex.create(tmp_path / "index", clip, IndexConfig())
    index.add([GalleryVideo.from_features("v0", features, "v0", str(videos[0]))])
    assert VideoIndex.open(tmp_path / "index", clip).manifest["profile"] == clip.profile
    siglip = ZeroShotModel.from_pretrained(str(models["siglip"]), device="cpu")
    with pytest.raises(IndexMismatchError):
        VideoIndex.open(tmp_path / "index", siglip)


# ----------------------------------------------------------------------------- choosing, serving, training
def test_app_settings_take_weights_from_flags_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from prvr.serve.settings import AppSettings

    monkeypatch.delenv("PRVR_WEIGHTS", raising=False)
    assert AppSettings.from_args([]).weight_specs() == {}
    given = AppSettings.from_args(["--weights", "clip=/m/a", "--weights", "minilm=/m/b"])
    assert given.weight_specs() == {"clip": "/m/a", "minilm": "/m/b"}
    monkeypatch.setenv("PRVR_WEIGHTS", "clip=/m/c, minilm=/m/d")
    assert AppSettings.from_args([]).weight_specs() == {"clip": "/m/c", "minilm": "/m/d"}
    assert AppSettings.from_args(["--weights", "clip=/m/e"]).weight_specs() == {"clip": "/m/e"}  # flag wins
    with pytest.raises(SystemExit):
        AppSettings.from_args(["--weights", "/m/no-name"])


def test_without_a_profile_the_app_falls_back_to_lite_naming_model_and_cause(tmp_path: Path) -> None:
    from prvr.models import bridge
    from prvr.serve.model_choice import load_model
    from prvr.serve.settings import AppSettings

    t0 = time.perf_counter()
    loaded = load_model(AppSettings(data_dir=tmp_path))
    assert loaded.profile.name == "lite" and isinstance(loaded.model, bridge.BridgeModel)
    why = loaded.info.why
    assert "laion/CLIP-ViT-B-32" in why and "unreachable" in why and "lite" in why
    assert time.perf_counter() - t0 < 60  # the failed clip attempt costs well under a second of that
    with pytest.raises(WeightsUnavailable, match="laion/CLIP-ViT-B-32"):
        load_model(AppSettings(data_dir=tmp_path, profile="clip"))  # asked for: no silent fallback
    with pytest.raises(ValueError, match="'clip', 'clip_whole' or 'lite' profile, not 'paper'"):
        load_model(AppSettings(data_dir=tmp_path, profile="paper"))


def test_app_serves_the_clip_profile_from_a_local_folder(models: dict, data_dir_with_demo,
                                                          tmp_path: Path) -> None:
    data = data_dir_with_demo(tmp_path / "data")
    args = ("--profile", "clip", "--weights", f"clip={models['siglip']}", "--demo-videos", "demo01")
    with running_app(data, tmp_path / "server.log", *args) as url:
        app = client(url)
        info = app.predict(api_name="/info")
        assert info["profile"]["name"] == "clip" and info["model"]["why"] == "chosen with --profile clip"
        # a model nobody calibrated: /info says so and why, and no result is strong (or none)
        assert info["confidence"]["calibrated"] is False
        assert "python -m benchmarks.calibrate --profile clip" in info["confidence"]["reason"]
        got = httpx.get(url.rstrip("/") + "/info").json()
        assert got.get("confidence") == info["confidence"], got
        response = app.predict("a cup of coffee on a table", 3, 0.7, api_name="/search")
    assert response["calibrated"] is False and response["no_strong_match"] is True
    assert {(r["confidence"], r["confidence_label"]) for r in response["results"]} == {("low", "unconfirmed")}
    top = response["results"][0]
    heat = top["heatmap"]  # one cell per 1 s row of this 40 s video (the clip profile samples 1 row/s)
    assert top["video_id"] == "demo01" and len(heat["score"]) == len(heat["start"]) == round(top["duration"])
    assert heat["start"][0] == 0.0 and heat["end"][-1] == pytest.approx(top["duration"], abs=1.0)
    assert 0 <= top["key_moment"]["start"] < top["key_moment"]["end"] <= top["duration"] + 1e-6


def test_checkpoint_trained_on_clip_features_is_served(models: dict, videos: list[Path], data_dir_with_demo,
                                                        tmp_path: Path) -> None:
    from extract.profiles import ProfileMismatch
    from prvr.evaluate.__main__ import main as evaluate_main
    from prvr.serve.bootstrap import assemble, start
    from prvr.serve.model_choice import load_model
    from prvr.serve.settings import AppSettings
    from prvr.train.loop import main as train_main

    feats, caps, split = tmp_path / "f.h5", tmp_path / "caps.txt", tmp_path / "all.txt"
    lines = [f"v{i}#enc#{j} {text}" for i in range(len(videos)) for j, text in enumerate(TEXTS)]
    caps.write_text("\n".join(lines) + "\n")
    split.write_text("\n".join(line.split()[0] for line in lines) + "\n")
    flags = ["--profile", "clip", "--weights", f"clip={models['clip']}", "--out", str(feats)]
    assert extract_main(["videos", *map(str, videos), *flags]) == 0
    assert extract_main(["captions", str(caps), *flags]) == 0
    train_main(["--features", str(feats), "--captions", str(feats), "--splits", f"train={split}",
                f"val={split}", "--out", str(tmp_path / "run"), "--device", "cpu", "--n_epoch=1",
                "--batch_size=2", "--hidden_size=16", "--n_heads=2"])
    metrics = evaluate_main(["--checkpoint", str(tmp_path / "run" / "best"), "--features", str(feats),
                             "--captions", str(feats), "--device", "cpu"])  # all 6 captions, 3 videos
    assert metrics["total"]["r100"] == 100.0 and 0 <= metrics["total"]["r1"] <= 100
    settings = AppSettings(data_dir=data_dir_with_demo(tmp_path / "data"),
                           checkpoint=tmp_path / "run" / "best", weights=(f"clip={models['clip']}",),
                           demo_videos="demo01")
    predictor = start(settings)
    assert predictor.profile == "clip" and predictor.model.cfg.visual_dim == DIMS["clip"][0]
    assert predictor.describe()["model"]["why"] == "chosen with --checkpoint"
    results = predictor.search("a cup of coffee", k=1).results
    assert [r["video_id"] for r in results] == ["demo01"] and len(results[0]["moments"]) >= 1
    other = AppSettings(data_dir=tmp_path / "data2", checkpoint=settings.checkpoint,
                        weights=(f"clip={models['siglip']}",))
    with pytest.raises(ProfileMismatch, match="Pass the weights the model was made with"):
        assemble(other, load_model(other))  # features of another model would be meaningless
