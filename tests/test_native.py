"""Run-time C compilation: content-keyed cache and clear compile errors."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from strata.native import CompileError, build_shared


def test_build_caches_by_content(tmp_path: Path, strata_home: Path) -> None:
    src = tmp_path / "add.c"
    src.write_text("int add(int a, int b) { return a + b; }\n")
    lib = build_shared(src, ("-O2", "-shared", "-fPIC"))
    assert ctypes.CDLL(str(lib)).add(2, 3) == 5
    mtime = lib.stat().st_mtime_ns
    assert build_shared(src, ("-O2", "-shared", "-fPIC")) == lib  # cache hit, no rebuild
    assert lib.stat().st_mtime_ns == mtime
    src.write_text("int add(int a, int b) { return a + b + 1; }\n")
    lib2 = build_shared(src, ("-O2", "-shared", "-fPIC"))
    assert lib2 != lib and ctypes.CDLL(str(lib2)).add(2, 3) == 6
    assert str(lib).startswith(str(strata_home))


def test_compile_error_carries_compiler_output(tmp_path: Path, strata_home: Path) -> None:
    src = tmp_path / "bad.c"
    src.write_text("int broken( { return; }\n")
    with pytest.raises(CompileError, match=r"bad\.c"):
        build_shared(src, ("-shared", "-fPIC"))
    assert not list((strata_home / "cache" / "native").glob("bad-*"))  # nothing half-written
