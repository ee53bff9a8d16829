"""`strata kernels ...`: the command layer over the kernel lab's service
(strata/kernels/service.py: session, verify, add, remove, trust, list, bench), which the
library (`strata.kernels`) and the generator (`kernels/gen/`) call too. What is the
command's own: the risk it states before `kernels trust`. Printing lives in
views/kernels.py."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from strata.kernels.service import (
    AddOutcome,
    Removed,
    Session,
    TrustChange,
    abi_path,
    add_external,
    add_kernel,
    default_jobs,
    judge_added,
    list_records,
    read_external,
    register_external,
    remove_kernel,
    revoke_kernel_trust,
    run_bench,
    run_verify,
    select,
    session,
    trust_kernel,
    trust_targets,
)

TRUST_RISK = ("trusting {name}: its code will run inside your own processes (strata.kernels.get, "
              "-B lab, train) with your permissions, outside any sandbox; recorded in the "
              "results DB until --revoke or a change to its source")



def probed_session(db: Path | None, console: Console) -> Session:
    """The kernel session on the results DB (`db`, else the default), the host probed under
    a status line on `console`."""
    with console.status("probing host…"):
        return session(db)


__all__ = ["TRUST_RISK", "AddOutcome", "Removed", "Session", "TrustChange", "abi_path",
           "add_external", "add_kernel", "default_jobs", "judge_added", "list_records",
           "probed_session", "read_external", "register_external", "remove_kernel",
           "revoke_kernel_trust", "run_bench", "run_verify", "select", "session",
           "trust_kernel", "trust_targets"]
