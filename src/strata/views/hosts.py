"""Terminal view of the stored hosts."""

from __future__ import annotations

from rich.table import Table

from strata.store.hosts import HostRow
from strata.views.console import plain


def hosts_table(rows: list[HostRow]) -> Table:
    t = Table(title="Hosts")
    for col in ("fingerprint", "hostname", "hardware", "roofline", "first seen", "last seen"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(r.fingerprint, plain(r.hostname), plain(r.summary),
                  "measured" if r.measured else "-", r.first_seen, r.last_seen)
    return t
