"""The launcher: run work in a child process that cannot hang, outlive or take down its
parent — a wall-clock timeout, resource limits, its own session (a timeout kills the whole
process group, grandchildren included), and output collected whatever happens.

Used by the probe's smoke test and the kernel lab's sandbox (which adds OS-level
confinement on top, inside the child: strata.kernels.confine); the ring's node processes,
training workers and the generation loop's verification jobs start theirs the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the directory that holds `strata/`


def worker_env() -> dict[str, str]:
    """The child must import this very `strata`, installed or not (tests run from src/)."""
    env = dict(os.environ)
    paths = [str(PACKAGE_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


class IsolatedRun(NamedTuple):
    returncode: int | None  # negative: killed by that signal; None: never started
    stdout: str
    stderr: str
    timed_out: bool


@dataclass(frozen=True)
class Limits:
    """Resource limits for the child (POSIX only; ignored where the OS lacks them)."""

    cpu_seconds: int | None = None
    address_space_bytes: int | None = None
    core_dumps: bool = False  # a crashing GPU driver can write multi-GB cores


def _limit_setter(limits: Limits) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec
        import resource

        if limits.cpu_seconds is not None:
            # Soft limit sends SIGXCPU, the hard one SIGKILL a few seconds later.
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
        if limits.address_space_bytes is not None:
            size = limits.address_space_bytes
            resource.setrlimit(resource.RLIMIT_AS, (size, size))
        if not limits.core_dumps:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _as_argv(argv_or_code: str | Sequence[str]) -> list[str]:
    """A string is Python source for the current interpreter; a sequence is an argv."""
    if isinstance(argv_or_code, str):
        return [sys.executable, "-c", argv_or_code]
    return list(argv_or_code)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the child and everything it started (it leads its own session)."""
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


def _drain(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Output a killed child left behind; give up quickly if an escaped grandchild holds a pipe."""
    try:
        out, err = proc.communicate(timeout=5)
        return out or "", err or ""
    except subprocess.TimeoutExpired:
        proc.kill()
        return "", ""


def run_isolated(argv_or_code: str | Sequence[str], timeout_s: float, *,
                 env: dict[str, str] | None = None, limits: Limits | None = None) -> IsolatedRun:
    """Run a child with a wall-clock timeout and limits; never hangs, never raises on failure."""
    argv = _as_argv(argv_or_code)
    use_limits = limits is not None and os.name == "posix"
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, errors="replace", env=env,
            # Own session: a timeout kills the whole group, grandchildren included.
            start_new_session=os.name == "posix",
            # preexec_fn is unsafe with threads when it takes locks; setrlimit is a bare
            # syscall, so the probe's telemetry thread cannot deadlock the child here.
            preexec_fn=_limit_setter(limits) if use_limits and limits else None,
        )
    except OSError as exc:
        return IsolatedRun(None, "", f"could not start {argv[0]}: {exc}", False)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return IsolatedRun(proc.returncode, out, err, False)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = _drain(proc)
        return IsolatedRun(proc.returncode, out, err, True)
    except BaseException:  # Ctrl-C in the parent must not leave a GPU job behind
        _kill_group(proc)
        proc.wait()
        raise
