"""Sweep the bridge's attention temperature on synthetic stimuli (the criterion in prvr/models/bridge.py);
JSON out.

    python -m benchmarks.bridge_temperature
"""

import json

import prvr  # noqa: F401  - applies the compatibility fix first
from extract.backbones import create_backbone, imagenet_classes
from prvr.models.bridge import BridgeConfig, attention_focus, class_embeddings
from prvr.paths import cache_dir

TEMPERATURES = (1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01)
TARGET = 0.9  # attention mass on the key clip's own scene


def main() -> None:
    """Print each temperature's attention focus and the largest temperature that meets the target."""
    cfg = BridgeConfig()
    table = class_embeddings(create_backbone("minilm"), cfg.prompt, imagenet_classes(), cache_dir("bridge"))
    focus = {t: attention_focus(table, t) for t in TEMPERATURES}
    chosen = max(t for t, f in focus.items() if f >= TARGET)
    report = {"focus": focus, "target": TARGET, "chosen": chosen, "default": cfg.temperature}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
