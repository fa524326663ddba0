"""The README's API and MCP examples, run as written against the running app (the session's app server:
the demo videos, MCP on), the MCP one with the pinned ``mcp`` and with the newest release as well."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clips import write_clip

REPO = Path(__file__).resolve().parents[1]
MCP_NEWEST = "2.3.0"  # the newest mcp release on PyPI when this was written (2026-11-27); the app pins 1.x
README_URL = "http://127.0.0.1:7860"


def api_examples() -> list[str]:
    """The python code blocks of the README's "## API" section, in order."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("\n## API\n"):]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def run_example(code: str, url: str, cwd: Path, python: str = sys.executable) -> str:
    """Run a README example with the app's real URL for the README's; its output (it must exit 0)."""
    assert README_URL in code, "the example no longer names the README's app URL"
    done = subprocess.run([python, "-c", code.replace(README_URL, url.rstrip("/"))], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the README example failed:\n{done.stderr[-4000:]}"
    return done.stdout


def titles_of(query: str) -> set[str]:
    """The titles of the demo videos that show what the demo caption ``query`` describes."""
    from prvr.demo.gallery import RenderConfig, load_spec, timeline

    spec = load_spec()
    clip = next(name for name, c in spec["clips"].items() if query in c["captions"])
    return {v["title"] for v in spec["videos"]
            if any(s.clip == clip for s in timeline(v, RenderConfig().transition_s))}


@pytest.fixture(scope="module")
def my_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the README's ``my_clip.mp4``."""
    folder = tmp_path_factory.mktemp("readme")
    write_clip(folder / "my_clip.mp4", 600, fps=10, size=(96, 64))
    return folder


def test_the_api_example_runs_as_written(app_url: str, my_clip: Path) -> None:
    api, _mcp, _library = api_examples()
    out = run_example(api, app_url, my_clip).splitlines()  # progress lines too, where the upload takes > 1 s
    assert any(line.startswith("added - my_clip.mp4: added") for line in out), out
    results = [line for line in out if re.match(r"\d+ ", line)]
    query = re.search(r'client\.predict\("([^"]+)"', api).group(1)
    top3 = {title for line in results[:3] for title in titles_of(query) if f" {title} " in line}
    assert top3, (query, results)  # a video that shows it is among the first three
    assert (my_clip / "top.mp4").stat().st_size > 10_000
    assert "more: [6, 7, 8]" in out, out  # the next page of the 8 demo videos
    clip = Path(next(line for line in out if line.startswith("clip: "))[len("clip: "):])
    assert clip.suffix == ".mp4" and clip.stat().st_size > 1_000  # the key moment, downloaded


def mcp_example_output(app_url: str, folder: Path, python: str) -> list[str]:
    """The README's MCP example's output lines, checked: three results, one of them a right video, and the
    add_video answer."""
    _api, mcp, _library = api_examples()
    out = run_example(mcp, app_url, folder, python).splitlines()
    results = [line for line in out if re.match(r"\d+ ", line)]
    query = re.search(r'"query": "([^"]+)"', mcp).group(1)
    assert len(results) == 3 and any(f" {t} " in line for line in results for t in titles_of(query)), out
    assert '"status"' in out[-1] and '"video_id"' in out[-1], out
    return out


def test_the_mcp_example_runs_with_the_pinned_mcp(app_url: str, my_clip: Path) -> None:
    import mcp  # noqa: F401  - the app's pin (requirements.txt)

    mcp_example_output(app_url, my_clip, sys.executable)


def test_the_mcp_example_runs_with_the_newest_mcp(app_url: str, my_clip: Path,
                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """In a fresh venv holding nothing but ``mcp`` at its newest release (what `pip install mcp` gives)."""
    venv = tmp_path_factory.mktemp("mcp-newest") / "venv"
    # no pip inside (3 s of ensurepip): this process's pip installs into it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
                              f"mcp=={MCP_NEWEST}"], capture_output=True, text=True, timeout=600)
    if install.returncode != 0:
        pytest.skip(f"could not install mcp=={MCP_NEWEST} from the package index: {install.stderr[-500:]}")
    version = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('mcp'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version == MCP_NEWEST
    mcp_example_output(app_url, my_clip, python)
