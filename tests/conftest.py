"""Fixtures shared by the test modules (built in the test session's own temporary folders: a run never
reads or writes pytest's cache, and any file can run alone or in any order)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import extract  # noqa: F401  - the torchvision fix, before any backbone
from tests.clips import write_clip
from tests.servers import free_port, running_app

# Gradio keeps uploaded files in GRADIO_TEMP_DIR (default: /tmp/gradio, one folder per content hash, shared by
# every process) and the app deletes its copy once handled, so two test sessions at once (CI runs beside each
# other) that chose the same clip's bytes deleted each other's copy: the page then never showed the chosen
# file. Each session's apps (in this process and the ones it starts) get a folder of their own.
GRADIO_UPLOADS = os.environ["GRADIO_TEMP_DIR"] = tempfile.mkdtemp(prefix="prvr-tests-gradio-")
# The text model's trace is kept between processes (extract.traced): the session's processes share one folder
# (the first that traces the model keeps it there, the others load it), where each app would keep its own.
TRACED = os.environ["PRVR_TRACED_DIR"] = tempfile.mkdtemp(prefix="prvr-tests-traced-")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The session's Gradio upload folder and traces folder go with it."""
    shutil.rmtree(GRADIO_UPLOADS, ignore_errors=True)
    shutil.rmtree(TRACED, ignore_errors=True)


@pytest.fixture(scope="session")
def lite_model():
    """The offline default model (real lite backbones installed from PyPI)."""
    from prvr.models.bridge import BridgeModel

    return BridgeModel.from_pretrained()


@pytest.fixture(scope="session")
def make_predictor(lite_model) -> Callable:
    """``make_predictor(data_dir, **settings)``: a Predictor over an empty shared index in ``data_dir`` (its
    parts only, ``prvr.serve.bootstrap.assemble``: no demo gallery, fast), with the offline default model;
    ``model=`` gives another."""
    from prvr.models.factory import LoadedModel, ModelInfo
    from prvr.serve.bootstrap import assemble
    from prvr.serve.settings import AppSettings

    def make(data_dir: Path, model=None, **settings):
        loaded = LoadedModel.of(model or lite_model, "lite", info=ModelInfo("m", "d"))
        return assemble(AppSettings(data_dir=data_dir, **settings), loaded)

    return make


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    """On a checkout whose numba cache is empty (a clean clone), the kernels every app of the suite runs
    (indexing, search, moments) are compiled here once, before any test, into the checkout's cache: else the
    apps the first tests start each compile them again while the cache is still unwritten. The kernels of
    larger galleries (``tests/warm_kernels.py``) compile at the same time in a process of their own: numba
    compiles on one core."""
    repo = Path(__file__).resolve().parents[1]
    cache = repo / "prvr" / "index" / "__pycache__"
    if any(cache.glob(f"kernels.*.py{sys.version_info.major}{sys.version_info.minor}.nbi")):
        return  # compiled before, by this Python: every process loads them from the cache in about a second
    beside = subprocess.Popen([sys.executable, "-m", "tests.warm_kernels"], cwd=repo, text=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        predictor = request.getfixturevalue("make_predictor")(tmp_path_factory.mktemp("kernels") / "data",
                                                              words="off")
        try:
            assert predictor.add_video(write_clip(tmp_path_factory.mktemp("kernels-clip") / "clip.mp4",
                                                  frames=48))["status"] == "added"
            assert predictor.search("a gradient", k=1).results
        finally:
            predictor.close()
    finally:
        try:
            output, _ = beside.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            beside.kill()
            output = beside.communicate()[0] + "\n(still compiling after 600 s: stopped)"
    assert beside.returncode == 0, output[-3000:]


@pytest.fixture(scope="session", autouse=True)
def kept_text_trace() -> None:
    """The text model traced once, before any test, into the session's traces folder: every process the
    suite starts then loads the trace instead of the model (``extract.traced``), the first app too."""
    from extract.backbones import create_backbone

    assert create_backbone("minilm", device="cpu").trace()


@pytest.fixture(scope="session")
def demo_renders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo gallery's videos rendered once per test session (seconds; copied into each app data dir that
    serves them)."""
    from prvr.demo.gallery import build_demo_gallery

    root = tmp_path_factory.mktemp("demo-renders")
    build_demo_gallery(root)
    return root


@pytest.fixture(scope="session")
def data_dir_with_demo(demo_renders: Path) -> Callable[[Path], Path]:
    """``data_dir_with_demo(root)``: a fresh app data dir at ``root`` holding the rendered demo videos."""

    def make(root: Path) -> Path:
        shutil.copytree(demo_renders, root / "demo")
        return root

    return make


@pytest.fixture(scope="session")
def app_url(tmp_path_factory: pytest.TempPathFactory, data_dir_with_demo: Callable) -> Iterator[str]:
    """URL of the test session's one ``python app.py`` server: the whole demo gallery, as a newcomer's first
    start serves it, MCP on, session-private uploads (so tests stay independent of each other); stopped
    when the session ends."""
    work = tmp_path_factory.mktemp("app")
    data = data_dir_with_demo(work / "data")
    with running_app(data, work / "server.log", "--uploads", "session", "--mcp") as url:
        yield url


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, make_predictor: Callable):
    """(URL, predictor, session registry) of the app in this process with MCP on, over one indexed synthetic
    clip (session uploads; a closed tab's uploads are deleted 1 s after; MCP's add_video may read files
    under the ``allowed`` dir beside the data dir; --persist in the ``bucket`` dir beside it); closed
    afterwards."""
    import app

    tmp = tmp_path_factory.mktemp("served")
    predictor = make_predictor(tmp / "data", uploads="session", persist=tmp / "bucket")
    predictor.settings.uploads = "shared"  # index one clip in the shared gallery, then serve sessions
    assert predictor.add_video(write_clip(tmp / "gradient.mp4"))["status"] == "added"
    predictor.settings.uploads = "session"
    predictor.settings.mcp_allow_paths = str(tmp / "allowed")
    predictor.settings.mcp = True
    sessions = app.ClosedSessions(grace_s=1.0)
    demo = app.build_ui(predictor, sessions)
    demo.queue()
    port = free_port()
    app.launch(demo, predictor, sessions, "127.0.0.1", port, quiet=True)  # the app's own launch
    with contextlib.ExitStack() as stack:
        stack.callback(demo.close)
        yield f"http://127.0.0.1:{port}/", predictor, sessions


@pytest.fixture(scope="session")
def full_clip_b32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A full-size random CLIP ViT-B/32 folder with the real BPE vocabulary (tests/full_size_clip.py), built
    once per session (about 10 s)."""
    from tests.full_size_clip import make_clip_b32

    return make_clip_b32(tmp_path_factory.mktemp("clip-b32") / "clip-b32")
