"""strata.train's model and data: the Llama over TorchOps against real transformers'
LlamaForCausalLM with the same weights (logits, loss, every gradient), the default corpus,
the split, the byte-level BPE, the token files and the batches."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from strata.errors import InputError  # noqa: E402
from strata.train import data as data_mod  # noqa: E402
from strata.train.data import (  # noqa: E402
    Batches,
    Document,
    TokenStore,
    default_corpus,
    encode_documents,
    load_corpus,
    split_documents,
)
from strata.train.model import Llama, flops_per_token, param_count  # noqa: E402
from strata.train.ops_torch import TorchOps  # noqa: E402
from strata.train.presets import PRESETS, ModelConfig  # noqa: E402
from strata.train.tokenizer import (  # noqa: E402
    EOT,
    load_tokenizer,
    merges,
    save_tokenizer,
    train_tokenizer,
)
from tests.test_gguf_torch import Shape, hf_weights  # noqa: E402

MIXED = ("The `with` statement: x = f(3.14159) + 42;\n\tcafé naïve 日本語 — “quotes” 🙂\n"
         "def add(a, b):\n    return a + b  # 2024-05-09, 0x1F, 1_000_000\n\n\n  end ")


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny matrices: one thread is faster, and two spinning threads on a busy 2-core machine
    were measured 20x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pydoc_docs(n: int = 30) -> list[Document]:
    from pydoc_data.topics import topics

    return [Document(k, topics[k]) for k in sorted(topics)[:n]]


# -- the model against transformers --------------------------------------------------------------


def model_pair(tied: bool) -> tuple[Llama, object, ModelConfig]:
    """Our Llama and transformers' with the same peaked random weights (test_gguf_torch's:
    position-dependent attention and sharp distributions, so a wrong rotation would show)."""
    s = Shape()
    vocab = 300
    cfg = ModelConfig(vocab=vocab, hidden=s.hidden, ffn=s.ffn, n_layers=s.n_layers,
                      n_heads=s.n_heads, n_kv_heads=s.n_kv_heads, ctx=48,
                      rope_theta=s.rope_theta, eps=s.eps, tied=tied)
    weights = {k: torch.from_numpy(v) for k, v in hf_weights(s, vocab, tied).items()}
    ours = Llama(cfg, TorchOps())
    missing = ours.load_state_dict(weights, strict=False).missing_keys
    assert missing == (["lm_head.weight"] if tied else [])
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=s.hidden, intermediate_size=s.ffn,
        num_hidden_layers=s.n_layers, num_attention_heads=s.n_heads,
        num_key_value_heads=s.n_kv_heads, rms_norm_eps=s.eps, rope_theta=s.rope_theta,
        tie_word_embeddings=tied, max_position_embeddings=cfg.ctx)
    theirs = transformers.LlamaForCausalLM(config)
    theirs.load_state_dict(weights, strict=False)
    if tied:
        theirs.tie_weights()
    return ours, theirs, cfg


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_model_equals_transformers_llama(tied: bool, capsys: pytest.CaptureFixture[str]) -> None:
    ours, theirs, cfg = model_pair(tied)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab, (2, cfg.ctx), generator=gen)
    targets = torch.randint(0, cfg.vocab, (2, cfg.ctx), generator=gen)
    logits, loss = ours(ids, targets)
    ref = theirs(ids).logits
    ref_loss = torch.nn.functional.cross_entropy(ref.reshape(-1, cfg.vocab), targets.reshape(-1))
    loss.backward()
    ref_loss.backward()
    theirs_params = dict(theirs.named_parameters())
    grad_err = max((p.grad - theirs_params[n].grad).abs().max().item() /
                   theirs_params[n].grad.abs().max().item() for n, p in ours.named_parameters())
    err = (logits - ref).abs().max().item()
    with capsys.disabled():
        print(f"\nmodel vs LlamaForCausalLM ({'tied' if tied else 'untied'}): max |logit diff| "
              f"{err:.1e} (logit SD {ref.std().item():.2f}), loss {loss.item():.6f} vs "
              f"{ref_loss.item():.6f}, max relative gradient diff {grad_err:.1e}")
    assert ref.std() > 1.0, "flat logits would prove little"
    assert err <= 1e-4  # float32 rounding of the same graph
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    assert grad_err <= 1e-4
    assert {n for n, _ in ours.named_parameters()} <= set(theirs_params)


def test_param_count_and_flops() -> None:
    ours, theirs, _ = model_pair(tied=True)
    assert param_count(ours) == theirs.num_parameters() == sum(
        p.numel() for p in theirs.parameters())
    tiny = PRESETS["tiny"].model
    # hand count: embedding, 4 x (q, k, v, o, gate, up, down, 2 norms), final norm
    per_layer = 128 * 128 * 2 + 128 * 64 * 2 + 3 * 128 * 384 + 2 * 128
    assert param_count(Llama(tiny, TorchOps())) == 1024 * 128 + 4 * per_layer + 128 == 918_656
    matmul = 4 * (per_layer - 256) + 1024 * 128  # the tied head multiplies; norms do not
    assert flops_per_token(tiny) == 6 * matmul + 12 * 4 * 128 * 128


def test_presets_are_consistent() -> None:
    assert {"tiny", "small", "test"} <= set(PRESETS)
    tiny = PRESETS["tiny"]
    assert (tiny.model.hidden, tiny.model.n_layers, tiny.model.n_heads, tiny.model.n_kv_heads,
            tiny.model.ctx, tiny.model.vocab, tiny.batch) == (128, 4, 4, 2, 128, 1024, 16)
    with pytest.raises(ValueError):
        dataclasses.replace(tiny.model, n_kv_heads=3)
    with pytest.raises(ValueError, match="exceed"):
        Llama(PRESETS["test"].model, TorchOps())(torch.zeros(1, 33, dtype=torch.long))


# -- corpus and split ----------------------------------------------------------------------------


def test_default_corpus_is_deterministic_offline_prose() -> None:
    data_mod._default_corpus.cache_clear()
    first = default_corpus()  # one build (~5 s of ast parsing): its order is what must hold
    first[0].text = "changed"  # callers get copies: the cached corpus stays as built
    assert default_corpus()[0].text != "changed"
    names = [d.name for d in first]
    topics = [n for n in names if n.startswith("pydoc/")]
    assert names == topics + sorted(set(names) - set(topics)) and topics == sorted(topics)
    assert len(set(names)) == len(names)
    size = sum(len(d.text.encode()) for d in first)
    assert 1_500_000 < size < 2_500_000, size
    assert names[0].startswith("pydoc/") and "stdlib/json/__init__.py" in names
    assert not [n for n in names if {"test", "idlelib", "site-packages", "encodings"}
                & set(n.split("/")[1:-1])]
    assert "JSON (JavaScript Object Notation)" in first[names.index("stdlib/json/__init__.py")].text


def test_load_corpus_files_and_folders(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("first text\n", encoding="utf-8")
    (tmp_path / "sub" / "b.md").write_text("second text\n", encoding="utf-8")
    (tmp_path / "sub" / "blob.bin").write_bytes(b"\xff\xfe\x00binary")  # skipped in a folder
    (tmp_path / ".hidden.txt").write_text("skipped\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    docs = load_corpus([tmp_path])
    assert [Path(d.name).name for d in docs] == ["a.txt", "b.md"]
    assert load_corpus([tmp_path / "a.txt"])[0].text == "first text\n"
    with pytest.raises(InputError, match="no such file"):
        load_corpus([tmp_path / "missing"])
    with pytest.raises(InputError, match="UTF-8"):
        load_corpus([tmp_path / "sub" / "blob.bin"])  # named: must be readable
    (tmp_path / "void").mkdir()
    with pytest.raises(InputError, match="no non-empty"):
        load_corpus([tmp_path / "void"])


def test_split_by_document_is_seeded_and_hashed() -> None:
    docs = [Document(f"d{i}", f"text number {i}\n" * 3) for i in range(60)]
    a, b, c = split_documents(docs), split_documents(docs), split_documents(docs, seed=1)
    assert [d.name for d in a.val] == [d.name for d in b.val] and a.hashes == b.hashes
    assert [d.name for d in a.val] != [d.name for d in c.val]
    assert len(a.val) == 3 and len(a.train) == 57
    assert {d.name for d in a.train} | {d.name for d in a.val} == {d.name for d in docs}
    assert not {d.name for d in a.train} & {d.name for d in a.val}
    changed = [*docs[:-1], Document("d59", "other")]
    assert split_documents(changed).hashes["corpus"] != a.hashes["corpus"]
    one = split_documents([Document("only", "line one\nline two\nline three\n" * 20)])
    assert len(one.train) == len(one.val) == 1 and one.val[0].text
    with pytest.raises(InputError):
        split_documents(docs, val_fraction=1.5)


# -- tokenizer, token files, batches -------------------------------------------------------------


def test_tokenizer_byte_level_bpe(tmp_path: Path) -> None:
    docs = pydoc_docs()
    tok = train_tokenizer(docs, 400)
    assert tok.get_vocab_size() == 400 and tok.token_to_id(EOT) == 0
    ids = tok.encode(MIXED).ids
    assert tok.decode(ids) == MIXED  # byte level: every string round-trips
    assert len(ids) < len(MIXED.encode()), "no merges applied"
    again = load_tokenizer(save_tokenizer(tok, tmp_path / "tok" / "tokenizer.json"))
    assert again.encode(MIXED).ids == ids
    assert merges(train_tokenizer(docs, 400)) == merges(tok)  # deterministic training
    with pytest.raises(InputError):
        train_tokenizer(docs, 100)
    (tmp_path / "bad.json").write_text("{}", encoding="utf-8")
    with pytest.raises(InputError):
        load_tokenizer(tmp_path / "bad.json")


def test_token_store_round_trip(tmp_path: Path) -> None:
    docs = pydoc_docs(12)
    split = split_documents(docs, val_fraction=0.2)
    tok = train_tokenizer(split.train, 300)
    store = TokenStore.build(tmp_path / "tokens", split, tok)
    again = TokenStore.open(tmp_path / "tokens")
    assert again.train.dtype == np.uint16 and isinstance(again.train, np.memmap)
    assert np.array_equal(again.train, encode_documents(split.train, tok))
    assert np.array_equal(again.val, store.val) and again.val[0] == tok.token_to_id(EOT)
    assert (np.asarray(again.val) == 0).sum() == len(split.val)  # one EOT per document
    assert again.meta["val_bytes"] == sum(len(d.text.encode()) for d in split.val)
    assert again.meta["hashes"] == split.hashes
    assert 1.0 < again.bytes_per_token("train") < 8.0
    with pytest.raises(InputError):
        TokenStore.open(tmp_path / "nothing")


def test_batches_reproducible_resumable_and_sharded() -> None:
    tokens = np.arange(10_000, dtype=np.uint16)
    a = Batches(tokens, batch=4, ctx=16, seed=7)
    first = [a.next() for _ in range(3)]
    x, y = first[0]
    assert x.shape == (4, 16) and x.dtype == torch.int64 and torch.equal(x[:, 1:] + 0, y[:, :-1])
    assert torch.equal(y, x + 1)  # consecutive tokens: y is x shifted by one
    state = a.state()
    after = a.next()
    b = Batches(tokens, batch=4, ctx=16, seed=7)
    b.restore(state)
    assert torch.equal(b.next()[0], after[0])
    assert not torch.equal(Batches(tokens, 4, 16, seed=8).next()[0], x)
    ranks = [Batches(tokens, 2, 16, seed=7, rank=r, world=2).next()[0] for r in range(2)]
    assert torch.equal(torch.cat(ranks), x)  # two ranks of 2 = one process of 4
    with pytest.raises(InputError):
        Batches(tokens[:10], 4, 16)
    with pytest.raises(InputError):
        b.restore({"seed": 1, "position": 0})
