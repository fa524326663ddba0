"""Turn media (videos, captions) into the feature files that ``prvr`` reads."""

from extract import compat  # noqa: F401  - must run before torchvision / transformers / pytorchvideo
