"""Why a node is not in the ring, in one line with the fix ("why don't my nodes see each
other?"): each absent peer's state and reason, as the daemon's links recorded them, mapped
to what is wrong and what to do; and the ring-wide causes (no multicast, no peers at all).
The rules are a table, first match wins; a reason no rule knows is shown as it is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    states: tuple[str, ...]
    needle: str  # a fragment of the recorded reason ("" matches any)
    fix: str  # {addr} and {port} are filled in


RULES: list[Rule] = [
    Rule(("refused",), "wrong ring secret", "it holds another ring secret: give every member "
         "the same one (STRATA_RING_SECRET or --secret-file; the first `ring serve` printed "
         "it)"),
    Rule(("refused",), "no ring-secret proof", "it speaks an older protocol: install the same "
         "strata version on every member"),
    Rule(("refused", "unreachable"), "protocol", "another strata version: install the same "
         "one on every member"),
    Rule(("refused",), "cannot join a ring of strata", "another strata version: install the "
         "same one on every member"),
    Rule(("refused",), "is taken by", "two daemons share one id: give each its own --name"),
    Rule(("unreachable",), "connection refused", "nothing listens at {addr}: start `strata "
         "ring serve` there, or check its --port and --host (by default it listens on its "
         "advertised address and 127.0.0.1 only)"),
    Rule(("unreachable",), "no answer", "{addr} does not answer: the host is down or a "
         "firewall drops TCP port {port}; open it, or check the address"),
    Rule(("unreachable",), "resolve", "the name in {addr} does not resolve: give an IP "
         "address in --peers"),
    Rule(("unreachable",), "unreachable", "no route to {addr}: check the address and that "
         "both machines are on one network"),
    Rule(("lost",), "", "it was a member and stopped answering (crashed, suspended, or the "
         "network went down); it rejoins by itself once it answers again"),
    Rule(("left",), "", "it said bye (stopped with Ctrl-C or SIGTERM); start it again to "
         "rejoin"),
]


def explain(state: str, reason: str | None, addr: str) -> str | None:
    """The fix for one peer that is not a member; None for a live one."""
    if state in ("live", "self", "connecting"):
        return None
    text = (reason or "").lower()
    port = addr.rpartition(":")[2]
    for rule in RULES:
        if state in rule.states and rule.needle in text:
            return rule.fix.format(addr=addr, port=port)
    return reason


def ring_hints(reply: dict[str, Any]) -> list[str]:
    """Causes that concern the whole ring rather than one peer."""
    peers = reply.get("peers") or []
    mdns = str(reply.get("mdns") or "")
    hints = []
    if not peers and mdns == "on":
        hints.append("no peer found: mDNS is on but nothing answered; multicast may not "
                     "cross this network (separate VLANs, Wi-Fi client isolation, a VPN): "
                     "start the others with --peers HOST:PORT of one member")
    elif not peers:
        hints.append(f"no peer found and mDNS is {mdns or 'off'}: give --peers HOST:PORT of "
                     "one member")
    return hints
