"""The prompt a model gets: the op's contract, the float64 reference, one worked example from
the lab, the rules the judge enforces, this host's hardware dialect and the target to beat.

Texts live as files under templates/ (string.Template `$name` placeholders: C and CUDA
braces need no escaping); their hash goes into every Attempt so a result always names the
prompt version it came from. What fills them comes from the lab itself: rules.py (contract,
reference, static/link/sandbox rules), hardware.py (probe + roofline) and, here, the worked
example and the target (stored verifications and benchmarks of this host).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any

from strata.errors import InputError
from strata.kernels.gen.hardware import gpu_for, hardware_dialect
from strata.kernels.gen.records import STATUSES
from strata.kernels.gen.rules import (
    DTYPE,
    FENCES,
    abi_signature,
    declaration,
    entry_for,
    reference_source,
    rules_text,
    shape_lines,
    tolerance_text,
)

if TYPE_CHECKING:
    from strata.kernels.impl import Implementation
    from strata.kernels.service import Session
    from strata.kernels.spec import KernelSpec
    from strata.measure.roofline import Roofline

TEMPLATES = Path(__file__).parent / "templates"

# The worked example is another op, close enough to teach the dialect's idioms but never a
# near twin of the requested op (layernorm for rmsnorm would hand over the answer).
EXAMPLE_FOR = {"rmsnorm": ("softmax", "silu_mul"), "layernorm": ("softmax", "silu_mul"),
               "softmax": ("rmsnorm", "silu_mul"), "cross_entropy": ("softmax", "rmsnorm"),
               "silu_mul": ("rope", "rmsnorm"), "rope": ("silu_mul", "rmsnorm"),
               "matmul": ("matvec_q8_0", "softmax"), "matvec_q8_0": ("matmul", "softmax"),
               "matvec_q4_0": ("matmul", "softmax"),
               "attention": ("decode_attention", "softmax"),
               "decode_attention": ("attention", "softmax"),
               # a convolution sees another layout's convolution, then the GEMM it lowers to
               "conv2d": ("conv2d_nhwc", "matmul"), "conv2d_nhwc": ("conv2d", "matmul"),
               "conv2d_nhwc_relu": ("conv2d_nhwc", "matmul"),
               "conv1d": ("conv2d", "conv1d_causal"), "conv1d_causal": ("conv1d", "softmax"),
               "conv1d_causal_step": ("conv1d_causal", "softmax")}

# how the task names the shape set its benchmark times
BENCH_SETS = {"llm": "the `llm` set, from real model configs",
              "kernelbench": "the `kernelbench` set: KernelBench level-1 problems at batch 1"}

__all__ = ["TEMPLATES", "Prompt", "Target", "abi_signature", "build_prompt", "entry_for",
           "example_op", "feedback_prompt", "hardware_dialect", "target_for",
           "template_hash", "worked_example"]


@dataclass
class Target:
    """What the model is asked to beat, at the op's `llm` shapes or a task set's (times at
    the largest)."""

    shapes: list[str]
    best_impl: str | None
    best_s: float | None
    eager_s: float | None
    ceiling_s: float | None  # roofline ceiling time at the largest shape
    largest: str = ""
    untimed: str | None = None  # why timings mean nothing here (an interpreter), else None
    set_name: str = "llm"  # the shape set timed


@dataclass
class Prompt:
    messages: list[dict[str, str]]  # system + user
    template_hash: str  # sha256[:16] over the template files used


# -- templates ---------------------------------------------------------------------------------

def template_files(dialect: str, template_dir: Path = TEMPLATES) -> list[Path]:
    names = ("system.md", "task.md", f"dialect_{dialect}.md", "feedback.md")
    return [template_dir / n for n in names]


def template_hash(dialect: str, template_dir: Path = TEMPLATES) -> str:
    """sha256[:16] over the names and bytes of every template a conversation uses."""
    digest = hashlib.sha256()
    for path in template_files(dialect, template_dir):
        digest.update(path.name.encode() + b"\0" + _read(path).encode() + b"\0")
    return digest.hexdigest()[:16]


def _read(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except OSError as exc:
        raise InputError(f"prompt template {path}: cannot read it ({exc.strerror})") from exc


def _render(path: Path, **values: object) -> str:
    try:
        return Template(_read(path)).substitute({k: str(v) for k, v in values.items()})
    except (KeyError, ValueError) as exc:
        raise InputError(f"prompt template {path.name}: bad placeholder {exc}") from exc


# -- the worked example ------------------------------------------------------------------------

def example_op(op: str, dialect: str) -> str:
    """Another op with a built-in in `dialect`: the preferred neighbour, else any other."""
    from strata.kernels.impl import builtin_implementations
    from strata.kernels.spec import all_specs

    have = {i.op for i in builtin_implementations() if i.dialect == dialect}
    for other in (*EXAMPLE_FOR.get(op, ()), *all_specs()):
        if other != op and other in have:
            return other
    raise InputError(f"dialect {dialect}: no built-in kernel of another op to show as an "
                     "example")


def worked_example(s: Session, op: str, dialect: str, device: str) -> \
        tuple[Implementation, float | None]:
    """The example op's built-in in `dialect`: its fastest verified variant on this host,
    else a verified one, else one that runs here (vectorised before naive)."""
    from strata.kernels.dispatch import speed_of
    from strata.kernels.registry import implementations
    from strata.store.kernels import latest_bench, latest_verification

    ranked = []
    for impl in implementations(example_op(op, dialect), s.conn):
        if impl.dialect != dialect or impl.origin != "builtin":
            continue
        h = impl.content_hash()
        stored = latest_verification(s.conn, s.fingerprint, impl.op, impl.name, h, device)
        verified = stored is not None and stored.status == "pass"
        speed = speed_of(latest_bench(s.conn, s.fingerprint, impl.op, impl.name, h, device))
        fast = speed.geomean if verified and not speed.problem else None
        ranked.append(((fast is not None, fast or 0.0, verified,
                        not impl.requires.check(s.caps), not impl.name.endswith(".naive"),
                        DTYPE in impl.dtypes), impl, fast))
    ranked.sort(key=lambda r: r[0], reverse=True)
    return ranked[0][1], ranked[0][2]


# -- the target --------------------------------------------------------------------------------

def ceiling_s(spec: KernelSpec, shape: dict[str, int], device: str,
              roofline: Roofline | None, dtype: str = DTYPE) -> float | None:
    """The roofline's least time for one shape (cold caches), as the benchmark judges it."""
    from strata.bench.explain import COMPUTE_DTYPE
    from strata.kernels.bench import ELEMENT_BYTES
    from strata.kernels.plausibility import min_time_s

    dev = roofline.device(device) if roofline is not None else None
    if dev is None:
        return None
    return min_time_s(spec.bytes(shape, ELEMENT_BYTES.get(dtype, 4)), spec.flops(shape),
                      dev.peak_bandwidth_gbs(), dev.peak_gflops(COMPUTE_DTYPE.get(dtype, dtype)),
                      cold=True)


def _time_at(rows: list[Any], shape: dict[str, int]) -> float | None:
    return next((r.data.get("median_s") for r in rows if r.shape == shape), None)


def target_for(s: Session, op: str, dialect: str, device: str,
               roofline: Roofline | None, shapes: str = "llm") -> Target:
    """Eager's time, the best verified implementation's (any dialect) and the roofline
    ceiling at the largest `llm` shape, from this host's stored benchmarks."""
    from strata.kernels.dialects import get_dialect
    from strata.kernels.dispatch import speed_of
    from strata.kernels.registry import baselines, implementations
    from strata.kernels.spec import get_spec, shape_label
    from strata.store.kernels import latest_bench, latest_verification

    spec = get_spec(op)
    set_name, shapes = shapes, spec.shape_set(shapes)
    largest = max(shapes, key=lambda sh: spec.bytes(sh, 4))
    eager = baselines(op)[0]
    eager_s = _time_at(latest_bench(s.conn, s.fingerprint, op, eager.name,
                                    eager.content_hash(), device), largest)
    best: tuple[float, str] | None = None
    for impl in implementations(op, s.conn):
        h = impl.content_hash()
        stored = latest_verification(s.conn, s.fingerprint, op, impl.name, h, device)
        rows = latest_bench(s.conn, s.fingerprint, op, impl.name, h, device)
        t = _time_at(rows, largest)
        if stored and stored.status == "pass" and t and not speed_of(rows).problem and \
                (best is None or t < best[0]):
            best = (t, impl.name)
    return Target([shape_label(sh) for sh in shapes], best[1] if best else None,
                  best[0] if best else None, eager_s, ceiling_s(spec, largest, device, roofline),
                  shape_label(largest), get_dialect(dialect).untimed_reason(device), set_name)


def _us(t: float | None) -> str:
    return f"{t * 1e6:,.3g} µs" if t is not None else "not measured yet"


def target_text(t: Target) -> str:
    if t.untimed:
        return f"Correctness only: {t.untimed}. A correct kernel is the goal here."
    best = f"{_us(t.best_s)} ({t.best_impl})" if t.best_impl else \
        "none verified and benchmarked here yet"
    return "\n".join([
        f"Timed at the `{t.set_name}` shapes: {'; '.join(t.shapes)}. At the largest "
        f"({t.largest}):",
        f"- PyTorch eager: {_us(t.eager_s)}",
        f"- fastest verified implementation on this host: {best}",
        f"- roofline ceiling (bytes at measured memory bandwidth with cold caches, FLOPs at "
        f"measured peak): {_us(t.ceiling_s)}",
        "Be correct first, then faster than both; within 10% of the ceiling is as fast as "
        "this host allows."])


def _requires(s: Session, dialect: str, device: str) -> str:
    """The requires= a kernel for this host would declare."""
    if dialect == "c":
        from strata.kernels.dialects.c import ISA_FLAGS

        return ",".join(f for f in ISA_FLAGS if f in s.caps.isa and f in ("avx2", "fma")) \
            or ""
    if dialect == "cuda":
        gpu = gpu_for(s.host, device)
        arch = gpu.arch if gpu is not None and (gpu.arch or "").startswith("sm_") else "sm_80"
        return f"cuda,{arch}+"
    return ""


# -- the prompt --------------------------------------------------------------------------------

def example_source(path: Path | None) -> str:
    """The worked example's source, followed by the shared headers it includes (a model
    sees the helpers it may #include by name, not just their names)."""
    from strata.kernels.impl import included_headers

    if path is None:
        return ""
    text = path.read_text().rstrip()
    for header in included_headers(text):
        text += (f"\n\n/* ---- {header.name}: a shared header of the lab; a C kernel may "
                 f"#include \"{header.name}\" ---- */\n" + header.read_text().rstrip())
    return text


def build_prompt(s: Session, op: str, dialect: str, device: str, roofline: Roofline | None,
                 skill_text: str | None = None, *, template_dir: Path = TEMPLATES,
                 shapes: str = "llm") -> Prompt:
    from strata.kernels.dialects import get_dialect
    from strata.kernels.spec import get_spec
    from strata.native import DEFAULT_FLAGS

    spec, d = get_spec(op), get_dialect(dialect)
    requires = _requires(s, d.name, device)
    impl, speed = worked_example(s, spec.name, d.name, device)
    how = f"verified here, {speed:.2f}x PyTorch eager" if speed else \
        "a built-in of the lab, not benchmarked on this host yet"
    common = {"entry": entry_for(spec.name, d.name), "fence": FENCES[d.name],
              "declaration": declaration(spec.name, d.name, requires)}
    skill = f"\n## Skill\n\n{skill_text.strip()}\n" if skill_text else ""
    system = _render(template_dir / "system.md", skill=skill, **common)
    user = _render(
        template_dir / "task.md", op=spec.name, dialect=d.name, device=device,
        summary=spec.summary,
        dialect_contract=_render(template_dir / f"dialect_{d.name}.md",
                                 compile_flags="cc " + " ".join(DEFAULT_FLAGS)).strip(),
        signature=abi_signature(spec.name, d.name), inputs=", ".join(spec.inputs),
        params=", ".join(f"{k}={v}" for k, v in spec.params.items()) or "none",
        verify_shapes=shape_lines(spec, spec.shape_set("verify")),
        llm_shapes=shape_lines(spec, spec.shape_set(shapes)),
        bench_set=BENCH_SETS.get(shapes, f"the `{shapes}` set"),
        tolerance=tolerance_text(spec), reference=reference_source(spec),
        example_op=impl.op, example_impl=impl.name,
        example_note=f"How the lab writes `{impl.op}` in this dialect ({how}). Same "
                     f"conventions, a different op: adapt the ideas, not the code.",
        example_source=example_source(impl.source),
        rules=rules_text(spec.name, d.name, requires),
        hardware=hardware_dialect(s.host, device, roofline),
        target=target_text(target_for(s, spec.name, d.name, device, roofline, shapes)),
        **common)
    return Prompt([{"role": "system", "content": system}, {"role": "user", "content": user}],
                  template_hash(d.name, template_dir))


def _feedback_sections(text: str) -> tuple[str, dict[str, tuple[str, str]]]:
    """feedback.md: the message template, then `## <status>` sections (meaning line, hint)."""
    head, *blocks = re.split(r"^## ", text, flags=re.M)
    sections = {}
    for block in blocks:
        status, meaning, *hint = block.strip().split("\n")
        sections[status.strip()] = (meaning.strip(), "\n".join(hint).strip())
    return head, sections


def feedback_prompt(status: str, feedback: str, *,
                    template_dir: Path = TEMPLATES) -> dict[str, str]:
    """The next user message after a judged reply: status class, the judge's text, a hint."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r}: not one of {', '.join(STATUSES)}")
    path = template_dir / "feedback.md"
    head, sections = _feedback_sections(_read(path))
    if status not in sections:
        raise InputError(f"prompt template {path.name}: no '## {status}' section")
    meaning, hint = sections[status]
    text = Template(head).safe_substitute(status=status, meaning=meaning,
                                          feedback=feedback.strip() or "(no details)",
                                          next=hint)
    return {"role": "user", "content": text.strip()}
