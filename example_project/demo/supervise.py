"""Run a few child processes together in the foreground; stop them all on Ctrl-C.

Standard library only. Each child runs in its own session (so its own process group):
a Ctrl-C in the terminal reaches this process alone, which forwards it to each child's
whole group, waits for them, and kills whatever is still there after a bounded wait. A
second Ctrl-C (or the wait running out) kills at once. On Linux each child also gets
SIGTERM if this process dies without cleaning up (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

#: How long children get to finish after the stop signal before they are killed.
STOP_TIMEOUT = 20.0


def _die_with_parent() -> None:
    """In the child, before exec: receive SIGTERM when the parent dies."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


@dataclass
class Child:
    name: str
    argv: Sequence[str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


@dataclass
class Supervisor:
    children: list[Child] = field(default_factory=list)
    #: The signal that asked us to stop (SIGINT, SIGTERM, SIGHUP), or None.
    stop_signal: int | None = None
    _signals_seen: int = 0

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals_seen += 1
        if self.stop_signal is None:
            self.stop_signal = signum
        if self._signals_seen > 1:
            self._kill_all()  # a second Ctrl-C: do not wait any longer

    @property
    def stopping(self) -> bool:
        return self.stop_signal is not None

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Child:
        child = Child(name, list(argv))
        child.process = subprocess.Popen(
            argv, env=env, start_new_session=True, preexec_fn=_die_with_parent
        )
        self.children.append(child)
        return child

    def first_exited(self) -> Child | None:
        for child in self.children:
            if child.process is not None and child.process.poll() is not None:
                return child
        return None

    def wait(self, seconds: float, until: Callable[[], bool] | None = None) -> bool:
        """Sleep up to ``seconds``; return early (True) when asked to stop, a child exited,
        or ``until()`` became true."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.stopping or self.first_exited() is not None or (until and until()):
                return True
            time.sleep(0.1)
        return False

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Forward the stop signal (SIGINT stays SIGINT, anything else becomes SIGTERM) to
        each child's process group, wait, then kill what is left."""
        forward = signal.SIGINT if self.stop_signal == signal.SIGINT else signal.SIGTERM
        for child in self.children:
            _signal_group(child.pid, forward)
        deadline = time.monotonic() + timeout
        for child in self.children:
            assert child.process is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(max(deadline - time.monotonic(), 0))
        self._kill_all()
        for child in self.children:
            assert child.process is not None
            child.process.wait()

    def _kill_all(self) -> None:
        for child in self.children:
            # The child's group, not just the child: nothing it started outlives the demo.
            _signal_group(child.pid, signal.SIGKILL)

    def leftovers(self) -> list[int]:
        """Process groups of children that still have a live member (should be none)."""
        alive = []
        for child in self.children:
            try:
                os.killpg(child.pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            alive.append(child.pid)
        return alive


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
