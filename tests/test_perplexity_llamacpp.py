"""`strata quality`'s perplexity is llama-perplexity's (tools/perplexity/perplexity.cpp,
perplexity()), token for token.

The expected value is computed here from raw llama.cpp logits (llama-cpp-python's Llama with
logits_all), never through strata's quality code, following perplexity.cpp step by step:
  tokens = common_tokenize(ctx, text, add_special=true)   # BOS first when the vocab adds one
  chunk i = tokens[i*n_ctx:(i+1)*n_ctx], its first token replaced by BOS when add_bos,
            decoded from an empty KV cache at positions 0..n_ctx-1
  NLL over positions j = n_ctx/2 .. n_ctx-2: -log softmax(logits[j])[tokens[i*n_ctx + j + 1]]
  PPL = exp(mean NLL)
The model is a converter-style GGUF with a BPE tokenizer (tests/test_gguf_torch.py): its
tokenisation is llama.cpp's own, not strata's synthetic one.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llamacpp extra) not installed")
pytest.importorskip("gguf")

from strata.quality import QualityConfig, prepare, run_quality
from tests.test_gguf_torch import quiet_stderr, write_converter_gguf

CTX = 64
CHUNKS = 3
RTOL = 1e-6


def corpus(path: Path) -> Path:
    from pydoc_data.topics import topics

    path.write_text(topics["assert"] + topics["assignment"], encoding="utf-8")
    return path


def llama_perplexity(model: Path, text: str, n_ctx: int, max_chunks: int,
                     shift_like_before: bool = False) -> tuple[float, list[int]]:
    """(PPL, tokens) as perplexity.cpp computes them, from llama.cpp's logits.

    shift_like_before: strata's old convention (text tokenised without BOS, then the first
    token of every chunk overwritten by BOS) — to show the test tells the two apart."""
    import llama_cpp

    with quiet_stderr():
        llm = llama_cpp.Llama(model_path=str(model), n_ctx=n_ctx, n_batch=n_ctx,
                              logits_all=True, n_threads=2, verbose=False)
    try:
        add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(
            llm.model)))
        bos = llm.token_bos()
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=not shift_like_before,
                              special=False)
        nll: list[float] = []
        for i in range(min(max_chunks, len(tokens) // n_ctx)):
            start = i * n_ctx
            batch = tokens[start:start + n_ctx]
            if add_bos:
                batch[0] = bos
            llm.reset()  # empty KV cache: every chunk stands alone
            llm.eval(batch)
            logits = np.array(llm.scores[:n_ctx], dtype=np.float64)
            for j in range(n_ctx // 2, n_ctx - 1):
                row = logits[j]
                top = row.max()
                log_z = top + math.log(np.exp(row - top).sum())
                nll.append(log_z - row[tokens[start + j + 1]])
        return math.exp(sum(nll) / len(nll)), tokens
    finally:
        llm.close()


@pytest.mark.parametrize("add_bos", [True, False], ids=["add-bos", "no-bos"])
def test_perplexity_is_llama_perplexitys(tmp_path: Path, add_bos: bool,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    model = write_converter_gguf(tmp_path / "llama.gguf", "Q8_0", add_bos=add_bos).path
    text = corpus(tmp_path / "text.txt")
    prepared = prepare(QualityConfig(str(model), text=text, ctx=CTX, backend="llamacpp",
                                     max_chunks=CHUNKS))
    got = run_quality(prepared, "llamacpp").to_dict()
    want, tokens = llama_perplexity(model, text.read_text("utf-8"), CTX, CHUNKS)
    before, _ = llama_perplexity(model, text.read_text("utf-8"), CTX, CHUNKS,
                                 shift_like_before=True)
    with capsys.disabled():
        print(f"\n{'add_bos' if add_bos else 'no bos'}: strata PPL {got['ppl']:.8f}, "
              f"llama-perplexity's {want:.8f} (rel {abs(got['ppl'] - want) / want:.1e}); "
              f"old convention {before:.8f} ({(before - want) / want:+.2%})")
    assert prepared.plan.tokens.ids.tolist() == tokens  # the same ids, BOS included
    assert got["n_tokens"] == CHUNKS * (CTX - 1 - CTX // 2)
    assert got["ppl"] == pytest.approx(want, rel=RTOL)
    if add_bos:  # the shifted chunks are another measurement, visibly so
        assert abs(before - want) / want > 100 * RTOL
    else:
        assert before == pytest.approx(want, rel=RTOL)  # no BOS: nothing to shift


def test_chunk_zero_keeps_the_real_bos_and_later_chunks_lose_their_first_token(
        tmp_path: Path) -> None:
    model = write_converter_gguf(tmp_path / "llama.gguf").path
    prepared = prepare(QualityConfig(str(model), text=corpus(tmp_path / "t.txt"), ctx=CTX,
                                     backend="llamacpp", max_chunks=CHUNKS))
    plan, ids = prepared.plan, prepared.plan.tokens.ids.tolist()
    bos = plan.tokens.bos
    assert bos is not None and ids[0] == bos and bos not in ids[1:]
    assert plan.inputs(0) == ids[:CTX]  # the real BOS, then the first CTX - 1 text tokens
    assert plan.inputs(1) == [bos, *ids[CTX + 1:2 * CTX]]
    assert plan.targets(1).tolist() == ids[CTX + CTX // 2 + 1:2 * CTX]
