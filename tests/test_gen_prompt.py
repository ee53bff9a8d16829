"""The generation prompt (kernels/gen/prompt.py + templates/) and skills, on a real Host and
Session over a seeded STRATA_HOME, recorded probes of GPUs that are not here, and the
templates as files."""

from __future__ import annotations

import inspect
import json
import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from strata.errors import InputError
from strata.hardware.profile import HostProfile
from strata.host import Host
from strata.kernels.bench import WRONG_AT_SHAPE
from strata.kernels.gen.prompt import (
    TEMPLATES,
    build_prompt,
    feedback_prompt,
    hardware_dialect,
    target_for,
    template_hash,
    worked_example,
)
from strata.kernels.gen.records import STATUSES
from strata.kernels.impl import builtin_implementations
from strata.kernels.registry import EAGER, baselines
from strata.kernels.service import Session
from strata.kernels.skills import load_skill, skill_hash, write_skill_folder
from strata.kernels.spec import get_spec
from strata.measure.roofline import DeviceRoofline, Figure, Roofline
from strata.store import open_db
from strata.store.kernels import KernelResult, save_kernel_results
from tests.seed_host import SEEDED_ROOFLINE, seed_host

ROOT = Path(__file__).parent.parent
PROBES = Path(__file__).parent / "fixtures" / "probes"


@pytest.fixture
def s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Session:
    """This host's real Session over a fresh STRATA_HOME seeded with its roofline."""
    from strata.kernels.service import session

    home = tmp_path / "home"
    monkeypatch.setenv("STRATA_HOME", str(home))
    seed_host(home)
    return session(conn=open_db(home / "strata.db"))


def _roof(s: Session) -> Roofline:
    return s.host.roofline(Console(quiet=True))  # the stored (seeded) one: nothing measured


def _doc_signatures(dialect_heading: str) -> dict[str, str]:
    """entry -> signature with whitespace collapsed, from docs/kernels-abi.md's code block."""
    doc = (ROOT / "docs" / "kernels-abi.md").read_text()
    section = doc.split(f"## Dialect `{dialect_heading}`", 1)[1].split("\n## ", 1)[0]
    block = section.split("```c", 1)[1].split("```", 1)[0]
    sigs = [" ".join(part.split()) + ";" for part in block.split(";") if "strata_" in part]
    return {re.search(r"(strata_\w+)\(", sig).group(1): sig for sig in sigs}


def _impl(op: str, name: str):
    return next(i for i in builtin_implementations() if i.op == op and i.name == name)


def _store(s: Session, op: str, name: str, shape: dict[str, int], median_s: float, *,
           verified: bool = True, flags: tuple[str, ...] = (), speedup: float = 1.0) -> None:
    h = baselines(op)[0].content_hash() if name == EAGER else _impl(op, name).content_hash()
    rows = [KernelResult(op, name, h, "verify", "pass", "cpu", "float32",
                         {"ok": True, "cases": 15})] if verified else []
    rows.append(KernelResult(op, name, h, "bench", "ok", "cpu", "float32",
                             {"median_s": median_s, "speedup_eager": speedup,
                              "flags": list(flags)}, shape=shape))
    save_kernel_results(s.conn, s.fingerprint, rows)


def _largest(op: str) -> dict[str, int]:
    spec = get_spec(op)
    return max(spec.shapes["llm"], key=lambda sh: spec.bytes(sh, 4))


# -- the prompt for rmsnorm / c -----------------------------------------------------------------

def test_rmsnorm_c_prompt_carries_contract_reference_example_rules_and_hardware(s) -> None:
    prompt = build_prompt(s, "rmsnorm", "c", "cpu", _roof(s))
    system, user = (m["content"] for m in prompt.messages)
    assert [m["role"] for m in prompt.messages] == ["system", "user"]
    assert prompt.template_hash == template_hash("c") and len(prompt.template_hash) == 16
    # the exact ABI, as docs/kernels-abi.md states it
    assert _doc_signatures("c")["strata_rmsnorm"] in user
    # the tolerance numbers and formula
    tol = get_spec("rmsnorm").tolerance("float32")
    assert f"|out - ref| <= {tol.atol:g} * max(1, rms(ref)) + {tol.rtol:g} * |ref|" in user
    # the float64 reference's own source
    from strata.kernels.ops import rmsnorm

    assert inspect.getsource(rmsnorm._reference).strip().splitlines()[-1].strip() in user
    assert "float64" in user
    # ragged verification shapes with the sizes the ABI passes
    assert "rows=3 cols=7: x float32[3, 7], w float32[7] -> out float32[3, 7]; sizes (3, 7)" \
        in user
    # a worked example of ANOTHER op in the same dialect, never rmsnorm's own built-ins
    example = re.search(r"## Worked example from this lab: `(\w+)` \(`([\w.]+)`", user)
    assert example and example.group(1) != "rmsnorm"
    shown = _impl(example.group(1), example.group(2))
    assert shown.dialect == "c" and shown.source.read_text().rstrip() in user
    others = "".join(i.source.read_text() for i in builtin_implementations()
                     if i.dialect == "c" and i.op != "rmsnorm")
    for own in (i for i in builtin_implementations() if i.op == "rmsnorm"):
        distinct = [line for line in own.source.read_text().splitlines()
                    if len(line.strip()) > 30 and line not in others
                    and "strata_rmsnorm" not in line]  # the declaration and the ABI are given
        assert distinct and not [line for line in distinct if line in user]
    # the forbidden symbols (static check), the link allow-list and the sandbox
    for needle in ("pthread_*", "fork", "fopen", "dlopen", "clock_gettime", "__asm__",
                   "cblas_*", "GOMP_* (OpenMP)", "memcpy", "socket", "out_of_bounds_write"):
        assert needle in user, needle
    # the hardware dialect of this host: ISA, caches, measured roofline
    cpu = s.host.profile.cpu
    assert cpu.isa and all(flag in user for flag in cpu.isa)
    for cache in (c for c in cpu.caches if c.kind != "instruction"):
        mib = cache.size_bytes / (1 << 20)
        size = f"{mib:g} MiB" if mib >= 1 else f"{cache.size_bytes / 1024:g} KiB"
        assert f"L{cache.level}" in user and size in user, size
    triad = SEEDED_ROOFLINE.devices[0].bandwidth["triad"].value
    fp32 = SEEDED_ROOFLINE.devices[0].compute["fp32"].value
    assert f"{triad:,.0f} GB/s" in user and f"{fp32:,.0f} GFLOP/s" in user
    # the target and the reply format
    assert "## Target" in user and "roofline ceiling" in user
    decl = "// strata-kernel: op=rmsnorm dialect=c entry=strata_rmsnorm"
    assert decl in system and decl in user and "strata_rmsnorm" in system


def test_every_c_and_cuda_signature_matches_the_abi_document(s) -> None:
    from strata.kernels.gen.rules import abi_signature
    from strata.kernels.spec import all_specs

    documented = _doc_signatures("c")
    assert set(documented) == {f"strata_{op}" for op in all_specs()}
    for op in all_specs():
        assert abi_signature(op, "c") == documented[f"strata_{op}"]
    cuda = abi_signature("rmsnorm", "cuda")
    assert cuda == ('extern "C" int strata_rmsnorm(float *out, const float *x, const float '
                    '*w, int64_t rows, int64_t cols, float eps, cudaStream_t stream);')
    assert abi_signature("rmsnorm", "triton") == "def launch(out, x, w, eps) -> None:"


def test_target_is_the_best_verified_time_eager_and_the_roofline_ceiling(s) -> None:
    largest = _largest("rmsnorm")
    _store(s, "rmsnorm", EAGER, largest, 10e-6, verified=False)
    _store(s, "rmsnorm", "c.avx2", largest, 5e-6, speedup=2.0)
    _store(s, "rmsnorm", "c.naive", largest, 1e-7, flags=(WRONG_AT_SHAPE,))  # disqualified
    _store(s, "softmax", "c.avx2", largest, 1e-9)  # another op: never the target
    target = target_for(s, "rmsnorm", "c", "cpu", _roof(s))
    assert (target.best_impl, target.best_s, target.eager_s) == ("c.avx2", 5e-6, 10e-6)
    spec, dev = get_spec("rmsnorm"), SEEDED_ROOFLINE.devices[0]
    expected = max(spec.bytes(largest, 4) / (dev.peak_bandwidth_gbs() * 1e9),
                   spec.flops(largest) / (dev.peak_gflops("fp32") * 1e9))
    assert target.ceiling_s == pytest.approx(expected)
    assert len(target.shapes) == len(spec.shapes["llm"])
    user = build_prompt(s, "rmsnorm", "c", "cpu", _roof(s)).messages[1]["content"]
    assert "PyTorch eager: 10 µs" in user and "5 µs (c.avx2)" in user
    assert f"{expected * 1e6:,.3g} µs" in user


def test_target_without_benchmarks_or_roofline_says_so(s) -> None:
    target = target_for(s, "softmax", "c", "cpu", None)
    assert target.best_impl is None and target.eager_s is None and target.ceiling_s is None
    user = build_prompt(s, "softmax", "c", "cpu", None).messages[1]["content"]
    assert "not measured on this host" in user and "none verified and benchmarked" in user


def test_example_prefers_the_fastest_verified_variant_here(s) -> None:
    impl, speed = worked_example(s, "rmsnorm", "c", "cpu")
    assert impl.op != "rmsnorm" and speed is None  # nothing verified yet: a runnable file
    other = "c.naive" if impl.name != "c.naive" else "c.avx2"
    _store(s, impl.op, other, _largest(impl.op), 1e-5, speedup=1.5)
    chosen, speed = worked_example(s, "rmsnorm", "c", "cpu")
    assert (chosen.name, speed) == (other, 1.5)
    user = build_prompt(s, "rmsnorm", "c", "cpu", _roof(s)).messages[1]["content"]
    assert "verified here, 1.50x PyTorch eager" in user
    assert _impl(impl.op, other).source.read_text().rstrip() in user


def test_skill_text_goes_into_the_system_message(s) -> None:
    plain = build_prompt(s, "silu_mul", "c", "cpu", _roof(s))
    skilled = build_prompt(s, "silu_mul", "c", "cpu", _roof(s),
                           skill_text=load_skill("builtin:c").text)
    assert "## Skill" not in plain.messages[0]["content"]
    assert "several accumulators" in skilled.messages[0]["content"].lower()
    assert skilled.messages[1] == plain.messages[1]


# -- templates: files, hashed ------------------------------------------------------------------

def test_template_hash_follows_the_template_files(s, tmp_path: Path) -> None:
    copy = tmp_path / "templates"
    shutil.copytree(TEMPLATES, copy)
    assert template_hash("c", copy) == template_hash("c") == template_hash("c")
    before = build_prompt(s, "silu_mul", "c", "cpu", _roof(s), template_dir=copy)
    assert before.template_hash == template_hash("c")
    (copy / "task.md").write_text((copy / "task.md").read_text() + "\nNEW RULE 42\n")
    after = build_prompt(s, "silu_mul", "c", "cpu", _roof(s), template_dir=copy)
    assert after.template_hash != before.template_hash
    assert "NEW RULE 42" in after.messages[1]["content"]
    # a template the c conversation does not use leaves its hash alone
    triton = template_hash("triton", copy)
    (copy / "dialect_triton.md").write_text("changed $nothing\n")
    assert template_hash("c", copy) == after.template_hash
    assert template_hash("triton", copy) != triton
    (copy / "feedback.md").write_text((copy / "feedback.md").read_text() + "\n")
    assert template_hash("c", copy) != after.template_hash


def test_a_broken_template_is_a_one_line_input_error(s, tmp_path: Path) -> None:
    copy = tmp_path / "templates"
    shutil.copytree(TEMPLATES, copy)
    (copy / "system.md").write_text("uses $unknown_placeholder\n")
    with pytest.raises(InputError) as err:
        build_prompt(s, "silu_mul", "c", "cpu", None, template_dir=copy)
    assert "unknown_placeholder" in str(err.value) and "\n" not in str(err.value)
    (copy / "task.md").unlink()
    with pytest.raises(InputError, match=r"task\.md"):
        template_hash("c", copy)


@pytest.mark.parametrize("status", STATUSES)
def test_feedback_message_for_every_status(status: str) -> None:
    msg = feedback_prompt(status, "[0,3]: got 1.5, expected 2.25\n")
    assert msg["role"] == "user" and f"**{status}**" in msg["content"]
    assert "[0,3]: got 1.5, expected 2.25" in msg["content"]
    assert "$" not in msg["content"] and "## " not in msg["content"]


def test_feedback_refuses_an_unknown_status() -> None:
    with pytest.raises(ValueError, match="not one of"):
        feedback_prompt("great", "")


# -- the hardware dialect of GPUs that are not here (recorded probes) --------------------------

def _recorded_host(name: str, conn) -> Host:
    profile = HostProfile.from_dict(json.loads((PROBES / f"{name}.json").read_text()))
    return Host(conn, profile, f"recorded-{name}")


def test_gpu_hardware_text_from_a_recorded_h100_probe(s) -> None:
    host = _recorded_host("h100_torch28_cu128", s.conn)
    roof = Roofline([DeviceRoofline("cuda:0", "NVIDIA H100 80GB HBM3",
                                    bandwidth={"copy": Figure(3_012.4, "seeded: copy")},
                                    compute={"bf16": Figure(612_345.0, "seeded: bf16")})],
                    seconds=1.0)
    text = hardware_dialect(host, "cuda:0", roof)
    for needle in ("NVIDIA H100 80GB HBM3", "compute capability 9.0 (sm_90)", "132 SMs",
                   "up to 227 KiB dynamic", "3,012 GB/s", "612,345 GFLOP/s",
                   "theoretical memory bandwidth 3,352 GB/s"):
        assert needle in text, needle
    assert "not measured" in hardware_dialect(host, "cuda:0", None)
    with pytest.raises(InputError, match="cuda:3"):
        hardware_dialect(host, "cuda:3", roof)
    # a whole CUDA prompt for that host: the stream-taking ABI and its arch declared
    prompt = build_prompt(Session(host), "rmsnorm", "cuda", "cuda:0", roof)
    user = prompt.messages[1]["content"]
    assert "cudaStream_t stream);" in user and "requires=cuda,sm_90+" in user
    assert "132 SMs" in user and "op=rmsnorm dialect=cuda" in user


def test_gpu_hardware_text_from_a_recorded_rdna4_probe(s) -> None:
    host = _recorded_host("rdna4_rx9070xt_torch25_rocm62", s.conn)
    gpu = host.profile.gpus[0]
    text = hardware_dialect(host, gpu.key, None)
    assert gpu.name in text and f"gfx target {gpu.arch}" in text and "wavefront 32" in text
    assert f"{gpu.multiprocessors} CUs" in text


# -- skills ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dialect", ["c", "triton", "cuda"])
def test_builtin_skills_load_offline_with_a_stable_hash(dialect: str) -> None:
    first, again = load_skill(f"builtin:{dialect}"), load_skill(f"builtin:{dialect}")
    assert first == again and first.hash == skill_hash(first.text, first.meta)
    assert first.meta["dialect"] == dialect and first.meta["train_ops"]
    assert first.name == f"strata-{dialect}" and first.ref == f"strata-{dialect}@{first.hash}"
    assert len(first.text) > 1500


def test_skill_folder_errors_are_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "no-skill"
    empty.mkdir()
    (empty / "skill.json").write_text("{}")
    cases = [(empty, "has no SKILL.md"), (tmp_path / "missing", "not found"),
             ("builtin:fortran", "builtin:c")]
    bad_json = tmp_path / "bad"
    bad_json.mkdir()
    (bad_json / "SKILL.md").write_text("text")
    (bad_json / "skill.json").write_text("{not json")
    cases.append((bad_json, "not valid JSON"))
    for ref, needle in cases:
        with pytest.raises(InputError) as err:
            load_skill(ref)
        assert needle in str(err.value) and "\n" not in str(err.value)


def test_write_skill_folder_round_trips_and_the_hash_follows_the_text(tmp_path: Path) -> None:
    meta = {"teacher": "model-a", "train_ops": ["softmax"], "fingerprint": "abc"}
    written = write_skill_folder(tmp_path / "sk", "my-skill", "Use 4 accumulators.", meta)
    loaded = load_skill(tmp_path / "sk")
    assert loaded == written and loaded.name == "my-skill"
    assert loaded.meta == {**meta, "name": "my-skill"}
    assert load_skill(tmp_path / "sk" / "SKILL.md") == loaded  # the file itself works too
    (tmp_path / "sk" / "SKILL.md").write_text("Use 8 accumulators.\n")
    assert load_skill(tmp_path / "sk").hash != loaded.hash


def test_an_example_that_includes_a_shared_header_shows_the_header() -> None:
    """A built-in that #includes strata_simd.h (silu_mul.avx2 does) is shown with the header's
    text after it, so a model sees the helpers it may include by name."""
    from strata.kernels.gen.prompt import example_source
    from strata.kernels.impl import included_headers

    impl = _impl("silu_mul", "c.avx2")
    text = impl.source.read_text()
    headers = included_headers(text)
    assert headers, "silu_mul.avx2 no longer includes a shared header: pick another example"
    shown = example_source(impl.source)
    assert shown.startswith(text.rstrip())
    for header in headers:
        assert f'#include "{header.name}"' in shown and header.read_text().strip() in shown
    plain = _impl("silu_mul", "c.naive")
    if not included_headers(plain.source.read_text()):
        assert example_source(plain.source) == plain.source.read_text().rstrip()
