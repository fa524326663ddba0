"""CPU cost of the CLIP-family candidates for the ``clip`` profile, with random weights built from configs.

    python -m benchmarks.clip_speed [--frames 32] [--repeats 3] [--threads 2]

Random weights have the real architectures' FLOPs, so CPU time per frame and per query is the real one;
quality comes from published zero-shot numbers (see ``extract/clip.py``). Prints one JSON line per model,
with GFLOPs per frame and per query counted by ``torch.utils.flop_counter`` (exact, load-independent).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import extract  # noqa: F401  - applies the torchvision CPU fix before transformers loads

# Architectures of the hub checkpoints (their config.json), so no download is needed.
VIT_B = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
         "image_size": 224}
CLIP_TEXT = {"hidden_size": 512, "num_hidden_layers": 12, "num_attention_heads": 8, "intermediate_size": 2048,
             "max_position_embeddings": 77, "vocab_size": 49408}
SIGLIP_TEXT = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
               "intermediate_size": 3072, "max_position_embeddings": 64, "vocab_size": 32000}
CANDIDATES = {
    "openai/clip-vit-base-patch32 (= laion/CLIP-ViT-B-32-laion2B-s34B-b79K)": ("clip", 32),
    "openai/clip-vit-base-patch16": ("clip", 16),
    "google/siglip-base-patch16-224": ("siglip", 16),
}


def build(family: str, patch: int) -> torch.nn.Module:
    """The model with random weights, in eval mode."""
    from transformers import CLIPConfig, CLIPModel, SiglipConfig, SiglipModel

    vision = dict(VIT_B, patch_size=patch)
    if family == "clip":
        return CLIPModel(CLIPConfig(vision_config=vision, text_config=CLIP_TEXT, projection_dim=512)).eval()
    return SiglipModel(SiglipConfig(vision_config=vision, text_config=SIGLIP_TEXT)).eval()


@torch.inference_mode()
def measure(model: torch.nn.Module, frames: int, repeats: int, text_len: int) -> dict:
    """Best-of-``repeats`` ms per frame (batch of ``frames``) and per query."""
    pixels = torch.randn(frames, 3, 224, 224)
    ids = torch.randint(0, 1000, (1, text_len))
    image, text = [], []
    model.get_image_features(pixel_values=pixels[:2])  # warm-up
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.get_image_features(pixel_values=pixels)
        image.append((time.perf_counter() - t0) * 1000 / frames)
        t0 = time.perf_counter()
        model.get_text_features(input_ids=ids)
        text.append((time.perf_counter() - t0) * 1000)
    return {"ms_per_frame": round(min(image), 1), "ms_per_query": round(min(text), 1),
            **flops(model, text_len)}


@torch.inference_mode()
def flops(model: torch.nn.Module, text_len: int) -> dict:
    """GFLOPs of one frame and of one query."""
    from torch.utils.flop_counter import FlopCounterMode

    image, ids = torch.randn(1, 3, 224, 224), torch.zeros(1, text_len, dtype=torch.long)
    runs = {"gflops_per_frame": lambda: model.get_image_features(pixel_values=image),
            "gflops_per_query": lambda: model.get_text_features(input_ids=ids)}
    out = {}
    for key, run in runs.items():
        with FlopCounterMode(display=False) as counter:
            run()
        out[key] = round(counter.get_total_flops() / 1e9, 2)
    return out


def main() -> None:
    """Print one JSON line per candidate."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name, (family, patch) in CANDIDATES.items():
        text_len = 64 if family == "siglip" else 16  # SigLIP always runs its full padded length
        row = measure(build(family, patch), args.frames, args.repeats, text_len)
        print(json.dumps({"model": name, "threads": args.threads, "frames": args.frames, **row}), flush=True)


if __name__ == "__main__":
    main()
