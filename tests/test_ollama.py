"""`ollama:NAME[:TAG]`: a fake Ollama store laid out on disk as Ollama lays it out (manifest
JSON + content-addressed blobs, the model blob a real synthetic GGUF), read through the real
resolver and the real CLI (bench on llama.cpp, fit), and `-B openai` against a real loopback
server that answers as Ollama does (standard routes, a chat template around every prompt)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from strata.errors import InputError
from strata.models import ollama
from strata.models.ollama import ollama_url, parse_name, pulled
from strata.models.source import ResolvedModel, resolve
from tests.conftest import home_db, run_cli
from tests.seed_host import seeded_home

MODEL_LAYER = "application/vnd.ollama.image.model"
TEMPLATE = "<|user|>\n{prompt}<|end|>\n<|assistant|>\n"  # what the server wraps prompts in


def add_blob(store: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (store / "blobs").mkdir(parents=True, exist_ok=True)
    (store / "blobs" / f"sha256-{digest}").write_bytes(data)
    return f"sha256:{digest}"


def add_model(store: Path, parts: tuple[str, str, str, str], gguf: bytes,
              extra_layers: tuple[dict, ...] = ()) -> Path:
    """manifests/<registry>/<namespace>/<name>/<tag> naming a model blob (and a config and a
    template blob, as `ollama pull` leaves them)."""
    config = b'{"model_format":"gguf","model_family":"llama"}'
    layers = [{"mediaType": MODEL_LAYER, "digest": add_blob(store, gguf), "size": len(gguf)},
              {"mediaType": "application/vnd.ollama.image.template",
               "digest": add_blob(store, TEMPLATE.encode()), "size": len(TEMPLATE)},
              *extra_layers]
    manifest = {"schemaVersion": 2,
                "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                           "digest": add_blob(store, config), "size": len(config)},
                "layers": layers}
    path = store / "manifests" / Path(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(tmp_path_factory.mktemp("home")))
        src = resolve("synthetic:tiny@q8_0").path("gguf", "ollama-test")
        copy = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
        shutil.copyfile(src, copy)
        return copy


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Path:
    """tiny (library, tag latest), someone/tiny:q8 and hf.co/org/repo:Q8_0, one blob each."""
    root = tmp_path_factory.mktemp("ollama") / "models"
    data = tiny_gguf.read_bytes()
    add_model(root, ("registry.ollama.ai", "library", "tiny", "latest"), data)
    add_model(root, ("registry.ollama.ai", "someone", "tiny", "q8"), data)
    add_model(root, ("hf.co", "org", "Repo-GGUF", "Q8_0"), data,
              ({"mediaType": "application/vnd.ollama.image.adapter",
                "digest": add_blob(root, b"lora"), "size": 4},))
    return root


@pytest.fixture
def in_store(store: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    return store


# -- names and the store ---------------------------------------------------------------------


@pytest.mark.parametrize(("ref", "parts", "short"), [
    ("ollama:llama3.2", ("registry.ollama.ai", "library", "llama3.2", "latest"),
     "llama3.2:latest"),
    ("ollama:qwen2.5:0.5b", ("registry.ollama.ai", "library", "qwen2.5", "0.5b"),
     "qwen2.5:0.5b"),
    ("ollama:someone/tiny:q8", ("registry.ollama.ai", "someone", "tiny", "q8"),
     "someone/tiny:q8"),
    ("ollama:hf.co/org/Repo-GGUF:Q4_K_M", ("hf.co", "org", "Repo-GGUF", "Q4_K_M"),
     "hf.co/org/Repo-GGUF:Q4_K_M"),
    ("ollama:localhost:5000/ns/m", ("localhost:5000", "ns", "m", "latest"),
     "localhost:5000/ns/m:latest"),
])
def test_names_follow_ollamas_layout(ref: str, parts: tuple, short: str) -> None:
    name = parse_name(ref)
    assert name.parts == parts and name.short == short


@pytest.mark.parametrize("ref", ["ollama:", "ollama:../x", "ollama:a/b/c/d", "ollama:m:",
                                 "ollama:m:a/b", "ollama:.hidden"])
def test_malformed_names_are_input_errors(ref: str) -> None:
    with pytest.raises(InputError, match=r"expected ollama:NAME\[:TAG\]"):
        parse_name(ref)


def test_resolves_to_the_gguf_blob_with_a_readable_name(in_store: Path,
                                                        tiny_gguf: Path) -> None:
    model = resolve("ollama:tiny")
    blob = model.artefacts["gguf"]
    assert isinstance(blob, Path) and blob.parent == in_store / "blobs"
    assert blob.read_bytes() == tiny_gguf.read_bytes()
    assert model.ref == "ollama:tiny:latest" and model.kind == "gguf"
    assert model.spec is not None and model.spec.n_layers == resolve(str(tiny_gguf)).spec.n_layers
    # -B openai: the running Ollama server, under the name Ollama knows the model by
    assert model.endpoint == "http://127.0.0.1:11434/v1" and model.model_name == "tiny:latest"
    assert resolve("ollama:tiny", "other-name").model_name == "other-name"


def test_namespaced_and_other_registry_models(in_store: Path) -> None:
    assert resolve("ollama:someone/tiny:q8").ref == "ollama:someone/tiny:q8"
    hf = resolve("ollama:hf.co/org/repo-gguf:Q8_0")  # names are matched without case
    assert hf.model_name == "hf.co/org/repo-gguf:Q8_0"
    assert hf.spec is not None and any("LoRA adapter" in n for n in hf.spec.notes)
    assert pulled(in_store) == ["hf.co/org/Repo-GGUF:Q8_0", "someone/tiny:q8", "tiny:latest"]


@pytest.mark.parametrize(("host", "url"), [
    ("", "http://127.0.0.1:11434/v1"),
    ("0.0.0.0", "http://127.0.0.1:11434/v1"),
    ("192.168.1.5:8000", "http://192.168.1.5:8000/v1"),
    ("https://ollama.example.com", "https://ollama.example.com:443/v1"),
    ("http://[::1]:11500/proxy", "http://[::1]:11500/proxy/v1"),
])
def test_ollama_host_is_read_as_ollama_reads_it(host: str, url: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", host)
    assert ollama_url() == url


# -- clear errors ----------------------------------------------------------------------------


def test_no_store_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nowhere"))
    with pytest.raises(InputError, match="no Ollama model store .*OLLAMA_MODELS=" +
                       re.escape(str(tmp_path / "nowhere"))):
        resolve("ollama:tiny")
    # unset: the user's store, then the Linux service's (here: neither exists)
    monkeypatch.delenv("OLLAMA_MODELS")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(ollama, "SERVICE_STORE", tmp_path / "service")
    with pytest.raises(InputError) as caught:
        resolve("ollama:tiny")
    assert f"{tmp_path}/.ollama/models or {tmp_path}/service" in str(caught.value)
    assert "set OLLAMA_MODELS" in str(caught.value)


def test_not_pulled_lists_what_is(in_store: Path) -> None:
    with pytest.raises(InputError) as caught:
        resolve("ollama:llama3.2")
    message = str(caught.value)
    assert "llama3.2:latest is not in the Ollama store" in message
    assert "pulled: hf.co/org/Repo-GGUF:Q8_0, someone/tiny:q8, tiny:latest" in message
    assert "`ollama pull llama3.2:latest`" in message and "\n" not in message


@pytest.fixture
def scratch_store(tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store of one model (broken by the test), found through OLLAMA_MODELS."""
    root = tmp_path / "models"
    add_model(root, ("registry.ollama.ai", "library", "tiny", "latest"), tiny_gguf.read_bytes())
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    return root


def _manifest(store: Path) -> Path:
    return store / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"


def _model_blob(store: Path) -> Path:
    layers = json.loads(_manifest(store).read_text())["layers"]
    digest = next(la["digest"] for la in layers if la["mediaType"] == MODEL_LAYER)
    return store / "blobs" / digest.replace(":", "-")


@pytest.mark.parametrize(("content", "needle"), [
    ("{not json", "damaged: not JSON"),
    ('{"schemaVersion": 2}', "damaged: no 'layers' list"),
    ('{"layers": [{"mediaType": "application/vnd.ollama.image.template", "digest": "x"}]}',
     "damaged: no layer of mediaType application/vnd.ollama.image.model"),
    ('{"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "md5:1"}]}',
     "digest 'md5:1' is not sha256"),
], ids=["not-json", "no-layers", "no-model-layer", "bad-digest"])
def test_damaged_manifest(scratch_store: Path, content: str, needle: str) -> None:
    _manifest(scratch_store).write_text(content)
    with pytest.raises(InputError, match=needle) as caught:
        resolve("ollama:tiny")
    assert str(_manifest(scratch_store)) in str(caught.value)


def test_missing_blob(scratch_store: Path) -> None:
    blob = _model_blob(scratch_store)
    blob.unlink()
    with pytest.raises(InputError, match=f"the model blob {blob} named by .* is missing"):
        resolve("ollama:tiny")


def test_truncated_blob(scratch_store: Path) -> None:
    blob = _model_blob(scratch_store)
    blob.write_bytes(blob.read_bytes()[:1000])
    with pytest.raises(InputError, match=r"is 1000 bytes, its manifest says .*incomplete"):
        resolve("ollama:tiny")


# -- through the real CLI ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_home(tmp_path_factory, "ollama-home")


def test_cli_bench_on_llamacpp_reads_the_pulled_file(home: Path, store: Path) -> None:
    proc = run_cli("bench", "ollama:tiny", "-B", "llamacpp", "-p", "8", "-n", "4", "-r", "1",
                   "-o", "json", home=home, env={"OLLAMA_MODELS": str(store)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)
    assert {(r["backend"], r["test"]) for r in records} == {("llamacpp", "pp8"),
                                                           ("llamacpp", "tg4")}
    assert all(r["avg_ts"] > 0 and r["bytes_per_token"] > 0 for r in records)


def test_cli_fit_names_the_model(home: Path, store: Path) -> None:
    proc = run_cli("fit", "ollama:tiny", home=home, env={"OLLAMA_MODELS": str(store)},
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ollama:tiny:latest" in proc.stdout and "sha256" not in proc.stdout


def test_cli_model_not_pulled_exits_2(home: Path, store: Path) -> None:
    proc = run_cli("bench", "ollama:nothere:7b", "-B", "llamacpp", "-p", "8", "-n", "none",
                   home=home, env={"OLLAMA_MODELS": str(store)}, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(lines) == 1
    assert "nothere:7b is not in the Ollama store" in lines[0] and "tiny:latest" in lines[0]


# -- -B openai: the running Ollama server --------------------------------------------------------


@pytest.fixture(scope="module")
def ollama_server(tiny_gguf: Path) -> Iterator:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python missing")
    from tests.standard_server import standard_server

    with standard_server(tiny_gguf, model_id="tiny:latest", template=TEMPLATE,
                         ollama=True) as srv:
        yield srv


def test_cli_openai_talks_to_ollama_with_the_local_tokenizer(home: Path, store: Path,
                                                            ollama_server) -> None:
    host = ollama_server.root.removeprefix("http://")
    proc = run_cli("bench", "ollama:tiny", "-B", "openai", "-p", "64", "-n", "8", "-r", "1",
                   "-o", "json", home=home, timeout=120,
                   env={"OLLAMA_MODELS": str(store), "OLLAMA_HOST": host})
    assert proc.returncode == 0, proc.stderr
    assert {r["test"] for r in json.loads(proc.stdout)} == {"pp64", "tg8"}
    # every completion asked for the model by its Ollama name
    assert {body["model"] for body in ollama_server.requests} == {"tiny:latest"}
    conn = home_db(home)
    info = {row["test"]: json.loads(row["info"]) for row in conn.execute(
        "SELECT test, info FROM results WHERE backend = 'openai'")}
    pp = info["pp64"]
    assert pp["server"] == "ollama" and pp["model_name"] == "tiny:latest"
    assert pp["prompt_tokens_from"].startswith("local tokenizer (the GGUF of ollama:tiny")
    # the server wraps every prompt in its template (32 tokens of this vocabulary); the
    # local tokenizer cuts the rest, so the server counts exactly 64
    assert pp["prompt_calibration"]["server_tokens_per_prompt"] == 32
    assert pp["tokens"]["prompt"] == pp["tokens"]["prompt_reported"] == [64]
    assert any(n.startswith("prompt tokens: local tokenizer") for n in pp["notes"])
    assert info["tg8"]["tokens"]["generated_reported"] == [8]


def test_openai_backend_on_an_ollama_ref(in_store: Path, ollama_server,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from strata.backends.base import LoadConfig, RunRequest
    from strata.backends.openai import OpenAIBackend

    monkeypatch.setenv("OLLAMA_HOST", ollama_server.root)
    model: ResolvedModel = resolve("ollama:tiny")
    backend = OpenAIBackend(read_timeout=20)
    backend.load(model, LoadConfig())
    try:
        with pytest.raises(InputError, match="counts 32 tokens of its own"):
            backend.random_tokens(32, seed=1)  # the template alone is 32 tokens
        for n in (33, 100):
            trace = backend.run(RunRequest((), tuple(backend.random_tokens(n, seed=n)), 4))
            assert trace.n_prompt == trace.n_prompt_reported == n
            assert sum(trace.chunk_tokens) == trace.n_gen_reported == 4
        # the local vocabulary's EOS (and EOT) are biased away: the server honours it here
        assert backend.info()["logit_bias_ids"] >= 1
    finally:
        backend.close()
