"""GPU probers: recorded AMD KFD topology, and real failure paths on this GPU-less machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.hardware.gpu import ProbeUnavailable, probe_gpus
from strata.hardware.gpu.amd import gfx_from_target_version, probe_kfd


@pytest.mark.parametrize("value,gfx", [(120001, "gfx1201"), (120000, "gfx1200"),
                                       (110000, "gfx1100"), (90010, "gfx90a"),
                                       (90402, "gfx942"), (100300, "gfx1030")])
def test_gfx_names(value: int, gfx: str) -> None:
    assert gfx_from_target_version(value) == gfx


def _kfd_tree(root: Path) -> Path:
    """A recorded KFD topology: node 0 the CPU, node 1 an RX 9070 XT (gfx1201)."""
    nodes = root / "nodes"
    (nodes / "0").mkdir(parents=True)
    (nodes / "0" / "properties").write_text("cpu_cores_count 16\nsimd_count 0\n"
                                            "gfx_target_version 0\n")
    gpu = nodes / "1"
    (gpu / "mem_banks" / "0").mkdir(parents=True)
    (gpu / "properties").write_text("cpu_cores_count 0\nsimd_count 128\n"
                                    "gfx_target_version 120001\nvendor_id 4098\n")
    (gpu / "name").write_text("gfx1201\n")
    (gpu / "mem_banks" / "0" / "properties").write_text(
        "heap_type 1\nsize_in_bytes 17163091968\nwidth 256\nmem_clk_max 1258\n")
    return nodes


def test_kfd_topology_gives_physical_arch(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # The override changes what the runtime pretends; the probe must still see gfx1201.
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "11.0.0")
    gpus = probe_kfd(_kfd_tree(tmp_path))
    assert len(gpus) == 1
    g = gpus[0]
    assert (g.vendor, g.backend, g.arch, g.bus_width_bits) == ("amd", "rocm", "gfx1201", 256)
    assert g.memory_total_bytes == 17163091968


def test_kfd_absent_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(ProbeUnavailable, match="absent"):
        probe_kfd(tmp_path / "missing")


def test_probe_gpus_never_raises_and_explains() -> None:
    gpus, unknown = probe_gpus()
    try:
        import pynvml

        pynvml.nvmlInit()
        nvml_works = True
    except Exception:
        nvml_works = False
    if not nvml_works:
        # the real NVML failure on a machine without the NVIDIA driver is reported
        assert "NVML" in unknown["gpu.nvidia"] or "nvidia-ml-py" in unknown["gpu.nvidia"]
    assert all(g.arch or g.unknown for g in gpus)
