"""`strata train`'s use case: the run's config (from the flags or a checkpoint), the checks,
the ops, the recorder and the peak MFU is against, then the training run itself."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from strata.errors import InputError
from strata.store import open_db
from strata.train.presets import DEFAULT_PRESET

FROM_CHECKPOINT = ("preset", "data", "batch", "accum", "seed", "out", "kernels", "dtype")


def default_kernels(args: dict[str, Any]) -> str:
    """The lab's CPU training kernels are float32 (c dialect); elsewhere the torch twin."""
    cpu = str(args["device"]).startswith("cpu")
    return "lab" if cpu and (args["dtype"] or "float32") == "float32" else "torch"


def config_from(args: dict[str, Any], db: Path | None) -> tuple[Any, Any]:
    """The TrainConfig (from the flags, or from the checkpoint with --resume) and the
    resumed checkpoint."""
    from strata.train.run import TrainConfig, find_resume, preset_named

    if args["resume"] is None:
        preset = preset_named(args["preset"] or DEFAULT_PRESET,
                              **{k: args[k] for k in ("steps", "batch", "accum", "eval_every",
                                                      "ckpt_every")})
        return TrainConfig(preset, data=args["data"] or None, device=args["device"],
                           dtype=args["dtype"] or "float32",
                           kernels=args["kernels"] or default_kernels(args),
                           seed=args["seed"] or 0, out=args["out"], threads=args["threads"],
                           export=args["export"]), None
    resumed = find_resume(args["resume"], _store(db))
    given = [k for k in FROM_CHECKPOINT if args[k] not in (None, [])]
    if given:
        raise InputError(f"--{given[0].replace('_', '-')}: a resumed run keeps its own (it comes "
                         "from the checkpoint); give only --steps, --device, --threads")
    cfg = TrainConfig.from_dict(resumed.checkpoint.config)
    steps = args["steps"] if args["steps"] is not None else cfg.preset.steps
    if steps <= resumed.checkpoint.step:
        raise InputError(f"--resume {args['resume']}: the run has done {resumed.checkpoint.step}"
                         f" of {steps} steps; give --steps above {resumed.checkpoint.step} to "
                         "train it further")
    cfg.preset = replace(cfg.preset, steps=steps, eval_every=args["eval_every"] or
                         cfg.preset.eval_every, ckpt_every=args["ckpt_every"] or
                         cfg.preset.ckpt_every)
    cfg.device, cfg.threads, cfg.resume = args["device"], args["threads"], args["resume"]
    cfg.export = args["export"]
    return cfg, resumed


def peak_for(conn: Any, device: Any, dtype: str, err: Console
             ) -> tuple[Any, tuple[float | None, str]]:
    """This host (probed) and the measured matmul peak MFU is against (measured once and
    stored when the host has no roofline yet)."""
    from strata.host import this_host

    host = this_host(conn, err)
    roof = host.roofline(err)
    from strata.hardware.devices import key_for

    key = key_for(device)
    dev = roof.device(key)
    name = {"float32": "fp32", "bfloat16": "bf16"}[dtype]
    gflops = dev.peak_gflops(name) if dev else None
    if not gflops:
        return host, (None, f"no measured {name} matmul peak for {key}")
    return host, (gflops * 1e9, f"{name} matmul {gflops:,.1f} GFLOP/s on {key}, measured: "
                                f"{dev.compute[name].method}")


def _store(db: Path | None) -> Any:
    from strata.paths import default_db_path

    return open_db(db or default_db_path())


def run(args: dict[str, Any], db: Path | None, err: Console, make_bar: Any) -> Any | None:
    """Train as the flags say; the result on rank 0 (None on the other ranks). `make_bar`:
    the progress printer for a recorder (rank 0 only)."""
    from strata.train.distributed import world_from_env
    from strata.train.loop import Quiet
    from strata.train.run import check, load_documents, make_ops
    from strata.train.run import train as run_train

    world = world_from_env()
    cfg, resumed = config_from(args, db)
    dev = check(cfg)
    # rank 0 records the run; every rank reads kernel verdicts for lab ops
    conn = _store(db) if world.main or cfg.kernels != "torch" else None
    ops = make_ops(cfg.kernels, dev, conn)
    docs = None if resumed else load_documents(cfg)
    store, peak, bar = None, (None, ""), None
    if world.main:
        from strata.store.training import TrainRecorder

        host, peak = peak_for(conn, dev, cfg.dtype, err)
        store = TrainRecorder(conn, host.fingerprint, ["strata", *sys.argv[1:]])
        bar = make_bar(store)
    try:
        result = run_train(cfg, ops, bar or Quiet(), store, resumed, peak, world, docs)
    finally:
        if bar:
            bar.close()
    return result if world.main else None
