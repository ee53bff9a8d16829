"""OS-level confinement of a sandboxed kernel worker, whatever the kernel's code does.

Applied by the worker to itself at start, while it is still single-threaded and before any
kernel code is loaded (Landlock restricts the calling thread and what it starts later):

- **Landlock** (Linux >= 5.13, unprivileged): no file may be written, created, removed or
  renamed outside the job's private scratch directory (plus /dev/null and, for GPU jobs,
  the device nodes); no executable may be started except the GPU toolchain on GPU jobs;
  no TCP bind/connect (ABI >= 4); no signals or abstract UNIX sockets reaching outside the
  sandbox (ABI >= 6). Reads stay allowed: Python and torch must import.
- **seccomp** (x86_64, aarch64): no new processes (fork/vfork/clone without CLONE_THREAD;
  clone3 answers ENOSYS so libc falls back to clone), no exec on CPU jobs, no sockets, no
  ptrace or cross-process memory access, no namespaces, mounts, io_uring, bpf or keyrings.
  Denied calls fail with EPERM; the worker stays alive to report.
- **An audit hook** (Python's `sys.addaudithook`, which code cannot remove): a Python-level
  attempt to write outside the scratch directory, start a process, open a socket or load a
  native library after the kernel was loaded is recorded — and refused — so the verdict can
  name it even when the kernel swallows the error.

Where a layer is missing the result says so ("sandbox: rlimits only") instead of pretending.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

# -- Landlock ---------------------------------------------------------------------------------
_SYS = {"x86_64": {"landlock_create_ruleset": 444, "landlock_add_rule": 445,
                   "landlock_restrict_self": 446},
        "aarch64": {"landlock_create_ruleset": 444, "landlock_add_rule": 445,
                    "landlock_restrict_self": 446}}
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
_FS_WRITES_V1 = (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | \
    (1 << 10) | (1 << 11) | (1 << 12)  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2  # ABI 4
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1, 2  # ABI 6
DEVICE_NODES = ("/dev/null", "/dev/zero", "/dev/full")
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                    "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3",
                    "/dev/nvidia4", "/dev/nvidia5", "/dev/nvidia6", "/dev/nvidia7",
                    "/dev/kfd", "/dev/dri", "/dev/shm")

# -- seccomp ------------------------------------------------------------------------------------
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_DENY = {  # syscall numbers denied with EPERM
    "x86_64": {"fork": 57, "vfork": 58, "socket": 41, "connect": 42, "bind": 49,
               "listen": 50, "ptrace": 101, "process_vm_readv": 310,
               "process_vm_writev": 311, "mount": 165, "umount2": 166, "unshare": 272,
               "setns": 308, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
               "pidfd_getfd": 438, "keyctl": 250, "add_key": 248, "request_key": 249,
               "chroot": 161, "pivot_root": 155, "init_module": 175, "finit_module": 313,
               "perf_event_open": 298, "kexec_load": 246},
    "aarch64": {"socket": 198, "connect": 203, "bind": 200, "listen": 201, "ptrace": 117,
                "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40,
                "umount2": 39, "unshare": 97, "setns": 268, "bpf": 280, "userfaultfd": 282,
                "io_uring_setup": 425, "pidfd_getfd": 438, "keyctl": 219, "add_key": 217,
                "request_key": 218, "chroot": 51, "pivot_root": 41, "init_module": 105,
                "finit_module": 273, "perf_event_open": 241, "kexec_load": 104},
}
_EXEC = {"x86_64": {"execve": 59, "execveat": 322}, "aarch64": {"execve": 221, "execveat": 281}}
_CLONE = {"x86_64": 56, "aarch64": 220}
_CLONE3 = 435
_CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000
_EPERM, _ENOSYS = 1, 38
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


@dataclass
class Confinement:
    """What this worker is confined by; `level` is shown with every verdict."""

    layers: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def level(self) -> str:
        core = [layer for layer in self.layers if layer != "rlimits"]
        return "+".join(core) if core else "rlimits only"

    def to_dict(self) -> dict[str, object]:
        return {"level": self.level, "layers": self.layers, "missing": self.missing}


def _arch() -> str:
    return platform.machine().lower().replace("arm64", "aarch64").replace("amd64", "x86_64")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """Landlock ABI version of this kernel, 0 where unavailable."""
    arch = _arch()
    if sys.platform != "linux" or arch not in _SYS:
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(ctypes.c_long(_SYS[arch]["landlock_create_ruleset"]), None,
                       ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return int(abi) if abi > 0 else 0


def _write_rights(abi: int) -> int:
    rights = FS_WRITE_FILE | _FS_WRITES_V1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    return rights


def _ruleset_attr(abi: int, handled_fs: int) -> bytes:
    if abi >= 6:
        return struct.pack("QQQ", handled_fs, NET_BIND_TCP | NET_CONNECT_TCP,
                           SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL)
    if abi >= 4:
        return struct.pack("QQ", handled_fs, NET_BIND_TCP | NET_CONNECT_TCP)
    return struct.pack("Q", handled_fs)


def _add_path(libc: ctypes.CDLL, nr: int, ruleset: int, path: str, access: int) -> bool:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return False  # absent device node or toolchain dir: nothing to allow
    try:
        # landlock_path_beneath_attr is packed: u64 allowed_access, s32 parent_fd
        attr = ctypes.create_string_buffer(struct.pack("=Qi", access, fd))
        return libc.syscall(ctypes.c_long(nr), ctypes.c_int(ruleset),
                            ctypes.c_int(_RULE_PATH_BENEATH), attr, ctypes.c_uint32(0)) == 0
    finally:
        os.close(fd)


def apply_landlock(writable: list[str], executable: list[str], devices: list[str]) -> str:
    """Restrict this thread (and everything it starts) as the module docstring says."""
    abi = landlock_abi()
    if abi <= 0:
        raise OSError("Landlock is not available in this kernel")
    arch, libc = _arch(), _libc()
    nrs = _SYS[arch]
    writes = _write_rights(abi)
    handled = writes | FS_EXECUTE
    attr = ctypes.create_string_buffer(_ruleset_attr(abi, handled))
    ruleset = libc.syscall(ctypes.c_long(nrs["landlock_create_ruleset"]), attr,
                           ctypes.c_size_t(len(attr.raw)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path in writable:
            _add_path(libc, nrs["landlock_add_rule"], ruleset, path, writes)
        for path in devices:
            _add_path(libc, nrs["landlock_add_rule"], ruleset, path,
                      FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0))
        for path in executable:
            _add_path(libc, nrs["landlock_add_rule"], ruleset, path, FS_EXECUTE)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS) failed")
        if libc.syscall(ctypes.c_long(nrs["landlock_restrict_self"]), ctypes.c_int(ruleset),
                        ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return f"landlock(abi {abi})"


def _bpf(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


_LD_W_ABS, _JEQ_K, _JSET_K, _JGE_K, _RET_K = 0x20, 0x15, 0x45, 0x35, 0x06


def seccomp_program(arch: str, allow_spawn: bool) -> bytes:
    """A classic-BPF filter: kill on a foreign arch, deny the listed calls with EPERM,
    clone only for threads, clone3 -> ENOSYS, allow everything else."""
    denied = dict(_DENY[arch])
    if not allow_spawn:
        denied.update(_EXEC[arch])
    prog = [_bpf(_LD_W_ABS, 4),  # seccomp_data.arch
            _bpf(_JEQ_K, _AUDIT_ARCH[arch], jt=1),
            _bpf(_RET_K, _RET_KILL_PROCESS),
            _bpf(_LD_W_ABS, 0)]  # seccomp_data.nr
    if arch == "x86_64":  # the x32 ABI would bypass the numbers below
        prog += [_bpf(_JGE_K, _X32_BIT, jt=0, jf=1), _bpf(_RET_K, _RET_ERRNO | _EPERM)]
    for nr in sorted(set(denied.values())):
        prog += [_bpf(_JEQ_K, nr, jt=0, jf=1), _bpf(_RET_K, _RET_ERRNO | _EPERM)]
    prog += [_bpf(_JEQ_K, _CLONE3, jt=0, jf=1), _bpf(_RET_K, _RET_ERRNO | _ENOSYS)]
    if not allow_spawn:
        # clone(flags, ...): the low word of args[0] (offset 16) must carry CLONE_THREAD
        prog += [_bpf(_JEQ_K, _CLONE[arch], jt=0, jf=3),
                 _bpf(_LD_W_ABS, 16),
                 _bpf(_JSET_K, _CLONE_THREAD, jt=1, jf=0),
                 _bpf(_RET_K, _RET_ERRNO | _EPERM)]
    prog.append(_bpf(_RET_K, _RET_ALLOW))
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def apply_seccomp(allow_spawn: bool) -> str:
    arch = _arch()
    if sys.platform != "linux" or arch not in _DENY:
        raise OSError(f"no seccomp filter for {sys.platform}/{arch}")
    program = seccomp_program(arch, allow_spawn)
    buf = ctypes.create_string_buffer(program)
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(SECCOMP) failed")
    return "seccomp"


@dataclass(frozen=True)
class Plan:
    """What one worker may touch: its scratch dir, and for GPU jobs the device nodes and
    the toolchain that Triton/nvcc start (ptxas, the host compiler)."""

    scratch: str
    gpu: bool = False
    toolchain: tuple[str, ...] = ()

    @classmethod
    def from_job(cls, data: dict[str, object]) -> Plan:
        return cls(str(data["scratch"]), bool(data.get("gpu")),
                   tuple(str(p) for p in data.get("toolchain", ()) or ()))  # type: ignore

    def to_job(self) -> dict[str, object]:
        return {"scratch": self.scratch, "gpu": self.gpu, "toolchain": list(self.toolchain)}


def confine(plan: Plan) -> Confinement:
    """Apply every layer available here; a missing layer is recorded, never fatal."""
    result = Confinement(layers=["rlimits"])
    devices = [*DEVICE_NODES, *(GPU_DEVICE_NODES if plan.gpu else ())]
    layers = (("landlock", lambda: apply_landlock([plan.scratch], list(plan.toolchain)
                                                  if plan.gpu else [], devices)),
              ("seccomp", lambda: apply_seccomp(allow_spawn=plan.gpu)))
    for name, apply in layers:
        try:
            result.layers.append(apply())
        except (OSError, AttributeError) as exc:
            result.missing.append(f"{name}: {exc}")
    return result


# -- the audit hook ---------------------------------------------------------------------------

_SPAWN_EVENTS = ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                 "os.forkpty", "subprocess.Popen", "pty.spawn")
_NET_EVENTS = ("socket.connect", "socket.bind", "socket.__new__", "socket.sendto",
               "socket.getaddrinfo")
_NATIVE_EVENTS = ("ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function", "ctypes.cdata",
                  "ctypes.addressof", "ctypes.string_at", "ctypes.wstring_at")
_FS_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
              "os.symlink", "os.link", "shutil.rmtree", "os.truncate", "os.utime")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class AuditGuard:
    """Records (and refuses) escapes attempted from Python once `arm()` was called.

    Armed after the harness has loaded what it needs and before kernel code runs. Native
    calls (ctypes) are refused only while Python (Triton) kernel code runs on the CPU: the
    harness itself calls C kernels through ctypes, C code raises no audit events (it cannot
    reach the Python API: elfcheck refuses the symbols), and on a GPU Triton's own runtime
    loads the driver.
    """

    def __init__(self, scratch: str, allow_spawn: bool, refuse_native: bool) -> None:
        self.scratch = os.path.realpath(scratch)
        self.allow_spawn = allow_spawn
        self.refuse_native = refuse_native
        self.armed = False
        self.python_kernel = False  # set while Python (Triton) kernel code runs
        self.violations: list[str] = []

    def install(self) -> AuditGuard:
        sys.addaudithook(self._hook)
        return self

    def arm(self) -> None:
        self.armed = True

    def _refuse(self, what: str) -> None:
        if len(self.violations) < 20:
            self.violations.append(what)
        raise PermissionError(f"strata sandbox: {what}")

    def _writes_outside(self, args: tuple[object, ...]) -> str | None:
        path, mode, flags = [*args, None, None, 0][:3]
        if not isinstance(path, str | bytes | os.PathLike):
            return None
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
            (isinstance(flags, int) and flags & _WRITE_FLAGS)
        if not writing:
            return None
        real = os.path.realpath(os.fsdecode(path))  # type: ignore[arg-type]
        if real == self.scratch or real.startswith(self.scratch + os.sep) or \
                real in DEVICE_NODES:
            return None
        return real

    def _inside(self, path: object) -> bool:
        if not isinstance(path, str | bytes | os.PathLike):
            return False
        real = os.path.realpath(os.fsdecode(path))  # type: ignore[arg-type]
        return real == self.scratch or real.startswith(self.scratch + os.sep)

    def _hook(self, event: str, args: tuple[object, ...]) -> None:
        if not self.armed:
            return
        if event == "open":
            outside = self._writes_outside(args)
            if outside:
                self._refuse(f"write to {outside} (outside the scratch directory)")
        elif event in _FS_EVENTS and not (args and self._inside(args[0])):
            self._refuse(f"{event} {args[0] if args else ''} (outside the scratch directory)")
        elif event.startswith(_SPAWN_EVENTS) and not self.allow_spawn:
            self._refuse(f"{event}: starting a process")
        elif event.startswith(_NET_EVENTS):
            self._refuse(f"{event}: network access")
        elif event.startswith(_NATIVE_EVENTS) and self.refuse_native and self.python_kernel:
            self._refuse(f"{event}: native code from a Python kernel")


def scratch_env(scratch: Path) -> dict[str, str]:
    """Environment pointing every cache a library might write at the scratch directory."""
    s = str(scratch)
    return {"TMPDIR": s, "TEMP": s, "TMP": s, "HOME": s, "TRITON_CACHE_DIR": f"{s}/triton",
            "TRITON_HOME": s, "XDG_CACHE_HOME": f"{s}/cache",
            "TORCHINDUCTOR_CACHE_DIR": f"{s}/inductor", "PYTHONDONTWRITEBYTECODE": "1",
            "MPLCONFIGDIR": f"{s}/mpl"}
