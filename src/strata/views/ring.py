"""How `strata ring serve`, `status` and `run` print: the serve line, flat records and rich
tables."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from strata.views.console import plain

GIB = 1024**3
# -o md: the tables' columns, by their record field names
STATUS_COLUMNS = ("id", "addr", "state", "device", "available_bytes", "mem_cap_bytes",
                  "bandwidth_gbps", "rtt_ms", "epoch", "leader", "reason", "fix")
RUN_COLUMNS = ("model_filename", "n_prompt", "n_gen", "world", "ttft_s", "prefill_s",
               "decode_tps", "e2e_s", "stages", "lost", "tokens")


def serve_line(node: Any) -> str:
    """What `strata ring serve` says once its node serves (a strata.ring.control.node.Node)."""
    member, config = node.member, node.config
    return (f"ring node {member.id} on {member.host}:{config.port} ({config.device}, "
            f"{config.ops} ops, {_gib(member.available_bytes)} available); mDNS "
            f"{'on' if node.mdns and not node.mdns.reason else 'off'}")


def _gib(n: Any) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def _size(n: Any) -> str:
    from strata.ring.plan.types import size

    return "" if n is None else size(n)


def _member_record(member: dict[str, Any], **extra: Any) -> dict[str, Any]:
    bw = member.get("bandwidth_Bps")
    return {"id": member.get("id"), "addr": f"{member.get('host')}:{member.get('port')}",
            "device": member.get("device"), "available_bytes": member.get("available_bytes"),
            "mem_cap_bytes": member.get("mem_cap_bytes"),
            "bandwidth_gbps": None if bw is None else round(bw / 1e9, 2),
            "strata_version": member.get("strata_version"), **extra}


def status_records(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per node: this daemon first, then each peer address it knows."""
    leader = reply.get("leader")
    me = reply["self"]
    rows = [_member_record(me, state="self", rtt_ms=None, epoch=reply.get("epoch"),
                           leader=me.get("id") == leader, reason=None, fix=None)]
    for peer in sorted(reply.get("peers", []), key=lambda p: (p["state"] != "live",
                                                              str(p.get("member") and
                                                                  p["member"]["id"]))):
        member = peer.get("member") or {"id": None}
        rec = _member_record(member, state=peer["state"],
                             rtt_ms=None if peer.get("rtt_ms") is None
                             else round(peer["rtt_ms"], 3),
                             epoch=None, leader=member.get("id") == leader,
                             reason=peer.get("reason"), fix=peer.get("fix"))
        rec["addr"] = peer["addr"]  # the address we reach it by
        rows.append(rec)
    return rows


def status_table(reply: dict[str, Any], records: list[dict[str, Any]]) -> Table:
    members = sum(r["state"] in ("self", "live") for r in records)
    table = Table(title=f"ring: {members} member(s), leader {reply.get('leader')}, epoch "
                  f"{reply.get('epoch')}; mDNS {reply.get('mdns')}", title_justify="left")
    for col, justify in (("id", "left"), ("address", "left"), ("state", "left"),
                         ("device", "left"), ("free", "right"), ("cap", "right"),
                         ("GB/s", "right"), ("RTT ms", "right"), ("note", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in records:
        def num(v: Any, f: str = "{:.1f}") -> str:
            return "" if v is None else f.format(v)
        note = "leader" if r["leader"] else ""
        if r["reason"]:
            note = f"{note}; {r['reason']}" if note else r["reason"]
        table.add_row(plain(r["id"] or "?"), plain(r["addr"]), r["state"],
                      plain(r["device"] or ""), _size(r["available_bytes"]),
                      _size(r["mem_cap_bytes"]),
                      num(r["bandwidth_gbps"]), num(r["rtt_ms"], "{:.2f}"), plain(note))
    return table


def stage_line(reply: dict[str, Any]) -> str | None:
    """What this member holds now and how it computes it."""
    st = reply.get("stage")
    if not st:
        return None
    torch = st["on_torch"]
    how = ("torch for every op" if torch == ["all"] else f"{st['ops']} kernels"
           + (f"; on torch for want of a verified kernel: {', '.join(torch)}" if torch
              else ", every op verified here"))
    kv = f", K/V cache {st['kv']}" if st.get("kv") else ""
    return f"holds layers [{st['first']}, {st['last']}) of {st['model']}{kv}: {how}"


def fix_lines(reply: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    """Below the table: why each absent peer is not a member and what to do, then the
    ring-wide causes."""
    lines = [f"{r['id'] or r['addr']} ({r['addr']}, {r['state']}): {r['fix']}"
             for r in records if r.get("fix")]
    return lines + list(reply.get("hints") or [])


def links_table(reply: dict[str, Any]) -> Table | None:
    """The links this daemon measured (the leader measures them for its plans)."""
    links = reply.get("links") or []
    if not links:
        return None
    table = Table(title="links measured for the plan", title_justify="left")
    for col in ("from", "to", "RTT ms", "MB/s"):
        table.add_column(col, justify="left" if col in ("from", "to") else "right")
    for x in links:
        table.add_row(plain(x["src"]), plain(x["dst"]), f"{1e3 * x['rtt_s']:.3f}",
                      f"{x['bandwidth_Bps'] / 1e6:,.0f}")
    return table


def run_record(reply: dict[str, Any]) -> dict[str, Any]:
    """`ring run` as one flat record (tokens as a space-separated string of ids)."""
    return {"model_filename": reply["model_filename"], "n_prompt": reply["n_prompt"],
            "n_gen": reply["n_gen"], "world": reply["world"], "ttft_s": reply["ttft_s"],
            "prefill_s": reply["prefill_s"],
            "decode_tps": reply["decode_tps"], "e2e_s": reply["e2e_s"],
            "stages": " ".join(f"{s['member']}[{s['first']},{s['last']})"
                               for s in reply["stages"]),
            "lost": " ".join(e["lost"] for e in reply["lost"]),
            "tokens": " ".join(str(t) for t in reply["tokens"]), "text": reply.get("text")}


def run_table(reply: dict[str, Any], out: Any, text_shown: bool = False) -> None:
    """The reply's text (unless it was streamed already), tokens and timings."""
    rec = run_record(reply)
    if reply.get("text") is not None and not text_shown:
        out.print(plain(reply["text"]))
    out.print(plain(f"tokens: {rec['tokens']}"))
    tps = "—" if rec["decode_tps"] is None else f"{rec['decode_tps']:.1f} t/s"
    out.print(plain(f"{reply['n_prompt']} prompt + {reply['n_gen']} generated tokens on "
                    f"{reply['world']} node(s) ({rec['stages']}): TTFT "
                    f"{1e3 * reply['ttft_s']:.1f} ms, decode {tps}, "
                    f"{reply['e2e_s']:.2f} s end to end"))
    line = reply.get("timeline")
    if line:
        compute = " + ".join(f"{ms:.2f}" for ms in line["compute_ms_per_token"].values())
        hop = line["machinery_ms_per_hop"]
        out.print(plain(f"per decoded token: {line['ms_per_token']:.2f} ms = stages' compute "
                        f"{compute} ms + machinery {line['machinery_ms_per_token']:.2f} ms"
                        + (f" ({hop:.2f} ms per hop, {line['hops']} hops)" if hop is not None
                           else "")))
    for e in reply["lost"]:
        out.print(plain(f"epoch {e['epoch']}: lost {e['lost']} after {e['at_token']} "
                        f"token(s) ({e['reason']}); re-planned and resumed"))
