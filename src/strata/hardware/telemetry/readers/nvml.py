"""NVIDIA GPU reader through NVML (pynvml is imported only when the reader opens)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from strata.hardware.telemetry.readers.base import (
    Reader,
    SourceUnavailable,
    _Fields,
    register_reader,
)
from strata.hardware.telemetry.samples import Readings


def _nvml_reasons_getter(nv: Any, handle: Any) -> Callable[[], float]:
    """Clocks-event reasons (driver >= 535 name) or the older 'throttle reasons' call."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nv, name, None)
        if fn is None:
            continue
        try:
            fn(handle)
        except nv.NVMLError:
            continue  # symbol missing in this driver: try the older name
        return lambda fn=fn: float(fn(handle))
    return _unsupported("neither clocks-event nor throttle reasons are supported")


def _unsupported(why: str) -> Callable[[], float]:
    """A getter that fails on first use, so _Fields records `why` as the field's reason."""

    def get() -> float:
        raise RuntimeError(why)

    return get


def _nvml_getters(nv: Any, handle: Any, prefix: str) -> dict[str, Callable[[], float]]:
    return {
        f"{prefix}.sm_clock_mhz": lambda: float(nv.nvmlDeviceGetClockInfo(handle,
                                                                         nv.NVML_CLOCK_SM)),
        f"{prefix}.mem_clock_mhz": lambda: float(nv.nvmlDeviceGetClockInfo(handle,
                                                                          nv.NVML_CLOCK_MEM)),
        f"{prefix}.temp_c": lambda: float(nv.nvmlDeviceGetTemperature(handle,
                                                                     nv.NVML_TEMPERATURE_GPU)),
        f"{prefix}.power_w": lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000,  # mW
        f"{prefix}.util_pct": lambda: float(nv.nvmlDeviceGetUtilizationRates(handle).gpu),
        f"{prefix}.mem_util_pct": lambda: float(nv.nvmlDeviceGetUtilizationRates(handle).memory),
        f"{prefix}.mem_used_bytes": lambda: float(nv.nvmlDeviceGetMemoryInfo(handle).used),
        f"{prefix}.clocks_event_reasons": _nvml_reasons_getter(nv, handle),
        # mJ since the driver loaded (Volta+); the run's energy is the difference.
        f"{prefix}.energy_j": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000,
    }


@register_reader
class NvmlReader(Reader):
    """NVIDIA GPUs through NVML (package nvidia-ml-py, imported only when sampling)."""

    name = "nvml"

    def open(self) -> None:
        try:
            import pynvml as nv
        except ImportError as exc:
            raise SourceUnavailable(
                "pynvml not installed (pip install 'strata[nvidia]')"
            ) from exc
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise SourceUnavailable(f"NVML init failed: {exc} (no NVIDIA driver?)") from exc
        self._nv = nv
        count = nv.nvmlDeviceGetCount()
        if count == 0:
            self.close()
            raise SourceUnavailable("NVML reports no NVIDIA GPUs")
        getters: dict[str, Callable[[], float]] = {}
        for i in range(count):
            getters.update(_nvml_getters(nv, nv.nvmlDeviceGetHandleByIndex(i), f"gpu{i}"))
        self._fields = _Fields(getters, self.dropped)
        self.source = f"NVML driver {nv.nvmlSystemGetDriverVersion()}"

    def read(self) -> Readings:
        return self._fields.read()

    def close(self) -> None:
        nv = getattr(self, "_nv", None)
        if nv is not None:
            self._nv = None
            nv.nvmlShutdown()  # reference counted: other users of NVML are unaffected
