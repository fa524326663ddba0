"""A start-up that speaks, one owner per data dir, clean exits (issue #31, items 3, 4 and 6).

One first start of ``python app.py`` on a fresh data dir (one demo video) serves most checks: its output
has no library warnings or progress bars and never goes silent for over 5 s; a second app on the same dir
is refused naming the owner; Ctrl-C stops it cleanly. A busy port is refused before anything loads.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.servers import call_mcp, free_port

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
QUIET_LIMIT_S = 5.0
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def env() -> dict:
    return dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")


def ctrl_c_as_in_a_terminal() -> None:
    """In the app's process before it starts: Ctrl-C as a terminal's foreground program gets it. A suite
    started as a background job by a shell without job control (``(./ci &)``) inherits SIGINT ignored, and
    an app started with SIGINT ignored rightly keeps ignoring it (POSIX), which would hang the Ctrl-C tests
    instead of testing the app."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Running:
    """``python app.py`` with every output line and the time it arrived."""

    def __init__(self, *args: str) -> None:
        self.t0 = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self.wall: list[float] = []  # when each line arrived, wall clock
        self.process = subprocess.Popen([sys.executable, "app.py", *args], cwd=REPO, env=env(), text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        preexec_fn=ctrl_c_as_in_a_terminal)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.monotonic() - self.t0, line.rstrip("\n")))
            self.wall.append(time.time())

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if any(text in line for _, line in self.lines):
                return True
            time.sleep(0.2)
        return any(text in line for _, line in self.lines)

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def interrupt(self, timeout: float) -> int:
        """Ctrl-C a second from now; the exit status (``TimeoutExpired`` if it has not stopped in time)."""
        time.sleep(1.0)
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=timeout)

    def close(self) -> None:
        """Kill the app if it still runs, and read the rest of its output."""
        if self.process.poll() is None:
            self.process.kill()
        self.reader.join(timeout=5)


def mcp_calls(url: str, clip: Path) -> list:
    """search, info and add_video (``clip`` as base64 data) through the mcp package's client."""
    import base64

    data = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    return call_mcp(url, ("search", {"query": "a clear glass flower figurine seen up close", "top_k": 1}),
                    ("info", {}), ("add_video", {"video": data}), timeout=300)


@pytest.fixture(scope="module")
def first_start(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Start the app (with MCP) on a fresh data dir, make three MCP calls and try a second app on the same
    dir while it serves, then Ctrl-C."""
    from tests.clips import write_clip

    data = tmp_path_factory.mktemp("startup") / "data"
    port = free_port()
    app = Running("--port", str(port), "--data-dir", str(data), "--demo-videos", "demo01", "--mcp")
    try:
        serving = app.wait_for("serving at", 900)
        assert serving, f"the app did not start:\n{app.output()[-4000:]}"
        before_mcp = len(app.lines)
        clip = write_clip(tmp_path_factory.mktemp("mcp") / "sent.mp4", frames=36, size=(80, 48))
        called = mcp_calls(f"http://127.0.0.1:{port}/", clip)
        assert [c.isError for c in called] == [False] * 3, [c.content[0].text for c in called]
        time.sleep(1.0)  # the calls' log lines, if any, are read
        mcp_lines = [line for _, line in app.lines[before_mcp:]]
        t = time.monotonic()
        second = subprocess.run([sys.executable, "app.py", "--port", str(free_port()),
                                 "--data-dir", str(data)],
                                cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
        second_s = time.monotonic() - t
        code = app.interrupt(timeout=120)
    finally:
        app.close()
    return {"app": app, "code": code, "second": second, "second_s": second_s, "data": data,
            "mcp_lines": mcp_lines}


def logged_at(line: str) -> float | None:
    """The wall-clock time of a log line's timestamp (local time, as logging writes it), or None."""
    match = STAMP.match(line)
    if match is None:
        return None
    stamp, millis = match.group(1).split(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def test_the_log_says_each_thing_once_in_words(first_start: dict) -> None:
    """Issue #38 item 7: no line twice (the kernel warm-up's "indexed 2 videos" was the real indexing's
    twin), each backbone loaded once, "1 video" not "1 videos", the CLIP fallback's reason said once, and
    no library INFO lines for an MCP call (4-6 each: "Terminating session: None")."""
    app = first_start["app"]
    logged = [STAMP.sub("", line) for _, line in app.lines if STAMP.match(line)]
    said = [line for line in logged if "still working (" not in line]  # the heartbeat counts seconds
    repeated = {line for line in said if said.count(line) > 1}
    assert not repeated, repeated
    for backbone in ("efficientnet_lite0", "minilm"):
        loads = [line for line in logged if f"loading backbone {backbone} " in line]
        assert len(loads) == 1, loads
    text = app.output()
    assert not re.search(r"\b1 (videos|uploads|files|leftovers|captions|entries)\b", text), text[-3000:]
    assert "indexed 1 video of the demo gallery" in text and "ready in" in text
    fallback = [line for line in logged if "did not load (" in line]
    assert len(fallback) == 1 and "WARNING" in fallback[0], fallback  # the reason once, as a warning
    mcp_lines = first_start["mcp_lines"]
    assert not [line for line in mcp_lines if " INFO mcp" in line or " INFO httpx" in line], mcp_lines
    assert any("indexed 1 video (2 in the index)" in line for line in mcp_lines), mcp_lines  # the upload
    assert len(mcp_lines) <= 2, mcp_lines  # three calls: the upload's own line (and the trace's) at most


def test_a_restore_of_one_video_says_one_video(tmp_path: Path, make_predictor,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """Issue #38 item 7: "restored 1 videos"."""
    import logging

    from tests.clips import write_clip

    bucket = tmp_path / "bucket"
    first = make_predictor(tmp_path / "data1", uploads="shared", persist=bucket)
    assert first.add_video(write_clip(tmp_path / "one.mp4", 30))["status"] == "added"
    first.close()
    again = make_predictor(tmp_path / "data2", uploads="shared", persist=bucket)
    try:
        with caplog.at_level(logging.INFO, logger="prvr.serve.ingest"):
            assert again.ingest.restore() == 1
    finally:
        again.close()
    said = [r.getMessage() for r in caplog.records if "restored" in r.getMessage()]
    assert len(said) == 1 and "restored 1 video in " in said[0], said


def test_busy_port_is_refused_at_once_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t = time.monotonic()
        done = subprocess.run([sys.executable, "app.py", "--port", str(port), "--data-dir", str(tmp_path)],
                              cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
        took = time.monotonic() - t
    assert done.returncode != 0 and took < 5, (done.returncode, took)  # before torch, gradio or the model
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0], lines
    assert "--port" in lines[0] and "PRVR_PORT" in lines[0], lines
    assert "GRADIO_SERVER_PORT" not in lines[0] and not list(tmp_path.iterdir())  # nothing loaded or written


def test_help_answers_at_once_and_explains_every_option() -> None:
    """Issue #38 item 6: ``--help`` prints the usage and nothing else before torch or gradio load, and each
    option says what it does, its default and its environment variable (from AppSettings' fields)."""
    from dataclasses import fields

    from prvr.serve.settings import AppSettings

    t = time.monotonic()
    done = subprocess.run([sys.executable, "app.py", "--help"], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=60)
    took = time.monotonic() - t
    assert done.returncode == 0 and done.stdout.startswith("usage: python app.py"), done.stderr[-2000:]
    assert done.stderr == "" and "starting" not in done.stdout  # no log line, no import step
    assert took < 2.0, f"--help took {took:.1f} s"
    imported = subprocess.run([sys.executable, "-X", "importtime", "app.py", "--help"], cwd=REPO, env=env(),
                              capture_output=True, text=True, timeout=60).stderr
    modules = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in imported.splitlines()}
    assert not modules & {"torch", "gradio", "numpy", "transformers"}, sorted(modules)
    text = " ".join(done.stdout.split())  # argparse wraps lines
    for f in fields(AppSettings):
        flag, variable = f"--{f.name.replace('_', '-')}", f"PRVR_{f.name.upper()}"
        entry = text.split(f" {flag} ", 1)[1].split(" --", 1)[0] if f.name != "persist" else \
            text.split(" --persist DIR ", 1)[1]
        what = entry.split("(default:")[0].split()[1:]  # after the metavar: what the option does
        assert len(what) >= 5 and "(default:" in entry and f"environment: {variable}" in entry, (flag, entry)
    bad = subprocess.run([sys.executable, "app.py", "--uploads", "everyone"], cwd=REPO, env=env(),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "argument --uploads: invalid choice: 'everyone'" in bad.stderr
    assert "starting" not in bad.stderr and "Traceback" not in bad.stderr  # refused before anything loads


def test_first_start_has_no_library_noise(first_start: dict) -> None:
    text = first_start["app"].output()
    for noise in ("FutureWarning", "Loading weights", "loss_type", "it/s]", "Traceback", "warnings.warn"):
        assert noise not in text, f"{noise!r} in the start-up output:\n{text[-3000:]}"


def test_first_start_never_goes_silent_for_over_5_s(first_start: dict) -> None:
    app = first_start["app"]
    lines = [(t, line) for t, line in app.lines]
    end = next(i for i, (_, line) in enumerate(lines) if "serving at" in line)
    started = lines[: end + 1]
    assert started[0][0] < QUIET_LIMIT_S, f"first line after {started[0][0]:.1f} s"
    # when the app wrote each line: its log time where it has one (a busy test process may read late),
    # else when it arrived
    stamps = [logged_at(line) or app.wall[i] for i, (_, line) in enumerate(started)]
    gaps = [(b - a, started[i + 1][1]) for i, (a, b) in enumerate(zip(stamps, stamps[1:], strict=False))]
    worst = max(gaps)
    assert worst[0] <= QUIET_LIMIT_S, f"{worst[0]:.1f} s of silence before {worst[1]!r}"
    logged = [line for _, line in started if STAMP.match(line)]
    assert any("loading the model" in line for line in logged) and any("ready in" in line for line in logged)


def test_a_second_app_on_the_same_data_dir_is_refused_naming_the_owner(first_start: dict) -> None:
    second, app = first_start["second"], first_start["app"]
    assert second.returncode == 2, second.stderr[-2000:]
    assert "Traceback" not in second.stderr
    refusal = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert len(refusal) == 1 and str(first_start["data"]) in refusal[0] and f"process {app.process.pid}" in \
        refusal[0], second.stderr[-2000:]
    assert "loading the model" not in second.stderr  # refused before any loading


def test_ctrl_c_stops_the_app_cleanly(first_start: dict) -> None:
    app = first_start["app"]
    assert first_start["code"] in (0, 130), app.output()[-3000:]
    after = app.output().split("serving at", 1)[1]
    assert "Traceback" not in after and "terminate called" not in after, after[-3000:]
    assert "stopping" in after


def test_a_script_with_a_predictor_exits_0_with_only_log_lines(first_start: dict, tmp_path: Path) -> None:
    script = tmp_path / "search.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from prvr.serve.bootstrap import start
        from prvr.serve.settings import AppSettings

        predictor = start(AppSettings(data_dir={str(first_start['data'])!r}, demo_videos="demo01"))
        print(predictor.search("a cat looking at the camera", k=1).results[0]["video_id"])
    """))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "demo:demo01" or done.stdout.strip().endswith("demo01"), done.stdout
    # logging's last-resort handler prints warnings as bare messages: anything else is noise
    noises = ("Traceback", "terminate called", "FutureWarning", "Loading weights", "it/s]", "warnings.warn")
    for noise in noises:
        assert noise not in done.stderr, done.stderr[-3000:]


def test_a_damaged_upload_prints_no_raw_ffmpeg_lines(tmp_path: Path) -> None:
    src = SHARED / "videos" / "gradio__gradio_media_assets_videos_world.mp4"
    if not src.exists():
        pytest.skip(f"{src} is absent (the shared test videos are not part of the repository)")
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(src.read_bytes()[: src.stat().st_size * 2 // 3])  # index at the start: part decodes
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from prvr.serve.startup import quiet_libraries
        from extract.decode import DecodeLimits, FrameReader, MediaError, probe
        quiet_libraries()
        info = probe({str(cut)!r}, DecodeLimits())
        try:
            for _ in FrameReader({str(cut)!r}, [t + 0.5 for t in range(int(info.duration))], (32, 32), 8,
                                 DecodeLimits(), info):
                pass
        except MediaError as err:
            print(err.reason)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "damaged" in done.stdout
    assert "[mov,mp4" not in done.stderr and "partial file" not in done.stderr, done.stderr
    assert cut.name in done.stderr  # the decoder's own warning names the file


def test_the_data_dir_lock_names_its_owner_and_goes_with_a_crash(tmp_path: Path) -> None:
    from prvr.serve.owner import DataDirBusy, DataDirLock

    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from prvr.serve.owner import DataDirLock
        DataDirLock({str(tmp_path)!r}).acquire()
        print("held", flush=True)
        time.sleep(300)
    """)], cwd=tmp_path, env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DataDirBusy, match=rf"{re.escape(str(tmp_path))} is already in use by process "
                                              rf"{holder.pid}, running since .*--data-dir"):
            DataDirLock(tmp_path).acquire()
    finally:
        holder.kill()  # a crash: the kernel drops the lock with the process
        holder.wait()
    mine = DataDirLock(tmp_path).acquire()
    assert mine.held
    mine.release()


def test_the_early_port_check_reads_host_and_port_as_the_settings_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from prvr.serve.settings import AppSettings
    from prvr.serve.startup import early_settings

    for name in ("PRVR_HOST", "PRVR_PORT", "SPACE_ID"):
        monkeypatch.delenv(name, raising=False)
    cases = [([], {}), (["--port", "9100"], {"PRVR_PORT": "9000"}), ([], {"PRVR_PORT": "9000"}),
             (["--host", "0.0.0.0"], {}), ([], {"SPACE_ID": "a/b"}), (["--port=9200", "--mcp"], {})]
    for argv, variables in cases:
        with monkeypatch.context() as patch:
            for key, value in variables.items():
                patch.setenv(key, value)
            settings = AppSettings.from_args(argv)
            assert early_settings(argv) == (settings.host, settings.port), (argv, variables)


def test_ctrl_c_while_loading_exits_without_a_traceback(tmp_path: Path) -> None:
    app = Running("--port", str(free_port()), "--data-dir", str(tmp_path / "data"), "--demo-videos", "demo01")
    try:
        assert app.wait_for("loading the model", 600), app.output()[-3000:]
        code = app.interrupt(timeout=300)
    finally:
        app.close()
    text = app.output()
    assert code in (130, -signal.SIGINT), text[-3000:]  # interrupted, as a shell expects
    assert "Traceback" not in text and "terminate called" not in text, text[-3000:]
    assert "interrupted while starting" in text
