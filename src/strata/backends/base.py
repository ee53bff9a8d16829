"""The Backend contract: load a model once, then run timed requests against it.

A backend is one file that registers itself by name (backends/__init__.py holds the
registry). Core code never names a backend; it asks the registry.

Timing contract (docs/architecture.md §5): the backend records `time.perf_counter_ns()`
timestamps at phase boundaries, with the device synchronised, and hands them back raw in a
`RunTrace`.
Metrics are computed from traces by strata.bench.metrics, the same for every backend.
Tokenisation and sampling stay outside the timed regions for in-process backends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

from strata.models.source import ResolvedModel

if TYPE_CHECKING:  # fit imports this module; its rules are built only when fit asks
    from strata.fit.backends import BackendRules


class BackendUnavailable(Exception):
    """The backend cannot run here (missing extra, no GPU): skipped with this reason."""


@dataclass(frozen=True)
class LoadConfig:
    """Everything that needs a model (re)load when it changes; part of every stored result."""

    threads: int | None = None  # None: backend default (all physical cores)
    n_gpu_layers: int = 0  # llama.cpp -ngl
    batch: int = 2048  # llama.cpp n_batch (-b)
    ubatch: int = 512  # llama.cpp n_ubatch (-ub)
    flash_attn: bool = False
    kv_type: str = "f16"  # K cache element type: f16, f32, bf16, q8_0, q4_0 (llama.cpp -ctk)
    # V cache element type (llama.cpp -ctv), set apart from K as llama-bench does; results
    # stored before it existed set both with kv_type (store.runs reads them so)
    kv_type_v: str = "f16"
    device: str = "cpu"  # torch device: cpu, cuda, mps
    dtype: str = "auto"  # torch dtype: auto (model's own), float32, bfloat16, float16
    n_ctx: int = 0  # 0: just enough for the largest test of the sweep


LOAD_FIELDS = tuple(f.name for f in fields(LoadConfig))


@dataclass(frozen=True)
class RunRequest:
    """One timed request. Token ids are random (BOS first); EOS is never honoured."""

    depth_tokens: tuple[int, ...]  # context prefilled before timing starts (@d<D>)
    prompt_tokens: tuple[int, ...]  # timed prefill (pp<N>); may be empty for pure tg
    n_gen: int  # tokens to generate one at a time (tg<M>)


@dataclass
class RunTrace:
    """Raw timestamps of one request, in perf_counter_ns, device-synchronised.

    t_start: request start (after depth prefill, before the prompt is sent/decoded).
    t_prefill_end: prompt fully processed (logits of its last token available).
    token_ns: completion time of each generated token, in order.
    For streamed HTTP backends t_prefill_end is unknown (None) and the first token's time is
    TTFT; `chunk_tokens` says how many tokens each streamed chunk carried.
    """

    n_prompt: int
    n_gen: int
    t_start: int
    t_prefill_end: int | None
    token_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    n_prompt_reported: int | None = None  # server `usage.prompt_tokens`, when given
    n_gen_reported: int | None = None  # server `usage.completion_tokens`, when given
    internal: dict[str, float] = field(default_factory=dict)  # backend's own counters
    notes: list[str] = field(default_factory=list)  # e.g. "server ignores max_tokens"


def decode_inputs(request: RunRequest, random_ids: Callable[[int], list[int]],
                  bos: int | None) -> list[int]:
    """The token fed at each decode step (no sampling, EOS never stops it): random ids drawn
    before the clock starts, BOS first for a pure tg test, as llama-bench does."""
    ids = list(random_ids(request.n_gen)) if request.n_gen else []
    if ids and not request.prompt_tokens and bos is not None:
        ids[0] = bos
    return ids


class Backend(Protocol):
    name: str

    def load(self, model: ResolvedModel, config: LoadConfig) -> None:
        """Load weights; raise BackendUnavailable or InputError with a one-line reason."""

    def run(self, request: RunRequest) -> RunTrace:
        """Run one request and return its raw trace."""

    def random_tokens(self, n: int, seed: int) -> list[int]:
        """n random non-special token ids of the loaded model's vocabulary."""

    def bos(self) -> int | None:
        """The BOS id to put first in every prompt (None if the model has none)."""

    def info(self) -> dict[str, Any]:
        """Versions and effective settings (threads actually used, device, dtype)."""

    def close(self) -> None:
        """Free the model (before loading the next one)."""


@dataclass(frozen=True)
class Scoring:
    """How `strata quality` loads a backend to read per-position logits."""

    config: Callable[[int], LoadConfig]  # --ctx -> how to load
    form: Callable[[ResolvedModel], ResolvedModel]  # which of the model's artefacts it reads


@dataclass(frozen=True)
class BackendDescriptor:
    """Everything the rest of strata needs to know about a backend, in one record.

    Descriptors are light (no heavy imports) so the CLI can list backends without importing
    torch or llama.cpp; `factory` names the implementation, imported only by `create`.
    LoadConfig stays one flat record (it is stored with every result); `options` says which
    of its fields this backend reads, the others it ignores.
    """

    name: str
    factory: str  # "module:Class" of the implementation
    accepts: tuple[str, ...]  # model forms it consumes: gguf, hf, endpoint
    help: str  # one line for CLI help
    options: tuple[str, ...]  # LoadConfig fields this backend reads
    device: Callable[[LoadConfig], str]  # device it runs on, when the backend did not say
    order: int = 100  # position in lists and in "auto" (lower first)
    fit: Callable[[], BackendRules] | None = None  # memory rules for `strata fit`, if any
    scoring: Scoring | None = None  # how `strata quality` uses it, if it can score
    auto: bool = True  # part of `--backend auto` (bench) and `auto`/`both` (quality)
    # Whether this host's roofline explains its figures (False: the work runs elsewhere,
    # e.g. on a ring's members, so bench neither measures nor applies one for it alone).
    roofline: bool = True
    # A quick check (well under a second) that the backend can run at all, made before bench
    # spends time on the host's roofline; raises InputError with what to do.
    preflight: Callable[[], None] | None = None
    # Can it take this model (architecture, storage types), judged from the metadata alone
    # without loading anything: why not, or None (bench.checks skips a pair it refuses).
    check: Callable[[Any], str | None] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.options) - set(LOAD_FIELDS)
        if unknown:
            raise ValueError(f"backend {self.name}: unknown LoadConfig fields {sorted(unknown)}")
