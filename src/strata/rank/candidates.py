"""What `strata rank` ranks: models as typed, the GGUF files of a folder, or every synthetic
preset; each with the backend that runs it, where it fits (strata fit) and how it loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from strata.backends.base import LoadConfig
from strata.errors import InputError
from strata.fit import FitOptions, fit_model
from strata.fit.verdict import FITS
from strata.hardware.profile import HostProfile
from strata.models.source import ResolvedModel, resolve

ENDPOINT_BACKEND = "openai"
PRESET_QUANTS = ("f32", "f16", "q8_0", "q4_0")


@dataclass
class Candidate:
    ref: str
    backend: str
    model: ResolvedModel
    load: LoadConfig = field(default_factory=LoadConfig)
    device: str | None = "cpu"  # where it runs whole; None: it fits nowhere (see `unfit`)
    unfit: str | None = None  # strata fit's reason, when it fits on no device here

    @property
    def label(self) -> str:
        return f"{self.ref} · {self.backend}"

    @property
    def is_endpoint(self) -> bool:
        return self.model.spec is None


def expand(refs: list[str], presets: bool, quant: str,
           include_test: bool = False) -> list[str]:
    """Model references: a folder that is not a Hugging Face model stands for its *.gguf
    files; --presets adds every synthetic preset of a published model at `quant` (strata's
    own test models too with `include_test`: they are not models anyone would run)."""
    out: list[str] = []
    for ref in refs:
        path = Path(ref).expanduser()
        if path.is_dir() and not (path / "config.json").exists():
            found = sorted(str(p) for p in path.glob("*.gguf"))
            if not found:
                raise InputError(f"MODEL {ref}: a folder with no .gguf files (and not a "
                                 "Hugging Face model folder)")
            out += found
        else:
            out.append(ref)
    if presets:
        if quant not in PRESET_QUANTS:
            raise InputError(f"--quant {quant}: choose one of {', '.join(PRESET_QUANTS)}")
        from strata.models.presets import preset_names

        out += [f"synthetic:{name}@{quant}" for name in preset_names(include_test)]
    if not out:
        raise InputError("nothing to rank: give MODEL… (files, a folder, endpoints) or "
                         "--presets")
    return list(dict.fromkeys(out))


def place(ref: str, backend: str, host: HostProfile, ctx: int) -> Candidate:
    """Resolve `ref` (metadata only) and find where it runs whole, as `strata fit` decides:
    the first GPU that holds it (all layers offloaded), else the CPU, else nowhere."""
    model = resolve(ref)
    if model.spec is None:  # an endpoint: the server decides where it runs
        return Candidate(ref, ENDPOINT_BACKEND, model, device=None)
    report = fit_model(model, host, FitOptions(ctx=ctx, backend=backend))
    rows = sorted(report.rows, key=lambda r: r.budget.kind == "cpu")  # GPUs first
    for row in rows:
        if row.verdict == FITS:
            return Candidate(ref, backend, model, _load(backend, row.budget.device,
                                                        row.budget.kind), row.budget.device)
    cpu = next(r for r in report.rows if r.budget.kind == "cpu")
    return Candidate(ref, backend, model, device=None,
                     unfit=f"{cpu.verdict_text}: {cpu.reason}" if cpu.reason else
                     cpu.verdict_text)


def _load(backend: str, device: str, kind: str) -> LoadConfig:
    if kind == "cpu":
        return LoadConfig()
    if backend == "llamacpp":
        return LoadConfig(n_gpu_layers=999)  # every layer, as llama-bench's -ngl 99
    return LoadConfig(device=device)
