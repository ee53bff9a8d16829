"""`strata train`, the use case: check the input, prepare the text (split, tokenizer, token
files), build the model on the chosen ops, train (strata.train.loop), then write the
Hugging Face folder and the GGUF and a text sample. Rank 0 of a data-parallel run does the
talking, the storing and the writing; every rank trains.

Run folder (--out, default $STRATA_HOME/train/run-<id>): tokenizer.json, tokens/ (memory-
mapped token files), val.txt (the held-out text, for `strata quality --text`),
checkpoint.pt, hf/, model.gguf.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from strata.errors import InputError
from strata.store.training import TrainRecorder
from strata.train import distributed as ddp
from strata.train.checkpoint import Checkpoint, load_checkpoint
from strata.train.loop import Loop, Progress, Quiet, make_optimizer
from strata.train.model import Llama, Ops, flops_per_token, param_count
from strata.train.presets import PRESETS, ModelConfig, TrainPreset

OP_NAMES = ("rmsnorm", "silu_mul", "rope", "attention", "cross_entropy")
VAL_SEED = 1_000_003  # the validation windows: fixed, never the training stream's
SAMPLE_PROMPT = "The "
DTYPES = {"float32": None, "bfloat16": torch.bfloat16}


# -- ops: --kernels NAME -> an Ops factory ----------------------------------------------------


def _torch_ops(device: torch.device, conn: Any) -> Ops:
    from strata.train.ops_torch import TorchOps

    return TorchOps()


def _lab_ops(device: torch.device, conn: Any) -> Ops:
    from strata.hardware.devices import key_for
    from strata.train.ops_lab import LabOps

    return LabOps(key_for(device), conn)


# --kernels NAME -> factory(device, results DB connection or None) -> Ops
OPS: dict[str, Callable[[torch.device, Any], Ops]] = {"lab": _lab_ops, "torch": _torch_ops}


def make_ops(name: str, device: torch.device, conn: Any = None) -> Ops:
    if name not in OPS:
        raise InputError(f"--kernels {name}: unknown (use {' or '.join(OPS)})")
    return OPS[name](device, conn)


def served_by(ops: Ops) -> dict[str, dict[str, str]]:
    """op -> {impl, ...}: what the ops object reports (`served()`: impl plus how dispatch
    decided), else its one name for every op (the plain PyTorch twin says "torch")."""
    report = getattr(ops, "served", None)
    if callable(report):
        return report()
    name = getattr(ops, "name", type(ops).__name__)
    return {op: {"impl": name, "decision": f"--kernels {name}"} for op in OP_NAMES}


# -- config -----------------------------------------------------------------------------------


@dataclass
class TrainConfig:
    preset: TrainPreset  # with the command line's overrides (steps, batch, accum, ...)
    data: list[Path] | None = None  # None: the embedded corpus
    device: str = "cpu"
    dtype: str = "float32"
    kernels: str = "torch"
    seed: int = 0
    out: Path | None = None
    resume: str | None = None
    threads: int | None = None
    export: bool = True
    sample_tokens: int = 48

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["data"] = [str(p) for p in self.data] if self.data else None
        d["out"] = str(self.out) if self.out else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        p = dict(d["preset"])
        p["model"] = ModelConfig(**p["model"])
        return cls(**{**d, "preset": TrainPreset(**p),
                      "data": [Path(x) for x in d["data"]] if d.get("data") else None,
                      "out": Path(d["out"]) if d.get("out") else None})


def preset_named(name: str, **overrides: int | None) -> TrainPreset:
    if name not in PRESETS:
        raise InputError(f"--preset {name}: unknown (use {', '.join(PRESETS)})")
    for flag, value in overrides.items():
        if value is not None and value <= 0:
            raise InputError(f"--{flag.replace('_', '-')} must be > 0 (got {value})")
    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})


def check(cfg: TrainConfig) -> torch.device:
    """Everything that can be refused before any work: one-line InputErrors."""
    from strata.backends.base import BackendUnavailable
    from strata.backends.torch_device import resolve_device

    if cfg.dtype not in DTYPES:
        raise InputError(f"--dtype {cfg.dtype}: use {' or '.join(DTYPES)}")
    if cfg.kernels not in OPS:
        raise InputError(f"--kernels {cfg.kernels}: unknown (use {' or '.join(OPS)})")
    if cfg.kernels == "lab" and cfg.dtype != "float32":
        raise InputError(f"--kernels lab --dtype {cfg.dtype}: the lab's training kernels "
                         "verified here are float32; use --dtype float32 or --kernels torch")
    for path in cfg.data or []:
        if not path.exists():
            raise InputError(f"--data {path}: no such file or folder")
    if cfg.threads is not None and cfg.threads <= 0:
        raise InputError(f"--threads must be > 0 (got {cfg.threads})")
    try:
        return resolve_device(cfg.device)
    except BackendUnavailable as exc:
        raise InputError(f"--device {cfg.device}: {str(exc).split(': ', 2)[-1]}") from None


# -- resume -----------------------------------------------------------------------------------


@dataclass
class Resumed:
    checkpoint: Checkpoint
    folder: Path
    run_id: int  # the run that wrote it (0: unknown, e.g. a path)


def find_resume(ref: str, conn: Any) -> Resumed:
    """--resume RUN: a training run id from the DB, or a run folder / checkpoint file."""
    from strata.store.training import get_train

    if ref.isdigit():
        row = get_train(conn, int(ref)) if conn is not None else None
        if row is None:
            raise InputError(f"--resume {ref}: no training run {ref} in the results DB (run "
                             "ids are printed by strata train; or give the run folder)")
        folder = Path(row.out_dir)
    else:
        folder = Path(ref).expanduser()
        if not folder.exists():
            raise InputError(f"--resume {ref}: not a run id nor an existing run folder")
        folder = folder if folder.is_dir() else folder.parent
    ckpt = load_checkpoint(folder)
    return Resumed(ckpt, folder, ckpt.run_id)


# -- data -------------------------------------------------------------------------------------


@dataclass
class Corpus:
    tokenizer: Any  # tokenizers.Tokenizer
    store: Any  # strata.train.data.TokenStore
    info: dict[str, Any] = field(default_factory=dict)


def load_documents(cfg: TrainConfig) -> list[Any]:
    from strata.train.data import default_corpus, load_corpus

    return load_corpus(cfg.data) if cfg.data else default_corpus()


def build_corpus(cfg: TrainConfig, docs: list[Any], folder: Path) -> Corpus:
    """Split by document, train the tokenizer on the training part, write the token files
    and the held-out text."""
    from strata.train.data import TokenStore, split_documents
    from strata.train.tokenizer import save_tokenizer, train_tokenizer

    split = split_documents(docs, seed=cfg.seed)
    tok = train_tokenizer(split.train, cfg.preset.model.vocab)
    save_tokenizer(tok, folder / "tokenizer.json")
    store = TokenStore.build(folder / "tokens", split, tok)
    (folder / "val.txt").write_text("\n\n".join(d.text for d in split.val), encoding="utf-8")
    return open_corpus(folder, store)


def open_corpus(folder: Path, store: Any = None) -> Corpus:
    from strata.train.data import TokenStore
    from strata.train.tokenizer import load_tokenizer

    store = store or TokenStore.open(folder / "tokens")
    sources = {k: v for k, v in store.meta.items() if k != "dtype"}
    return Corpus(load_tokenizer(folder / "tokenizer.json"), store, sources)


# -- model ------------------------------------------------------------------------------------


def model_config(preset: TrainPreset, tokenizer: Any) -> ModelConfig:
    """The preset's model sized to the trained vocabulary (little text: fewer merges)."""
    return replace(preset.model, vocab=tokenizer.get_vocab_size())


def build_model(cfg: TrainConfig, mcfg: ModelConfig, ops: Ops,
                device: torch.device) -> Llama:
    torch.manual_seed(cfg.seed)
    return Llama(mcfg, ops).to(device)


def make_loop(cfg: TrainConfig, corpus: Corpus, ops: Ops, device: torch.device,
              world: ddp.World, folder: Path | None, peak_flops: float | None) -> Loop:
    from strata.train.data import Batches

    preset = cfg.preset
    ddp.check_batch(world, preset.batch)
    mcfg = model_config(preset, corpus.tokenizer)
    model = build_model(cfg, mcfg, ops, device)
    per_rank = preset.batch // world.size
    batches = Batches(corpus.store.train, per_rank, mcfg.ctx, cfg.seed, world.rank, world.size)
    val_windows = Batches(corpus.store.val, per_rank, mcfg.ctx, VAL_SEED, world.rank, world.size)

    def val_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
        val_windows.position = 0  # the same windows at every evaluation
        return [val_windows.next() for _ in range(preset.eval_batches)]

    return Loop(model=model, trainable=ddp.wrap(model, world, device),
                optimizer=make_optimizer(model, preset), preset=preset, batches=batches,
                val_batches=val_batches,
                val_bytes_per_token=corpus.store.bytes_per_token("val"), world=world,
                device=device, autocast_dtype=DTYPES[cfg.dtype],
                flops_per_token=flops_per_token(mcfg), peak_flops=peak_flops, folder=folder,
                config=cfg.to_dict())


@torch.no_grad()
def sample_text(model: Llama, tokenizer: Any, n_tokens: int, device: torch.device) -> str:
    """Greedy continuation of SAMPLE_PROMPT after <|endoftext|> (deterministic)."""
    from strata.train.tokenizer import eot_id

    model.eval()
    ids = [eot_id(tokenizer), *tokenizer.encode(SAMPLE_PROMPT).ids]
    for _ in range(n_tokens):
        window = torch.tensor([ids[-model.cfg.ctx:]], device=device)
        logits, _ = model(window)
        ids.append(int(logits[0, -1].argmax()))
    return tokenizer.decode(ids[1:])


def export(model: Llama, tokenizer: Any, folder: Path) -> dict[str, str]:
    from strata.train.export import export_gguf, export_hf

    cpu = model.to("cpu").float()
    hf = export_hf(cpu, cpu.cfg, tokenizer, folder / "hf")
    gguf = export_gguf(cpu, cpu.cfg, tokenizer, folder / "model.gguf")
    return {"hf": str(hf), "gguf": str(gguf)}


def follow_up_commands(gguf: str, ctx: int, val_text: Path) -> list[str]:
    """`strata bench` and `strata quality` for the new model, at sizes its context holds."""
    q = " ".join(_quote(x) for x in (gguf,))
    return [f"strata bench {q} -p {ctx // 2} -n {max(ctx // 4, 1)}",
            f"strata quality {q} --ctx {ctx} --text {_quote(str(val_text))}"]


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


# -- the run ----------------------------------------------------------------------------------


@dataclass
class TrainResult:
    run_id: int
    folder: Path | None
    completed: bool  # False: stopped by Ctrl-C after a checkpoint
    step: int
    steps: int
    params: int
    tokens_per_s: float | None  # this session: tokens / training seconds
    mfu: float | None
    peak_basis: str
    val_loss: float | None
    bits_per_byte: float | None
    train_s: float  # this session's training time (steps only)
    ops: dict[str, dict[str, str]]
    outputs: dict[str, str] = field(default_factory=dict)
    sample: str | None = None
    commands: list[str] = field(default_factory=list)


def _threads(cfg: TrainConfig, world: ddp.World) -> int:
    """Size torch's team and the lab kernels' OpenMP team (hardware/threads.py): --threads,
    or the cores shared out between the ranks of one host, or the one default. libgomp's count
    is per thread: set here, on the thread that runs the steps and their backward."""
    import os

    from strata.hardware.threads import set_threads

    n = cfg.threads or (max(1, (os.cpu_count() or 1) // world.size) if world.parallel else None)
    return set_threads(n)


def _prepare(cfg: TrainConfig, world: ddp.World, store: TrainRecorder | None,
             resumed: Resumed | None, docs: list[Any] | None) -> tuple[int, Path | None, Corpus]:
    """Rank 0 opens the record and writes the text files; the others read them from the
    folder rank 0 names (one host, or a folder every node sees)."""
    run_id, folder = 0, None
    if world.main:
        run_id = store.open(cfg) if store else 0
        from strata.paths import home_dir

        folder = resumed.folder if resumed else cfg.out or home_dir() / "train" / f"run-{run_id}"
        folder.mkdir(parents=True, exist_ok=True)
        corpus = open_corpus(resumed.folder) if resumed else build_corpus(cfg, docs or [],
                                                                           folder)
    if world.parallel:
        import torch.distributed as dist

        shared = [str(folder) if folder else None, run_id]
        dist.broadcast_object_list(shared, src=0)
        if not world.main:
            run_id, corpus = int(shared[1]), open_corpus(Path(str(shared[0])))
            folder = None  # only rank 0 writes
    return run_id, folder, corpus


def train(cfg: TrainConfig, ops: Ops, progress: Progress, store: TrainRecorder | None,
          resumed: Resumed | None = None, peak: tuple[float | None, str] = (None, ""),
          world: ddp.World | None = None, docs: list[Any] | None = None) -> TrainResult:
    """Train (or continue) one run; see the module docstring for what it writes. `docs`:
    the corpus if already loaded (the CLI loads it first, so bad --data fails early)."""
    world = world or ddp.world_from_env()
    device = ddp.device_for(world, check(cfg))
    if docs is None and not resumed:
        docs = load_documents(cfg)
    ddp.init(world, device)
    _threads(cfg, world)
    loop = None
    try:
        run_id, folder, corpus = _prepare(cfg, world, store, resumed, docs)
        loop = make_loop(cfg, corpus, ops, device, world, folder, peak[0] if world.main else None)
        loop.run_id = run_id
        if resumed:
            loop.restore(resumed.checkpoint)
        result = _train(cfg, loop, corpus, progress, store if world.main else None, resumed,
                        peak[1], served_by(ops))
    except BaseException as exc:
        if store and store.run_id:  # a second Ctrl-C (no checkpoint) leaves it incomplete
            store.finish("incomplete" if isinstance(exc, KeyboardInterrupt) else "failed")
        raise
    finally:
        # DDP's reducer holds gloo work objects: free it while the group is still alive
        # (freed later, at interpreter exit, it crashed a rank with SIGABRT).
        loop = None
        gc.collect()
        ddp.shutdown(world)
    return result


def _row(cfg: TrainConfig, loop: Loop, corpus: Corpus, ops: dict, peak_basis: str,
         resumed: Resumed | None) -> Any:
    from strata.store.training import TrainRow

    return TrainRow(run_id=loop.run_id, preset=cfg.preset.name,
                    model=asdict(loop.model.cfg), params=param_count(loop.model),
                    data={"sources": [str(p) for p in cfg.data] if cfg.data else "embedded",
                          **corpus.info},
                    device=str(loop.device), dtype=cfg.dtype, kernels=cfg.kernels, ops=ops,
                    world_size=loop.world.size, steps=cfg.preset.steps,
                    out_dir=str(loop.folder), step=loop.step, tokens_seen=loop.tokens_seen,
                    peak_gflops=loop.peak_flops / 1e9 if loop.peak_flops else None,
                    peak_basis=peak_basis,
                    outputs={"tokenizer": str(loop.folder / "tokenizer.json")},
                    resumed_from=resumed.run_id or None if resumed else None)


def _train(cfg: TrainConfig, loop: Loop, corpus: Corpus, progress: Progress,
           store: TrainRecorder | None, resumed: Resumed | None, peak_basis: str,
           ops: dict[str, dict[str, str]]) -> TrainResult:
    if store:
        store.begin(_row(cfg, loop, corpus, ops, peak_basis, resumed), loop.history)
    start_step, start_s = loop.step, loop.elapsed_s
    completed = loop.run(progress, store or Quiet())
    seconds = loop.elapsed_s - start_s
    tps = (loop.step - start_step) * loop.tokens_per_step / seconds if seconds > 0 else None
    val = loop.history.val[-1] if loop.history.val else None
    result = TrainResult(
        run_id=loop.run_id, folder=loop.folder, completed=completed, step=loop.step,
        steps=cfg.preset.steps, params=param_count(loop.model), tokens_per_s=tps,
        mfu=tps * loop.flops_per_token / loop.peak_flops if tps and loop.peak_flops else None,
        peak_basis=peak_basis, val_loss=val[1] if val else None,
        bits_per_byte=val[2] if val else None, train_s=seconds, ops=ops)
    if completed and loop.world.main and loop.folder is not None:
        result.sample = sample_text(loop.model, corpus.tokenizer, cfg.sample_tokens,
                                    loop.device)
        if cfg.export:
            result.outputs = export(loop.model, corpus.tokenizer, loop.folder)
            result.commands = follow_up_commands(result.outputs["gguf"], loop.model.cfg.ctx,
                                                 loop.folder / "val.txt")
    if store:
        row = store.row
        row.tokens_per_s, row.mfu, row.sample = result.tokens_per_s, result.mfu, result.sample
        row.outputs.update(result.outputs)
        row.step, row.tokens_seen = loop.step, loop.tokens_seen
        store.finish("complete" if completed else "incomplete")
    return result
