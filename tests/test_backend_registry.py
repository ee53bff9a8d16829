"""The backend registry: descriptors are the one place a backend is declared, and every list
strata shows (names, model forms, fit rules, quality scorers, CLI help) is derived from them."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import strata.backends as backends_mod
import strata.backends.descriptors as descriptors_pkg
from strata.backends import ACCEPTS, BACKENDS, create, describe, names, registry
from strata.backends.base import LOAD_FIELDS, BackendDescriptor, LoadConfig, RunRequest
from strata.commands.bench_options import backend_help, choose_backends
from strata.errors import InputError
from strata.fit.backends import backend_rules, fit_rules
from strata.quality.scorers import backend_choices

TOY = '''
from __future__ import annotations

import time

from strata.backends.base import BackendDescriptor, LoadConfig, RunRequest, RunTrace


class ToyBackend:
    """Echoes a fixed vocabulary; enough to run a real request through the contract."""

    name = "toy"

    def load(self, model, config: LoadConfig) -> None:
        self.threads = config.threads

    def run(self, request: RunRequest) -> RunTrace:
        start = time.perf_counter_ns()
        trace = RunTrace(len(request.prompt_tokens), request.n_gen, start,
                         time.perf_counter_ns())
        for _ in range(request.n_gen):
            trace.token_ns.append(time.perf_counter_ns())
        return trace

    def random_tokens(self, n: int, seed: int) -> list[int]:
        return [(seed + i) % 7 + 1 for i in range(n)]

    def bos(self) -> int | None:
        return None

    def info(self) -> dict:
        return {"threads": self.threads}

    def close(self) -> None:
        pass


DESCRIPTOR = BackendDescriptor(
    name="toy", factory=f"{__name__}:ToyBackend", accepts=("endpoint",),
    help="a toy for the registry test", order=99, options=("threads",),
    device=lambda _config: "cpu")
'''


def test_registry_reproduces_the_lists_it_replaced() -> None:
    # the literals that lived in backends/__init__, fit/backends, report/fit_table and
    # quality/scorers before the descriptors: same names, same order, same values — plus
    # lab and ring, which run only when named (never part of auto/both)
    assert BACKENDS == {"llamacpp": "strata.backends.llamacpp:LlamaCppBackend",
                        "torch": "strata.backends.torch_backend:TorchBackend",
                        "lab": "strata.backends.lab:LabBackend",
                        "openai": "strata.backends.openai:OpenAIBackend",
                        "ring": "strata.backends.ring:RingBackend"}
    assert list(ACCEPTS.items()) == [("llamacpp", ("gguf",)), ("torch", ("hf", "gguf")),
                                     ("lab", ("gguf",)), ("openai", ("endpoint",)),
                                     ("ring", ("gguf",))]
    assert names(fit=True) == ("llamacpp", "torch", "lab")
    assert list(fit_rules()) == ["llamacpp", "torch", "lab"]
    assert backend_rules("llamacpp").layer_split and not backend_rules("torch").layer_split
    assert backend_choices() == {"auto": ("llamacpp", "torch"), "llamacpp": ("llamacpp",),
                                 "torch": ("torch",), "lab": ("lab",),
                                 "both": ("llamacpp", "torch")}
    with pytest.raises(InputError, match="fit plans for llamacpp, torch, lab"):
        backend_rules("openai")


def test_descriptors_declare_real_load_options_and_devices() -> None:
    for desc in registry().values():
        assert set(desc.options) <= set(LOAD_FIELDS), desc.name
    assert describe("llamacpp").device(LoadConfig(n_gpu_layers=99)) == "cuda:0"
    assert describe("llamacpp").device(LoadConfig()) == "cpu"
    assert "kv_type" in describe("llamacpp").options
    assert "kv_type" not in describe("torch").options
    with pytest.raises(ValueError, match="unknown LoadConfig fields"):
        BackendDescriptor(name="bad", factory="x:y", accepts=(), help="", options=("ngl",),
                          device=lambda _c: "cpu")
    with pytest.raises(InputError, match="unknown backend"):
        describe("nope")


@pytest.fixture
def toy_registered(tmp_path: Path) -> Iterator[None]:
    """A new backend as a plugin would add it: one descriptor file on the package's path."""
    (tmp_path / "toy.py").write_text(textwrap.dedent(TOY))
    descriptors_pkg.__path__.append(str(tmp_path))
    registry.cache_clear()
    try:
        yield
    finally:
        descriptors_pkg.__path__.remove(str(tmp_path))
        registry.cache_clear()


def test_one_new_file_adds_a_backend_everywhere(toy_registered: None) -> None:
    assert list(registry())[-1] == "toy"
    # read through the module: a name imported before the toy was added is a snapshot
    assert backends_mod.ACCEPTS["toy"] == ("endpoint",)
    assert "toy (a toy for the registry test)" in backend_help()
    assert choose_backends("auto", ["http://127.0.0.1:1/v1"]) == ["openai", "toy"]
    assert choose_backends("toy", ["x.gguf"]) == ["toy"]
    assert "toy" not in names(fit=True) and "toy" not in backend_choices()
    backend = create("toy")
    backend.load(None, LoadConfig(threads=2))  # type: ignore[arg-type]
    trace = backend.run(RunRequest((), (1, 2, 3), 4))
    assert len(trace.token_ns) == 4 and backend.info() == {"threads": 2}
    assert trace.n_prompt == 3 and trace.token_ns == sorted(trace.token_ns)


def test_the_toy_is_gone_after_the_fixture() -> None:
    assert "toy" not in registry()
    with pytest.raises(InputError, match="--backend toy"):
        choose_backends("toy", ["x.gguf"])
