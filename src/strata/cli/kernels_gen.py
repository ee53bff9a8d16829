"""`strata kernels generate | attempts | eval`: models write kernels, the lab judges them.

The flags and their checks; the use cases are commands/kernels_gen.py, the views
views/kernels_gen.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from strata.cli import DbOption, check_positive, err, out
from strata.cli.helptext import reflowed
from strata.cli.kernels import DIALECT_NAMES, OPS, JsonOption, _check_format, kernels_app
from strata.cli.output import with_json
from strata.cli.status import OUTPUT_PANEL, ProgressOption, status, use_progress
from strata.errors import InputError
from strata.views.output import emit

# Options come in panels: each is its own table, so its columns fit its own names and the
# help texts keep room at 80 columns.
MODEL_PANEL, SEARCH_PANEL, JUDGE_PANEL = "Model server", "Search", "Judging"

EndpointOption = Annotated[str, typer.Option(
    "--endpoint", metavar="URL", rich_help_panel=MODEL_PANEL, show_default=False,
    help="OpenAI-compatible base URL: llama-server, Ollama (port 11434), vLLM, LM Studio or "
    "a hosted API.")]
DialectOption = Annotated[str, typer.Option("--dialect", rich_help_panel=SEARCH_PANEL,
                                            help=f"Dialect to write: {DIALECT_NAMES}.")]
DeviceOption = Annotated[str | None, typer.Option(
    "--device", rich_help_panel=SEARCH_PANEL, show_default=False,
    help="cpu, cuda:0, … (default: cpu for c; for the others the first GPU, else cpu).")]
TurnsOption = Annotated[int, typer.Option("--turns", rich_help_panel=SEARCH_PANEL,
                                          help="Turns per conversation: each verdict goes "
                                          "back as the next message.")]
SamplesOption = Annotated[int, typer.Option("--samples", rich_help_panel=SEARCH_PANEL,
                                            help="Independent conversations per op.")]
SkillOption = Annotated[str | None, typer.Option(
    "--skill", rich_help_panel=SEARCH_PANEL, show_default=False,
    help="A skill added to the prompt: a folder (SKILL.md + skill.json) or builtin:<dialect>.")]
KeyOption = Annotated[str | None, typer.Option(
    "--api-key-env", metavar="VAR", rich_help_panel=MODEL_PANEL, show_default=False,
    help="Env var with the API key.")]
TempOption = Annotated[float, typer.Option("--temperature", rich_help_panel=MODEL_PANEL,
                                           help="Temperature of the sampling (0 to 2).")]
TimeoutOption = Annotated[float, typer.Option("--timeout", metavar="SECONDS",
                                              rich_help_panel=JUDGE_PANEL,
                                              help="Sandbox seconds per candidate.")]
StreamOption = Annotated[bool, typer.Option("--stream/--no-stream", rich_help_panel=MODEL_PANEL,
                                            help="Ask for streamed replies (server-sent events).")]
RequestTimeoutOption = Annotated[float, typer.Option(
    "--request-timeout", metavar="SECONDS", rich_help_panel=MODEL_PANEL,
    help="How long a model may stay silent before the request is retried (3 retries, then "
    "the run stops).")]
MaxTokensOption = Annotated[int | None, typer.Option(
    "--max-tokens", metavar="N", rich_help_panel=MODEL_PANEL, show_default=False,
    help="Most tokens per reply; default: the server's limit.")]
BenchOption = Annotated[bool, typer.Option("--bench/--no-bench", rich_help_panel=JUDGE_PANEL,
                                           help="Benchmark correct candidates against this "
                                           "host's roofline (measured first when missing).")]
ModelOption = Annotated[str | None, typer.Option(
    "--model", metavar="MODEL", rich_help_panel=MODEL_PANEL, show_default=False,
    help="Model name (default: the server's first).")]

def _check_counts(turns: int, samples: int, temperature: float) -> None:
    check_positive("--turns", turns)
    check_positive("--samples", samples)
    if turns > 50 or samples > 64:
        raise InputError(f"--turns {turns} / --samples {samples}: at most 50 turns and 64 "
                         "samples (each turn is a request and a sandboxed verification)")
    if not 0 <= temperature <= 2:
        raise InputError(f"--temperature {temperature}: choose a value from 0 to 2")


@contextmanager
def saying(message: str, quote: Callable[[str], str] = escape) -> Iterator[Callable[[str], None]]:
    """A status line on stderr (nothing when piped: it changes too often to log) and the
    callback that shows a step's latest message there."""
    with status(err, message, lines=False) as line:
        yield lambda m: line.update(quote(m))


@kernels_app.command("generate")
@reflowed
def kernels_generate(
    op: Annotated[str, typer.Argument(metavar="OP", help=f"The op to write: {OPS}.")],
    endpoint: EndpointOption,
    model: ModelOption = None,
    dialect: DialectOption = "c",
    device: DeviceOption = None,
    turns: TurnsOption = 6,
    samples: SamplesOption = 4,
    skill: SkillOption = None,
    api_key_env: KeyOption = None,
    temperature: TempOption = 0.7,
    register: Annotated[bool, typer.Option("--register/--no-register",
                                           rich_help_panel=JUDGE_PANEL, help="Register the "
                                           "best correct kernel for dispatch (the door of "
                                           "`strata kernels add`).")] = True,
    bench: BenchOption = True,
    timeout: TimeoutOption = 120.0,
    stream: StreamOption = False,
    max_tokens: MaxTokensOption = None,
    request_timeout: RequestTimeoutOption = 300.0,
    fmt: Annotated[str, typer.Option("--format", "-o", metavar="FORMAT", show_default=False,
                                     rich_help_panel=OUTPUT_PANEL,
                                     help="table (default), or the attempts as md, csv, "
                                     "json or jsonl.")] = "table",
    json_out: JsonOption = False,
    progress: ProgressOption = None,
    db: DbOption = None,
) -> None:
    """A language model writes OP for this hardware dialect; the lab judges every reply.

    The prompt (templates under strata/kernels/gen/templates, hash stored) gives the op's
    contract, the float64 reference, a verified built-in of another op in the dialect, the
    rules, this host's hardware (ISA, caches, measured GB/s and GFLOP/s) and the target (the
    best implementation's time and the roofline ceiling). Each reply goes through the
    `kernels add` door: code extracted from the fenced block defining the entry, static and
    link checks, sandboxed verification, benchmark. The status class (format, static,
    compile, runtime, mismatch, implausible, slow, ok) and its evidence (compiler errors,
    first mismatches, timings) go back as the next turn. A conversation stops at --turns,
    after the same failure 3 times, or within 10% of the roofline. Every attempt is stored
    (`strata kernels attempts`). Exit code 1 if no sample produced a correct kernel.

    [bold]Examples[/bold]
      strata kernels generate rmsnorm --endpoint http://127.0.0.1:8080/v1
      strata kernels generate rope --endpoint http://localhost:11434/v1   [dim]# Ollama[/dim]
      strata kernels generate softmax --endpoint $URL --skill builtin:c
      strata kernels generate matmul --endpoint $URL --api-key-env MY_API_KEY
    """
    from strata.commands.kernels_gen import GenerateOptions, ModelServer, generate
    from strata.views.kernels_gen import SampleBoard, no_bench_note, render_generate

    use_progress(progress)
    fmt = _check_format(fmt, json_out)
    _check_counts(turns, samples, temperature)
    check_positive("--timeout", timeout)
    check_positive("--request-timeout", request_timeout)

    @contextmanager
    def board(message: str) -> Iterator[SampleBoard]:
        with status(err, message, lines=False) as line:
            yield SampleBoard(line, samples, f"{op}: ")

    result = generate(GenerateOptions(
        op=op, server=ModelServer(endpoint, api_key_env, stream, request_timeout), model=model,
        dialect=dialect, device=device, turns=turns, samples=samples, skill=skill,
        temperature=temperature, register=register, bench=bench, timeout_s=timeout,
        max_tokens=max_tokens, db=db), err, board)
    _emit_attempts(result.attempts, fmt, lambda: render_generate(out, err, result))
    if not bench:
        no_bench_note(err)
    if result.best is None:
        raise typer.Exit(1)


def _emit_attempts(attempts: list[Any], fmt: str, table: Callable[[], None]) -> None:
    from strata.views.kernels_gen import ATTEMPT_COLUMNS, ATTEMPT_NUMERIC, attempt_record

    emit(out, fmt, [attempt_record(a) for a in attempts], table=table,
         md_columns=ATTEMPT_COLUMNS, md_numeric=ATTEMPT_NUMERIC)


@kernels_app.command("attempts")
@reflowed
def kernels_attempts(
    op: Annotated[str | None, typer.Argument(metavar="OP", help="Only this op.",
                                             show_default=False)] = None,
    run: Annotated[str | None, typer.Option("--run", help="Only this generate/eval run.",
                                            show_default=False)] = None,
    model: Annotated[str | None, typer.Option("--model", metavar="MODEL",
                                              help="Only this model.", show_default=False)]
    = None,
    export: Annotated[Path | None, typer.Option(
        "--export", metavar="FILE", help="Write the attempts (prompt, reply, code, verdict) "
        "as JSON lines, to replay elsewhere with `strata kernels eval --replay FILE`.",
        show_default=False)] = None,
    fmt: Annotated[str, typer.Option("--format", "-o", metavar="FORMAT", show_default=False,
                                     rich_help_panel=OUTPUT_PANEL,
                                     help="table (default), md, csv, json or jsonl.")]
    = "table",
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Every stored model reply: run, sample, turn, status, tokens, latency, speedup.

    Replies of `strata kernels generate` and `strata kernels eval`, newest last; --export
    writes them whole (prompt, reply, code, verdict) for a replay on another host.

    [bold]Examples[/bold]
      strata kernels attempts rmsnorm
      strata kernels attempts --run 3f2a9c1e0b7d --export transcripts.jsonl
    """
    from strata.commands.kernels_gen import attempts
    from strata.views.kernels_gen import attempts_table

    fmt = _check_format(fmt, json_out)
    found = attempts(db, op=op, run=run, model=model, export=export)
    if export is not None:
        err.print(f"wrote {len(found)} attempts to {export}", markup=False)
        return
    _emit_attempts(found, fmt, lambda: out.print(attempts_table(found)))


@kernels_app.command("eval")
@reflowed
def kernels_eval(
    endpoint: Annotated[str | None, typer.Option(
        "--endpoint", metavar="URL", rich_help_panel=MODEL_PANEL, show_default=False,
        help="OpenAI-compatible base URL serving the models (not needed with --replay).")]
    = None,
    models: Annotated[str | None, typer.Option(
        "--models", metavar="MODELS", rich_help_panel=MODEL_PANEL, show_default=False,
        help="Comma-separated model names (default: the server's first).")] = None,
    ops: Annotated[str, typer.Option("--ops", rich_help_panel=SEARCH_PANEL,
                                     help="all, or a comma list of ops (`strata kernels "
                                     "list` names every one) and task sets: "
                                     "kernelbench-conv is KernelBench's level-1 conv "
                                     "problems, timed at their own shapes.")] = "all",
    dialect: DialectOption = "c",
    device: DeviceOption = None,
    samples: SamplesOption = 4,
    turns: TurnsOption = 4,
    skill: SkillOption = None,
    api_key_env: KeyOption = None,
    temperature: TempOption = 0.7,
    replay: Annotated[Path | None, typer.Option(
        "--replay", metavar="FILE", rich_help_panel=JUDGE_PANEL, show_default=False,
        help="Re-score recorded replies (`strata kernels attempts --export FILE`) on this "
        "host, without calling any model.")] = None,
    bench: BenchOption = True,
    timeout: TimeoutOption = 120.0,
    stream: StreamOption = False,
    request_timeout: RequestTimeoutOption = 300.0,
    fmt: Annotated[str, typer.Option("--format", "-o", metavar="FORMAT", show_default=False,
                                     rich_help_panel=OUTPUT_PANEL,
                                     help="table (default), md or json.")] = "table",
    json_out: JsonOption = False,
    progress: ProgressOption = None,
    db: DbOption = None,
) -> None:
    """A leaderboard of models as kernel writers, measured by execution on this host.

    Per model x dialect, over samples (one conversation each; its result is its best turn):
    [bold]compile[/bold] share of samples that built and ran; [bold]correct[/bold] share
    with a verified kernel; [bold]pass@k[/bold] the unbiased 1 - C(n-c,k)/C(n,k) per op,
    averaged over ops; [bold]fast_p[/bold] share of samples correct and more than p x faster
    than torch eager (eager@p) or than the best verified implementation (best@p), p = 1, 1.5,
    2;
    [bold]geomean[/bold] speedup over eager of each op's best correct kernel, with
    [bold]coverage[/bold] the share of ops that have one; [bold]turns[/bold] to the first
    correct kernel; [bold]tokens[/bold] per correct kernel (in + out, from usage);
    [bold]cheats[/bold] attempts where a guard fired. Registration is off: a leaderboard
    does not change dispatch. Stored; `strata report` shows it.

    [bold]Examples[/bold]
      strata kernels eval --endpoint http://127.0.0.1:8080/v1 --ops rmsnorm,rope
      strata kernels eval --endpoint $URL --models qwen3,gemma3 --samples 2
      strata kernels eval --replay transcripts.jsonl --bench
    """
    from strata.commands.kernels_gen import EvalOptions, ModelServer, leaderboard
    from strata.views.kernels_gen import (
        leaderboard_columns,
        leaderboard_numeric,
        leaderboard_table,
        no_bench_note,
        scores_record,
    )

    use_progress(progress)
    fmt = with_json(fmt, json_out)
    if fmt not in ("table", "md", "json"):
        raise InputError(f"--format {fmt}: choose table, md or json")
    _check_counts(turns, samples, temperature)
    check_positive("--timeout", timeout)
    server = None  # a replay calls no model
    if replay is None:
        if endpoint is None:
            raise InputError("give --endpoint URL (a server with the models) or --replay "
                             "FILE (recorded replies)")
        check_positive("--request-timeout", request_timeout)
        server = ModelServer(endpoint, api_key_env, stream, request_timeout)
    scores = leaderboard(EvalOptions(
        server=server, models=models, ops=ops, dialect=dialect,
        device=device, samples=samples, turns=turns, skill=skill, temperature=temperature,
        replay=replay, bench=bench, timeout_s=timeout, db=db), err, saying)
    if not bench:
        no_bench_note(err)
    emit(out, fmt, [scores_record(x) for x in scores],
         table=lambda: out.print(leaderboard_table(scores)),
         md_columns=leaderboard_columns(scores), md_numeric=leaderboard_numeric(scores))
