"""A start-up that speaks: the port checked before anything slow, every step logged with its time, and no
output a user cannot act on (library progress bars, deprecation warnings, raw FFmpeg lines).

Only the standard library is imported here: ``app.py`` loads this file and calls ``early_start`` before it
imports gradio and torch (seconds; ``prvr/__init__`` imports torch, so app.py loads it by path), so that
``--help`` answers at once, a malformed flag, a busy port and a data dir another app owns are refused at
once, the imports are logged, and Ctrl-C or SIGTERM end the start at once from the first import on
(``prvr.serve.lifecycle``).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import importlib.util
import logging
import os
import socket
import sys
import threading
import time
import types
import warnings
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("prvr.serve.startup")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
QUIET_AFTER_S = 3.0  # a step that logs nothing for this long gets a "still ..." line (a busy machine may
# delay it by a second or two: the promise is no silence over 5 s)


class PortBusy(SystemExit):
    """The app's port is taken (or not ours to bind): one line for the user, exit status 2."""

    def __init__(self, host: str, port: int, why: str) -> None:
        super().__init__(2)
        self.message = (f"cannot serve on {host}:{port}: {why}. Stop the program using it or choose another "
                        f"port with --port PORT (or the PRVR_PORT variable).")


def check_command_line(argv: Sequence[str]) -> Path:
    """Read the command line with ``AppSettings``' own parser, before anything heavy loads: ``--help``
    prints the usage and exits 0, a malformed flag exits 2 with argparse's message (``SystemExit``). Returns
    the data dir as the settings will read it (flag, then ``PRVR_DATA_DIR``, then the default).

    ``prvr.serve.settings`` imports only the standard library and ``prvr.paths``; in a process that has not
    imported ``prvr`` yet (``app.py`` at its start) both are loaded under bare stand-ins of their packages,
    whose ``__init__`` (torch) does not run, and forgotten afterwards: the real imports later run as usual.
    """
    stand_ins = [name for name in ("prvr", "prvr.serve") if name not in sys.modules]
    before = {name for name in sys.modules if name.startswith("prvr.")}
    root = Path(__file__).resolve().parents[2]
    for name in stand_ins:
        package = types.ModuleType(name)
        package.__path__ = [str(root.joinpath(*name.split(".")))]
        sys.modules[name] = package
    try:
        given = importlib.import_module("prvr.serve.settings").AppSettings.parser().parse_args(list(argv))
        data_dir = given.data_dir if given.data_dir is not None else \
            importlib.import_module("prvr.paths").default_data_dir()
        return Path(data_dir).expanduser()
    finally:
        if stand_ins:  # the modules of this checkout loaded under them (the standard library's stay)
            for name in {n for n in sys.modules if n.startswith("prvr.")} - before | set(stand_ins):
                del sys.modules[name]


def early_settings(argv: Sequence[str] | None) -> tuple[str, int | None]:
    """(host, port) as the full settings will read them (flags, then PRVR_HOST/PRVR_PORT, then defaults),
    from the command line alone: nothing heavy imported. A malformed port gives None (argparse reports it
    later, with the other flags)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", default=None)
    known, _ = parser.parse_known_args(argv)
    default_host = "0.0.0.0" if os.environ.get("SPACE_ID") else "127.0.0.1"  # as AppSettings
    host = known.host or os.environ.get("PRVR_HOST") or default_host
    try:
        port = int(known.port or os.environ.get("PRVR_PORT") or 7860)
    except ValueError:
        return host, None
    return host, port


def check_port(host: str, port: int) -> None:
    """Raise ``PortBusy`` unless a server could listen on ``host:port`` now."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as err:
        raise PortBusy(host, port, f"the host name does not resolve ({err.strerror or err})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is fine
        try:
            probe.bind(address)
        except OSError as err:
            why = {errno.EADDRINUSE: "another program is already listening on this port",
                   errno.EACCES: "this user may not listen on this port",
                   errno.EADDRNOTAVAIL: "this machine has no such address"}.get(err.errno, str(err))
            raise PortBusy(host, port, why) from None


class Heartbeat(logging.Handler):
    """Logs "still <last step> (N s)" whenever nothing was logged for ``quiet_after_s`` seconds, so a
    long step (loading a model, embedding class names, rendering videos) never looks like a hang."""

    def __init__(self, quiet_after_s: float = QUIET_AFTER_S) -> None:
        super().__init__(logging.INFO)
        self.quiet_after_s = quiet_after_s
        self.step, self.step_t0 = "starting", time.monotonic()
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="startup-heartbeat", daemon=True)

    def emit(self, record: logging.LogRecord) -> None:
        self.last = time.monotonic()
        if record.name != log.name:  # a new step (not our own "still ..." line)
            self.step, self.step_t0 = record.getMessage(), self.last

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            now = time.monotonic()
            if now - self.last >= self.quiet_after_s:
                step = self.step if len(self.step) <= 90 else self.step[:87] + "..."
                log.info("still working (%.0f s): %s", now - self.step_t0, step)

    def start(self) -> Heartbeat:
        logging.getLogger().addHandler(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        logging.getLogger().removeHandler(self)


def quiet_libraries() -> None:
    """No output a user cannot act on: transformers' weight-loading progress bars, its deprecation and
    loss-type notices (raised when the text model is traced), and decord's raw FFmpeg lines for a damaged
    file (the decoder's own warning and the upload's message name the file and the problem), and the INFO
    lines of the MCP server and of HTTP clients (gradio's own loopback calls): 4-6 a tool call, "Terminating
    session: None" among them. Real errors still show: only these messages are dropped (the MCP server's
    and httpx's warnings pass), and FFmpeg's errors reach us as exceptions."""
    warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r".*loss_type=None.*", category=FutureWarning)
    # gradio's note that MCP calls get a fresh State: each MCP call is its own session, as documented
    warnings.filterwarnings("ignore", message=r"This MCP server includes a tool that has a gr\.State input")
    for library in ("mcp", "httpx"):
        logging.getLogger(library).setLevel(logging.WARNING)
    with contextlib.suppress(ImportError):
        import transformers.utils.logging as hf_logging

        hf_logging.disable_progress_bar()
        logging.getLogger("transformers.modeling_utils").addFilter(_drop_loss_type_notice)
    with contextlib.suppress(ImportError):
        import decord.logging

        decord.logging.set_level(decord.logging.QUIET)


def _drop_loss_type_notice(record: logging.LogRecord) -> bool:
    """transformers' "`loss_type=None` ... Using the default loss" notice: about training, not inference."""
    return "loss_type=" not in str(record.msg)


_HEARTBEAT: Heartbeat | None = None


def early_start(argv: Sequence[str] | None = None) -> Heartbeat:
    """Before gradio and torch load: logging with times, the stop signals' handling, the port check (a busy
    port exits here with one line), the data dir check (one that another app owns: the same), and the
    heartbeat that speaks during long steps. Returns the heartbeat (``stop`` it once up)."""
    global _HEARTBEAT
    argv = sys.argv[1:] if argv is None else argv
    data_dir = check_command_line(argv)  # --help, or a bad flag: answered here, before any log line
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    # Ctrl-C and SIGTERM end the start at once from here on, even inside the imports that follow
    _stdlib_sibling("lifecycle").install()
    host, port = early_settings(argv)
    if port is not None:
        try:
            check_port(host, port)
        except PortBusy as busy:
            print(f"error: {busy.message}", file=sys.stderr)
            raise
    owner = _stdlib_sibling("owner")
    try:  # only a look: the start takes the lock later (prvr.serve.bootstrap), and refuses then as well
        owner.DataDirLock(data_dir).check()
    except owner.DataDirBusy as busy:
        print(f"error: {busy}", file=sys.stderr)
        raise SystemExit(2) from None
    if _HEARTBEAT is None:
        _HEARTBEAT = Heartbeat().start()
        _HEARTBEAT.step = "importing gradio and torch"
    log.info("starting on %s:%s: importing gradio and torch", host, port)
    return _HEARTBEAT


def _stdlib_sibling(name: str) -> types.ModuleType:
    """``prvr.serve.<name>``, a module of the standard library only: imported as usual once ``prvr`` is,
    else loaded by its path and registered (``prvr/__init__`` imports torch; later imports get this one)."""
    full = f"prvr.serve.{name}"
    if full in sys.modules:
        return sys.modules[full]
    if "prvr.serve" in sys.modules:
        return importlib.import_module(full)
    spec = importlib.util.spec_from_file_location(full, Path(__file__).with_name(f"{name}.py"))
    module = sys.modules[full] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stop_heartbeat() -> None:
    """Stop the start-up heartbeat (the app is serving: silence means idle now)."""
    global _HEARTBEAT
    if _HEARTBEAT is not None:
        _HEARTBEAT.stop()
        _HEARTBEAT = None
