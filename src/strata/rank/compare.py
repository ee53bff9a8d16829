"""`strata compare rank:A rank:B`: the latest ranking of two hosts, score against score.

The score is the same formula on every host (score.py), so one model's score here and there
compare directly: ratio = score on B / score on A, per profile, model and backend.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from strata.errors import InputError

PREFIX = "rank:"
FIELDS = ("profile", "model_filename", "backend", "score_a", "score_b", "ratio",
          "verdict_a", "verdict_b", "basis_a", "basis_b")


def is_rank(side: str) -> bool:
    return side.startswith(PREFIX)


def latest_ranking(conn: sqlite3.Connection, side: str) -> tuple[str, list[dict[str, Any]]]:
    """(fingerprint, records) of the newest `strata rank` of the host `rank:FP` names."""
    from strata.store.hosts import latest_measurement

    prefix = side[len(PREFIX):]
    hosts = [fp for (fp,) in conn.execute(
        "SELECT DISTINCT fingerprint FROM measurements WHERE kind = 'rank' AND fingerprint "
        "LIKE ?", (prefix + "%",))]
    if len(hosts) != 1:
        why = "no host with a ranking" if not hosts else f"{len(hosts)} hosts"
        raise InputError(f"{side}: {why} matches '{prefix}' (strata hosts lists them; run "
                         "strata rank on each host)")
    stored = latest_measurement(conn, hosts[0], "rank") or {}
    return hosts[0], stored.get("records", [])


def compare_rankings(conn: sqlite3.Connection, side_a: str,
                     side_b: str) -> list[dict[str, Any]]:
    """Every (profile, model, backend) both rankings scored, with B's score over A's."""
    if not (is_rank(side_a) and is_rank(side_b)):
        raise InputError(f"{side_a} vs {side_b}: a ranking compares with a ranking (give "
                         "rank:HOST on both sides)")
    _, a = latest_ranking(conn, side_a)
    _, b = latest_ranking(conn, side_b)
    key = ("profile", "model_filename", "backend")
    theirs = {tuple(r[k] for k in key): r for r in b if r.get("score")}
    out = []
    for r in a:
        other = theirs.get(tuple(r[k] for k in key))
        if other is None or not r.get("score"):
            continue
        out.append({**{k: r[k] for k in key}, "score_a": r["score"], "score_b": other["score"],
                    "ratio": other["score"] / r["score"], "verdict_a": r.get("verdict"),
                    "verdict_b": other.get("verdict"), "basis_a": r.get("basis"),
                    "basis_b": other.get("basis")})
    return out
