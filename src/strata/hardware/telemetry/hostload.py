"""Is the host busy? CPU time used by processes outside strata's own process tree.

A timed test on a host where other processes are running is slow because of them, not
because of the model, the backend or the kernel. `HostLoadMonitor` measures that over a
timed region, so a verdict can name the busy host instead of blaming the thing measured.

    with HostLoadMonitor() as mon:
        run_the_timed_test()
    load = mon.summary                  # HostLoad
    load.busy_share                     # other processes' CPU time / (wall x cores)
    load.busy                           # True/False by BUSY_SHARE/BUSY_STEAL_SHARE, or None
    load.verdict                        # "host busy: other processes used 47% of the CPUs
                                        #  during this test (top: cc1plus 31%, ...)"

How (Linux /proc, no root needed):
- all CPU time = the busy columns of /proc/stat (user, nice, system, irq, softirq) summed
  over every CPU: it includes processes that started and ended inside the region and the
  kernel's own work, which a per-process scan would miss;
- strata's own tree = the root pid (this process unless given) and its descendants, from
  the ppid of every /proc/<pid>/stat; its CPU time is utime + stime + cutime + cstime, so
  children we reaped during the region count as ours (each existed at the start or was
  born inside the region, so the sums over the two snapshots' trees stay right);
- other processes' CPU time = all CPU time - our tree's; the largest per-process deltas of
  the rest are kept by name (`top_other`) so the verdict can say who;
- steal = the steal column of /proc/stat (a hypervisor giving our vCPUs to someone else);
- load average from /proc/loadavg, as context only: it counts our own threads too.

The reduction is the pure function `host_load(start, end)` over two `LoadSnapshot`s, so
recorded snapshots from other machines can be fed to it (tests do).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# busy: other processes used at least this share of all CPUs during the region. 10% is far
# above an idle machine's background (daemons, the kernel: ~1%) and already costs a test
# that uses every core about a tenth of its speed.
BUSY_SHARE = 0.10
BUSY_STEAL_SHARE = 0.05  # a hypervisor taking 5% of our vCPUs is as bad as a busy neighbour
MIN_WALL_S = 0.05  # shorter regions are a few clock ticks: too coarse to judge
# The monitor extends a shorter region to this by waiting at its end: a tiny model's test
# can take 5 ms, 1/2 of a clock tick; the load right after it is then the reading.
MIN_REGION_S = 0.25
TOP_OTHER = 5  # processes named in the breakdown

# /proc/stat "cpu" columns (proc(5)); guest time is already inside user.
_BUSY_COLUMNS = (0, 1, 2, 5, 6)  # user nice system irq softirq
_STEAL_COLUMN = 7


@dataclass(frozen=True)
class ProcTimes:
    """One process from /proc/<pid>/stat: CPU time in clock ticks, children reaped included."""

    pid: int
    ppid: int
    name: str
    ticks: int  # utime + stime: its own threads
    child_ticks: int  # cutime + cstime: children it reaped, their whole lifetime at reap
    start: int  # starttime in ticks since boot: tells a reused pid from the old one


@dataclass(frozen=True)
class LoadSnapshot:
    """What /proc says at one instant; two of them make a HostLoad."""

    t_s: float  # time.perf_counter()
    hz: int  # clock ticks per second (SC_CLK_TCK)
    cores: int  # CPUs whose time /proc/stat sums
    busy_ticks: int  # all CPUs, all processes and the kernel
    steal_ticks: int
    loadavg: tuple[float, float, float]
    procs: dict[int, ProcTimes] = field(default_factory=dict)

    def tree(self, root: int) -> set[int]:
        """root and every descendant alive in this snapshot."""
        children: dict[int, list[int]] = {}
        for p in self.procs.values():
            children.setdefault(p.ppid, []).append(p.pid)
        out, todo = set(), [root]
        while todo:
            pid = todo.pop()
            if pid not in out:
                out.add(pid)
                todo.extend(children.get(pid, []))
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LoadSnapshot:
        procs = {int(pid): ProcTimes(**p) for pid, p in d.get("procs", {}).items()}
        return cls(d["t_s"], d["hz"], d["cores"], d["busy_ticks"], d["steal_ticks"],
                   tuple(d["loadavg"]), procs)  # type: ignore[arg-type]


@dataclass
class OtherProcess:
    pid: int
    name: str
    cpu_s: float
    share: float  # of all CPUs over the region, like busy_share


@dataclass
class HostLoad:
    """CPU use of everything outside our process tree over one timed region."""

    wall_s: float
    cores: int
    own_cpu_s: float  # our process tree
    other_cpu_s: float  # everything else, the kernel's work included
    steal_s: float
    busy_share: float  # other_cpu_s / (wall_s x cores)
    steal_share: float  # steal_s / (wall_s x cores)
    loadavg: tuple[float, float, float]  # 1, 5, 15 min at the end of the region
    busy: bool | None  # None: could not tell (see reason)
    top_other: list[OtherProcess] = field(default_factory=list)
    own_pids: list[int] = field(default_factory=list)
    threshold: float = BUSY_SHARE
    reason: str | None = None

    @property
    def verdict(self) -> str:
        """One line for a verdict or a note; says who, when a process stands out."""
        if self.busy is None:
            return f"host load unknown: {self.reason}"
        pct = f"{self.busy_share:.0%}"
        head = (f"host busy: other processes used {pct} of the CPUs during this test"
                if self.busy else
                f"host quiet: other processes used {pct} of the CPUs during this test")
        extra = []
        named = [p for p in self.top_other if p.share >= 0.01]
        if self.busy and named:
            extra.append("top: " + ", ".join(f"{p.name} {p.share:.0%}" for p in named[:3]))
        if self.steal_share >= 0.01:
            extra.append(f"the hypervisor took {self.steal_share:.0%} (steal)")
        return head + (f" ({'; '.join(extra)})" if extra else "")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HostLoad:
        d = {k: v for k, v in d.items() if k != "verdict"}
        d["top_other"] = [OtherProcess(**p) for p in d.get("top_other", [])]
        d["loadavg"] = tuple(d.get("loadavg", (0.0, 0.0, 0.0)))
        return cls(**d)

    @classmethod
    def unknown(cls, reason: str, wall_s: float = 0.0) -> HostLoad:
        return cls(wall_s, 0, 0.0, 0.0, 0.0, 0.0, 0.0, (0.0, 0.0, 0.0), None, reason=reason)


def host_load(start: LoadSnapshot, end: LoadSnapshot, root_pid: int | None = None,
              busy_share: float = BUSY_SHARE,
              busy_steal_share: float = BUSY_STEAL_SHARE) -> HostLoad:
    """Pure: other processes' CPU use between two snapshots (root_pid's tree is ours)."""
    root = os.getpid() if root_pid is None else root_pid
    wall = end.t_s - start.t_s
    if wall < MIN_WALL_S:
        return HostLoad.unknown(f"region of {wall * 1e3:.0f} ms is too short to judge "
                                f"(needs {MIN_WALL_S * 1e3:.0f} ms)", wall)
    hz, cores = end.hz, end.cores
    own_start, own_end = start.tree(root), end.tree(root)
    # Reaped children moved into their parent's cutime/cstime: sums over each snapshot's
    # tree stay right when a child of ours exits inside the region.
    own = (sum(end.procs[p].ticks + end.procs[p].child_ticks for p in own_end)
           - sum(start.procs[p].ticks + start.procs[p].child_ticks for p in own_start))
    own_ticks = max(own, 0)
    other_ticks = max(end.busy_ticks - start.busy_ticks - own_ticks, 0)
    steal_ticks = max(end.steal_ticks - start.steal_ticks, 0)
    capacity = wall * cores * hz
    load = HostLoad(wall_s=wall, cores=cores, own_cpu_s=own_ticks / hz,
                    other_cpu_s=other_ticks / hz, steal_s=steal_ticks / hz,
                    busy_share=other_ticks / capacity, steal_share=steal_ticks / capacity,
                    loadavg=end.loadavg, busy=None, own_pids=sorted(own_end),
                    threshold=busy_share)
    load.busy = load.busy_share >= busy_share or load.steal_share >= busy_steal_share
    load.top_other = _top_other(start, end, own_start | own_end, capacity, other_ticks)
    return load


def _top_other(start: LoadSnapshot, end: LoadSnapshot, ours: set[int],
               capacity: float, other_ticks: int) -> list[OtherProcess]:
    """Other processes by CPU time in the region, children they reaped included (a test
    runner's or a build's short-lived children are most of a busy host's load).

    A parent's cutime jumps by a child's whole lifetime when it reaps it; the part the child
    had already used at the start (seen in the start snapshot) is taken off again."""
    gone = _pre_region_of_reaped(start, end)
    out = []
    for pid, p in end.procs.items():
        if pid in ours:
            continue
        before = start.procs.get(pid)
        same = before is not None and before.start == p.start
        own = p.ticks - (before.ticks if before and same else 0)
        reaped = p.child_ticks - (before.child_ticks if before and same else 0)
        # capped by all others' time: a reaper the start snapshot could not see (a process
        # re-parented to a subreaper) must not read as more than the whole host
        ticks = min(own + max(reaped - gone.get(pid, 0), 0), other_ticks)
        if ticks > 0:
            out.append(OtherProcess(pid, p.name, ticks / end.hz, ticks / capacity))
    out.sort(key=lambda o: o.cpu_s, reverse=True)
    return out[:TOP_OTHER]


def _alive(start: LoadSnapshot, end: LoadSnapshot, pid: int) -> bool:
    after = end.procs.get(pid)
    return after is not None and after.start == start.procs[pid].start


def _pre_region_of_reaped(start: LoadSnapshot, end: LoadSnapshot) -> dict[int, int]:
    """Surviving pid -> CPU ticks that processes gone by the end had used before the region.

    A vanished process's lifetime lands in its parent's cutime; when the parent vanished too
    (bash -> timeout -> python), both land in the nearest surviving ancestor's. Its share
    before the region is charged there, so only time inside the region is counted."""
    gone: dict[int, int] = {}
    for pid, p in start.procs.items():
        if _alive(start, end, pid):
            continue
        ancestor, seen = p.ppid, {pid}
        while ancestor in start.procs and not _alive(start, end, ancestor) \
                and ancestor not in seen:
            seen.add(ancestor)
            ancestor = start.procs[ancestor].ppid
        # its threads and the children it had already reaped; children still alive at the
        # start are charged by their own entries in this loop
        gone[ancestor] = gone.get(ancestor, 0) + p.ticks + p.child_ticks
    return gone


# ---------------------------------------------------------------- reading /proc


class HostLoadUnavailable(Exception):
    """/proc is missing or unreadable here (not Linux, or a locked-down sandbox)."""


def _parse_stat(text: str) -> ProcTimes:
    # comm is in parentheses and may hold spaces or ')': split at the last one.
    head, _, rest = text.rpartition(")")
    pid_s, _, name = head.partition(" (")
    f = rest.split()
    # after comm: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14) ...
    # starttime(19), per proc(5) fields 3, 4, 14-17 and 22.
    return ProcTimes(int(pid_s), int(f[1]), name, int(f[11]) + int(f[12]),
                     int(f[13]) + int(f[14]), int(f[19]))


def _read_procs(root: Path) -> dict[int, ProcTimes]:
    procs = {}
    for entry in os.scandir(root):
        if not entry.name.isdigit():
            continue
        try:
            p = _parse_stat((root / entry.name / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # it exited between the listing and the read
        procs[p.pid] = p
    return procs


def _read_cpu(root: Path) -> tuple[int, int, int]:
    """(busy ticks, steal ticks, number of CPUs) from /proc/stat."""
    busy = steal = cores = 0
    for line in (root / "stat").read_text().splitlines():
        if line.startswith("cpu "):
            cols = [int(x) for x in line.split()[1:]]
            busy = sum(cols[i] for i in _BUSY_COLUMNS if i < len(cols))
            steal = cols[_STEAL_COLUMN] if len(cols) > _STEAL_COLUMN else 0
        elif line.startswith("cpu"):
            cores += 1
    return busy, steal, max(cores, 1)


def snapshot(procfs_root: Path | str = "/proc") -> LoadSnapshot:
    """Read /proc now. Raises HostLoadUnavailable where there is no usable /proc."""
    root = Path(procfs_root)
    try:
        busy, steal, cores = _read_cpu(root)
        loadavg = tuple(float(x) for x in (root / "loadavg").read_text().split()[:3])
        procs = _read_procs(root)
    except (OSError, ValueError) as exc:
        raise HostLoadUnavailable(f"cannot read {root}: {exc}") from exc
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return LoadSnapshot(time.perf_counter(), hz, cores, busy, steal,
                        loadavg, procs)  # type: ignore[arg-type]


class HostLoadMonitor:
    """Context manager: other processes' CPU use over the `with` block.

        with HostLoadMonitor() as mon:
            timed_region()
        mon.summary.busy, mon.summary.verdict

    root_pid: the process whose tree is "ours" (default: this process). Where /proc cannot
    be read, the summary says so (busy=None with a reason) and the timed region still runs.
    min_region_s: a region shorter than this is extended by waiting at its end (after the
    timed work: nothing timed is slowed), so a test of a few milliseconds still gets a
    reading; 0 disables it (then a region under MIN_WALL_S gives busy=None).
    Monitors may nest (each reads /proc twice; a read takes a few milliseconds).
    """

    def __init__(self, *, root_pid: int | None = None, procfs_root: Path | str = "/proc",
                 busy_share: float = BUSY_SHARE, busy_steal_share: float = BUSY_STEAL_SHARE,
                 min_region_s: float = MIN_REGION_S) -> None:
        self.min_region_s = min_region_s
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self.procfs_root = Path(procfs_root)
        self.busy_share, self.busy_steal_share = busy_share, busy_steal_share
        self.start_snapshot: LoadSnapshot | None = None
        self._summary: HostLoad | None = None
        self._error: str | None = None
        self._t0 = 0.0

    def __enter__(self) -> HostLoadMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> HostLoadMonitor:
        self._t0 = time.perf_counter()
        try:
            self.start_snapshot = snapshot(self.procfs_root)
        except HostLoadUnavailable as exc:
            self._error = str(exc)
        return self

    def stop(self) -> HostLoad:
        """End the region and compute the summary (idempotent)."""
        if self._summary is not None:
            return self._summary
        if self.start_snapshot is None:
            self._summary = HostLoad.unknown(self._error or "monitor was never started",
                                             time.perf_counter() - self._t0)
            return self._summary
        short = self.min_region_s - (time.perf_counter() - self.start_snapshot.t_s)
        if short > 0:
            time.sleep(short)
        try:
            end = snapshot(self.procfs_root)
        except HostLoadUnavailable as exc:
            self._summary = HostLoad.unknown(str(exc), time.perf_counter() - self._t0)
            return self._summary
        self._summary = host_load(self.start_snapshot, end, self.root_pid, self.busy_share,
                                  self.busy_steal_share)
        return self._summary

    @property
    def summary(self) -> HostLoad:
        if self._summary is None:
            raise RuntimeError("HostLoadMonitor.summary is ready after the `with` block ends")
        return self._summary
