"""A stop signal reaches ``runjobs``'s loop wherever the main thread is when it lands.

A signal handler runs in the main thread between two of its bytecodes. The loop's main
thread takes the lock of its wake event at every pass (``Event.clear()``, ``wait()``), so a
handler that set that event itself would, landing there, wait for a lock its own thread
holds: the runner would never stop. (The real processes' SIGTERM tests:
tests/test_faults_sigterm.py.)
"""

from __future__ import annotations

import os
import signal
import threading
import time

from django_fencedjobs import loop
from django_fencedjobs.management.commands import runjobs


def test_a_sigterm_that_lands_while_the_loop_holds_its_wake_lock_stops_the_loop():
    dispatcher = loop.Dispatcher([])
    held = dispatcher.wake._cond  # the lock Event.clear() and Event.wait() take
    stuck = threading.Event()

    def unstick() -> None:  # only if the handler waits on the lock this thread holds
        stuck.set()
        held.release()

    before = signal.getsignal(signal.SIGTERM)
    with runjobs._stopped_by_signals(dispatcher):
        held.acquire()
        watchdog = threading.Timer(5, unstick)
        watchdog.start()
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(20):  # the handler runs in here, this thread holding the lock
            time.sleep(0.01)
        watchdog.cancel()
        if not stuck.is_set():
            held.release()
        assert not stuck.is_set(), "the signal handler waited on its own thread's lock"
        assert dispatcher.stop.wait(5) and dispatcher.wake.wait(5)
        # A second signal now would exit at once; the handlers are restored on the way out.
        assert signal.getsignal(signal.SIGTERM) is runjobs._exit_now
    assert signal.getsignal(signal.SIGTERM) is before
