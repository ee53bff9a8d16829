"""CPU probe: parsers fed with recorded data of other machines, and the real probe here."""

from __future__ import annotations

from pathlib import Path

from strata.hardware.cpu import isa_from_flags, parse_cpulist, parse_size, probe_cpu, probe_linux

# Recorded /proc/cpuinfo heads (two logical CPUs each) of machines that are not here.
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs \
paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40
CPU revision\t: 1

processor\t: 1
Features\t: fp asimd
CPU implementer\t: 0x41
"""

SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
cpu MHz\t\t: 2000.000
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16 \
avx_vnni amx_bf16 amx_tile amx_int8

processor\t: 1
vendor_id\t: GenuineIntel
physical id\t: 0
core id\t\t: 0
"""


def _fake_proc(tmp_path: Path, text: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(text)
    return proc


def test_arm_features_and_vendor(tmp_path: Path) -> None:
    cpu = probe_linux(_fake_proc(tmp_path, GRAVITON3), tmp_path / "nosys", tmp_path / "nonode")
    assert cpu.vendor == "ARM"
    assert cpu.isa == ["bf16", "dotprod", "fp16", "i8mm", "neon", "sve"]
    assert "sve2" not in cpu.isa and "sme" not in cpu.isa
    assert cpu.logical_threads == 2
    # sysfs was absent: the probe says so instead of guessing
    assert "caches" in cpu.unknown and "numa_nodes" in cpu.unknown


def test_x86_server_features_and_cores(tmp_path: Path) -> None:
    cpu = probe_linux(_fake_proc(tmp_path, SAPPHIRE_RAPIDS), tmp_path / "x", tmp_path / "y")
    assert {"avx512_bf16", "avx512_fp16", "amx_int8", "avx_vnni", "avx512_vnni"} <= set(cpu.isa)
    assert (cpu.family, cpu.model_id, cpu.freq_mhz_nominal) == (6, 143, 2000.0)
    assert cpu.logical_threads == 2 and cpu.physical_cores == 1  # one core, two hyperthreads


def test_sysfs_caches_count_instances(tmp_path: Path) -> None:
    root = tmp_path / "cpu"
    (root / "cpu0" / "cache").mkdir(parents=True)
    (root / "online").write_text("0-7\n")
    for i, (level, kind, size, shared) in enumerate(
            [(1, "Data", "48K", "0"), (2, "Unified", "2048K", "0"), (3, "Unified", "105M", "0-7")]):
        d = root / "cpu0" / "cache" / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size),
                            ("shared_cpu_list", shared)):
            (d / name).write_text(f"{value}\n")
    cpu = probe_linux(_fake_proc(tmp_path, SAPPHIRE_RAPIDS), root, tmp_path / "n")
    assert cpu.cache_bytes(2) == 8 * 2048 * 1024  # per-core L2 x 8 cores
    assert cpu.last_level_cache_bytes() == 105 << 20  # one shared L3


def test_small_parsers() -> None:
    assert parse_cpulist("0-3,8") == [0, 1, 2, 3, 8]
    assert parse_size("1024K") == 1 << 20 and parse_size("32M") == 32 << 20
    assert isa_from_flags({"avx2", "fma", "sse2"}) == ["avx2", "fma"]


def test_real_probe_of_this_machine() -> None:
    import os

    cpu = probe_cpu()
    assert cpu.logical_threads == os.cpu_count()
    assert cpu.ram_total_bytes and cpu.ram_available_bytes
    assert 0 < cpu.ram_available_bytes <= cpu.ram_total_bytes
    if Path("/sys/devices/system/cpu/cpu0/cache").exists():
        assert cpu.last_level_cache_bytes()
