"""Memory a model needs on one device, by the rules of the backend that runs it.

weights   exact per-tensor bytes of the tensors the device holds
KV cache  2 · layers · kv_heads · head_dim · ctx · bytes · batch (grouped-query aware: kv_heads,
          never hidden size), split across devices in proportion to the blocks each holds;
          a sliding-window layer (gemma3's local layers) holds the cells its backend gives
          it (Shape.window_cells: llama.cpp's window_cells rule, the lab's windowed cache)
buffers   compute buffers (+ the logits buffer on the host), by a rule per backend and device
          kind, stated in its DeviceRules.text and printed with every plan
overhead  runtime state that is neither weights nor buffers (tokenizer tables, graph
          metadata, a GPU runtime context)

The llama.cpp CPU rules were fitted to what llama.cpp really allocates on this project's
development host (its logged buffer sizes and the process RSS after a full-context prefill);
tests/test_fit.py re-measures them with `python -m strata.fit.calibrate`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from strata.backends.base import LoadConfig
from strata.bench.explain import KV_BYTES
from strata.models.spec import OUTPUT, TOKEN_EMBD, ModelSpec

MiB = 2**20
CTX_PAD = 256  # llama.cpp sizes its KV cache in multiples of 256 cells
F32 = 4  # llama.cpp keeps activations, scores and logits in f32

_BLOCK = re.compile(r"^(?:blk|model\.layers)\.(\d+)\.")  # GGUF names, or HF names we do not map
_OUTPUT_GROUP = (OUTPUT, "output_norm.weight")  # what llama.cpp calls the output layer


@dataclass(frozen=True)
class Shape:
    """What a context is sized for."""

    ctx: int  # tokens per sequence
    batch: int = 1  # parallel sequences, each with its own ctx
    kv_type: str = "f16"  # K/V element type (a torch dtype name for the torch backend)
    ubatch: int = LoadConfig.ubatch  # llama.cpp n_ubatch (bench's default): tokens per graph
    n_batch: int = LoadConfig.batch  # llama.cpp n_batch (bench's default)
    # the backend's KV cells of a sliding-window layer at this shape, where it keeps fewer
    # than n_kv there (None, or a rule answering None: the full context, as any other layer)
    window_rule: Callable[[Shape], int | None] | None = field(default=None, compare=False)
    fa: bool | None = None  # llama.cpp -fa; None: implied by the KV type (below)

    @property
    def window_cells(self) -> int | None:
        return self.window_rule(self) if self.window_rule is not None else None

    @property
    def flash_attn(self) -> bool:
        # llama.cpp refuses a quantised V cache without flash attention, so a quantised KV
        # type implies it; f16 follows bench's default (-fa 0) unless `fa` says otherwise
        if self.kv_type in ("q8_0", "q4_0"):
            return True
        return bool(self.fa)

    @property
    def kv_elem_bytes(self) -> float:
        return KV_BYTES[self.kv_type]

    @property
    def n_kv(self) -> int:
        """KV cells: every sequence's context in one cache, padded as llama.cpp pads it."""
        return -(-self.ctx * self.batch // CTX_PAD) * CTX_PAD

    @property
    def n_ub(self) -> int:
        """Tokens per graph evaluation: llama.cpp clips n_ubatch to n_batch and n_batch to
        the requested context."""
        return min(self.ubatch, self.n_batch, self.ctx * self.batch)


@dataclass
class Memory:
    weights: int = 0
    kv: int = 0
    buffers: int = 0
    overhead: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.buffers + self.overhead

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


# -- which weights sit where ------------------------------------------------------------------


@dataclass(frozen=True)
class LayerBytes:
    """Weight bytes grouped the way llama.cpp places them on devices."""

    blocks: tuple[int, ...]  # per transformer block, in order
    output: int  # output layer: head + final norm (a tied head is a copy of the embedding)
    input: int  # token embedding and anything else that always stays on the CPU

    @classmethod
    def of(cls, spec: ModelSpec) -> LayerBytes:
        blocks = [0] * spec.n_layers
        output = inp = 0
        for t in spec.tensors:
            m = _BLOCK.match(t.name)
            if m and int(m.group(1)) < spec.n_layers:
                blocks[int(m.group(1))] += t.nbytes
            elif t.name in _OUTPUT_GROUP:
                output += t.nbytes
            else:
                inp += t.nbytes
        embd = spec.tensor(TOKEN_EMBD)
        if spec.tensor(OUTPUT) is None and embd is not None:
            # tied head: llama.cpp duplicates the embedding onto the output layer's device
            # (on the CPU both are one mmap, so only a GPU pays for the copy)
            output += embd.nbytes
        return cls(tuple(blocks), output, inp)


@dataclass(frozen=True)
class Share:
    """What one device holds of a model: weight bytes and how many blocks (with their KV)."""

    weights: int
    blocks: int
    output: bool  # the output layer (head, logits) runs here


def whole(spec: ModelSpec) -> Share:
    """Everything on one device (the weights as stored, a tied head counted once)."""
    return Share(spec.weight_bytes(), spec.n_layers, True)


def llamacpp_split(spec: ModelSpec, layers: LayerBytes, ngl: int) -> tuple[Share, Share]:
    """(GPU share, CPU share) for llama.cpp's -ngl.

    llama.cpp counts L + 1 offloadable layers, the output layer last: -ngl N puts layers
    [L + 1 - N, L] on the GPU, so -ngl 1 offloads only the output layer and -ngl L + 1 is full
    offload. The token embedding always stays on the CPU.
    """
    n = spec.n_layers
    start = max(n + 1 - ngl, 0)
    on_gpu = range(start, n)
    gpu_blocks = sum(layers.blocks[i] for i in on_gpu)
    output_on_gpu = ngl >= 1
    gpu = Share(gpu_blocks + (layers.output if output_on_gpu else 0), len(on_gpu), output_on_gpu)
    cpu_output = 0 if output_on_gpu else _cpu_output_bytes(spec, layers)
    cpu = Share(layers.input + sum(layers.blocks[:start]) + cpu_output, n - len(on_gpu),
                not output_on_gpu)
    return gpu, cpu


def _cpu_output_bytes(spec: ModelSpec, layers: LayerBytes) -> int:
    """The output layer on the CPU: a tied head reads the embedding already counted."""
    embd = spec.tensor(TOKEN_EMBD)
    tied_copy = embd.nbytes if spec.tensor(OUTPUT) is None and embd is not None else 0
    return layers.output - tied_copy


# -- rules ------------------------------------------------------------------------------------

BufferRule = Callable[[ModelSpec, Shape, Share], int]
OverheadRule = Callable[[ModelSpec], int]


@dataclass(frozen=True)
class DeviceRules:
    buffers: BufferRule
    overhead: OverheadRule
    text: tuple[str, ...]  # the rules in words, printed with every plan
    measured: bool  # checked against real allocations (False: a stated prior)


def kv_bytes(spec: ModelSpec, shape: Shape, blocks: int) -> int:
    """KV cache of `blocks` of the model's layers (grouped-query aware via n_kv_heads): the
    full context on every layer, the window's cells on the sliding-window ones (shared in
    proportion, like the blocks)."""
    if not spec.n_layers:
        return 0
    window = shape.window_cells
    windowed = spec.windowed_layers() if window is not None else 0
    cells = (spec.n_layers - windowed) * shape.n_kv + windowed * (window or 0)
    return int(spec.kv_bytes(1, shape.kv_elem_bytes) * cells / spec.n_layers
               * blocks / spec.n_layers)


def llamacpp_window_cells(spec: ModelSpec, shape: Shape, swa_full: bool) -> int | None:
    """llama.cpp's SWA cache (llama_kv_cache_iswa): the window of every sequence plus one
    ubatch, padded to 256 cells, never more than the full cache; --swa-full keeps the full
    size. Read off llama.cpp's own log ("creating SWA KV cache, size = N cells") for n_swa
    16 at contexts 40, 1000 and 3000 and ubatch 64 to 512 (tests/test_fit_windows.py)."""
    if not spec.sliding_window or swa_full:
        return None
    cells = spec.sliding_window * shape.batch + shape.n_ub
    return min(shape.n_kv, -(-cells // CTX_PAD) * CTX_PAD)


def memory(spec: ModelSpec, shape: Shape, share: Share, rules: DeviceRules) -> Memory:
    return Memory(weights=share.weights, kv=kv_bytes(spec, shape, share.blocks),
                  buffers=rules.buffers(spec, shape, share), overhead=rules.overhead(spec))


def ffn_per_token(spec: ModelSpec) -> int:
    """Bytes per ubatch token of one layer's FFN intermediates (f32).

    Dense: the gate and up projections (2·ffn). Mixture of experts, as llama.cpp's
    build_moe_ffn builds it: the router's logits and probabilities (n_experts each), the gate
    and up projections of every expert the token is sent to (2·n_used·expert_ffn) and each
    of those experts' down projection before the weighted sum (n_used·hidden)."""
    if not spec.is_moe:
        return F32 * 2 * spec.ffn
    used = spec.n_experts_used
    return F32 * (2 * spec.n_experts + 2 * used * spec.expert_ffn + used * spec.hidden)


MOE_FFN_TEXT = ("with experts the FFN term 8·ffn becomes 4·(2·n_experts + 2·n_used·expert_ffn + "
                "n_used·hidden) B per token (router logits and probabilities, gate and up of "
                "each expert used, their down outputs before the weighted sum: llama.cpp's "
                "MoE graph); a rule, not checked against real allocations")


def _attention_per_token(spec: ModelSpec, shape: Shape) -> int:
    """Bytes per ubatch token live at the attention/FFN peak of one layer."""
    if shape.flash_attn:  # tiled: no score matrix, only an f16 mask
        return 2 * shape.n_kv + ffn_per_token(spec)
    # f32 scores for every head + f32 mask + the FFN's intermediates
    return F32 * spec.n_heads * shape.n_kv + F32 * shape.n_kv + ffn_per_token(spec)


def llamacpp_reserved(spec: ModelSpec, shape: Shape, _share: Share) -> int:
    """The compute buffer llama.cpp reserves: the worst-case graph of one ubatch, which asks
    logits for every token. A GPU allocates all of it."""
    per_token = max(F32 * spec.vocab, _attention_per_token(spec, shape))
    return shape.n_ub * (per_token + F32 * 3 * spec.hidden)


def llamacpp_cpu_resident(spec: ModelSpec, shape: Shape, share: Share) -> int:
    """What a CPU process really touches of its compute buffer while generating, + logits.

    A prompt asks logits for its last token only, so the vocab-wide rows of the reservation
    are never written (untouched pages cost no RAM). Without flash attention the CPU converts
    softmax(KQ) to f16 for the KQ·V product against the f16 V cache (a work buffer).
    """
    logits = F32 * spec.vocab * shape.batch  # llama.cpp's output buffer: one row per sequence
    if not share.blocks:  # full offload: only the embedded inputs are staged on the host
        return shape.n_ub * F32 * spec.hidden + logits
    convert = 0 if shape.flash_attn else 2 * spec.n_heads * shape.n_kv
    per_token = _attention_per_token(spec, shape) + convert + F32 * 3 * spec.hidden
    return shape.n_ub * per_token + logits


def llamacpp_cpu_overhead(spec: ModelSpec) -> int:
    """The RSS left over after weights, KV and buffers: token tables (~70 B per vocab entry:
    llama.cpp's vocabulary and the bench backend's list of token ids), graph metadata
    (~0.2 MiB per layer), context and thread-pool state (3.5 MiB)."""
    return int(3.5 * MiB + 0.2 * MiB * spec.n_layers + 70 * spec.vocab)


GPU_RUNTIME_PRIOR = 512 * MiB  # CUDA/ROCm context + BLAS handles per GPU: a prior, see text


def gpu_runtime_overhead(_spec: ModelSpec) -> int:
    return GPU_RUNTIME_PRIOR


def torch_activations(spec: ModelSpec, shape: Shape, share: Share) -> int:
    """One forward over the whole prompt (torch does not split it into ubatches): the residual,
    attention output and FFN intermediates of one layer at a time, a bool causal mask, and the
    last token's f32 logits."""
    if not share.blocks:
        return 0
    elem = shape.kv_elem_bytes  # the model's dtype: torch keeps K/V in it
    tokens = shape.ctx * shape.batch
    return int(tokens * elem * (4 * spec.hidden + 2 * spec.ffn) + shape.ctx ** 2 * shape.batch
               + F32 * spec.vocab * shape.batch)


TORCH_CPU_OVERHEAD = 100 * MiB  # transformers' modelling code and state: RSS of a 0.5 MB model


def torch_overhead(_spec: ModelSpec) -> int:
    return TORCH_CPU_OVERHEAD


LLAMACPP_CPU = DeviceRules(
    llamacpp_cpu_resident, llamacpp_cpu_overhead,
    ("llama.cpp CPU buffers = n_ubatch x [4·n_heads·n_kv (f32 KQ scores) + 2·n_heads·n_kv (their "
     "f16 copy for KQ·V) + 4·n_kv (mask) + 8·ffn + 12·hidden] B + 4·vocab·batch B (logits); with "
     "flash attention (implied by a quantised KV) the score terms drop and the mask is f16. "
     "Only what generation touches: llama.cpp reserves more (the all-logits worst case) but "
     "untouched pages cost no RAM",
     "llama.cpp CPU overhead = 3.5 MiB + 0.2 MiB/layer + 70 B/vocab token (token tables, graph "
     "metadata, threads)",
     "n_kv = ctx x batch padded to 256; n_ubatch = min(512, ctx x batch) (bench defaults)"),
    measured=True)

LLAMACPP_GPU = DeviceRules(
    llamacpp_reserved, gpu_runtime_overhead,
    ("llama.cpp GPU buffers = n_ubatch x [max(4·vocab, 4·n_heads·n_kv + 4·n_kv + 8·ffn) + "
     "12·hidden] B: the compute buffer llama.cpp reserves (checked against its own log on a "
     "CPU; a GPU allocates the same graph in full)",
     f"GPU runtime overhead = {GPU_RUNTIME_PRIOR // MiB} MiB per GPU (CUDA/ROCm context, BLAS "
     "handles): a prior, not measured on this host"),
    measured=False)

TORCH_CPU = DeviceRules(
    torch_activations, torch_overhead,
    ("torch buffers = ctx x batch x dtype bytes x (4·hidden + 2·ffn) + ctx² x batch (bool "
     "causal mask) + 4·vocab·batch: one forward over the whole prompt; a rule, not checked "
     "against real allocations",
     f"torch CPU overhead = {TORCH_CPU_OVERHEAD // MiB} MiB (transformers' modelling code; "
     "measured once: RSS growth when loading a 0.5 MB model)"),
    measured=False)

TORCH_GPU = DeviceRules(
    torch_activations, gpu_runtime_overhead,
    (TORCH_CPU.text[0],
     f"GPU runtime overhead = {GPU_RUNTIME_PRIOR // MiB} MiB per GPU (CUDA/ROCm context): a "
     "prior, not measured on this host"),
    measured=False)


def rules_text(rules: dict[str, DeviceRules]) -> list[str]:
    seen: list[str] = []
    for r in rules.values():
        seen += [t for t in r.text if t not in seen]
    return seen
