"""The `strata` command: one thin command per user question (docs/architecture.md §1, §10).

Logic lives in the packages; this file parses flags, calls them, prints, and maps errors
to exit codes: 0 success, 1 failure of the thing measured, 2 usage or input error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.text import Text
from typer.exceptions import Abort, TyperException

from strata import __version__
from strata.backends import names
from strata.commands.bench_options import backend_help
from strata.errors import InputError, StrataError
from strata.views.console import make_console

app = typer.Typer(
    name="strata",
    help="What will run on this machine, how fast, and why: measured, not guessed.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)
# Piped, both print every table whole at its natural width (views/console.py).
out = make_console()
err = make_console(stderr=True)

DbOption = Annotated[
    Path | None,
    typer.Option("--db", help="Results database file (default: $STRATA_HOME/strata.db or the "
                 "user data dir).", show_default=False),
]


def _version(value: bool) -> None:
    if value:
        out.print(f"strata {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version,
                                                is_eager=True, help="Print the version.")]
          = False) -> None:
    """strata profiles local-AI hardware: probe, measure, bench, explain."""


def _open_store(db: Path | None):  # -> sqlite3.Connection
    from strata.paths import default_db_path
    from strata.store import open_db

    return open_db(db or default_db_path())


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise InputError(f"{name} must be > 0 (got {value})")


@app.command()
def probe(
    measure: Annotated[bool, typer.Option("--measure", help="Also measure memory bandwidth and "
                                          "matmul FLOP/s per dtype: this host's roofline "
                                          "(about 10-30 s on a small CPU).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the profile (and roofline) as "
                                           "JSON on stdout instead of tables.")] = False,
    watch: Annotated[float | None, typer.Option("--watch", metavar="SECONDS",
                                                help="Sample telemetry (clocks, temperatures, "
                                                "power, throttling) live for SECONDS, then "
                                                "summarise.")] = None,
    interval_ms: Annotated[int, typer.Option("--interval", metavar="MS",
                                             help="Telemetry sampling interval for --watch.")]
    = 250,
    smoke: Annotated[bool, typer.Option("--smoke/--no-smoke", help="Run the per-device smoke "
                                        "test (tiny ops in each dtype, in a subprocess).")]
    = True,
    smoke_timeout: Annotated[float, typer.Option("--smoke-timeout", metavar="SECONDS",
                                                 help="Kill a smoke test that runs longer.")]
    = 90.0,
    allow_busy: Annotated[bool, typer.Option("--allow-busy", help="With --measure: store the "
                                             "roofline even when other processes kept the "
                                             "host busy in every attempt (its peaks are then "
                                             "low; it is stored flagged).")] = False,
    db: DbOption = None,
) -> None:
    """What this machine is, whether its stack can drive each device, and (--measure) its roofline.

    The probe names CPU features, GPUs (physical arch), the torch/llama.cpp/Triton stack,
    and a support verdict per device from two checks: arch rules and a smoke test.
    --measure stores this host's roofline for every later command: each figure is the best
    of several trials; on a busy host it measures again, and refuses to store peaks known to
    be low (exit 1) unless --allow-busy.

    [bold]Examples[/bold]
      strata probe               [dim]# hardware, software, support verdicts[/dim]
      strata probe --measure     [dim]# + bandwidth and FLOP/s (the roofline)[/dim]
      strata probe --watch 30    [dim]# live telemetry, throttling verdict[/dim]
      strata probe --json > host.json
    """
    _positive("--smoke-timeout", smoke_timeout)
    if watch is not None:
        _positive("--watch", watch)
    if not 10 <= interval_ms <= 10_000:
        raise InputError(f"--interval must be between 10 and 10000 ms (got {interval_ms})")
    conn = _open_store(db)  # fail on a bad --db before spending time probing
    from strata.commands.probe import run_probe

    result = run_probe(conn, measure=measure, smoke=smoke, smoke_timeout_s=smoke_timeout,
                       console=err, allow_busy=allow_busy)
    if not json_out:
        result.render(out)
    if watch is not None:
        from strata.commands.probe import run_watch

        result.telemetry = run_watch(conn, result.fingerprint, watch, interval_ms / 1000, err)
    if json_out:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    if result.refused:
        raise StrataError(result.refused)  # printed above, not stored: exit 1


Opt = typer.Option


@app.command(context_settings={"help_option_names": ["-h", "--help"]})
def bench(
    models: Annotated[list[str] | None, typer.Argument(
        metavar="MODEL", help="file.gguf, a Hugging Face dir, synthetic:<preset>\\[@f32|f16|"
        "q8_0|q4_0], or http://host:port\\[/v1]. Default: the embedded synthetic preset.")] = None,
    backend: Annotated[str, Opt("--backend", "-B", help=escape(backend_help()))] = "auto",
    n_prompt: Annotated[str, Opt("-p", "--n-prompt", help="Prompt sizes (pp tests); 'none' to "
                                 "skip.")] = "512",
    n_gen: Annotated[str, Opt("-n", "--n-gen", help="Generation sizes (tg tests); 'none' to "
                              "skip.")] = "128",
    pg: Annotated[list[str] | None, Opt("-pg", "--pg", metavar="PROMPT,GEN",
                                        help="Combined pp+tg test (repeatable).")] = None,
    depth: Annotated[str, Opt("-d", "--n-depth", help="Context already in the KV cache.")] = "0",
    batch: Annotated[str, Opt("-b", "--batch-size", help="llama.cpp n_batch.")] = "2048",
    ubatch: Annotated[str, Opt("-ub", "--ubatch-size", help="llama.cpp n_ubatch.")] = "512",
    threads: Annotated[str, Opt("-t", "--threads", help="CPU threads (default: physical "
                                "cores).")] = "",
    n_gpu_layers: Annotated[str, Opt("-ngl", "--n-gpu-layers", help="Layers offloaded to the "
                                     "GPU (llama.cpp).")] = "0",
    flash_attn: Annotated[str, Opt("-fa", "--flash-attn", help="0 or 1 (llama.cpp).")] = "0",
    kv_type: Annotated[str, Opt("-ctk", "--cache-type", help="KV cache type: f16, q8_0, "
                                "q4_0.")] = "f16",
    device: Annotated[str, Opt("--device", help="torch device: cpu, cuda, cuda:1, mps.")]
    = "cpu",
    dtype: Annotated[str, Opt("--dtype", help="torch dtype: auto, float32, bfloat16, "
                              "float16.")] = "auto",
    reps: Annotated[int | None, Opt("-r", "--repetitions", help="Fixed repetitions (default: "
                                    "adaptive to --ci-target).")] = None,
    ci_target: Annotated[float, Opt("--ci-target", help="Stop repeating once the 95% CI "
                                    "half-width is this fraction of the mean.")] = 0.02,
    max_reps: Annotated[int, Opt("--max-reps", help="Most repetitions per test.")] = 10,
    max_time: Annotated[float, Opt("--max-time", metavar="SECONDS", help="Most timed seconds "
                                   "per test.")] = 30.0,
    delay: Annotated[float, Opt("--delay", metavar="SECONDS", help="Cool down between tests.")]
    = 0.0,
    sustained: Annotated[float | None, Opt("--sustained", metavar="SECONDS", help="Decode "
                                           "continuously: t/s timeline and throttling.")] = None,
    model_name: Annotated[str | None, Opt("--model-name", help="Model id for an endpoint "
                                          "(default: the server's first).")] = None,
    fmt: Annotated[str, Opt("--format", "-o", help="table, md, csv, json or jsonl.")] = "table",
    list_presets: Annotated[bool, Opt("--list-presets", help="List the synthetic presets and "
                                      "exit.")] = False,
    seed: Annotated[int, Opt("--seed", help="Seed for the random prompts.")] = 0,
    db: DbOption = None,
) -> None:
    """How fast a model runs here, on llama.cpp, PyTorch or a server, and why (the roofline).

    Tests follow llama-bench: pp<N> prompt processing, tg<M> generation, pp<N>+tg<M>, each
    optionally @d<D> after D tokens of context. Lists and ranges sweep (-p 128,512 -t 1-2).
    Every result is stored with the host, versions, full config and raw samples.

    [bold]Examples[/bold]
      strata bench                                   [dim]# embedded synthetic preset[/dim]
      strata bench synthetic:qwen2.5-0.5b@q4_0 -p 128,512 -n 64
      strata bench model.gguf -B llamacpp -t 1-2 -d 0,1024 -o md
      strata bench http://127.0.0.1:8080 --model-name my-model -p 256 -n 64
    """
    from strata.commands.bench_options import FORMATS_HELP, BenchFlags, build_config

    if list_presets:
        _print_presets()
        return
    if fmt not in FORMATS_HELP:
        raise InputError(f"--format {fmt}: choose one of {', '.join(FORMATS_HELP)}")
    from strata.models.presets import default_model

    flags = BenchFlags(models=models or [default_model()], backend=backend, n_prompt=n_prompt,
                       n_gen=n_gen, pg=pg or [], depth=depth, batch=batch, ubatch=ubatch,
                       threads=threads, n_gpu_layers=n_gpu_layers, flash_attn=flash_attn,
                       kv_type=kv_type, device=device, dtype=dtype, reps=reps,
                       ci_target=ci_target, max_reps=max_reps, max_time=max_time, delay=delay,
                       sustained=sustained, model_name=model_name, seed=seed)
    config = build_config(flags)
    conn = _open_store(db)
    from strata.commands.bench import print_outcome, run_bench

    outcome = run_bench(conn, config, err)
    print_outcome(outcome, fmt, out, err)
    if outcome.status == "incomplete":
        raise typer.Exit(130)


def _print_presets() -> None:
    from rich.table import Table

    from strata.models.presets import default_model, list_presets

    t = Table(title=f"Synthetic presets (default {default_model()})", title_justify="left")
    for col in ("preset", "arch", "layers", "hidden", "heads/kv", "vocab", "source"):
        t.add_column(col)
    for p in list_presets():
        t.add_row(p.name, p.arch, str(p.n_layers), str(p.hidden),
                  f"{p.n_heads}/{p.n_kv_heads}", str(p.vocab), p.source)
    out.print(t)
    out.print("quantisations: @f32 @f16 @q8_0 @q4_0 (GGUF); torch runs the f16/f32 weights")


@app.command()
def compare(
    side_a: Annotated[str, typer.Argument(metavar="A", help="Baseline: run id, run:N, "
                                          "host:FP, backend:NAME or commit:SHA.")],
    side_b: Annotated[str, typer.Argument(metavar="B", help="Compared against A, same forms.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
    db: DbOption = None,
) -> None:
    """Speedup of B over A on every configuration both have, with its significance.

    [bold]Examples[/bold]
      strata compare 3 4                          [dim]# run 4 vs run 3[/dim]
      strata compare backend:torch backend:llamacpp
      strata compare host:0de260d8 host:9a1f3c2b
    """
    from strata.compare import compare as run_compare
    from strata.views.compare import compare_table

    pairs = run_compare(_open_store(db), side_a, side_b)
    if json_out:
        print(json.dumps([{"model": p.a.model, "test": p.a.test, "backend_a": p.a.backend,
                           "backend_b": p.b.backend, "metric": p.metric, "a": p.a_mean,
                           "b": p.b_mean, "speedup": p.speedup, "p": p.p,
                           "significant": p.significant} for p in pairs], indent=2))
    else:
        out.print(compare_table(pairs, side_a, side_b))


@app.command()
def history(
    model: Annotated[str | None, typer.Argument(help="Only this model (as given to bench).")]
    = None,
    backend: Annotated[str | None, typer.Option("--backend", "-B", help="Only this backend.")]
    = None,
    test: Annotated[str | None, typer.Option("--test", help="Only this test, e.g. tg128.")]
    = None,
    db: DbOption = None,
) -> None:
    """Every stored bench result over time: run, date, host, commit, t/s."""
    from strata.compare import history as run_history
    from strata.views.compare import history_table

    out.print(history_table(run_history(_open_store(db), model, backend, test)))


@app.command()
def report(
    out_path: Annotated[Path, typer.Option("--out", metavar="FILE", help="Where to write the "
                                           "HTML file.")] = Path("report.html"),
    open_it: Annotated[bool, typer.Option("--open", help="Open it in the default browser "
                                          "once written.")] = False,
    db: DbOption = None,
) -> None:
    """One self-contained HTML report: host card, roofline chart, t/s vs depth and prompt size,
    sustained runs and throttling, quantisation frontier, fit table.

    No scripts, fonts or network requests: the file opens offline and can be shared as is.
    A section without data says which command fills it.

    [bold]Examples[/bold]
      strata report                          [dim]# writes ./report.html[/dim]
      strata report --out ~/host.html --open
    """
    from strata.commands.report import open_report, run_report

    outcome = run_report(_open_store(db), out_path)
    out.print(outcome.summary(), highlight=False, soft_wrap=True, markup=False)
    if open_it and not open_report(outcome.path):
        err.print(f"could not start a browser: open {outcome.path} by hand", markup=False)


@app.command()
def quality(
    model: Annotated[str, typer.Argument(
        help="file.gguf, a Hugging Face dir (with its tokenizer files) or synthetic:<preset>"
        "\\[@f32|f16|q8_0|q4_0].")],
    ref: Annotated[str | None, typer.Option(
        "--ref", metavar="MODEL", help="Reference with the same vocabulary (e.g. the f16 of a "
        "q4_0): adds KL divergence, top-1 agreement and the decode speed ratio.")] = None,
    text: Annotated[Path | None, typer.Option(
        "--text", metavar="FILE", help="UTF-8 text to score (default: the stdlib's pydoc "
        "topics, offline).")] = None,
    ctx: Annotated[int, typer.Option(
        "--ctx", help="Tokens per chunk; the second half of each chunk is scored "
        "(llama-perplexity's convention).")] = 512,
    backend: Annotated[str, typer.Option(
        "--backend", "-B", help=f"{', '.join(names(scoring=True))}, both, or auto (the first "
        f"of {', '.join(names(scoring=True))} that can read the model).")] = "auto",
    max_chunks: Annotated[int, typer.Option(
        "--max-chunks", metavar="K", help="Score only the first K chunks (bounds the time).")]
    = 32,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    db: DbOption = None,
) -> None:
    """What a quantisation costs: perplexity; with --ref, KL, top-1 and the speed ratio.

    Every backend scores the same token ids and the same weights (torch: the GGUF in float32).
    Results are stored with the host, next to the bench results.

    [bold]Examples[/bold]
      strata quality synthetic:smollm2-135m@q8_0          [dim]# perplexity, default text[/dim]
      strata quality model-q4_0.gguf --ref model-f16.gguf  [dim]# KL, top-1, speed ratio[/dim]
      strata quality model.gguf --backend both --ctx 256   [dim]# llama.cpp vs PyTorch[/dim]
      strata quality model.gguf --text my.txt --max-chunks 64 --json
    """
    conn = _open_store(db)  # fail on a bad --db before tokenising or loading anything
    from strata.commands.quality import quality_main

    quality_main(model, ref, text, ctx, backend, max_chunks, json_out, conn, out, err)


@app.command()
def fit(
    model: Annotated[str, typer.Argument(
        metavar="MODEL", help="file.gguf, a Hugging Face dir, or synthetic:<preset>@<quant> "
        "(f32, f16, q8_0, q4_0). Only its metadata is read: nothing is loaded or written.")],
    ctx: Annotated[int | None, typer.Option("--ctx", "-c", help="Context per sequence, in "
                                            "tokens (default 4096).", show_default=False)]
    = None,
    batch: Annotated[int, typer.Option("--batch", help="Parallel sequences, each with its own "
                                       "context.")] = 1,
    kv_type: Annotated[str | None, typer.Option("--kv-type", help="KV cache type for llamacpp: "
                                                "f16 (default), q8_0, q4_0.",
                                                show_default=False)] = None,
    backend: Annotated[str, typer.Option("--backend", "-B",
                                         help=f"{' or '.join(names(fit=True))}.")]
    = "llamacpp",
    json_out: Annotated[bool, typer.Option("--json", help="Print everything as JSON.")] = False,
    db: DbOption = None,
) -> None:
    """Will MODEL fit on this machine, with how much context, and how fast would it run?

    Per device: weights (exact per-tensor bytes), KV cache (grouped-query aware), buffers and
    overhead (the rules are printed), the verdict with the -ngl to pass to llama.cpp, the
    largest context and the quantisations that fit. Predicted t/s = this host's measured
    roofline x the median η of its past bench results (else a stated prior).

    [bold]Examples[/bold]
      strata fit synthetic:llama-3.1-8b@q4_0 --ctx 32768
      strata fit model.gguf --kv-type q8_0 --batch 4
      strata fit ./hf-model-dir --backend torch --json
    """
    conn = _open_store(db)
    from strata.commands.fit import print_fit, run_fit

    report = run_fit(conn, model, ctx=ctx, batch=batch, kv_type=kv_type, backend=backend,
                     console=err)
    print_fit(report, json_out, out)


@app.command()
def hosts(
    json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
    db: DbOption = None,
) -> None:
    """List the hosts in the results database, one per hardware + software fingerprint."""
    from strata.store.hosts import list_hosts
    from strata.views.hosts import hosts_table

    rows = list_hosts(_open_store(db))
    if json_out:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
    elif not rows:
        err.print("no hosts stored yet: run `strata probe` (or `strata probe --measure`)")
    else:
        out.print(hosts_table(rows))


kernels_app = typer.Typer(
    name="kernels", no_args_is_help=True, rich_markup_mode="rich",
    help="Kernel lab: verify, benchmark and dispatch kernels per hardware dialect "
    "(c, triton, cuda) against the torch baselines.")
app.add_typer(kernels_app)

OpArg = Annotated[str | None, typer.Argument(
    metavar="[OP]", help="matmul, softmax, layernorm, rmsnorm, silu_mul, rope, attention, "
    "decode_attention, matvec_q8_0, matvec_q4_0, cross_entropy (default: all).",
    show_default=False)]
ImplOption = Annotated[str | None, typer.Option(
    "--impl", help="One implementation of OP, e.g. c.avx2, c.naive, triton, cuda.",
    show_default=False)]
FormatOption = Annotated[str, typer.Option(
    "--format", "-o", help="table (default), md, csv, json or jsonl.")]


def _check_format(fmt: str) -> None:
    from strata.store.export import FORMATS

    if fmt != "table" and fmt not in FORMATS:
        raise InputError(f"--format {fmt}: choose table, {', '.join(FORMATS)}")


def _kernel_session(db: Path | None):  # -> commands.kernels.Session
    from strata.commands.kernels import session

    with err.status("probing host…"):
        return session(conn=_open_store(db))


@kernels_app.command("list")
def kernels_list(op: OpArg = None, fmt: FormatOption = "table", db: DbOption = None) -> None:
    """Ops x dialects x implementations: available here, verification status, best speedup.

    [bold]Examples[/bold]
      strata kernels list
      strata kernels list rmsnorm -o json
    """
    from strata.commands.kernels import list_records
    from strata.views.kernels import LIST_COLUMNS, emit, list_table

    _check_format(fmt)
    records = list_records(_kernel_session(db), op)
    if fmt == "table":
        out.print(list_table(records))
    else:
        sys.stdout.write(emit(records, fmt, LIST_COLUMNS))


@kernels_app.command("verify")
def kernels_verify(
    op: OpArg = None,
    impl: ImplOption = None,
    force: Annotated[bool, typer.Option("--force", help="Verify again even when this host "
                                        "has a verdict for this exact source.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per implementation "
                                           "before the sandbox kills it.")] = 300.0,
    fmt: FormatOption = "table",
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
    from strata.views.kernels import VERIFY_COLUMNS, emit, render_failures, verdict_table

    _check_format(fmt)
    _positive("--timeout", timeout)
    s = _kernel_session(db)
    impls = select(op, impl, s.conn)
    with err.status("verifying…") as status:
        verdicts = run_verify(s, impls, force=force, timeout_s=timeout,
                              progress=lambda m: status.update(escape(m)))
    if fmt == "table":
        out.print(verdict_table(verdicts))
        render_failures(err, verdicts)
    else:
        sys.stdout.write(emit([v.to_dict() for v in verdicts], fmt, VERIFY_COLUMNS))
    if any(v.status == "fail" for v in verdicts):
        raise typer.Exit(1)


@kernels_app.command("bench")
def kernels_bench(
    op: OpArg = None,
    impl: ImplOption = None,
    shapes: Annotated[str, typer.Option("--shapes", help="Shape set: llm (the presets' real "
                                        "shapes), figure (the README figures), verify (tiny), "
                                        "gpu (matmul 4096³).")] = "llm",
    compile_: Annotated[bool, typer.Option("--compile/--no-compile", help="Also time "
                                           "torch.compile (compiles per shape: slow on CPU).")]
    = True,
    max_time: Annotated[float, typer.Option("--max-time", help="Seconds of timed calls per "
                                            "contender and shape.")] = 0.5,
    cache: Annotated[str, typer.Option("--cache", help="cold: flush the caches before every "
                                       "call (default); warm: calls back to back, as in a "
                                       "decode loop.")] = "cold",
    dtype: Annotated[str, typer.Option("--dtype", help="float32 (default), bfloat16 or "
                                       "float16; implementations that do not declare it "
                                       "are skipped (the c dialect is float32).")]
    = "float32",
    fmt: FormatOption = "table",
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
    from strata.views.kernels import BENCH_COLUMNS, bench_table, emit, figure_record

    _check_format(fmt)
    _positive("--max-time", max_time)
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
        with err.status(f"[{n}/{len(ops)}] {name}…") as status:
            done = run_bench(s, [i for i in impls if i.op == name], roof, shapes=shapes,
                             compile_=compile_, max_time_s=max_time, cache=cache,
                             dtype=dtype,
                             progress=lambda m, n=n: status.update(
                                 f"[{n}/{len(ops)}] {escape(m)}"))
        figures += done
        if fmt == "table" and done:
            out.print(bench_table(done, f"{name} ({dtype}, {cache} cache)"))
    if fmt != "table":
        sys.stdout.write(emit([figure_record(f) for f in figures], fmt, BENCH_COLUMNS))


@kernels_app.command("explain")
def kernels_explain(
    op: Annotated[str, typer.Argument(metavar="OP", help="The op to dispatch.")],
    device: Annotated[str, typer.Option("--device", help="cpu, cuda:0, rocm:0, …")] = "cpu",
    json_out: Annotated[bool, typer.Option("--json", help="Print the decision as JSON.")]
    = False,
    db: DbOption = None,
) -> None:
    """Which implementation dispatch picks for OP here, and why each other one was not.

    [bold]Examples[/bold]
      strata kernels explain rmsnorm
      strata kernels explain matmul --device cuda:0 --json
    """
    from strata.kernels.dispatch import resolve
    from strata.views.kernels import render_decision

    s = _kernel_session(db)
    if s.caps.device(device) is None:
        raise InputError(f"--device {device}: not on this host (it has "
                         f"{', '.join(d.key for d in s.caps.devices)})")
    decision = resolve(op, device, s.conn, s.fingerprint, s.caps)
    if json_out:
        print(json.dumps(decision.to_dict(), indent=2))
    else:
        render_decision(out, decision)


@kernels_app.command("add")
def kernels_add(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="One kernel source with a "
                                         "'strata-kernel: op=… dialect=… entry=…' line.")],
    bench: Annotated[bool, typer.Option("--bench/--no-bench", help="Benchmark it after it "
                                        "verifies.")] = True,
    timeout: Annotated[float, typer.Option("--timeout", help="Sandbox seconds.")] = 300.0,
    db: DbOption = None,
) -> None:
    """Register an external kernel (hand-written or model-written): static check, sandboxed
    verification, benchmark; dispatch uses it when it wins.

    The file declares itself (docs/kernels-abi.md), e.g. a first line
    [bold]// strata-kernel: op=rmsnorm dialect=c entry=strata_rmsnorm requires=avx2,fma[/bold].
    It must not call the vendor op, patch the timer or harness, start threads, streams or
    processes, or touch files or the network. Exit code 1 if it is rejected.

    [bold]Examples[/bold]
      strata kernels add my_rmsnorm.c
      strata kernels add softmax_kernel.py --no-bench
    """
    from strata.commands.kernels import add_external, register_external, run_bench, run_verify
    from strata.kernels.dispatch import resolve
    from strata.views.kernels import bench_table, render_decision, render_failures, verdict_table

    _positive("--timeout", timeout)
    s = _kernel_session(db)
    impl = add_external(s, file)
    with err.status(f"verifying {escape(impl.key)}…") as status:
        verdicts = run_verify(s, [impl], force=False, timeout_s=timeout,
                              progress=lambda m: status.update(escape(m)))
    out.print(verdict_table(verdicts))
    render_failures(err, verdicts)
    if verdicts[0].status not in ("pass", "compiled"):
        raise typer.Exit(1)
    register_external(s, impl, file)
    if verdicts[0].status == "compiled":
        err.print(f"{impl.key}: registered; it compiles but runs only where its device is "
                  "(verify there)", markup=False)
        return
    if bench:
        roof = s.host.roofline(err)
        with err.status("benchmarking…") as status:
            figures = run_bench(s, [impl], roof, shapes="llm", compile_=False, max_time_s=0.3,
                                progress=lambda m: status.update(escape(m)))
        out.print(bench_table(figures, f"{impl.op}: {impl.name} vs torch eager"))
    for device in dict.fromkeys(filter(None, [verdicts[0].device])):
        render_decision(out, resolve(impl.op, device, s.conn, s.fingerprint, s.caps))


def main() -> None:
    """Entry point: every usage/input error becomes one line on stderr and exit code 2."""
    try:
        code = app(standalone_mode=False, prog_name="strata")
    except StrataError as exc:
        _fail(str(exc), exc.exit_code)
    except TyperException as exc:  # usage errors: unknown flag, bad value, unknown command
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()  # `strata` alone prints the help
        else:
            ctx = getattr(exc, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            _fail(f"{exc.format_message()}{hint}", exc.exit_code)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, Abort):
        _fail("interrupted: results finished so far are kept", 130)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    # The message quotes what the user typed (a model name, a path): a Text, never markup.
    err.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False,
              soft_wrap=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
