"""The page's HTML is plain text over result dicts (``prvr.serve.page``): it is made without Gradio, so it is
checked, and can be reused, without a server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_page_module_loads_no_gradio() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, prvr.serve.page; print(sorted(m for m in sys.modules "
                               "if m.split('.')[0] in ('gradio', 'gradio_client')))"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "[]", loaded.stdout


def test_a_player_plays_from_the_apps_own_route_at_the_key_moment() -> None:
    from prvr.serve.page import player_html

    key = {"start": 4.0, "end": 9.0, "play_from": 4.5}
    result = {"video_id": "up/a b.mp4", "title": 'a "quoted" <title>', "duration": 20.0, "key_moment": key,
              "moments": [key]}
    html = player_html(result, "https://example.org")
    assert 'src="https://example.org/prvr/video/up/a%20b.mp4#t=4.50"' in html, html
    assert 'data-start="4.50"' in html and "&quot;quoted&quot; &lt;title&gt;" in html
