"""Running the app in a real process for a test: a free port, the start-up wait, the stop."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PATIENCE_S = 180.0  # how long a condition of a page may take on a busy machine (waits end once it holds)
PATIENCE_MS = int(PATIENCE_S * 1000)  # the same for playwright's waits

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 900  # a first build on a busy 2-core machine; a start with rendered demo videos takes ~30 s


def ctrl_c_as_in_a_terminal() -> None:
    """``preexec_fn`` of an app's process: SIGINT at its default, as a terminal's foreground program has it.
    A suite started in the background by a shell without job control (``nohup .ci/run &``, cron, a runner)
    inherits SIGINT ignored, and an app started with it ignored keeps ignoring it (as it should: see
    ``prvr.serve.lifecycle``), which would turn a Ctrl-C test into a hang instead of a test of the app."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_port() -> int:
    """A TCP port nobody uses right now, at random below the kernel's ephemeral range: an app binds it
    seconds after this answers, and a port of that range may meanwhile become the local end of an outgoing
    connection (this suite's HTTP clients, or those of another suite running on the machine)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    chooser = random.SystemRandom()
    for _ in range(100):
        port = chooser.randrange(max(1024, low - 12000), low) if low > 2048 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free TCP port found below the ephemeral range")


def wait_until_serving(url: str, process: subprocess.Popen, log: Path, timeout: float) -> None:
    """Poll until the app answers; fail with the server log if it exits or never answers."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"app exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(1)
    pytest.fail(f"app did not serve within {timeout} s:\n{log.read_text()[-4000:]}")


@contextlib.contextmanager
def running_app(data_dir: Path, log: Path, *args: str) -> Iterator[str]:
    """Run ``python app.py`` on a free port with this data dir; yield its URL; stop it afterwards."""
    port = free_port()
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, str(REPO / "app.py"), "--port", str(port),
                                    "--data-dir", str(data_dir), *args],
                                   cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   preexec_fn=ctrl_c_as_in_a_terminal)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_until_serving(url, process, log, START_TIMEOUT_S)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def client(url: str):
    """A gradio_client session (each Client is its own browser session)."""
    from gradio_client import Client

    return Client(url, verbose=False)


def call_mcp(url: str, *calls: tuple[str, dict], timeout: float = 180) -> list:
    """Call the app's MCP tools in order over one streamable-HTTP session; their CallToolResults."""
    import asyncio

    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def talk() -> list:
        async with streamablehttp_client(url + "gradio_api/mcp/") as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()
            return [await session.call_tool(name, arguments) for name, arguments in calls]

    return asyncio.run(asyncio.wait_for(talk(), timeout))


def choose_file(page, box: str, path: Path, tries: int = 3) -> None:
    """Choose ``path`` in the page's Gradio file box ``box`` (a CSS selector) and wait until the box shows its
    name. Under load a choice was dropped without a sign now and then (the box never showed the file, in CI
    runs beside another), so a choice not shown within a share of the patience is made again."""
    from playwright.sync_api import TimeoutError as NotShown

    for attempt in range(1, tries + 1):
        page.locator(f"{box} input[type=file]").set_input_files(str(path))
        try:
            page.locator(box).get_by_text(path.name).first.wait_for(timeout=PATIENCE_MS / tries)
            return
        except NotShown:
            if attempt == tries:
                raise
