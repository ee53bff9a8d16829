"""`strata kernels …`: the kernel lab's sub-commands."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from strata.cli import DbOption, app, check_positive, err, open_store, out
from strata.cli.helptext import reflowed
from strata.cli.output import CHOICES, with_json
from strata.cli.status import OUTPUT_PANEL, ProgressOption, status, use_progress
from strata.errors import InputError
from strata.kernels.dialects import DIALECTS
from strata.kernels.spec import all_specs
from strata.views.output import emit

# Help lists come from the registries (ops, dialects): they cannot go stale. Both load
# without torch (specs and dialects import it lazily).
OPS = ", ".join(all_specs())
DIALECT_NAMES = ", ".join(DIALECTS)

kernels_app = typer.Typer(
    name="kernels", no_args_is_help=True, rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Kernel lab: verify, benchmark and dispatch kernels per hardware dialect "
    f"({DIALECT_NAMES}) against the torch baselines.")
app.add_typer(kernels_app)

OpArg = Annotated[str | None, typer.Argument(
    metavar="OP", help=f"{OPS} (default: all).", show_default=False)]
ImplOption = Annotated[str | None, typer.Option(
    "--impl", help="One implementation of OP: a dialect name or dialect.variant (dialects: "
    f"{DIALECT_NAMES}; `strata kernels list OP` shows them).", show_default=False)]
FormatOption = Annotated[str, typer.Option(
    "--format", "-o", metavar="FORMAT", show_default=False, rich_help_panel=OUTPUT_PANEL,
    help="Output: table (default), md, csv, json or jsonl.")]
JsonOption = Annotated[bool, typer.Option("--json", rich_help_panel=OUTPUT_PANEL,
                                          help="Same as -o json.")]
TimeoutOption = Annotated[float, typer.Option(
    "--timeout", metavar="SECONDS", help="Sandbox seconds per implementation: the sandbox "
    "kills it after that.")]


def _check_format(fmt: str, json_out: bool = False) -> str:
    """The format asked for (--json is -o json): one of the CLI's formats (table, md, csv,
    json, jsonl; sql is bench's and history's alone), else exit 2."""
    fmt = with_json(fmt, json_out)
    if fmt not in CHOICES:
        raise InputError(f"--format {fmt}: choose one of {', '.join(CHOICES)}")
    return fmt


def _kernel_session(db: Path | None):  # -> commands.kernels.Session
    from strata.commands.kernels import probed_session

    return probed_session(db, err)


@kernels_app.command("list")
@reflowed
def kernels_list(op: OpArg = None, fmt: FormatOption = "table", json_out: JsonOption = False,
                 db: DbOption = None) -> None:
    """Ops x dialects x implementations: available here, verification status, best speedup.

    Built-in kernels ship with strata; external ones come from `strata kernels add` (origin
    external) and go with `strata kernels remove`. Verdicts and speedups are this host's.

    [bold]Examples[/bold]
      strata kernels list
      strata kernels list rmsnorm -o json
    """
    from strata.commands.kernels import list_records
    from strata.views.kernels import LIST_COLUMNS, list_table

    fmt = _check_format(fmt, json_out)
    records = list_records(_kernel_session(db), op)
    emit(out, fmt, records, table=lambda: out.print(list_table(records)),
         md_columns=LIST_COLUMNS, md_numeric=())


@kernels_app.command("verify")
@reflowed
def kernels_verify(
    op: OpArg = None,
    impl: ImplOption = None,
    force: Annotated[bool, typer.Option("--force", help="Verify again even when this host "
                                        "has a verdict for this exact source.")] = False,
    timeout: TimeoutOption = 300.0,
    fmt: FormatOption = "table",
    json_out: JsonOption = False,
    progress: ProgressOption = None,
    db: DbOption = None,
) -> None:
    """Prove implementations correct, each in a sandboxed subprocess.

    Compiled kernels are first checked for what they link to (libm, memory and OpenMP only;
    no constructors); each worker then confines itself (Landlock: writes only in a private
    scratch dir; seccomp: no processes, exec or sockets) before it loads the kernel — the
    table's caption names the level. Several shapes (ragged ones included), seeds and input
    distributions; every case is called three times on canary-guarded buffers with the
    output pre-filled with NaN, zeros, random values or another input's answer, on one, the
    default and an oversubscribed number of threads, and every call must be right; inputs
    unchanged; outputs must depend on the inputs and not be constant; NaN/Inf parity;
    tolerance |out - ref| <= atol*max(1, rms(ref)) + rtol*|ref|. Verdicts are cached per
    host and source hash. Triton runs under its interpreter without a GPU; CUDA sources are
    compile-checked when nvcc is present but no GPU is. Exit code 1 if any fails.

    [bold]Examples[/bold]
      strata kernels verify
      strata kernels verify rmsnorm --impl c.avx2 --force
    """
    from strata.commands.kernels import run_verify, select
    from strata.views.kernels import VERIFY_COLUMNS, render_failures, verdict_table

    use_progress(progress)
    fmt = _check_format(fmt, json_out)
    check_positive("--timeout", timeout)
    s = _kernel_session(db)
    impls = select(op, impl, s.conn)
    with status(err, "verifying…") as line:
        verdicts = run_verify(s, impls, force=force, timeout_s=timeout,
                              progress=lambda m: line.update(escape(m)))

    def table() -> None:
        out.print(verdict_table(verdicts))
        render_failures(err, verdicts)

    emit(out, fmt, [v.to_dict() for v in verdicts], table=table, md_columns=VERIFY_COLUMNS,
         md_numeric=())
    if any(v.status == "fail" for v in verdicts):
        raise typer.Exit(1)


@kernels_app.command("bench")
@reflowed
def kernels_bench(
    op: OpArg = None,
    impl: ImplOption = None,
    shapes: Annotated[str, typer.Option("--shapes", help="Shape set: llm (the presets' real "
                                        "shapes), figure (the README figures), verify (tiny), "
                                        "gpu (matmul 4096³).")] = "llm",
    compile_: Annotated[bool, typer.Option("--compile/--no-compile", help="Also time "
                                           "torch.compile (compiles per shape: slow on CPU).")]
    = True,
    max_time: Annotated[float, typer.Option("--max-time", metavar="SECONDS", help="Seconds "
                                            "of timed calls per contender and shape.")]
    = 0.5,
    cache: Annotated[str, typer.Option("--cache", help="cold: flush the caches before every "
                                       "call (default); warm: calls back to back, as in a "
                                       "decode loop.")] = "cold",
    dtype: Annotated[str, typer.Option("--dtype", help="float32 (default), bfloat16 or "
                                       "float16; implementations that do not declare it "
                                       "are skipped (the c dialect is float32).")]
    = "float32",
    fmt: FormatOption = "table",
    json_out: JsonOption = False,
    progress: ProgressOption = None,
    db: DbOption = None,
) -> None:
    """Time verified implementations against torch eager and torch.compile, side by side.

    Baselines time in their own trusted process, kernels in a confined one, on the same
    stream of inputs: every call gets inputs it has never seen and a poisoned output, and
    the timed calls' outputs are checked afterwards. The cache is flushed before each call
    with a buffer ≥ 2x the probed last-level cache (GPU: 2x L2); warm-up by time; median
    and IQR; GB/s and GFLOP/s as a share of this host's measured roofline (measured first if
    missing; re-measured when a result beats it by > 5%). A time beyond the roofline is
    disqualified; speedups > 10x are re-timed in new processes on new inputs; a noisy
    eager baseline is re-measured and, if still noisy, its shape does not count. Rows are
    stored for dispatch.

    [bold]Examples[/bold]
      strata kernels bench rmsnorm
      strata kernels bench matmul --shapes figure --no-compile -o md
    """
    from strata.commands.kernels import run_bench, select
    from strata.kernels.spec import get_spec
    from strata.views.kernels import BENCH_COLUMNS, bench_table, figure_record

    use_progress(progress)
    fmt = _check_format(fmt, json_out)
    check_positive("--max-time", max_time)
    if cache not in ("cold", "warm"):
        raise InputError(f"--cache {cache}: choose cold or warm")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise InputError(f"--dtype {dtype}: choose float32, bfloat16 or float16")
    s = _kernel_session(db)
    impls = select(op, impl, s.conn)
    ops = list(dict.fromkeys(i.op for i in impls))
    for name in ops:  # a bad --shapes fails before minutes of roofline measurement
        get_spec(name).shape_set(shapes)
    roof = s.host.roofline(err)
    figures = []
    for n, name in enumerate(ops, 1):  # each op's table as soon as it is measured
        with status(err, f"[{n}/{len(ops)}] {name}…") as line:
            done = run_bench(s, [i for i in impls if i.op == name], roof, shapes=shapes,
                             compile_=compile_, max_time_s=max_time, cache=cache,
                             dtype=dtype,
                             progress=lambda m, n=n: line.update(
                                 f"[{n}/{len(ops)}] {escape(m)}"))
        figures += done
        if fmt == "table" and done:
            out.print(bench_table(done, f"{name} ({dtype}, {cache} cache)"))
    # the table went out op by op, above
    emit(out, fmt, [figure_record(f) for f in figures], md_columns=BENCH_COLUMNS, md_numeric=())


@kernels_app.command("explain")
@reflowed
def kernels_explain(
    op: Annotated[str, typer.Argument(metavar="OP", help="The op to dispatch.")],
    device: Annotated[str, typer.Option("--device", help="cpu, cuda:0, rocm:0, …")] = "cpu",
    shape: Annotated[str | None, typer.Option(
        "--shape", metavar="DIMS", show_default=False,
        help="For calls at this shape, e.g. \"N=1 H=56 W=56 C=64 O=64 K=3 G=1 S=1 P=1\": "
        "the ops dispatched per shape (convolutions) then rank by the benchmark at it, and "
        "an external kernel serves only where it was proven.")] = None,
    fmt: FormatOption = "table",
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Which implementation dispatch picks for OP here, and why each other one was not.

    The decision trace: every implementation of OP with the reason it was taken or passed
    over (not verified here, needs a device or ISA this host lacks, slower than torch).

    [bold]Examples[/bold]
      strata kernels explain rmsnorm
      strata kernels explain matmul --device cuda:0 -o json
      strata kernels explain conv2d --shape N=1,H=7,W=7,C=8,O=8,K=3,G=1,S=1,P=1
    """
    from strata.kernels import choose
    from strata.views.kernels import render_decision

    fmt = _check_format(fmt, json_out)
    s = _kernel_session(db)
    if s.caps.device(device) is None:
        raise InputError(f"--device {device}: not on this host (it has "
                         f"{', '.join(d.key for d in s.caps.devices)})")
    if shape is None:
        decision = choose(s.host, [op], device)[op].decision
    else:
        from strata.kernels.dispatch import resolve
        from strata.kernels.spec import get_spec, parse_shape

        decision = resolve(op, device, s.host, parse_shape(get_spec(op), shape))
    # json: the whole decision; the other formats its trace, one row each
    document = decision.to_dict()
    trace = document["trace"]
    emit(out, fmt, trace, document=document, table=lambda: render_decision(out, decision),
         md_columns=tuple(trace[0]) if trace else (), md_numeric=())


@kernels_app.command("add")
@reflowed
def kernels_add(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="One kernel source with a "
                                         "'strata-kernel: op=… dialect=… entry=…' line.")],
    bench: Annotated[bool, typer.Option("--bench/--no-bench", help="Benchmark it after it "
                                        "verifies.")] = True,
    timeout: TimeoutOption = 300.0,
    progress: ProgressOption = None,
    db: DbOption = None,
) -> None:
    """Register an external kernel (hand-written or model-written): static check, sandboxed
    verification, benchmark; dispatch uses it when it wins.

    The file declares itself, e.g. a first line
    [bold]// strata-kernel: op=rmsnorm dialect=c entry=strata_rmsnorm requires=avx2,fma[/bold].
    It must not call the vendor op, patch the timer or harness, start threads, streams or
    processes, or touch files or the network. Exit code 1 if it is rejected. The kernel ABI
    (each op's inputs, outputs and parameters; each dialect's calling convention) ships with
    strata: `strata kernels abi` prints it. `strata kernels remove NAME` undoes an add.

    [bold]Examples[/bold]
      strata kernels add my_rmsnorm.c
      strata kernels add softmax_kernel.py --no-bench
    """
    from strata.commands.kernels import abi_path, add_kernel, judge_added, read_external
    from strata.views.kernels import bench_table, render_decision, render_failures, verdict_table

    use_progress(progress)
    check_positive("--timeout", timeout)
    read_external(file)  # a file without a valid declaration fails before the host probe
    s = _kernel_session(db)
    with status(err, f"verifying {escape(str(file))}…") as line:
        outcome = add_kernel(s, file, timeout_s=timeout,
                             progress=lambda m: line.update(escape(m)))
    out.print(verdict_table([outcome.verdict]))
    render_failures(err, [outcome.verdict])
    if not outcome.registered:
        err.print(f"not registered; the kernel ABI: {abi_path()}", markup=False,
                  highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    if outcome.compiled_only:
        err.print(f"{outcome.impl.key}: registered; it compiles but runs only where its device "
                  "is (verify there)", markup=False)
        return
    roof = s.host.roofline(err) if bench else None
    with status(err, "benchmarking…") as line:
        judge_added(s, outcome, roof, progress=lambda m: line.update(escape(m)))
    if outcome.figures:
        out.print(bench_table(outcome.figures,
                              f"{outcome.impl.op}: {outcome.impl.name} vs torch eager"))
    for decision in outcome.decisions:
        render_decision(out, decision)



@kernels_app.command("remove")
@reflowed
def kernels_remove(
    name: Annotated[str, typer.Argument(metavar="NAME", help="An added kernel, as `strata "
                                        "kernels list` names it (c.ext.my_rmsnorm), or "
                                        "OP/NAME.")],
    db: DbOption = None,
) -> None:
    """Undo `strata kernels add`: forget the kernel, its verdicts and benchmark rows, and
    delete the private copy of its source (your own file is left alone).

    Dispatch no longer sees it. Built-in kernels cannot be removed (exit code 2, as for a
    name that was never added).

    [bold]Examples[/bold]
      strata kernels remove c.ext.my_rmsnorm
      strata kernels remove rmsnorm/c.ext.my_rmsnorm
    """
    from strata.commands.kernels import remove_kernel

    for r in remove_kernel(open_store(db), name):
        copies = f"; deleted {', '.join(r.files)}" if r.files else ""
        out.print(f"removed {r.key} (added from {r.origin_path}): {r.results} result row(s)"
                  f"{copies}", markup=False, highlight=False, soft_wrap=True)


@kernels_app.command("trust")
@reflowed
def kernels_trust(
    name: Annotated[str, typer.Argument(metavar="NAME", help="An added kernel, as `strata "
                                        "kernels list` names it (c.ext.my_rmsnorm), or "
                                        "OP/NAME.")],
    revoke: Annotated[bool, typer.Option("--revoke", help="Undo it: the kernel runs "
                                         "confined again.")] = False,
    note: Annotated[str, typer.Option("--note", help="Why you trust it (stored with the "
                                      "trust).")] = "",
    db: DbOption = None,
) -> None:
    """Let an added kernel run inside your own processes (strata.kernels.get, -B lab, train)
    instead of a confined worker.

    Until trusted, an external kernel serves from its own confined process over shared
    memory. Trust is for the exact source bytes registered now: a changed source is
    untrusted again; `strata kernels remove` drops it too. Built-in kernels ship with
    strata and always run in-process (exit code 2, as for a name that was never added).

    [bold]Examples[/bold]
      strata kernels trust c.ext.my_rmsnorm
      strata kernels trust rmsnorm/c.ext.my_rmsnorm --revoke
    """
    from strata.commands.kernels import TRUST_RISK, revoke_kernel_trust, trust_kernel, trust_targets

    conn = open_store(db)
    if revoke:
        for c in revoke_kernel_trust(conn, name):
            text = f"revoked trust in {c.key}: it runs confined again" if c.changed else \
                f"{c.key} was not trusted: it runs confined"
            out.print(text, markup=False, highlight=False, soft_wrap=True)
        return
    trust_targets(conn, name)  # an unknown or built-in NAME fails before the risk is stated
    err.print(TRUST_RISK.format(name=name), markup=False, highlight=False, soft_wrap=True)
    for c in trust_kernel(conn, name, note):
        out.print(f"trusted {c.key} in-process (source {c.source_hash}, {c.trusted_at})",
                  markup=False, highlight=False, soft_wrap=True)


@kernels_app.command("abi")
@reflowed
def kernels_abi(
    path: Annotated[bool, typer.Option("--path", help="Print the installed "
                                       "document's path, not its text.")] = False,
) -> None:
    """The kernel ABI: what a kernel source must declare, receive and do (Markdown).

    Each op's inputs, output and parameters, each dialect's calling convention and what a
    compiled kernel may link to: the contract `strata kernels add` checks a file against.

    [bold]Examples[/bold]
      strata kernels abi | less
      strata kernels abi --path
    """
    from strata.commands.kernels import abi_path

    where = abi_path()
    sys.stdout.write(f"{where}\n" if path else where.read_text("utf-8"))
