"""A real SMTP server for the notification tests, run as a process of its own:

    python -m tests.smtp_sink PORT DIRECTORY

listens on 127.0.0.1:PORT (aiosmtpd) and writes each message it accepts to DIRECTORY, one
file each (``<n>.eml``: the envelope's recipients on a first line, then the message as
received). Prints ``ready`` once it accepts connections; stops on SIGTERM.
"""

from __future__ import annotations

import itertools
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller


class Sink:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.numbers = itertools.count(1)
        self.lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self.lock:
            number = next(self.numbers)
        header = "X-Envelope-To: " + ", ".join(envelope.rcpt_tos) + "\r\n"
        content = envelope.original_content or envelope.content
        (self.directory / f"{number:04d}.part").write_bytes(header.encode() + content)
        (self.directory / f"{number:04d}.part").rename(self.directory / f"{number:04d}.eml")
        return "250 Message accepted"


def main() -> int:
    port, directory = int(sys.argv[1]), Path(sys.argv[2])
    directory.mkdir(parents=True, exist_ok=True)
    controller = Controller(Sink(directory), hostname="127.0.0.1", port=port)
    controller.start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    print("ready", flush=True)
    stopped.wait()
    controller.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
