"""Make the README's screenshot from the running app: search an example query, wait for the result cards,
open the first card's player at its key moment, capture the page.

    python scripts/screenshot.py                                  # start the app on its default data dir
    python scripts/screenshot.py --url http://127.0.0.1:7860/     # an app that is already running
    python scripts/screenshot.py --query "a shallow stream flowing between large rocks" --out shot.png

Needs Debian's ``chromium`` (or ``--chromium PATH``) and the ``playwright`` package (requirements-dev.txt).
Started by this script, the app serves the whole demo gallery from ``--data-dir`` (default: the app's own
default, so a built gallery is reused) on a free port, and is stopped afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_QUERY = "a crystal lotus flower ornament on a wooden table"  # an example of assets/demo_gallery.json
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 1100}


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def started_app(data_dir: Path | None, timeout_s: float = 900) -> Iterator[str]:
    """``python app.py`` on a free port (its log goes to stderr); yield its URL once it answers."""
    import httpx

    port = free_port()
    args = [sys.executable, str(REPO / "app.py"), "--port", str(port)]
    if data_dir is not None:
        args += ["--data-dir", str(data_dir)]
    process = subprocess.Popen(args, cwd=REPO, env=dict(os.environ, GRADIO_ANALYTICS_ENABLED="False"))
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"the app exited with {process.returncode} before serving")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            time.sleep(1)
        else:
            raise SystemExit(f"the app did not serve within {timeout_s:.0f} s")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def capture(url: str, out: Path, query: str = DEFAULT_QUERY, chromium: str | None = None) -> int:
    """Search ``query`` in the page at ``url`` and save the page to ``out`` (PNG); the cards shown."""
    from playwright.sync_api import sync_playwright

    executable = chromium or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(executable).exists():
        raise SystemExit(f"no Chromium at {executable}: install Debian's chromium or pass --chromium PATH")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
            page.goto(url)
            page.get_by_label("What happens in the moment").fill(query)
            page.get_by_role("button", name="Search", exact=True).click()
            deadline = time.monotonic() + 120
            while query not in page.locator(".summary").inner_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            page.wait_for_selector(".result-card .heat rect.bin", timeout=60_000)
            # a card makes its player when asked: the first card's, loaded and paused at its key moment (the
            # other cards keep their stand-ins, each over its poster, as a visitor sees them)
            page.locator(".result-card .player-stub").first.click()
            page.wait_for_function("() => { const v = document.querySelector('.result-card video.player');"
                                   " return v && v.readyState >= 3 && !v.seeking; }", timeout=60_000)
            page.evaluate("() => document.querySelector('.result-card video.player').pause()")
            # the other cards' stand-ins show their posters (loaded lazily: those in view)
            page.wait_for_function("() => [...document.querySelectorAll('.player-stub img.poster')]"
                                   ".filter(i => i.getBoundingClientRect().top < innerHeight)"
                                   ".every(i => i.complete)",
                                   timeout=60_000)
            time.sleep(1.5)  # the player's own loading overlay fades out
            cards = page.locator(".card-head").count()
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out))
        finally:
            browser.close()
    return cards


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running app (default: start one)")
    parser.add_argument("--data-dir", type=Path, help="the started app's data dir (default: the app's)")
    parser.add_argument("--query", default=DEFAULT_QUERY, help="what to search (default: %(default)r)")
    parser.add_argument("--out", type=Path, default=REPO / "assets" / "screenshot.png", help="PNG to write")
    parser.add_argument("--chromium", help="the Chromium binary (default: chromium on PATH)")
    args = parser.parse_args(argv)
    with contextlib.nullcontext(args.url) if args.url else started_app(args.data_dir) as url:
        cards = capture(url, args.out, args.query, args.chromium)
    print(f"{args.out}: {cards} result cards for {args.query!r}")


if __name__ == "__main__":
    main()
