"""`fit_model`: will this model fit on each device of a host, and how fast would it run there.

Works from metadata alone (a ResolvedModel's spec: GGUF header, HF config + safetensors
headers, or a synthetic preset's tensor plan); nothing is loaded, written or materialised.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from strata.errors import InputError
from strata.fit import experts
from strata.fit.backends import (
    BACKENDS,
    DEVICE_KINDS,
    BackendRules,
    FitSection,
    Runtime,
    backend_rules,
)
from strata.fit.memory import MOE_FFN_TEXT, Shape, rules_text
from strata.fit.predict import EtaHistory, Prediction, predict, tests_for
from strata.fit.verdict import (
    FITS,
    MAX_CTX,
    NO,
    PARTIAL,
    Budget,
    Case,
    DeviceFit,
    budgets,
    evaluate,
)
from strata.fit.weights import QuantSpec
from strata.hardware.profile import HostProfile
from strata.measure.roofline import Roofline
from strata.models.source import ResolvedModel
from strata.models.spec import ModelSpec

DEFAULT_CTX = 4096


@dataclass(frozen=True)
class FitOptions:
    ctx: int = DEFAULT_CTX
    batch: int = 1
    kv_type: str | None = None  # None: the backend's default (llama.cpp f16; torch its dtype)
    backend: str = "llamacpp"
    swa_full: bool = False  # llama.cpp --swa-full: sliding-window layers keep the full context
    flash_attn: bool | None = None  # llama.cpp -fa (None: bench's -fa 0, or a quantised KV's)

    def __post_init__(self) -> None:
        if not 1 <= self.ctx <= MAX_CTX:
            raise InputError(f"--ctx {self.ctx}: must be between 1 and {MAX_CTX:,} tokens")
        if self.batch < 1:
            raise InputError(f"-np {self.batch}: must be at least 1 (parallel sequences)")
        rules = backend_rules(self.backend)
        if self.kv_type is not None and rules.kv_types and self.kv_type not in rules.kv_types:
            raise InputError(f"--kv-type {self.kv_type}: choose one of "
                             f"{', '.join(rules.kv_types)}")

    @property
    def rules(self) -> BackendRules:
        return BACKENDS[self.backend]


@dataclass
class QuantWeights:
    quant: str
    weight_bytes: int
    exact: bool


@dataclass
class FitReport:
    model: dict[str, Any]
    options: FitOptions
    host: str
    rows: list[DeviceFit]
    quants: list[QuantWeights]
    predictions: list[Prediction] = field(default_factory=list)
    prediction_absent: list[str] = field(default_factory=list)  # why a prediction is missing
    rules: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fingerprint: str | None = None
    sections: list[FitSection] = field(default_factory=list)  # the backend's own (rules.sections)

    def row(self, device: str) -> DeviceFit:
        return next(r for r in self.rows if r.budget.device == device)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "options": asdict(self.options), "host": self.host,
                "fingerprint": self.fingerprint, "devices": [r.to_dict() for r in self.rows],
                "quantisations": [asdict(q) for q in self.quants],
                "predictions": [p.to_dict() for p in self.predictions],
                "prediction_absent": self.prediction_absent, "rules": self.rules,
                "notes": self.notes, "sections": [s.to_dict() for s in self.sections]}

    def to_json(self) -> dict[str, Any]:
        """`strata fit -o json`: everything, in the output vocabulary (docs/output.md).
        (to_dict is the internal form the HTML report reads.)"""
        o = self.options
        return {"model": _model_json(self.model),
                "options": {"n_ctx": o.ctx, "n_parallel": o.batch, "kv_type": o.kv_type,
                            "backend": o.backend},
                "host": self.host, "fingerprint": self.fingerprint,
                "devices": [_device_json(r) for r in self.rows],
                "quantisations": [asdict(q) for q in self.quants],
                "predictions": [p.to_json() for p in self.predictions],
                "prediction_absent": self.prediction_absent, "rules": self.rules,
                "notes": self.notes, "sections": [s.to_dict() for s in self.sections]}

    def records(self) -> list[dict[str, Any]]:
        """One flat record per device (fit's -o jsonl/csv/md): memory, verdict, -ngl, the
        largest context and the predicted pp/tg t/s of bench's default tests there."""
        head = {"model_filename": self.model["ref"], "backend": self.options.backend,
                "n_ctx": self.options.ctx, "n_parallel": self.options.batch,
                "type_k": self.model["kv_type"], "type_v": self.model["kv_type"]}
        return [{**head, **_device_json(r), **self._predicted(r.budget.device)}
                for r in self.rows]

    def to_records(self) -> list[dict[str, Any]]:
        """records(), by the name every API result uses (strata.frame)."""
        return self.records()

    def to_pandas(self) -> Any:
        from strata.frame import to_pandas

        return to_pandas(self.records())

    def _repr_html_(self) -> str:
        from strata.frame import html_table

        o = self.options
        title = (f"strata fit · {self.model['ref']} · {o.backend} · ctx {o.ctx:,} x "
                 f"batch {o.batch}")
        return html_table(self.records(), FIT_COLUMNS, title)

    def _predicted(self, device: str) -> dict[str, float | None]:
        mine = [p for p in self.predictions if p.device == device and "@" not in p.test]
        by_phase = {p.phase: p.tps for p in mine}
        return {"predicted_prefill_ts": by_phase.get("prefill"),
                "predicted_decode_ts": by_phase.get("decode")}


# the table's columns, by their record field names (docs/output.md): -o md and notebooks
FIT_COLUMNS = ("model_filename", "backend", "device", "name", "weights_bytes", "kv_bytes",
               "total_bytes", "available_bytes", "verdict", "n_gpu_layers", "max_ctx",
               "predicted_prefill_ts", "predicted_decode_ts")
MODEL_FIELDS = {"ref": "model_filename", "params": "model_n_params",
                "weight_bytes": "model_size"}  # internal name -> output name (llama-bench's)


def _model_json(model: dict[str, Any]) -> dict[str, Any]:
    out = {MODEL_FIELDS.get(k, k): v for k, v in model.items() if k != "kv_type"}
    return {**out, "type_k": model["kv_type"], "type_v": model["kv_type"]}


def _memory_json(prefix: str, mem: dict[str, int] | None) -> dict[str, int | None]:
    keys = ("weights", "kv", "buffers", "overhead", "total")
    return {f"{prefix}{k}_bytes": (mem or {}).get(k) for k in keys}


def _device_json(row: DeviceFit) -> dict[str, Any]:
    """A device row, flat: bytes as *_bytes, -ngl as n_gpu_layers; `host_*_bytes` is the RAM
    a GPU row also needs (None on the CPU's own row)."""
    d = row.to_dict()
    placement = d.pop("placement")
    d.pop("expert_offload")
    out = {"device": d.pop("device"), "kind": d.pop("kind"), "name": d.pop("name"),
           "available_bytes": d.pop("available"), "available_basis": d.pop("available_basis"),
           "verdict": d.pop("verdict"), "verdict_text": d.pop("verdict_text"),
           "reason": d.pop("reason"), "n_layers": d.pop("n_layers"),
           "n_gpu_layers": placement["ngl"], "blocks_on_device": placement["blocks"],
           "output_layer_on_device": placement["output_layer"],
           **_memory_json("", placement["device"]), **_memory_json("host_", placement["host"])}
    return {**out, **d, **_offload_json(row)}  # + max_ctx, max_ctx_is_model_limit,
    # quants_that_fit, notes, then the expert offload


def _offload_json(row: DeviceFit) -> dict[str, Any]:
    """The expert-offload placement of a GPU row (all None where there is none: a dense
    model, a model the GPU holds whole, the CPU's row)."""
    eo = row.expert_offload
    decode = [p for p in eo.predictions if "@" not in p.test] if eo else []
    return {"expert_offload": eo.flags if eo else None,
            "expert_offload_fits": eo.fits if eo else None,
            "expert_offload_total_bytes": eo.device.total if eo else None,
            "expert_offload_host_total_bytes": eo.host.total if eo else None,
            "expert_offload_predicted_decode_ts": decode[0].tps if decode else None}


def _model_summary(model: ResolvedModel, rt: Runtime) -> dict[str, Any]:
    s = rt.spec
    return {"ref": model.ref, "kind": model.kind, "arch": s.arch, "params": s.params(),
            "weight_bytes": s.weight_bytes(), "dtype": s.main_dtype(), "quant": s.quant_label(),
            "bytes_by_type": s.bytes_by_type(), "n_layers": s.n_layers,
            "n_heads": s.n_heads, "n_kv_heads": s.n_kv_heads, "head_dim": s.head_dim,
            "hidden": s.hidden, "ffn": s.ffn, "vocab": s.vocab, "ctx_max": s.ctx_max,
            "kv_type": rt.kv_type, "runtime_dtype": rt.runtime_dtype}


def _shape(options: FitOptions, kv_type: str, spec: ModelSpec) -> Shape:
    rule, full = options.rules.window_cells, options.swa_full
    window = (lambda s: rule(spec, s, full)) if rule and spec.windowed_layers() else None
    return Shape(ctx=options.ctx, batch=options.batch, kv_type=kv_type, fa=options.flash_attn,
                 # bench's batches
                 window_rule=window)


def _device_row(model: ResolvedModel, host: HostProfile, options: FitOptions,
                budget: Budget, ram: Budget) -> tuple[DeviceFit, Runtime, list[QuantSpec]]:
    rules = options.rules
    rt = rules.runtime(model, host, budget.kind, options.kv_type)
    case = Case(rt.spec, _shape(options, rt.kv_type, rt.spec), rules)
    quants = [rules.quant(model, rt, q) for q in rules.quants]
    quant_cases = {q.quant: case.with_spec(q.spec) for q in quants}
    row = evaluate(case, budget, ram, quant_cases, rt)
    if budget.kind == "gpu" and row.verdict in (PARTIAL, NO):
        row.expert_offload = experts.expert_offload(case, budget, ram)
    return row, rt, quants


def check_model(model: ResolvedModel, options: FitOptions) -> None:
    """InputError for a model the backend cannot run at all (a MoE on a dense-only one)."""
    s, rules = model.spec, options.rules
    if s is not None and s.is_moe and not rules.moe:
        raise InputError(f"MODEL {model.ref}: -B {rules.name} does not run mixture-of-experts "
                         f"models ({s.n_experts} experts, {s.n_experts_used} per token); plan "
                         "it for --backend llamacpp")
    from strata.backends import describe

    check = describe(rules.name).check
    why = check(model) if check is not None and s is not None else None
    if why:  # no plan for what cannot run: no "fits", no predicted t/s
        raise InputError(f"MODEL {model.ref}: cannot run on -B {rules.name}: {why}")


def fit_model(model: ResolvedModel, host: HostProfile, options: FitOptions,
              roofline: Roofline | None = None, history: EtaHistory | None = None,
              fingerprint: str | None = None) -> FitReport:
    """Memory, verdict, largest context and fitting quantisations per device of `host`, and
    predicted t/s where `roofline` measures a device the model fits on whole."""
    if model.spec is None:
        raise InputError(f"MODEL {model.ref}: fit works from a model's metadata; an endpoint "
                         "has none (give a .gguf file, a Hugging Face directory or "
                         "synthetic:<preset>)")
    check_model(model, options)
    devices = budgets(host)
    ram = devices[0]  # the CPU's: where whatever a GPU does not hold must fit
    rows, runtimes, quants = [], {}, []
    for budget in devices:
        row, rt, q = _device_row(model, host, options, budget, ram)
        rows.append(row)
        runtimes[budget.device] = rt
        quants = quants or q  # the CPU's; the same bytes on every device kind
    cpu_rt = runtimes["cpu"]
    report = FitReport(model=_model_summary(model, cpu_rt), options=options,
                       host=_host_summary(host), rows=rows,
                       quants=[QuantWeights(q.quant, q.spec.weight_bytes(), q.exact)
                               for q in quants],
                       rules=rules_text({k: options.rules.devices[k] for k in DEVICE_KINDS
                                         if any(r.budget.kind == k for r in rows)})
                       + _moe_rules(cpu_rt, rows, options),
                       notes=_notes(list(runtimes.values()), options), fingerprint=fingerprint)
    _add_predictions(report, runtimes, roofline, history or EtaHistory(options.backend))
    return report


def _moe_rules(rt: Runtime, rows: list[DeviceFit], options: FitOptions) -> list[str]:
    if not rt.spec.is_moe or not options.rules.layer_split:  # llama.cpp's rules
        return []
    offload = [experts.RULE] if any(r.expert_offload for r in rows) else []
    return [MOE_FFN_TEXT, *offload]


def _moe_note(spec: ModelSpec) -> list[str]:
    if not spec.is_moe:
        return []
    gib = 2**30
    return [f"mixture of experts: {spec.n_experts} experts per layer, {spec.n_experts_used} "
            f"per token: memory holds all of them ({spec.expert_bytes() / gib:.2f} GiB of "
            f"{spec.weight_bytes() / gib:.2f} GiB); a decoded token reads "
            f"{spec.active_weight_bytes() / gib:.2f} GiB of weights"]


def _host_summary(host: HostProfile) -> str:
    from strata.store.hosts import host_summary

    return host_summary(host)


def _notes(runtimes: list[Runtime], options: FitOptions) -> list[str]:
    notes = list(dict.fromkeys(n for rt in runtimes for n in rt.notes))  # once each, in order
    s = runtimes[0].spec
    notes += _moe_note(s)
    notes += _window_note(s, options)
    notes += _undeclared_note(s)
    if s.ctx_max and options.ctx > s.ctx_max:
        notes.append(f"--ctx {options.ctx} is beyond the model's trained context ({s.ctx_max})")
    if options.batch > 1:
        notes.append(f"-np {options.batch}: KV and logits for {options.batch} sequences of "
                     f"{options.ctx} tokens each; predictions are for one sequence")
    notes.append("plan from metadata only: no weights were loaded or written")
    return notes


def _undeclared_note(spec: ModelSpec) -> list[str]:
    """An architecture strata's engine does not declare: which figures are still exact."""
    from strata.models import arch

    if spec.source != "gguf" or arch.find(spec.arch) is not None:
        return []
    return [f"{spec.arch}: not an architecture strata's engine runs (llama.cpp may: "
            "--backend llamacpp): the weights are exact (the file's tensors), the KV cache "
            "and buffers are estimates, sized as a decoder's with these heads"]


def _window_note(spec: ModelSpec, options: FitOptions) -> list[str]:
    """How the sliding-window layers' KV cache is sized, when the model has them."""
    n = spec.windowed_layers()
    if not n:
        return []
    shape = _shape(options, options.kv_type or "f16", spec)
    cells = shape.window_cells
    held = f"{cells:,} cells each" if cells is not None else f"the full {shape.n_kv:,} cells"
    if options.swa_full:
        flag = " (--swa-full)"
    elif options.backend == "llamacpp":
        flag = " (--swa-full: the full context)"
    else:
        flag = "" if cells is not None else " (this backend keeps every position)"
    return [f"{n} of {spec.n_layers} layers see only the last {spec.sliding_window:,} "
            f"positions: their KV cache holds {held}{flag}"]


def _add_predictions(report: FitReport, runtimes: dict[str, Runtime],
                     roofline: Roofline | None, history: EtaHistory) -> None:
    if roofline is None:
        report.prediction_absent.append(
            "no measured roofline for this host: run `strata probe --measure` (or any "
            "`strata bench`, which measures it once), then fit again")
        return
    for row in report.rows:
        device = row.budget.device
        _predict_offload(report, row, runtimes[device], roofline, history)
        if row.verdict == PARTIAL:
            report.prediction_absent.append(
                f"{device}: not predicted for a partial offload (how the split's devices add "
                f"up is not modelled): bench it with -ngl {row.placement.ngl}")
        if row.verdict != FITS:
            continue
        roof = roofline.device(device)
        if roof is None:
            report.prediction_absent.append(f"{device}: this host's roofline does not measure "
                                            "it (strata probe --measure)")
            continue
        rt = runtimes[device]
        report.predictions += predict(rt.spec, roof, rt.kv_type, rt.runtime_dtype, history,
                                      report.options.ctx)


def _predict_offload(report: FitReport, row: DeviceFit, rt: Runtime, roofline: Roofline,
                     history: EtaHistory) -> None:
    eo = row.expert_offload
    if eo is None or not eo.fits:
        return
    gpu, cpu = roofline.device(row.budget.device), roofline.device("cpu")
    if gpu is None or cpu is None or not experts.predict_offload(
            eo, rt.spec, tests_for(report.options.ctx), gpu, cpu, rt.kv_type, history):
        report.prediction_absent.append(
            f"{row.budget.device}: experts on the CPU not predicted: this host's roofline "
            "lacks the GPU's or the CPU's bandwidth (strata probe --measure)")
