"""The model factory (``prvr.models.factory``): one place makes a model, resolving its profile once; adding a
model is a profile JSON and one registry line (docs/design.md, "Adding a model"), followed here end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import extract  # noqa: F401  - the torchvision fix, before any backbone
from extract.weights import resolve_weights
from tests.clips import write_clip
from tests.tiny_clip import DIMS, make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random CLIP folder (both towers): the weights of the test's new profile."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-clip") / "clip", "clip")


@pytest.fixture
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The profile and model registries as they were, once the test is over (it registers its own)."""
    from extract import profiles
    from prvr.models import factory

    monkeypatch.setattr(profiles, "_PROFILES", dict(profiles._PROFILES))
    monkeypatch.setattr(factory, "_MODELS", dict(factory._MODELS))


def add_tiny_profile(folder: Path, seconds_per_frame: float = 0.5):
    """docs/design.md's steps: 1. the profile's JSON (here in a temporary folder, registered from there);
    2. one registry entry naming the model class that reads it. Nothing else is edited."""
    from extract.profiles import register_profile
    from prvr.models.factory import ModelEntry, register_model
    from prvr.models.zero_shot import ZeroShotModel

    spec = {"name": "tiny_test", "version": 1, "description": "A tiny random CLIP, 2 s windows (tests).",
            "window_s": 2.0, "frame_fit": "whole", "visual": [{"backbone": "clip", "frames": 1}],
            "text": "clip_text"}
    path = folder / "tiny_test.json"
    path.write_text(json.dumps(spec))
    register_profile(path)
    return register_model(ModelEntry("tiny_test", ZeroShotModel, "tiny test model",
                                     lambda model: f"A tiny random CLIP from {model.source}.",
                                     seconds_per_frame=seconds_per_frame))


def test_a_new_profile_is_served_end_to_end(tiny: Path, tmp_path: Path, registries: None) -> None:
    """Factory -> text encoder + extractor -> gallery -> search, for a profile added at run time."""
    from prvr.models.factory import create_model, training_free_profiles
    from prvr.serve.bootstrap import assemble
    from prvr.serve.settings import AppSettings
    from prvr.serve.zerogpu import SlotRule

    add_tiny_profile(tmp_path)
    assert "tiny_test" in training_free_profiles()
    loaded = create_model("tiny_test", {"clip": str(tiny), "minilm": "ignored: another profile's"},
                          device="cpu")
    profile = loaded.profile
    assert profile.name == "tiny_test" and profile.resolved and profile.window_s == 2.0
    assert (profile.visual_dim, profile.text_dim) == DIMS["clip"]  # sized by the tiny weights, not 512
    assert profile.identity()["weights"] == {"clip": resolve_weights(str(tiny)).identity,
                                             "clip_text": resolve_weights(str(tiny)).identity}
    assert loaded.model.profile == profile.identity()  # the model, its encoder and extractor: one identity
    assert loaded.info.name == "tiny test model" and loaded.info.why == "chosen with --profile tiny_test"
    assert loaded.info.description == f"A tiny random CLIP from {tiny.resolve()}."
    assert loaded.seconds_per_frame == 0.5 and SlotRule().frame_seconds(profile) == 0.5  # ZeroGPU's rule
    encoder = loaded.text_encoder("cpu")
    assert encoder.profile is profile and encoder.encode(["a red square"])[0].shape[1] == DIMS["clip"][1]
    assert loaded.video_extractor("cpu").profile is profile

    predictor = assemble(AppSettings(data_dir=tmp_path / "data", uploads="shared"), loaded)
    try:
        assert predictor.profile == "tiny_test" and predictor.text.profile is profile
        added = predictor.add_video(write_clip(tmp_path / "clip.mp4", frames=96, fps=12))  # 8 s
        assert added["status"] == "added", added
        results = predictor.search("a red square", k=1).results
        assert [r["video_id"] for r in results] == [added["video_id"]]
        assert len(results[0]["heatmap"]["score"]) == 4  # one row per 2 s window of the new profile
    finally:
        predictor.close()


def test_the_profile_is_resolved_once(tiny: Path, tmp_path: Path, registries: None,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights given are resolved once on the way from the factory to the model, its text encoder and its
    video extractor (each used to resolve them again)."""
    from extract import backbones, pipeline
    from prvr.models import zero_shot
    from prvr.models.factory import create_model

    add_tiny_profile(tmp_path)
    calls = []

    def counted(spec: str):
        calls.append(spec)
        return resolve_weights(spec)

    for module in (pipeline, backbones, zero_shot):
        monkeypatch.setattr(module, "resolve_weights", counted)
    loaded = create_model("tiny_test", {"clip": str(tiny)}, device="cpu")
    loaded.text_encoder("cpu")
    loaded.video_extractor("cpu")
    assert calls == [str(tiny)]


def test_one_answer_for_every_caller(tiny: Path, tmp_path: Path) -> None:
    """The app and evaluation read one registry: clip_whole is served, unknown names get one error, lite's
    packaged weights refuse others, and a model made elsewhere is checked against its profile."""
    from extract.profiles import ProfileMismatch
    from prvr.models.bridge import BridgeConfig
    from prvr.models.factory import LoadedModel, create_model, model_entry, seconds_per_frame
    from prvr.serve.model_choice import load_model
    from prvr.serve.settings import AppSettings

    whole = load_model(AppSettings(data_dir=tmp_path, profile="clip_whole", weights=(f"clip={tiny}",)))
    assert whole.profile.name == "clip_whole" and whole.profile.frame_fit == "whole"
    assert whole.model.profile == whole.profile.identity()
    assert whole.info.why == "chosen with --profile clip_whole"
    words = "the training-free models read the 'clip', 'clip_whole' or 'lite' profile, not 'paper'"
    app = AppSettings(data_dir=tmp_path, profile="paper")
    for make in (lambda: create_model("paper"), lambda: load_model(app), lambda: model_entry("paper")):
        with pytest.raises(ValueError, match=words):
            make()
    with pytest.raises(ValueError, match="'lite' training-free model uses its packaged weights"):
        create_model("lite", {"minilm": str(tiny)})
    with pytest.raises(ValueError, match="give the profile"):
        create_model(cfg=object())
    with pytest.raises(ProfileMismatch, match="Pass the weights the model was made with"):
        LoadedModel.of(whole.model, "lite")  # a CLIP model's identity is not lite's
    assert (seconds_per_frame("lite"), seconds_per_frame("clip"), seconds_per_frame("clip_whole"),
            seconds_per_frame("paper")) == (0.001, 0.01, 0.01, 0.01)
    # a benchmark's deliberately different config goes through the factory too
    variant = create_model("lite", cfg=BridgeConfig(top_k=3), cache_dir=tmp_path / "bridge")
    assert variant.model.cfg.top_k == 3 and variant.info.why == "chosen with --profile lite"
    assert variant.model.profile == variant.profile.identity()
    assert list((tmp_path / "bridge").glob("classes-*"))  # its cache where it was asked to keep it
