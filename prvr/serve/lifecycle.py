"""The app's stop: Ctrl-C (SIGINT) or SIGTERM at any moment ends it within seconds, however busy it is.

Python runs a signal's handler only between bytecodes of the main thread, which spends seconds inside single
calls while the app starts (importing torch, loading a model, a compile), and an interrupted start waited for
its non-daemon threads. So the C-level handler's write to a wake-up socket (``signal.set_wakeup_fd``) is read
by a watcher thread, which acts at once: while **starting**, one line and exit 130 (``os._exit``: every write
of a start is atomic, the next start sweeps what is left, the data dir's lock goes with the process); while
**serving**, the main thread's wait returns and the app closes its server, exiting 0 at most
``STOP_WITHIN_S`` after the signal even if work still runs (an upload cut short: swept at the next start).

A SIGINT ignored when the process started stays ignored (a shell starts background jobs that way so that a
Ctrl-C meant for the foreground program spares them); the "serving at" line says so, and SIGTERM still
stops it. Standard library only: ``prvr.serve.startup`` installs it before gradio and torch load.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

log = logging.getLogger("prvr.serve.lifecycle")

INTERRUPTED = 130  # the status of a start cut short, as a shell reports a program stopped by Ctrl-C
STOP_WITHIN_S = 3.0  # a stop while serving may take this long, then the process exits anyway (the promise
# is 5 s from the signal; the rest is the slack of a busy machine)


class Lifecycle:
    """Where the app is (starting, serving, stopping) and what a stop signal does there."""

    def __init__(self) -> None:
        self.phase = "starting"
        self.stop_requested = threading.Event()
        self._lock = threading.Lock()  # one signal acts at a time; a phase changes between them
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_write.setblocking(False)  # set_wakeup_fd's requirement: a full buffer drops, never blocks
        self.signals = [signal.SIGTERM]
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self.signals.append(signal.SIGINT)
        self._watcher = threading.Thread(target=self._watch, name="stop-signals", daemon=True)
        self.installed = False

    def install(self) -> Lifecycle:
        """Route the stop signals to the watcher (the main thread only: where Python allows it)."""
        self.installed = True
        for signum in self.signals:
            signal.signal(signum, _noted)  # a Python handler, so that the C handler wakes the watcher
        signal.set_wakeup_fd(self._wake_write.fileno(), warn_on_full_buffer=False)
        os.register_at_fork(after_in_child=self._forget)
        self._watcher.start()
        return self

    def _forget(self) -> None:
        """In a forked child (ZeroGPU's worker, multiprocessing's fork): its signals are its own again. The
        wake-up socket is shared with this process, whose watcher would take the child's SIGTERM for its own,
        and the child has no watcher: a signal would do nothing."""
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if signal.SIGINT in self.signals:
                signal.signal(signal.SIGINT, signal.default_int_handler)

    def how_to_stop(self) -> str:
        """What stops this process, in words for the "serving at" line."""
        if signal.SIGINT in self.signals:
            return "Ctrl-C stops"
        return "SIGTERM stops; Ctrl-C does not: SIGINT was ignored when this process started"

    def serving(self) -> None:
        """From now a stop signal closes the server (exit 0) instead of ending a start (exit 130)."""
        with self._lock:
            # the wake-up socket is ours again, should a library have taken it meanwhile
            signal.set_wakeup_fd(self._wake_write.fileno(), warn_on_full_buffer=False)
            self.phase = "serving"

    def wait_while(self, running: Callable[[], bool]) -> None:
        """Block (the main thread) until a stop signal arrives or ``running()`` turns false."""
        while running() and not self.stop_requested.wait(0.2):
            pass
        with self._lock:
            self.phase = "stopping"

    def _watch(self) -> None:
        """The watcher thread: each signal number the C handler wrote, acted on as it arrives."""
        while True:
            try:
                received = self._wake_read.recv(64)
            except OSError:
                return
            for signum in received:
                if signum in self.signals:
                    self._on_signal(signal.Signals(signum))

    def _on_signal(self, which: signal.Signals) -> None:
        """A stop signal: exit now while starting; while serving, wake the main thread and bound its stop."""
        with self._lock:
            if self.phase == "starting":
                log.info("interrupted while starting (%s)", which.name)
                exit_now(INTERRUPTED)
            first = not self.stop_requested.is_set()
            self.stop_requested.set()
        if first:
            threading.Thread(target=self._deadline, args=(which,), name="stop-deadline", daemon=True).start()

    def _deadline(self, which: signal.Signals) -> None:
        """Exit 0 if the stop the signal asked for has not ended the process in ``STOP_WITHIN_S``."""
        time.sleep(STOP_WITHIN_S)
        log.warning("stopped %.0f s after %s with work still running (an upload cut short is swept at the "
                    "next start)", STOP_WITHIN_S, which.name)
        exit_now(0)


def _noted(signum: int, frame: object) -> None:
    """The Python-level handler: nothing to do, the watcher thread has the signal already."""


def finish(status: int) -> NoReturn:
    """The app's last step once it has closed what it opened: the interpreter's exit hooks run, then the
    process ends, without the seconds that tearing down torch's and numba's native state takes (measured:
    3-5 s after a stop, which broke the promise of an exit within 5 s)."""
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()  # what ``sys.exit`` would run (logging's flush, gradio's, weakref finalizers)
    exit_now(status)


def exit_now(status: int) -> NoReturn:
    """End the process at once with ``status``, its log lines and output written out first (no atexit hooks,
    no waiting for threads: called when waiting is what must not happen)."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


_CURRENT: Lifecycle | None = None


def install() -> Lifecycle:
    """The process's lifecycle, its signal handling installed on the first call (from the main thread);
    elsewhere (a thread, a test) one that handles no signals."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = Lifecycle()
    if not _CURRENT.installed and threading.current_thread() is threading.main_thread():
        _CURRENT.install()
    return _CURRENT
