"""How daemons find each other: mDNS/DNS-SD (`_strata-ring._tcp`) and static `--peers`.

Discovery only proposes addresses. Whether a node is a member is decided by the control
connection (strata.ring.control.wire): the hello handshake checks its strata version and its
pings keep it alive. An mDNS record says nothing about liveness — a crashed node's record
lingers until its TTL runs out (120 s for the address, 4500 s for the rest) — so a record
that disappears or stays is never used to add or drop a member, only to try a connection.

python-zeroconf is imported lazily and is optional at run time: a network without
multicast (or a host without the package) still forms a ring from `--peers`.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SERVICE_TYPE = "_strata-ring._tcp.local."

Found = Callable[[str, int, dict[str, str]], None]  # host, control port, advertised properties


@dataclass
class Advert:
    """What a node says about itself in its TXT record (all strings, as DNS-SD wants)."""

    id: str
    device: str
    free_bytes: int
    bandwidth_Bps: float | None
    version: str
    epoch: int

    def properties(self) -> dict[str, str]:
        return {"id": self.id, "device": self.device, "free": str(self.free_bytes),
                "bw": "" if self.bandwidth_Bps is None else f"{self.bandwidth_Bps:.0f}",
                "ver": self.version, "epoch": str(self.epoch)}


def _instance(node_id: str) -> str:
    # DNS labels are at most 63 bytes; the id is also in the TXT record, whole.
    label = "".join(c if c.isalnum() or c in "-_" else "-" for c in node_id)[:63] or "node"
    return f"{label}.{SERVICE_TYPE}"


def _decode(props: dict[Any, Any]) -> dict[str, str]:
    return {(k.decode() if isinstance(k, bytes) else str(k)):
            (v.decode() if isinstance(v, bytes) else "" if v is None else str(v))
            for k, v in props.items()}


@dataclass
class Zeroconf:
    """Advertise this node and call `found` for every other node's record (own one skipped).

    `interface` is the address to advertise and listen on ("127.0.0.1" keeps a test ring
    on loopback); "" means every interface, advertising the host's primary address."""

    advert: Advert
    port: int
    found: Found
    interface: str = ""
    reason: str | None = None  # why mDNS is off, when it is
    _zc: Any = field(default=None, repr=False)
    _info: Any = field(default=None, repr=False)
    _make_info: Any = field(default=None, repr=False)  # Advert -> ServiceInfo

    def start(self) -> bool:
        """True when advertising and browsing; False (with `reason`) when mDNS is unusable
        here — the ring then relies on --peers."""
        try:
            from zeroconf import IPVersion, ServiceBrowser, ServiceInfo
            from zeroconf import Zeroconf as _Zc
        except ImportError:
            self.reason = "python-zeroconf is not installed (pip install zeroconf)"
            return False
        addr = self.interface or _primary_address()
        try:
            ifaces = [self.interface] if self.interface else None
            self._zc = _Zc(interfaces=ifaces, ip_version=IPVersion.V4Only) if ifaces \
                else _Zc(ip_version=IPVersion.V4Only)
            self._make_info = lambda adv: ServiceInfo(
                SERVICE_TYPE, _instance(adv.id), addresses=[socket.inet_aton(addr)],
                port=self.port, properties=adv.properties())
            self._info = self._make_info(self.advert)
            self._zc.register_service(self._info, allow_name_change=True)
            ServiceBrowser(self._zc, SERVICE_TYPE, handlers=[self._on_change])
        except Exception as exc:  # no multicast route, socket refused, ...: say it, go on
            self.reason = f"mDNS unavailable ({type(exc).__name__}: {exc})"
            self.close()
            return False
        return True

    def _on_change(self, zeroconf: Any, service_type: str, name: str,
                   state_change: Any) -> None:
        # Removal is ignored on purpose: liveness is the control connection's business.
        if state_change.name not in ("Added", "Updated"):
            return
        info = zeroconf.get_service_info(service_type, name, timeout=2000)
        if info is None or not info.port:
            return
        props = _decode(info.properties or {})
        if props.get("id") == self.advert.id:
            return
        for host in info.parsed_addresses():
            self.found(host, int(info.port), props)
            break

    def update(self, advert: Advert) -> None:
        """Re-advertise after a change (epoch, free memory)."""
        self.advert = advert
        if self._zc is None or self._info is None:
            return
        with contextlib.suppress(Exception):  # a stale TXT record is harmless
            info = self._make_info(advert)
            self._zc.update_service(info)
            self._info = info

    def close(self) -> None:
        if self._zc is not None:
            with contextlib.suppress(Exception):
                if self._info is not None:
                    self._zc.unregister_service(self._info)
                self._zc.close()
        self._zc = self._info = None


def _primary_address() -> str:
    """The address other hosts reach this one by: the source address of a route out (no
    packet is sent by a UDP connect)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"
