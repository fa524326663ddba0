"""The pinned environment imports and runs the libraries the project needs, on a CPU-only torch."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter at the repo root; return its stdout, fail with its stderr."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_libraries_work_after_compat_fix() -> None:
    out = run_fresh(
        """
import extract  # applies the compatibility fix, as every entry point does
import torch, torchvision
model = torchvision.models.resnet152().eval()
with torch.no_grad():
    print(tuple(model(torch.rand(1, 3, 64, 64)).shape))
from transformers import BertConfig, BertModel
bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37))
print(tuple(bert(torch.tensor([[1, 2, 3]])).last_hidden_state.shape))
import pytorchvideo.transforms
print(pytorchvideo.transforms.ShortSideScale.__name__)
"""
    )
    assert out.split() == ["(1,", "1000)", "(1,", "3,", "32)", "ShortSideScale"]


def test_compat_does_nothing_when_torchvision_ops_exist() -> None:
    # Simulate a torchvision whose compiled extension loaded (as on a CUDA machine): the ops exist
    # before the fix runs, so the fix must not define anything.
    out = run_fresh(
        """
import torch
lib = torch.library.Library("torchvision", "DEF")
lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
from extract import compat
compat.apply()
print(compat._LIBRARY is None)
"""
    )
    assert out.strip() == "True"


def test_every_entry_point_imports_the_fix_first() -> None:
    for package in ("extract", "prvr"):
        source = (ROOT / package / "__init__.py").read_text()
        # the standard library's os may come first (prvr sets OpenMP's wait policy before torch loads)
        code_lines = [ln for ln in source.splitlines()
                      if ln.startswith(("import ", "from ")) and ln != "import os"]
        assert code_lines[0].startswith("from extract import compat"), package
    app = ROOT / "app.py"
    if app.exists():
        imports = [ln for ln in app.read_text().splitlines() if ln.startswith(("import ", "from "))]
        heavy = ("gradio", "torch", "prvr", "extract")
        first = next(ln for ln in imports if any(name in ln for name in heavy))
        assert "extract" in first or "prvr" in first, first


def imported_modules(paths: list[Path]) -> set[str]:
    """Top-level names of every module imported anywhere in these files (function-level imports too)."""
    import ast

    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_every_library_the_app_imports_is_pinned_in_requirements() -> None:
    """A clean install (`pip install -r requirements.txt`) gets every third-party module that the shipped
    code (app.py, prvr/, extract/) imports, at a pinned version."""
    from importlib.metadata import packages_distributions

    shipped = [ROOT / "app.py", *(ROOT / "prvr").rglob("*.py"), *(ROOT / "extract").rglob("*.py")]
    ours = {"prvr", "extract", "app", "__future__"}
    third_party = imported_modules(shipped) - ours - set(sys.stdlib_module_names)
    pinned = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        spec = line.split("#")[0].split(";")[0].strip()
        if "==" in spec:
            pinned[spec.split("==")[0].strip().lower().replace("_", "-")] = spec
    distributions = packages_distributions()
    unpinned = {}
    for module in sorted(third_party):
        names = {d.lower().replace("_", "-") for d in distributions.get(module, [])}
        if not names & pinned.keys():
            unpinned[module] = sorted(names) or "not installed"
    assert not unpinned, f"imported but not pinned in requirements.txt: {unpinned}"
