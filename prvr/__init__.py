"""Turn features into rankings: the MS-SL model, training, evaluation, index and search."""

from extract import compat  # noqa: F401  - must run before torchvision / transformers / pytorchvideo
