"""Run the real `strata` CLI in a pseudo-terminal of a given width, as a user's terminal.

rich sizes tables to the terminal only when stdout is one; a pipe gets a fixed width. So the
80-column checks run the command on a real pty (os.openpty + TIOCSWINSZ) and read what a
user would see, ANSI codes stripped.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def run_in_pty(*args: str, home: Path, cols: int = 80, rows: int = 50,
               timeout: float = 300) -> tuple[int, str]:
    """(exit code, screen text) of `strata ARGS` on a cols-wide terminal."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {**os.environ, "STRATA_HOME": str(home), "TERM": "xterm-256color",
           "STRATA_PROGRESS": "0"}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    proc = subprocess.Popen([sys.executable, "-m", "strata.cli", *args], stdin=slave,
                            stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its side
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=timeout)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    return code, ANSI.sub("", text)


def cut_figures(screen: str) -> list[str]:
    """Numbers rich cropped with an ellipsis ("6,915…", "1.2…")."""
    return re.findall(r"\d[\d,.]*…", screen)
