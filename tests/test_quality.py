"""`strata quality` against real llama.cpp and real PyTorch/transformers (nothing of ours mocked).

Models are strata's synthetic tiny presets at f32, and re-quantisations of them written by
strata.quality.requant with gguf-py's quantisers: the same weights at f32, q8_0 and q4_0.
Random synthetic weights give near-uniform next-token distributions (logits with an SD of
~0.15), where perplexity barely moves and every argmax is a coin toss; a "sharpened" copy
(query/key and output-head weights scaled up) gives peaked distributions and position-dependent
attention, so that a wrong position, a shifted row or other weights would show.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llamacpp extra) not installed")
pytest.importorskip("transformers")

from strata.errors import InputError
from strata.models.source import resolve
from strata.models.synthetic import FIRST_TEXT_ID
from strata.quality import QualityConfig, prepare, run_quality
from strata.quality.chunks import ChunkPlan
from strata.quality.metrics import log_softmax, score_chunk
from strata.quality.requant import requantize_gguf
from strata.quality.scorers import open_scorer
from strata.quality.speed import decode_speed_ratio
from strata.quality.tokenizer import synthetic_ids
from strata.store import open_db
from strata.store.runs import StoredResult, add_result, start_run
from tests.conftest import run_cli

CTX = 64
CHUNKS = 4
PPL_RTOL = 1e-4  # llama.cpp keeps K/V in f16, torch in f32: agreement to ~1e-5 is expected
SHARPEN = {"attn_q.weight": 4.0, "attn_k.weight": 4.0, "output.weight": 10.0}


def sharpen(name: str, values: np.ndarray) -> np.ndarray:
    factor = next((f for suffix, f in SHARPEN.items() if name.endswith(suffix)), 1.0)
    return values * factor


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One STRATA_HOME for the module: the synthetic models are written once, never into the
    user's cache."""
    path = tmp_path_factory.mktemp("strata-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(path))
        yield path


@pytest.fixture(scope="module")
def quants(home: Path) -> dict[str, Path]:
    """Sharpened tiny at f32, and that exact f32 re-quantised to q8_0 and q4_0."""
    src = resolve("synthetic:tiny@f32").path("gguf", "llamacpp")
    f32 = requantize_gguf(src, home / "sharp-f32.gguf", "f32", sharpen)
    return {"f32": f32, **{q: requantize_gguf(f32, home / f"sharp-{q}.gguf", q)
                           for q in ("q8_0", "q4_0")}}


def measure(model: str, ref: str | None = None, backend: str = "llamacpp",
            **kw: object) -> dict[str, dict[str, object]]:
    prepared = prepare(QualityConfig(model, ref=ref, ctx=CTX, backend=backend,
                                     max_chunks=CHUNKS, **kw))  # type: ignore[arg-type]
    return {b: run_quality(prepared, b).to_dict() for b in prepared.backends}


# -- backend agreement -------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen2"])
def test_llamacpp_and_torch_agree_on_perplexity(home: Path, preset: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    got = measure(f"synthetic:{preset}@f32", backend="both")
    lc, pt = got["llamacpp"], got["torch"]
    with capsys.disabled():
        print(f"\n{preset}@f32 PPL llamacpp {lc['ppl']:.6f} torch {pt['ppl']:.6f} "
              f"(rel diff {abs(lc['ppl'] - pt['ppl']) / lc['ppl']:.2e})")
    assert lc["n_tokens"] == pt["n_tokens"] == CHUNKS * (CTX - 1 - CTX // 2)
    assert lc["ppl"] == pytest.approx(pt["ppl"], rel=PPL_RTOL)
    assert lc["ppl_sd"] == pytest.approx(pt["ppl_sd"], rel=1e-3)
    assert np.allclose(lc["chunk_nll"], pt["chunk_nll"], atol=1e-4)


def test_backends_agree_position_by_position_on_a_peaked_model(quants: dict[str, Path]) -> None:
    """Per-position distributions, not just their mean: KL between the backends ~ 0 and the
    same argmax everywhere, on a model whose distributions are far from uniform."""
    model = resolve(str(quants["f32"]))
    prepared = prepare(QualityConfig(str(quants["f32"]), ctx=CTX, max_chunks=2))
    plan = prepared.plan
    a, b = open_scorer("llamacpp", model, CTX), open_scorer("torch", model, CTX)
    try:
        pairs = [(a.logits(plan.inputs(i), plan.first)[:-1],
                  b.logits(plan.inputs(i), plan.first)[:-1]) for i in range(2)]
    finally:
        a.close()
        b.close()
    top_p = np.exp(log_softmax(np.concatenate([la for la, _ in pairs]))).max(axis=-1)
    assert top_p.mean() > 10 / 512, "near uniform: agreement would prove little"
    scores = [score_chunk(lt, plan.targets(i), la) for i, (la, lt) in enumerate(pairs)]
    assert max(float(s.kl.max()) for s in scores) < 1e-5  # type: ignore[union-attr]
    assert all(s.top1.all() for s in scores)  # type: ignore[union-attr]


def test_torch_scores_the_gguf_weights_not_the_synthetic_safetensors(home: Path) -> None:
    """A synthetic model's safetensors hold other random weights than its GGUF: scoring them
    would make the backends disagree. The torch scorer must read the GGUF."""
    model = resolve("synthetic:tiny@f32")
    scorer = open_scorer("torch", model, CTX)
    try:
        assert scorer.info()["weights"].startswith("GGUF F32")
    finally:
        scorer.close()


# -- KL and top-1 ------------------------------------------------------------------------


def test_kl_grows_with_coarser_quantisation(quants: dict[str, Path],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    ref = str(quants["f32"])
    q8 = measure(str(quants["q8_0"]), ref)["llamacpp"]
    q4 = measure(str(quants["q4_0"]), ref)["llamacpp"]
    with capsys.disabled():
        for name, r in (("q8_0", q8), ("q4_0", q4)):
            print(f"\n{name} vs f32 (sharpened tiny, llamacpp): PPL {r['ppl']:.3f} vs "
                  f"{r['ref_ppl']:.3f}, KL {r['kl']:.3e}, p99 {r['kl_p99']:.3e}, "
                  f"top-1 {r['top1']:.4f}")
    assert 0 < q8["kl"] < 1e-3
    assert q4["kl"] > 10 * q8["kl"]
    assert q4["top1"] < q8["top1"] <= 1.0
    assert q4["top1"] < 1.0
    assert q8["ref_ppl"] == pytest.approx(q4["ref_ppl"], rel=1e-9)  # same reference, same ids


@pytest.mark.parametrize("backend", ["llamacpp", "torch"])
def test_a_model_against_itself(quants: dict[str, Path], backend: str) -> None:
    path = str(quants["q4_0"])
    r = measure(path, path, backend=backend)[backend]
    assert r["kl"] == pytest.approx(0.0, abs=1e-12)
    assert r["kl_max"] == pytest.approx(0.0, abs=1e-12)
    assert r["top1"] == 1.0
    assert r["ppl"] == pytest.approx(r["ref_ppl"], rel=1e-12)
    assert r["delta_ppl"] == pytest.approx(0.0, abs=1e-9 * r["ppl"])


def test_requantised_file_keeps_names_metadata_and_tokenisation(quants: dict[str, Path]) -> None:
    f32, q4 = resolve(str(quants["f32"])), resolve(str(quants["q4_0"]))
    assert f32.spec is not None and q4.spec is not None
    assert [t.name for t in f32.spec.tensors] == [t.name for t in q4.spec.tensors]
    assert q4.spec.main_dtype() == "Q4_0" and f32.spec.main_dtype() == "F32"
    assert (q4.spec.vocab, q4.spec.ctx_max) == (f32.spec.vocab, f32.spec.ctx_max)
    # the file carries the synthetic marker: it tokenises like the preset it came from
    assert prepare(QualityConfig(str(quants["q4_0"]), ctx=CTX)).plan.tokens.scheme.startswith(
        "synthetic")


# -- chunks and tokens -------------------------------------------------------------------


def test_chunk_plan_scores_the_second_half_with_bos_first(home: Path) -> None:
    prepared = prepare(QualityConfig("synthetic:tiny@f32", ctx=CTX, max_chunks=3))
    plan = prepared.plan
    ids = plan.tokens.ids
    assert plan.n_chunks == 3 and plan.first == CTX // 2
    # as llama-perplexity: the text is tokenised with BOS first, so chunk 0 is BOS + the
    # first CTX - 1 text ids; a later chunk's first id is replaced by BOS
    text_ids = synthetic_ids(prepared.text.content, 512)
    assert ids[0] == 1 and ids[1:].tolist() == text_ids.tolist()
    assert plan.inputs(0) == ids[:CTX].tolist()
    assert plan.inputs(1)[0] == 1 and plan.inputs(1)[1:] == ids[CTX + 1:2 * CTX].tolist()
    assert plan.targets(1).tolist() == ids[CTX + CTX // 2 + 1:2 * CTX].tolist()
    assert ChunkPlan.of(plan.tokens, CTX, 10**9).n_chunks == len(ids) // CTX


def test_synthetic_tokens_are_deterministic_text_ids() -> None:
    ids = synthetic_ids("Aa\u00e9\u4e00", 512)
    n_text = 512 - FIRST_TEXT_ID
    assert ids.tolist() == [FIRST_TEXT_ID + cp % n_text for cp in (0x41, 0x61, 0xE9, 0x4E00)]
    assert ids.min() >= FIRST_TEXT_ID and ids.max() < 512


def test_gguf_tokenizer_is_llama_cpps(home: Path) -> None:
    """A GGUF without strata's synthetic marker is tokenised by llama.cpp: on the synthetic
    vocabulary, its CJK characters are one token each and other text falls back to bytes."""
    from strata.backends.llamacpp_vocab import tokenize_gguf
    from strata.models.synthetic import BOS_ID, text_for_tokens

    path = resolve("synthetic:tiny@f32").path("gguf", "llamacpp")
    ids, bos = tokenize_gguf(path, text_for_tokens([300, 301, 511]) + "h\u00e9")
    assert bos == BOS_ID
    assert ids == [300, 301, 511] + [3 + b for b in "h\u00e9".encode()]  # <0xNN> = 3 + NN


def test_detokenizers_invert_the_tokenizers(home: Path) -> None:
    """What ring run prints: llama.cpp's detokenizer on a GGUF's own vocabulary (CJK pieces
    and byte fallbacks back to UTF-8, BOS left out), the synthetic scheme's inverse on its
    text ids."""
    from strata.backends.llamacpp_vocab import detokenize_gguf, tokenize_gguf
    from strata.models.synthetic import BOS_ID, text_for_tokens
    from strata.quality.tokenizer import detokenize, tokenize

    path = resolve("synthetic:tiny@f32").path("gguf", "llamacpp")
    text = text_for_tokens([300, 301, 511]) + "h\u00e9"
    ids, _bos = tokenize_gguf(path, text)
    assert detokenize_gguf(path, [BOS_ID, *ids]) == text
    model = resolve("synthetic:tiny@f32")
    assert detokenize(model, list(tokenize(model, "Once upon a time").ids)) == "Once upon a time"


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def with_chat_template(src: Path, dst: Path, template: str) -> Path:
    """A copy of the GGUF at `src` with tokenizer.chat_template set (gguf-py's own
    metadata copier)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    writer = gguf.GGUFWriter(dst, arch=arch.contents(), endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(
        gguf.GGUFValueType.STRING, template)}, [])
    return dst


def test_chat_prompts_are_formatted_by_llama_cpps_template_engine(home: Path,
                                                                 tmp_path: Path) -> None:
    """--chat: one user turn through the GGUF's own template (llama.cpp recognises ChatML),
    the assistant's turn opened; its special tokens parsed, BOS first. A GGUF without a
    template, and a synthetic model, are refused in one line."""
    from strata.backends.llamacpp_vocab import chat_prompt_gguf, tokenize_gguf
    from strata.models.source import resolve
    from strata.quality.tokenizer import chat_tokens

    plain = resolve("synthetic:tiny@f32").path("gguf", "llamacpp")
    path = with_chat_template(plain, tmp_path / "chat.gguf", CHATML)
    want = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    assert chat_prompt_gguf(path, [("user", "Hi there")]) == want
    tokens = chat_tokens(resolve(str(path)), "Hi there")
    ids, bos = tokenize_gguf(path, want, special=True)
    assert tokens.ids.tolist() == [bos, *ids]
    for ref in (str(plain), "synthetic:tiny@f32"):  # strata's synthetic files have none
        with pytest.raises(InputError, match="no chat template"):
            chat_tokens(resolve(ref), "Hi")
    with pytest.raises(InputError, match="--chat needs a GGUF"):
        chat_tokens(resolve(str(resolve("synthetic:tiny@f32").path("hf", "torch"))), "Hi")


# -- bad input (in process: every message names the flag) --------------------------------


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"ctx": 4}, "--ctx 4: must be at least 8"),
    ({"ctx": 4096}, "takes at most 2048 tokens"),
    ({"max_chunks": 0}, "--max-chunks 0"),
    ({"text": Path("/nonexistent/strata.txt")}, "--text /nonexistent/strata.txt: cannot read"),
    ({"backend": "vllm"}, "--backend vllm"),
])
def test_bad_flags_are_input_errors(home: Path, kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(InputError, match=needle.replace(".", r"\.")):
        prepare(QualityConfig("synthetic:tiny@f32", **kwargs))  # type: ignore[arg-type]


def test_text_that_is_a_directory_or_not_utf8(home: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        prepare(QualityConfig("synthetic:tiny@f32", text=tmp_path))
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9 ".encode("latin-1") * 100)
    with pytest.raises(InputError, match="not UTF-8"):
        prepare(QualityConfig("synthetic:tiny@f32", text=bad))


def test_ref_with_another_vocabulary_is_refused(home: Path) -> None:
    with pytest.raises(InputError, match=r"vocabulary of 49152 tokens.*has 512"):
        prepare(QualityConfig("synthetic:tiny@f32", ref="synthetic:smollm2-135m@q8_0"))


# -- speed ratio from stored bench results -----------------------------------------------


def _bench_row(conn: sqlite3.Connection, run_id: int, model: str, test: str, n_prompt: int,
               n_gen: int, tps: float, threads: int = 2, n: int = 5,
               busy: bool = False) -> None:
    add_result(conn, run_id, StoredResult(
        model=model, backend="llamacpp", test=test, n_prompt=n_prompt, n_gen=n_gen, n_depth=0,
        load_config={"threads": threads}, metrics={"decode_tps": {"mean": tps, "n": n}},
        explain=None, telemetry={"host_load": {"busy": busy}}, info={}))


def test_speed_ratio_pairs_like_with_like(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "s.db")
    conn.execute("INSERT INTO hosts VALUES ('fp', 'h', 's', 'now', 'now', '{}')")
    run = start_run(conn, "fp", "bench", [], {})
    assert decode_speed_ratio(conn, "fp", "q4", "f16", ["llamacpp"]) is None
    _bench_row(conn, run, "q4", "tg64", 0, 64, 240.0)
    _bench_row(conn, run, "f16", "tg64", 0, 64, 100.0, threads=1)  # other settings: no pair
    _bench_row(conn, run, "f16", "pp64+tg64", 64, 64, 50.0)  # not a pure decode test
    assert decode_speed_ratio(conn, "fp", "q4", "f16", ["llamacpp"]) is None
    _bench_row(conn, run, "f16", "tg64", 0, 64, 100.0)
    ratio = decode_speed_ratio(conn, "fp", "q4", "f16", ["llamacpp"])
    assert ratio is not None and ratio.ratio == pytest.approx(2.4) and ratio.test == "tg64"
    assert ratio.caveat is None
    assert decode_speed_ratio(conn, "other-host", "q4", "f16", ["llamacpp"]) is None
    # two 2-sample runs, one on a busy host: the ratio is kept, and says why it is weak
    _bench_row(conn, run, "q4", "tg64", 0, 64, 164.0, n=2, busy=True)
    _bench_row(conn, run, "f16", "tg64", 0, 64, 100.0, n=2)
    weak = decode_speed_ratio(conn, "fp", "q4", "f16", ["llamacpp"])
    assert weak is not None and weak.caveat == "a busy host and 2 repetition(s)"
    from strata.views.quality import _speed

    line = _speed({"speed": weak.to_dict(), "model": "q4", "ref": "f16"})
    assert line == ("1.64x faster decode (llamacpp tg64; unreliable: a busy host and 2 "
                    "repetition(s))")


# -- the CLI -----------------------------------------------------------------------------


def _one_line_error(proc: object) -> str:
    err = proc.stderr.strip()  # type: ignore[attr-defined]
    assert proc.returncode == 2, (proc.stdout, err)  # type: ignore[attr-defined]
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err
    return err


def test_cli_text_shorter_than_one_context(tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("forty characters of text, not a context.", encoding="utf-8")
    proc = run_cli("quality", "synthetic:tiny@f32", "--text", str(short), "--ctx", "64",
                   home=tmp_path / "home", timeout=120)
    err = _one_line_error(proc)
    assert "41 tokens" in err and "--ctx 64" in err and "--ctx 41 or less" in err  # BOS + 40
    db = tmp_path / "home" / "strata.db"
    assert not db.exists() or "quality" not in _kinds(db)  # nothing stored


def test_cli_ref_with_another_vocabulary(tmp_path: Path) -> None:
    proc = run_cli("quality", "synthetic:tiny@f32", "--ref", "synthetic:tiny-qwen2@f32",
                   "--ctx", "8", home=tmp_path / "home", timeout=120)
    assert proc.returncode == 0, proc.stderr  # same 512-token vocabulary: allowed
    proc = run_cli("quality", "synthetic:tiny@f32", "--ref", "synthetic:qwen2.5-0.5b",
                   home=tmp_path / "home", timeout=120)
    assert "vocabulary of 151936 tokens" in _one_line_error(proc)


def _kinds(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT kind FROM measurements")]


def test_cli_stores_the_measurement_next_to_speed_results(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    model = "synthetic:tiny@f32"
    proc = run_cli("quality", model, "--ref", model, "--ctx", str(CTX), "--max-chunks", "2",
                   "--backend", "both", "--json", "--db", str(db), home=tmp_path / "home",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT m.data, h.fingerprint FROM measurements m JOIN hosts h "
                            "ON h.fingerprint = m.fingerprint WHERE kind = 'quality' "
                            "ORDER BY m.id").fetchall()
    stored = [json.loads(r[0]) for r in rows]
    assert [s["backend"] for s in stored] == ["llamacpp", "torch"] == [p["backend"]
                                                                       for p in printed]
    for s in stored:
        for key in ("model", "ref", "backend", "ctx", "n_chunks", "n_tokens", "ppl", "ppl_sd",
                    "ppl_ci95", "kl", "top1", "speed_ratio", "text", "seconds"):
            assert key in s, key
        assert (s["model"], s["ref"], s["ctx"], s["n_chunks"]) == (model, model, CTX, 2)
        assert s["n_tokens"] == 2 * (CTX - 1 - CTX // 2)
        assert s["kl"] == pytest.approx(0.0, abs=1e-12) and s["top1"] == 1.0
        assert s["speed_ratio"] is None  # nothing benched in this DB
        assert s["text"]["name"].startswith("pydoc_data.topics")
        assert len(s["text"]["sha256"]) == 64 and s["seconds"] > 0
    assert stored[0]["ppl"] == pytest.approx(stored[1]["ppl"], rel=PPL_RTOL)

    table = run_cli("quality", model, "--ref", model, "--ctx", str(CTX), "--max-chunks", "1",
                    "--db", str(db), home=tmp_path / "home", timeout=300)
    assert table.returncode == 0, table.stderr
    assert "run strata bench on both" in table.stdout and "KL 0.000000" in table.stdout
    assert len(_kinds(db)) == 3


@pytest.mark.slow
def test_default_run_time_on_smollm2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not asserted: how long the default run takes here (figure for the docs)."""
    model = "synthetic:smollm2-135m@q8_0"
    home = tmp_path / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(home))
        resolve(model).path("gguf", "llamacpp")  # writing the GGUF is not part of the run
    t0 = time.perf_counter()
    proc = run_cli("quality", model, "--json", home=home, timeout=900)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)[0]
    with capsys.disabled():
        print(f"\n`strata quality {model}` (default text, --ctx {r['n_ctx']}, "
              f"{r['n_chunks']} chunks, {r['n_tokens']} tokens scored): {seconds:.1f} s wall, "
              f"{r['time_s']:.1f} s load + scoring; PPL {r['ppl']:.1f} ± {r['ppl_sd']:.1f}")



def test_both_prints_what_it_measured_before_the_backend_that_failed(tmp_path: Path) -> None:
    """-B both on a GGUF torch cannot load (qwen3moe): llama.cpp's perplexity is printed
    (and stored), then torch's refusal, exit 2 (it used to be computed and never shown)."""
    from strata.models.source import resolve

    moe = tmp_path / "moe.gguf"
    moe.write_bytes(Path(resolve("synthetic:tiny-moe@q8_0").path("gguf", "llamacpp"))
                    .read_bytes())
    proc = run_cli("quality", str(moe), "-B", "both", "--ctx", "64", "--max-chunks", "1",
                   "-o", "json", home=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr
    [shown] = json.loads(proc.stdout)
    assert shown["backend"] == "llamacpp" and shown["ppl"] > 1
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "qwen3moe" in proc.stderr


def test_the_table_says_what_its_two_uncertainties_are(tmp_path: Path) -> None:
    """'PPL ± SD 14.99 ± 1.39' beside '95% CI 5.76..39.04' read as a contradiction: the ± is
    llama-perplexity's (standard error over tokens), the CI comes from chunk means; both are
    named, and a note says which to read."""
    proc = run_cli("quality", "synthetic:tiny@f32", "--ctx", "8", "--max-chunks", "4",
                   home=tmp_path / "home", timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = " ".join((proc.stdout + proc.stderr).split())
    assert "PPL ± (as llama.cpp)" in text and "95% CI (chunk means)" in text
    assert "PPL ±: llama-perplexity's uncertainty" in text and "the one to read" in text
