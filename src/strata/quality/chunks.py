"""How a token stream is cut into contexts and which positions count: exactly what llama.cpp's
`tools/perplexity/perplexity.cpp` (perplexity(), no --ppl-stride) does, so strata's figures
are llama-perplexity's, token for token.

  * the tokens are the whole text's, BOS first when the vocabulary adds one (tokenizer.py);
    they are cut into consecutive, non-overlapping chunks of `ctx` tokens (the tail shorter
    than one chunk is dropped); the first `max_chunks` are used;
  * each chunk is evaluated from an empty KV cache at positions 0..ctx-1, its first token
    replaced by BOS when the model adds one (chunk 0 already starts with the real BOS; a later
    chunk loses its first text token to it, as in llama.cpp);
  * only the second half is scored: the logits at positions ctx/2 .. ctx-2 predict tokens
    ctx/2+1 .. ctx-1 — every scored token sees at least ctx/2 tokens of context, so the
    figure measures the model, not how little context the first tokens of a chunk have.
The same ids and positions are fed to every backend and to the reference model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.quality.tokenizer import Tokens

MIN_CTX = 8  # a chunk must leave several scored positions


@dataclass(frozen=True)
class ChunkPlan:
    tokens: Tokens
    ctx: int
    n_chunks: int

    @classmethod
    def of(cls, tokens: Tokens, ctx: int, max_chunks: int) -> ChunkPlan:
        return cls(tokens, ctx, min(max_chunks, len(tokens) // ctx))

    @property
    def first(self) -> int:
        """First scored position: logits from here on count."""
        return self.ctx // 2

    @property
    def scored_per_chunk(self) -> int:
        return self.ctx - 1 - self.first

    @property
    def n_scored(self) -> int:
        return self.n_chunks * self.scored_per_chunk

    def inputs(self, i: int) -> list[int]:
        """Token ids fed to the model for chunk i (BOS in place of the first, if the model
        adds one)."""
        ids = self.tokens.ids[i * self.ctx:(i + 1) * self.ctx].tolist()
        if self.tokens.bos is not None:
            ids[0] = self.tokens.bos
        return ids

    def targets(self, i: int) -> np.ndarray:
        """The tokens the scored logits predict: positions first+1 .. ctx-1 of chunk i."""
        start = i * self.ctx
        return self.tokens.ids[start + self.first + 1:start + self.ctx]
