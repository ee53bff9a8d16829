"""A model trained for a few steps, exported: transformers reloads the Hugging Face folder
with identical logits; real llama.cpp (llama-cpp-python) loads the GGUF, tokenizes a mixed
text to the trained tokenizer's ids and computes the same logits (F32, within 1e-3); without
the Q/K permutation it does not; `strata quality -B both` agrees on the file."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llamacpp extra) not installed")

from strata.models.gguf_torch import read_gguf_weights  # noqa: E402
from strata.train.data import Batches, Document, encode_documents  # noqa: E402
from strata.train.export import export_gguf, export_hf, permute_rows  # noqa: E402
from strata.train.model import Llama  # noqa: E402
from strata.train.ops_torch import TorchOps  # noqa: E402
from strata.train.presets import PRESETS, ModelConfig  # noqa: E402
from strata.train.tokenizer import EOT, train_tokenizer  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests.test_gguf_torch import converter_permute, llama_cpp_logits, quiet_stderr  # noqa: E402
from tests.test_train_model import MIXED  # noqa: E402

LOGIT_ATOL = 1e-3
TRAIN_TOPICS = 40  # the first pydoc topics train; the quality text comes from later ones


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny matrices: one thread is faster, and two spinning threads on a busy 2-core machine
    were measured 20x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass
class Trained:
    model: Llama
    cfg: ModelConfig
    tok: object
    eval_ids: list[int]


def topics_docs(start: int, stop: int) -> list[Document]:
    from pydoc_data.topics import topics

    return [Document(k, topics[k]) for k in sorted(topics)[start:stop]]


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def trained(request: pytest.FixtureRequest) -> Trained:
    """The `test` preset at context 64, 12 AdamW steps on pydoc topics: small enough for
    seconds, trained enough that its logits are far from flat."""
    docs = topics_docs(0, TRAIN_TOPICS)
    tok = train_tokenizer(docs, 320)
    cfg = dataclasses.replace(PRESETS["test"].model, ctx=64, tied=request.param)
    torch.manual_seed(0)
    model = Llama(cfg, TorchOps())
    model.reset_parameters(seed=0)
    batches = Batches(encode_documents(docs, tok), batch=8, ctx=cfg.ctx, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(12):
        _, loss = model(*batches.next())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    ids = [tok.token_to_id(EOT), *tok.encode(MIXED).ids]
    ids += tok.encode(topics_docs(TRAIN_TOPICS, TRAIN_TOPICS + 1)[0].text).ids
    return Trained(model, cfg, tok, ids[:cfg.ctx])


def torch_logits(t: Trained) -> np.ndarray:
    with torch.inference_mode():
        return t.model(torch.tensor([t.eval_ids]))[0][0].numpy()


def test_export_hf_reloads_with_identical_logits(trained: Trained, tmp_path: Path) -> None:
    out = export_hf(trained.model, trained.cfg, trained.tok, tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert isinstance(model, transformers.LlamaForCausalLM)
    assert model.config.tie_word_embeddings is trained.cfg.tied
    with torch.inference_mode():
        theirs = model(torch.tensor([trained.eval_ids])).logits[0].numpy()
    ours = torch_logits(trained)
    assert ours.std() > 0.5, "flat logits would prove little"
    assert np.array_equal(theirs, ours)
    fast = transformers.AutoTokenizer.from_pretrained(out)
    assert fast.encode(MIXED, add_special_tokens=False) == trained.tok.encode(MIXED).ids
    assert fast.bos_token == fast.eos_token == EOT


def test_permutation_is_llama_cpps_converters() -> None:
    """Ours against the converter's code as written (tests/test_gguf_torch.converter_permute),
    with GQA: K is permuted with the KV head count."""
    w = np.random.default_rng(0).standard_normal((2 * 8, 5))
    assert np.array_equal(permute_rows(w, 2), converter_permute(w, 4, 2))
    assert np.array_equal(permute_rows(w, 4), converter_permute(w, 4, 4))


def test_gguf_reads_back_as_the_trained_weights(trained: Trained, tmp_path: Path) -> None:
    """strata's own GGUF -> torch loader (which undoes the converter's permutation) sees the
    trained weights bit for bit, the tied head as no output.weight."""
    path = export_gguf(trained.model, trained.cfg, trained.tok, tmp_path / "m.gguf")
    read = read_gguf_weights(path)
    state = {k: v.numpy() for k, v in trained.model.state_dict().items()}
    if trained.cfg.tied:
        del state["lm_head.weight"]
    assert set(read.tensors) == set(state)
    assert all(np.array_equal(read.tensors[k], v) for k, v in state.items())
    assert read.config["tie_word_embeddings"] is trained.cfg.tied
    assert read.config["num_key_value_heads"] == trained.cfg.n_kv_heads


def test_gguf_runs_in_llama_cpp(trained: Trained, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    from llama_cpp import Llama as LlamaCpp

    path = export_gguf(trained.model, trained.cfg, trained.tok, tmp_path / "m.gguf")
    unpermuted = export_gguf(trained.model, trained.cfg, trained.tok, tmp_path / "raw.gguf",
                             permute_qk=False)
    with quiet_stderr():
        vocab = LlamaCpp(model_path=str(path), vocab_only=True, verbose=False)
        try:
            theirs_ids = vocab.tokenize(MIXED.encode(), add_bos=False, special=False)
            with_bos = vocab.tokenize(MIXED.encode(), add_bos=True, special=False)
            meta = dict(vocab.metadata)
        finally:
            vocab.close()
    ours_ids = trained.tok.encode(MIXED).ids
    assert theirs_ids == ours_ids
    assert with_bos == [trained.tok.token_to_id(EOT), *ours_ids]
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    ours = torch_logits(trained)
    err = np.abs(llama_cpp_logits(path, trained.eval_ids) - ours).max()
    wrong = np.abs(llama_cpp_logits(unpermuted, trained.eval_ids) - ours).max()
    with capsys.disabled():
        print(f"\nGGUF F32 {'tied' if trained.cfg.tied else 'untied'}: max |llama.cpp - "
              f"torch| {err:.1e}; without the Q/K permutation {wrong:.2f} (logit SD "
              f"{ours.std():.2f})")
    assert err <= LOGIT_ATOL
    # the bound above must catch a file written without the permutation, by a wide margin
    assert wrong > 20 * LOGIT_ATOL, "the permutation made no difference: the test is blind"


def test_quality_both_backends_agree(trained: Trained, tmp_path: Path, strata_home: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    if not trained.cfg.tied:
        pytest.skip("one CLI run is enough: the untied file differs only by output.weight")
    path = export_gguf(trained.model, trained.cfg, trained.tok, tmp_path / "m.gguf")
    text = tmp_path / "held-out.txt"
    text.write_text("".join(d.text for d in topics_docs(TRAIN_TOPICS, TRAIN_TOPICS + 4)),
                    encoding="utf-8")
    proc = run_cli("quality", str(path), "-B", "both", "--ctx", "64", "--max-chunks", "2",
                   "--text", str(text), "--json", home=strata_home, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    got = {r["backend"]: r for r in json.loads(proc.stdout)}
    lc, pt = got["llamacpp"], got["torch"]
    rel = abs(lc["ppl"] - pt["ppl"]) / lc["ppl"]
    with capsys.disabled():
        print(f"\nquality -B both on the trained GGUF (ctx 64, 2 chunks): PPL llamacpp "
              f"{lc['ppl']:.4f} torch {pt['ppl']:.4f} rel diff {rel:.1e}")
    assert lc["n_tokens"] == pt["n_tokens"] == 2 * 31
    assert pt["ppl"] == pytest.approx(lc["ppl"], rel=1e-4)
    assert lc["ppl"] < trained.cfg.vocab, "no better than uniform: did it train?"


@pytest.fixture(scope="module")
def lab_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One STRATA_HOME for the lab runs of this module: its kernels are verified once."""
    from tests.seed_host import seed_host

    home = tmp_path_factory.mktemp("lab-home")
    seed_host(home)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(home))
        yield home


def test_trained_gguf_runs_on_lab_kernels(trained: Trained, tmp_path: Path, lab_home: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """What strata trained, exported, runs on the lab's own inference kernels (-B lab) with
    llama.cpp's logits: the loop from training to inference closes on strata's kernels."""
    import strata.lab

    path = export_gguf(trained.model, trained.cfg, trained.tok, tmp_path / "m.gguf")
    want = llama_cpp_logits(path, trained.eval_ids)
    model = strata.lab.load(path, "cpu", n_ctx=len(trained.eval_ids), threads=1)
    with torch.inference_mode():
        got = model.prefill(trained.eval_ids, logits_from=0).numpy()
    err = float(np.abs(got - want).max())
    with capsys.disabled():
        print(f"\ntrained GGUF ({'tied' if trained.cfg.tied else 'untied'}) on -B lab: max "
              f"|lab - llama.cpp| {err:.1e} (logit SD {want.std():.2f})")
    assert want.std() > 0.5
    assert err <= 1e-4 * float(np.abs(want).max())
