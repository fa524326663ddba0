"""Full-size random CLIP ViT-B/32 and SigLIP B/16 model folders, made on the spot from published configs.

No hub: the weights are random, the architectures exactly those of the default ``clip`` model
(``laion/CLIP-ViT-B-32-laion2B-s34B-b79K``: open_clip's ``ViT-B-32`` config, GELU) and of
``google/siglip-base-patch16-224``; the CLIP tokenizer files are built from the real BPE vocabulary that
the ``open_clip_torch`` wheel ships (``bpe_simple_vocab_16e6.txt.gz``), the image processors carry the
published preprocessing (shortest side 224, bicubic, centre crop 224, OpenAI mean/std; SigLIP: 224 x 224,
mean/std 0.5). SigLIP's real sentencepiece vocabulary (T5's 32k ``c4_en``) is not on this machine or on
PyPI: ``make_siglip`` trains a small sentencepiece model on the spot and states it in the folder
(``tokenizer_note.txt``), so SigLIP's tokenizer *rules* (lower-casing, punctuation removed, EOS, padding to
64) can be checked, its real vocabulary's segmentation cannot.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch

import extract  # noqa: F401  - the torchvision fix, before transformers and open_clip

CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def bpe_vocab_path() -> Path:
    """open_clip's copy of CLIP's BPE merges (the file OpenAI's CLIP ships)."""
    import open_clip

    return Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"


def clip_tokenizer_files(folder: Path) -> None:
    """vocab.json + merges.txt of CLIP's tokenizer, in OpenAI's order, from the BPE merges file."""
    from open_clip.tokenizer import bytes_to_unicode

    merges = gzip.open(bpe_vocab_path()).read().decode("utf-8").split("\n")[1 : 49152 - 256 - 2 + 1]
    pairs = [tuple(m.split()) for m in merges]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(p) for p in pairs]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    (folder / "vocab.json").write_text(json.dumps({v: i for i, v in enumerate(vocab)}, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(p) for p in pairs) + "\n")


def make_clip_b32(folder: Path, seed: int = 0) -> Path:
    """A random CLIP ViT-B/32 (laion2B's architecture) with the real tokenizer and processor, saved."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    clip_tokenizer_files(folder)
    tokenizer = CLIPTokenizer(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"),
                              model_max_length=77)
    vision = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
              "num_attention_heads": 12, "image_size": 224, "patch_size": 32, "hidden_act": "gelu",
              "layer_norm_eps": 1e-5}
    text = {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 8,
            "max_position_embeddings": 77, "vocab_size": 49408, "hidden_act": "gelu", "layer_norm_eps": 1e-5,
            "bos_token_id": 49406, "eos_token_id": 49407, "pad_token_id": 49407}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLIPModel(CLIPConfig(vision_config=vision, text_config=text, projection_dim=512))
    processor = CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224},
                                   resample=3, image_mean=list(CLIP_MEAN), image_std=list(CLIP_STD))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def train_sentencepiece(path: Path, texts: list[str], vocab_size: int = 600) -> Path:
    """A small unigram sentencepiece model in T5's id layout (pad 0, </s> 1, <unk> 2, no BOS), as SigLIP's."""
    import sentencepiece as spm

    with open(path.with_suffix(".model"), "wb") as out:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=out, vocab_size=vocab_size,
                                       model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                       hard_vocab_limit=False, minloglevel=2, num_threads=1)
    return path.with_suffix(".model")


def make_siglip_b16(folder: Path, corpus: list[str], seed: int = 0) -> Path:
    """A random SigLIP B/16 224 (google/siglip-base-patch16-224's architecture: transformers' SiglipConfig
    defaults) with a sentencepiece vocabulary trained on ``corpus`` (module docstring), saved."""
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = SiglipTokenizer(vocab_file=str(train_sentencepiece(folder / "spiece", corpus)))
    text = {"vocab_size": 32000, "pad_token_id": 1, "eos_token_id": 1, "bos_token_id": None}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SiglipModel(SiglipConfig(text_config=text))
    processor = SiglipImageProcessor(size={"height": 224, "width": 224}, resample=3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    processor.save_pretrained(folder)
    (folder / "tokenizer_note.txt").write_text(
        "spiece.model is NOT SigLIP's vocabulary: a small sentencepiece model trained on the spot (tests), "
        "in T5's id layout. The weights are random.\n")
    return folder


def open_clip_state_dict(hf: dict[str, torch.Tensor], layers: int = 12) -> dict[str, torch.Tensor]:
    """A transformers ``CLIPModel`` state dict in open_clip's ``CLIP`` layout (ViT towers)."""
    out = {"positional_embedding": hf["text_model.embeddings.position_embedding.weight"],
           "token_embedding.weight": hf["text_model.embeddings.token_embedding.weight"],
           "ln_final.weight": hf["text_model.final_layer_norm.weight"],
           "ln_final.bias": hf["text_model.final_layer_norm.bias"],
           "text_projection": hf["text_projection.weight"].T.contiguous(),
           "logit_scale": hf["logit_scale"],
           "visual.class_embedding": hf["vision_model.embeddings.class_embedding"],
           "visual.positional_embedding": hf["vision_model.embeddings.position_embedding.weight"],
           "visual.conv1.weight": hf["vision_model.embeddings.patch_embedding.weight"],
           "visual.proj": hf["visual_projection.weight"].T.contiguous()}
    for ours, theirs in (("visual.ln_pre", "vision_model.pre_layrnorm"),
                         ("visual.ln_post", "vision_model.post_layernorm")):
        out[f"{ours}.weight"], out[f"{ours}.bias"] = hf[f"{theirs}.weight"], hf[f"{theirs}.bias"]
    towers = (("transformer", "text_model.encoder"), ("visual.transformer", "vision_model.encoder"))
    for ours, theirs in towers:
        for i in range(layers):
            a, b = f"{ours}.resblocks.{i}", f"{theirs}.layers.{i}"
            for part in ("weight", "bias"):
                out[f"{a}.attn.in_proj_{part}"] = torch.cat([hf[f"{b}.self_attn.{p}_proj.{part}"]
                                                             for p in "qkv"])
                for x, y in (("attn.out_proj", "self_attn.out_proj"), ("ln_1", "layer_norm1"),
                             ("ln_2", "layer_norm2"), ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")):
                    out[f"{a}.{x}.{part}"] = hf[f"{b}.{y}.{part}"]
    return out


def open_clip_b32(folder: Path) -> tuple[torch.nn.Module, object, object]:
    """open_clip's own ViT-B-32 (model, preprocess, tokenizer) holding the weights saved in ``folder``."""
    import open_clip
    from safetensors.torch import load_file

    model, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None)
    model.load_state_dict(open_clip_state_dict(load_file(folder / "model.safetensors")), strict=True)
    return model.eval(), preprocess, open_clip.get_tokenizer("ViT-B-32")
