"""The host CPU: always there, synchronous, timed by the wall clock; its support verdict is
the smoke test's (support.cpu_verdict), since there is no arch list to check."""

from __future__ import annotations

from strata.hardware.vendors import register
from strata.hardware.vendors.base import Runtime, Vendor

CPU = Runtime("cpu", indexed=False)

VENDOR = register(Vendor(backend="cpu", vendor="cpu", runtime=CPU, accelerator=False))
