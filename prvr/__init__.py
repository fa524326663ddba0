"""Turn features into rankings: the MS-SL model, training, evaluation, index and search."""

import os

# Two OpenMP runtimes share the cores: torch's and numba's (the index kernels). By default each keeps its
# idle workers spinning after a parallel region, stealing the cores the other needs next; idle workers
# that sleep at once make a whole search several times faster (benchmarks/RESULTS.md, session 9). Each
# runtime reads this when it loads, so it is set before anything imports torch; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from extract import compat  # noqa: F401  - must run before torchvision / transformers / pytorchvideo
