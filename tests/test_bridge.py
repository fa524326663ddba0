"""The training-free default model: real photos land near their words; MS-SL's protocol holds."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import prvr  # noqa: F401  - applies the compatibility fix first
from prvr.models import bridge
from prvr.models.bridge import BridgeConfig, BridgeModel
from prvr.models.preprocess import n_proposals


@pytest.fixture(scope="module")
def real() -> SimpleNamespace:
    """The default bridge with the lite profile's real backbones (class embeddings cached as in use)."""
    from extract.backbones import create_backbone

    return SimpleNamespace(model=BridgeModel.from_pretrained(), visual=create_backbone("efficientnet_lite0"),
                           text=create_backbone("minilm"))


def toy_model(cfg: BridgeConfig | None = None) -> BridgeModel:
    """A bridge over 4 orthogonal 'classes' whose classifier reads a row's first 4 numbers as logits."""
    head = torch.nn.Linear(6, 4)
    with torch.no_grad():
        head.weight.copy_(torch.eye(4, 6) * 20)
        head.bias.zero_()
    cfg = replace(cfg or BridgeConfig(), top_k=2)
    return BridgeModel(head, torch.eye(4, 8), cfg, profile={"name": "toy"})


def scene_video(classes: list[int], seconds: int = 8) -> np.ndarray:
    """Raw rows of a video whose consecutive scenes each show one toy class for ``seconds`` rows."""
    rows = np.zeros((len(classes) * seconds, 6), dtype=np.float32)
    for i, c in enumerate(classes):
        rows[i * seconds : (i + 1) * seconds, c] = 1.0
    return rows


@pytest.mark.parametrize(("photo", "right", "wrong"), [("chelsea", "a cat", "a rocket"),
                                                       ("rocket", "a rocket", "a cat")])
def test_real_photo_ranks_its_own_word_first(real: SimpleNamespace, photo: str, right: str,
                                             wrong: str) -> None:
    import skimage.data

    rows = real.visual.embed(getattr(skimage.data, photo)()[None])  # (1, 1280), as one 1 s feature row
    videos = real.model.encode_videos([np.repeat(rows, 4, axis=0)])
    scores = real.model.score(real.model.encode_queries(real.text.encode([right, wrong])), videos)
    assert scores.total[0, 0] > scores.total[1, 0] + 0.05
    assert scores.clip[0, 0] > scores.clip[1, 0] and scores.frame[0, 0] > scores.frame[1, 0]


def test_default_temperature_is_the_largest_that_meets_the_written_criterion(real: SimpleNamespace) -> None:
    table, t = real.model.class_text.cpu(), real.model.cfg.temperature
    # 25 random videos instead of the sweep's 100: the margins (0.96 vs 0.70) dwarf the sampling error
    assert bridge.attention_focus(table, t, trials=25) >= 0.9
    assert bridge.attention_focus(table, t * 2, trials=25) < 0.9  # the next value of the sweep fails it
    assert bridge.attention_focus(table, 1.0, trials=25) < 0.3  # without a temperature: nearly uniform


def test_profile_and_description(real: SimpleNamespace) -> None:
    from extract.pipeline import VideoExtractor

    assert real.model.profile == VideoExtractor("lite").profile.identity()  # features it reads
    info = real.model.describe()
    assert info["name"] == bridge.NAME and info["profile"] == "lite"
    assert info["settings"] == BridgeConfig().to_dict() and info["fingerprint"] == real.model.fingerprint()
    assert real.model.class_text.shape == (1000, 384)


def test_protocol_shapes_weights_and_key_clip() -> None:
    model = toy_model()
    videos = model.encode_videos([scene_video([0, 1, 2]), scene_video([3, 1], seconds=5)])
    assert videos.clip_units.shape == (2, 32, 8) and videos.proposals.shape == (2, n_proposals(32), 8)
    assert videos.frames.shape == (2, 24, 8) and videos.frame_mask.sum(dim=1).tolist() == [24, 10]
    queries = model.encode_queries([np.eye(8, dtype=np.float32)[[1, 1, 5]], np.eye(8, dtype=np.float32)[[3]]])
    scores = model.score(queries, videos)
    assert torch.allclose(scores.total, 0.7 * scores.clip + 0.3 * scores.frame)
    assert scores.total[1].argmax() == 1  # class 3 is only in video 1
    assert scores.total[0, 0] > scores.total[1, 0]
    # the key clip of query "class 1" in video 0 lies inside the class-1 scene (rows 8..15 = units ~11..21)
    from prvr.models.preprocess import proposal_units

    start, end = proposal_units(int(scores.key_clip[0, 0]))
    assert 10 <= start and end <= 22
    z, alpha = model.attend(videos, scores.key_clip.t()[:, :1])  # (Nv, 1, H), (Nv, 1, L)
    assert alpha[0, 0, 8:16].sum() > 0.9  # attention concentrates on the class-1 scene
    assert alpha[1, 0, 10:].abs().sum() == 0 and torch.allclose(alpha.sum(-1), torch.ones(2, 1))


def test_to_text_space_keeps_top_k_classes() -> None:
    model = toy_model()
    row = torch.tensor([[0.3, 0.2, 0.1, 0.0, 0, 0]])  # logits 6, 4, 2, 0 -> keep classes 0, 1
    mapped = model.to_text_space(row)[0]
    assert mapped[2:].abs().max() == 0 and mapped[0] > mapped[1] > 0
    assert torch.isclose(mapped.norm(), torch.tensor(1.0))


def test_encode_rows_mixes_every_class_unless_told_otherwise() -> None:
    model = toy_model()  # ranks on the top 2 of 4 classes; localisation's rows keep all 4 by default
    row = np.array([[0.3, 0.2, 0.1, 0.0, 0, 0]], np.float32)
    fine = model.encode_rows(row, np.zeros(1), np.ones(1))[0][0]
    probs = torch.softmax(torch.tensor([6.0, 4.0, 2.0, 0.0]), dim=0).numpy()
    np.testing.assert_allclose(fine[:4], probs / np.linalg.norm(probs), atol=1e-6)  # the full posterior
    assert fine[2] > fine[3] > 0 and model.to_text_space(row)[0, 2:].abs().max() == 0
    top2 = toy_model(BridgeConfig(fine_top_k=2))
    np.testing.assert_allclose(top2.encode_rows(row, np.zeros(1), np.ones(1))[0], top2.to_text_space(row),
                               atol=1e-6)
    videos = [scene_video([0, 1, 2])]
    assert torch.equal(model.encode_videos(videos).frames, top2.encode_videos(videos).frames)  # ranking


def test_fingerprint_tracks_every_setting() -> None:
    base = toy_model()
    assert base.fingerprint() == toy_model().fingerprint()
    for change in ({"temperature": 0.1}, {"prompt": "{}"}, {"clip_scale_w": 0.5}, {"propagation": True},
                   {"propagation_beta": 0.5}, {"fine_top_k": 5}):
        assert toy_model(replace(BridgeConfig(), **change)).fingerprint() != base.fingerprint()
    assert BridgeConfig.from_dict(BridgeConfig().to_dict()) == BridgeConfig()
    with pytest.raises(ValueError, match="hidden_size"):
        BridgeConfig.from_dict({"hidden_size": 384})
    with pytest.raises(ValueError, match="propagation_beta"):
        BridgeConfig(propagation_beta=1.0)
    with pytest.raises(ValueError, match="fine_top_k 0"):
        BridgeConfig(fine_top_k=0)


def test_propagation_feeds_both_branches_and_leaves_encode_rows_as_mapped() -> None:
    from prvr.temporal.propagation import propagate
    from prvr.temporal.segments import segment_video

    rng = np.random.default_rng(0)
    raw = scene_video([0, 1, 2, 1], seconds=10)
    raw[:, :4] += rng.uniform(0, 0.08, (40, 4)).astype(np.float32)  # noisy class evidence per row
    on, off = toy_model(BridgeConfig(propagation=True)), toy_model()
    assert not off.cfg.propagation  # the default since session 13 (the real dev set's tuning half)
    mapped = off.to_text_space(raw).numpy()
    expected = propagate(mapped, segment_video(raw), on.cfg.propagation_beta)
    frames = on.encode_videos([raw]).frames[0, :40].numpy()
    np.testing.assert_allclose(frames, expected, atol=1e-4)  # 40 rows <= max_ctx_l: the rows themselves
    np.testing.assert_allclose(off.encode_videos([raw]).frames[0, :40].numpy(), mapped, atol=1e-4)
    assert np.abs(frames - mapped).max() > 0.01  # propagation changed the rows
    vectors = on.encode_rows(raw, np.arange(40.0), np.arange(1.0, 41.0))[0]
    fine = on.class_mix(raw, on.cfg.fine_top_k).numpy()
    np.testing.assert_allclose(vectors, fine, atol=1e-6)  # localisation reads the rows as mapped
    queries = on.encode_queries([torch.eye(4, 8)[c][None] for c in range(4)])
    assert not torch.allclose(on.score(queries, on.encode_videos([raw])).total,
                              off.score(queries, off.encode_videos([raw])).total)


def test_bad_inputs_are_named() -> None:
    model = toy_model()
    with pytest.raises(ValueError, match=r"video 1: features of shape \(5, 7\)"):
        model.encode_videos([scene_video([0]), np.zeros((5, 7), np.float32)])
    broken = scene_video([0]).copy()
    broken[2, 0] = np.nan  # the same checks as MS-SL's raw inputs (prvr.models.preprocess.check_rows)
    with pytest.raises(ValueError, match=r"encode_rows: NaN or inf values in rows \[2\]"):
        model.encode_rows(broken, np.arange(len(broken)), np.arange(len(broken)) + 1.0)
    with pytest.raises(ValueError, match=r"text 0: token features of shape \(3, 9\)"):
        model.encode_queries([np.zeros((3, 9), np.float32)])
    with pytest.raises(ValueError, match="no videos"):
        model.encode_videos([])
    with pytest.raises(ValueError, match="4 classes but 3"):
        BridgeModel(torch.nn.Linear(6, 4), torch.eye(3, 8))


def test_class_embeddings_are_cached_per_model_and_prompt(tmp_path) -> None:
    calls = []

    def encode(texts: list[str]) -> list[np.ndarray]:
        calls.append(list(texts))
        return [np.full((2, 4), float(len(t)), np.float32) for t in texts]

    text = SimpleNamespace(name="toy", weights=SimpleNamespace(identity="v1"), cfg=SimpleNamespace(dim=4),
                           encode=encode)
    first = bridge.class_embeddings(text, "a photo of a {}.", ["cat", "dog"], tmp_path)
    again = bridge.class_embeddings(text, "a photo of a {}.", ["cat", "dog"], tmp_path)
    assert calls == [["a photo of a cat.", "a photo of a dog."]] and torch.equal(first, again)
    bridge.class_embeddings(text, "{}", ["cat", "dog"], tmp_path)  # another prompt: computed anew
    assert len(calls) == 2 and len(list(tmp_path.glob("classes-*.npy"))) == 2
    assert torch.allclose(first.norm(dim=1), torch.ones(2))
