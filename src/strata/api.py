"""strata's Python API: the CLI's questions as functions (`from strata import api`).

    from strata import api
    host = api.probe()                          # HostProfile: CPU, GPUs, software, verdicts
    rows = api.bench("synthetic:smollm2-135m@q4_0", backend="llamacpp", n_prompt=64,
                     n_gen=16, reps=1)          # llama-bench-style records, stored
    plan = api.fit("model.gguf", ctx=32768)     # FitReport: per device, .to_json()
    ppl = api.quality("model-q4_0.gguf", ref="model-f16.gguf")
    strata.kernels.get("rmsnorm")               # the kernel lab (strata/kernels/__init__.py)

Each function does what its command does (the same checks, the same stored rows) and
returns the data instead of printing it. Heavy pieces (torch, llama.cpp) are imported when
a function is called, never by `import strata`. A bad argument raises strata.InputError
(the CLI's exit code 2) naming the argument by its parameter name here ("ctx=0: …").
Results render as tables in Jupyter and convert with `.to_pandas()` / `.to_records()`
(the documented `-o json` field names, docs/output.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strata.frame import Records

if TYPE_CHECKING:
    import sqlite3

    from rich.console import Console

    from strata.fit import FitReport
    from strata.hardware.profile import HostProfile


def _conn(db: Path | str | None) -> sqlite3.Connection:
    from strata.paths import default_db_path
    from strata.store import open_db

    return open_db(Path(db) if db is not None else default_db_path())


def _console(verbose: bool) -> Console:
    """Where progress and notes go: stderr when verbose, nowhere otherwise."""
    from strata.views.console import make_console

    console = make_console(stderr=True)
    console.quiet = not verbose
    return console


def probe(*, smoke: bool = False, smoke_timeout_s: float = 90.0) -> HostProfile:
    """This host's profile, as `strata probe` shows it: CPU (model, cores, ISA features,
    caches, RAM), GPUs (vendor, physical arch, memory), the software stack (torch,
    llama.cpp, Triton, drivers) and a support verdict per device.

    smoke=True also runs the per-device smoke test (tiny ops in every claimed dtype, in a
    subprocess; seconds) that the CLI runs by default. Nothing is stored; `profile.to_dict()`
    gives the JSON of `strata probe --json`'s "profile".
    """
    from strata.hardware.probe import probe_host

    return probe_host(smoke=smoke, smoke_timeout_s=smoke_timeout_s)


def bench(model: str | list[str] | None = None, *, db: Path | str | None = None,
          verbose: bool = False, **flags: Any) -> Records:
    """Run `strata bench` and return its records (one dict per model x backend x test, in
    llama-bench's vocabulary: model_filename, n_prompt, n_gen, avg_ts, stddev_ts, samples_ts,
    ... plus strata's ceiling_ts and eta). The run is stored in the results DB.

    model: what `strata bench MODEL` takes (file.gguf, a Hugging Face dir,
    synthetic:<preset>[@quant], ollama:NAME[:TAG], http://host:port), or a list of them;
    None = the embedded synthetic preset. flags: the command's options by their long names
    with `_` for `-` (backend="llamacpp", n_prompt=64, n_gen=[16, 32], depth=0, threads=4,
    reps=1, flash_attn=1, ...): numbers and lists become the text the command line takes
    ("16,32"), and a string is taken as typed ("1-4").
    Raises InputError for a bad flag and when nothing ran (every pair skipped: the reasons
    are in the message). The list also renders as a table in a notebook and converts with
    `.to_pandas()` / `.to_records()`.
    """
    from strata.commands.bench import run_bench
    from strata.commands.bench_options import BenchFlags, build_config
    from strata.errors import InputError

    models = [model] if isinstance(model, str) else (list(model) if model else None)
    config = build_config(BenchFlags(models=models, **_as_typed(BenchFlags, flags)))
    outcome = run_bench(_conn(db), config, _console(verbose))
    if not outcome.records and outcome.skipped:
        raise InputError("no results: " + "; ".join(f"{what}: {why}"
                                                    for what, why in outcome.skipped))
    return Records(outcome.records, BENCH_COLUMNS, "strata bench")


def _as_typed(cls: type, flags: dict[str, Any]) -> dict[str, Any]:
    """Python values for flags that take text as typed: n_prompt=512 or [128, 512] for
    "-p 128,512", reps=1 for "-r 1". Unknown names raise InputError, as the CLI would."""
    import dataclasses
    import typing

    from strata.errors import InputError

    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    typed = {}
    for name, value in flags.items():
        if name not in names:
            raise InputError(f"bench: no option {name!r} (options: {', '.join(sorted(names))})")
        hint = hints[name]
        takes_text = hint is str or str in typing.get_args(hint)
        if takes_text and isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        elif takes_text and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        elif not takes_text and isinstance(value, str) and list in (
                typing.get_origin(hint), *map(typing.get_origin, typing.get_args(hint))):
            value = [value]
        typed[name] = value
    return typed


def fit(model: str, *, ctx: int | None = None, batch: int = 1, kv_type: str | None = None,
        backend: str = "llamacpp", db: Path | str | None = None,
        verbose: bool = False) -> FitReport:
    """Will `model` fit on this host, with how much context, and how fast would it run
    (`strata fit`)? Only the model's metadata is read.

    ctx: tokens per sequence (None: 4096); batch: parallel sequences; kv_type: llama.cpp's
    KV cache type (f16, q8_0, q4_0); backend: llamacpp, torch or lab. Returns the FitReport
    (per-device memory, verdict, largest context, predicted t/s from this host's roofline);
    `.to_json()` is what `strata fit -o json` prints.
    """
    from strata.commands.fit import run_fit
    from strata.paths import default_db_path
    from strata.store.db import open_db_readonly

    # only reads, as the CLI: a missing database is an empty one, and none is created
    with _named_as_parameters():
        conn = open_db_readonly(Path(db) if db is not None else default_db_path())
        return run_fit(conn, model, ctx=ctx, batch=batch, kv_type=kv_type, backend=backend,
                       console=_console(verbose))


def quality(model: str, *, ref: str | None = None, text: Path | str | None = None,
            ctx: int = 512, backend: str = "auto", max_chunks: int = 32,
            db: Path | str | None = None, verbose: bool = False) -> Records:
    """What a quantisation costs (`strata quality`): perplexity of `model` on `text` (default:
    the stdlib's pydoc topics, offline), and with `ref` (same vocabulary) KL divergence,
    top-1 agreement and the decode speed ratio. One result per backend (backend="both"
    scores on llama.cpp and PyTorch); each is stored. `result.to_dict()` is the stored row;
    the returned list's `.to_records()` / `.to_pandas()` give what `-o json` prints, and a
    notebook shows it as the terminal's table.
    """
    from strata.commands.quality import quality_record, run_quality_command
    from strata.quality.run import QualityConfig
    from strata.views.quality import MD_FIELDS

    with _named_as_parameters():
        config = QualityConfig(model=model, ref=ref,
                               text=Path(text) if text is not None else None, ctx=ctx,
                               backend=backend, max_chunks=max_chunks)
        results = run_quality_command(_conn(db), config, _console(verbose))
    return Records(results, MD_FIELDS, f"strata quality · {model}",
                   lambda r: quality_record(r.to_dict()))


def whatif(model: str | list[str], *, on: str | list[str] | None = None,
           ctx: int | None = None, kv_type: str | None = None,
           prices: dict[str, float] | None = None, ram_gib: float | None = None,
           db: Path | str | None = None) -> Records:
    """What if I bought a device (`strata whatif`): per model and catalogue device, fit's
    verdict, the support verdict, predicted decode/prefill t/s with a range and where its η
    comes from, t/s per $1000 (prices: {device: USD}) and per watt. on: catalogue ids or
    names (None: every device). Returns Records of the documented whatif fields
    (docs/output.md); only metadata is read, the DB only read.
    """
    from strata.commands.whatif import run_whatif
    from strata.paths import default_db_path
    from strata.store.db import open_db_readonly

    models = [model] if isinstance(model, str) else list(model)
    devices = [on] if isinstance(on, str) else list(on or [])
    from strata.whatif.plan import parse_prices

    with _named_as_parameters():
        paid = parse_prices([f"{k}={v}" for k, v in (prices or {}).items()])
        conn = open_db_readonly(Path(db) if db is not None else default_db_path())
        answer = run_whatif(conn, models, devices, ctx=ctx, kv_type=kv_type, prices=paid,
                            ram_gib=ram_gib, sweep_what=None)
    return Records(answer.records(), WHATIF_COLUMNS, "strata whatif")


WHATIF_COLUMNS = ("model_filename", "device", "memory_gib", "bandwidth_gbs", "verdict",
                  "max_ctx", "predicted_decode_ts", "predicted_prefill_ts", "decode_eta_basis",
                  "decode_ts_per_kusd", "decode_ts_per_watt")
BENCH_COLUMNS = ("model_filename", "backend", "n_threads", "n_prompt", "n_gen", "n_depth",
                 "avg_ts", "stddev_ts", "ceiling_ts", "eta", "bound", "host_busy")

# CLI flag -> the API's parameter, so an error names what the caller typed
PARAMETERS = {"--ctx": "ctx=", "-c": "ctx=", "-np": "batch=", "--kv-type": "kv_type=",
              "--backend": "backend=", "-B": "backend=", "--ref": "ref=", "--text": "text=",
              "--max-chunks": "max_chunks=", "--on": "on=", "--price": "prices=",
              "--ram": "ram_gib=", "MODEL": "model="}


@contextmanager
def _named_as_parameters() -> Iterator[None]:
    """Re-raise an InputError with the CLI's flag names turned into this API's parameter
    names ('--ctx 0: …' -> 'ctx=0: …')."""
    from strata.errors import InputError

    try:
        yield
    except InputError as e:
        text = str(e)
        for flag, param in sorted(PARAMETERS.items(), key=lambda kv: -len(kv[0])):
            text = re.sub(rf"(?<![\w-]){re.escape(flag)}(?![\w-]) ?", param, text)
        raise InputError(text) from None


__all__ = ["Records", "bench", "fit", "probe", "quality", "whatif"]
