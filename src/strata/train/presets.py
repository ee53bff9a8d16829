"""Model and training sizes, by name. Pure dataclasses: importing this loads no torch.

`tiny` is the default of `strata train`: width 128, 4 layers, 4 heads sharing 2 KV heads,
context 128, a byte-level BPE of 1024 tokens, tied head: ~0.9M parameters, measured to reach
a validation loss of ~3.6 in 1500 steps of batch 16 on two CPU cores in a few minutes
(/work/shared/RESEARCH.md, "Sizes that train on 2 CPU cores"). `test` trains in seconds and
exists for the test suite.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    vocab: int
    hidden: int
    ffn: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ctx: int
    rope_theta: float = 10000.0
    eps: float = 1e-5
    tied: bool = True

    def __post_init__(self) -> None:
        if self.hidden % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.n_heads} heads / {self.n_kv_heads} KV heads do not divide "
                             f"a width of {self.hidden}")
        if self.head_dim % 2:  # RoPE rotates pairs
            raise ValueError(f"head size {self.head_dim} is odd")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


@dataclass(frozen=True)
class TrainPreset:
    name: str
    model: ModelConfig
    batch: int  # sequences per optimizer step (before accumulation), all ranks together
    steps: int
    lr: float
    warmup: int
    weight_decay: float
    grad_clip: float
    accum: int
    eval_every: int
    eval_batches: int
    ckpt_every: int


PRESETS: dict[str, TrainPreset] = {
    "tiny": TrainPreset(
        "tiny", ModelConfig(vocab=1024, hidden=128, ffn=384, n_layers=4, n_heads=4,
                            n_kv_heads=2, ctx=128),
        batch=16, steps=1500, lr=2e-3, warmup=100, weight_decay=0.1, grad_clip=1.0, accum=1,
        eval_every=250, eval_batches=8, ckpt_every=500),
    "small": TrainPreset(
        "small", ModelConfig(vocab=4096, hidden=256, ffn=768, n_layers=6, n_heads=8,
                             n_kv_heads=4, ctx=256),
        batch=16, steps=3000, lr=1e-3, warmup=200, weight_decay=0.1, grad_clip=1.0, accum=1,
        eval_every=500, eval_batches=8, ckpt_every=1000),
    # seconds on one core: the test suite's size (vocab: 256 bytes + 1 special + 63 merges)
    "test": TrainPreset(
        "test", ModelConfig(vocab=320, hidden=32, ffn=64, n_layers=2, n_heads=4, n_kv_heads=2,
                            ctx=32),
        batch=4, steps=20, lr=1e-2, warmup=2, weight_decay=0.1, grad_clip=1.0, accum=1,
        eval_every=10, eval_batches=2, ckpt_every=10),
}
DEFAULT_PRESET = "tiny"
