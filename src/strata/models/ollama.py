"""`ollama:NAME[:TAG]`: a model the user already pulled with Ollama, read from Ollama's store.

Ollama keeps models under `$OLLAMA_MODELS`, else `~/.ollama/models` (the Linux service's own
store is `/usr/share/ollama/.ollama/models`):

    manifests/<registry>/<namespace>/<name>/<tag>    a JSON manifest (OCI image style)
    blobs/sha256-<hex>                               content-addressed files

`llama3.2` is `registry.ollama.ai/library/llama3.2:latest`, `user/model:tag` is in the
`user` namespace, and `hf.co/org/repo:Q4_K_M` is on another registry, as Ollama lays them
out. The manifest's layer of mediaType `application/vnd.ollama.image.model` names the GGUF
blob, which is what llama.cpp, torch, fit and quality read. No request is made here: the
openai backend talks to the running Ollama server at `$OLLAMA_HOST` (default
127.0.0.1:11434) under the model's Ollama name (`llama3.2:latest`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from strata.errors import InputError
from strata.models.endpoint import normalise_url
from strata.models.gguf import has_gguf_magic, read_spec
from strata.models.source import ResolvedModel, register

PREFIX = "ollama:"
DEFAULT_REGISTRY, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
MODEL_LAYER = "application/vnd.ollama.image.model"
ADAPTER_LAYER = "application/vnd.ollama.image.adapter"
PROJECTOR_LAYER = "application/vnd.ollama.image.projector"
DEFAULT_PORT = 11434
SERVICE_STORE = Path("/usr/share/ollama/.ollama/models")  # the Linux install's service user
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(:[0-9]+)?\Z")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
SHOWN = 8  # pulled models listed in a "not pulled" error


@dataclass(frozen=True)
class OllamaName:
    registry: str
    namespace: str
    model: str
    tag: str

    @property
    def short(self) -> str:
        """The name as `ollama list` shows it and the Ollama API takes it."""
        if self.registry != DEFAULT_REGISTRY:
            head = f"{self.registry}/{self.namespace}/"
        else:
            head = "" if self.namespace == DEFAULT_NAMESPACE else f"{self.namespace}/"
        return f"{head}{self.model}:{self.tag}"

    @property
    def parts(self) -> tuple[str, str, str, str]:
        return self.registry, self.namespace, self.model, self.tag


def parse_name(ref: str) -> OllamaName:
    """`ollama:[registry/][namespace/]name[:tag]` (InputError when malformed)."""
    body = ref[len(PREFIX):].strip()
    path, tag = body, DEFAULT_TAG
    colon = body.rfind(":")
    if colon > body.rfind("/"):
        path, tag = body[:colon], body[colon + 1:]
    parts = path.split("/")
    if len(parts) == 1:
        parts = [DEFAULT_REGISTRY, DEFAULT_NAMESPACE, *parts]
    elif len(parts) == 2:
        parts = [DEFAULT_REGISTRY, *parts]
    ok = (len(parts) == 3 and _HOST.match(parts[0]) and all(map(_PART.match, parts[1:]))
          and _TAG.match(tag) and ".." not in parts)
    if not ok:
        raise InputError(f"MODEL {ref}: expected ollama:NAME[:TAG], e.g. ollama:llama3.2 or "
                         "ollama:qwen2.5:0.5b (names as `ollama list` shows them)")
    return OllamaName(parts[0], parts[1], parts[2], tag)


# -- the store ---------------------------------------------------------------------------


def store_candidates() -> list[Path]:
    """Where Ollama keeps models: $OLLAMA_MODELS when set, else the per-user store and the
    Linux service's store."""
    env = os.environ.get("OLLAMA_MODELS", "").strip()
    if env:
        return [Path(env).expanduser()]
    return [Path.home() / ".ollama" / "models", SERVICE_STORE]


def _stores(ref: str) -> list[Path]:
    found = [s for s in store_candidates() if (s / "manifests").is_dir()]
    if found:
        return found
    env = os.environ.get("OLLAMA_MODELS", "").strip()
    where = (f"OLLAMA_MODELS={env}" if env
             else " or ".join(str(p) for p in store_candidates()))
    raise InputError(f"MODEL {ref}: no Ollama model store (no manifests/ folder in {where}); "
                     "set OLLAMA_MODELS to the folder Ollama keeps its models in, or "
                     "`ollama pull` the model first")


def _child(folder: Path, name: str) -> Path | None:
    """folder/name, matched without regard to case as Ollama does when it has to."""
    exact = folder / name
    if exact.exists():
        return exact
    try:
        return next((p for p in folder.iterdir() if p.name.lower() == name.lower()), None)
    except OSError:
        return None


def _manifest(store: Path, name: OllamaName) -> Path | None:
    at: Path | None = store / "manifests"
    for part in name.parts:
        at = _child(at, part) if at is not None else None
    return at if at is not None and at.is_file() else None


def pulled(store: Path) -> list[str]:
    """Every model in a store, as `ollama list` names them."""
    root = store / "manifests"
    names = []
    for tag in root.glob("*/*/*/*"):
        if tag.is_file():
            registry, namespace, model = tag.parent.parent.parent.name, tag.parent.parent.name, \
                tag.parent.name
            names.append(OllamaName(registry, namespace, model, tag.name).short)
    return sorted(names)


def _not_pulled(ref: str, name: OllamaName, stores: list[Path]) -> InputError:
    have = [n for s in stores for n in pulled(s)]
    listed = ", ".join(have[:SHOWN]) + (f" and {len(have) - SHOWN} more" if len(have) > SHOWN
                                        else "")
    where = " or ".join(str(s) for s in stores)
    return InputError(f"MODEL {ref}: {name.short} is not in the Ollama store at {where} "
                      f"(pulled: {listed or 'nothing'}); `ollama pull {name.short}` first")


# -- the manifest ------------------------------------------------------------------------


def _damaged(ref: str, manifest: Path, why: str) -> InputError:
    return InputError(f"MODEL {ref}: the Ollama manifest {manifest} is damaged: {why} "
                      "(`ollama pull` the model again)")


def _read_manifest(ref: str, manifest: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _damaged(ref, manifest, f"not JSON ({type(exc).__name__})") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        raise _damaged(ref, manifest, "no 'layers' list")
    return [layer for layer in layers if isinstance(layer, dict)]


def _model_blob(ref: str, store: Path, manifest: Path,
                layers: list[dict[str, Any]]) -> Path:
    models = [layer for layer in layers if layer.get("mediaType") == MODEL_LAYER]
    if not models:
        raise _damaged(ref, manifest, f"no layer of mediaType {MODEL_LAYER} (a cloud model "
                       "or a manifest without local weights?)")
    digest, size = models[0].get("digest"), models[0].get("size")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise _damaged(ref, manifest, f"the model layer's digest {digest!r} is not "
                       "sha256:<64 hex digits>")
    blob = store / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise InputError(f"MODEL {ref}: the model blob {blob} named by {manifest} is missing "
                         "(`ollama pull` the model again)")
    actual = blob.stat().st_size
    if isinstance(size, int) and actual != size:
        raise InputError(f"MODEL {ref}: the model blob {blob} is {actual} bytes, its manifest "
                         f"says {size}: an incomplete download? (`ollama pull` it again)")
    if not has_gguf_magic(blob):
        raise InputError(f"MODEL {ref}: the model blob {blob} is not a GGUF file")
    return blob


def _notes(layers: list[dict[str, Any]]) -> list[str]:
    kinds = {layer.get("mediaType") for layer in layers}
    notes = []
    if ADAPTER_LAYER in kinds:
        notes.append("the Ollama model also has a LoRA adapter that Ollama applies; strata "
                     "reads the base weights only")
    if PROJECTOR_LAYER in kinds:
        notes.append("the Ollama model also has a vision projector; strata reads the "
                     "language model only")
    return notes


# -- the server ----------------------------------------------------------------------------


def ollama_url() -> str:
    """The running Ollama server's OpenAI API: $OLLAMA_HOST read as Ollama reads it
    (`host`, `host:port`, `scheme://host[:port][/path]`), default http://127.0.0.1:11434."""
    raw = os.environ.get("OLLAMA_HOST", "").strip()
    scheme, sep, rest = raw.partition("://")
    port = DEFAULT_PORT
    if not sep:
        scheme, rest = "http", raw
    elif scheme in ("http", "https"):
        port = 80 if scheme == "http" else 443
    hostport, _, path = rest.partition("/")
    try:
        parts = urlsplit(f"//{hostport}")
        host, port = parts.hostname or "127.0.0.1", parts.port or port
    except ValueError as exc:
        raise InputError(f"OLLAMA_HOST={raw}: not a host[:port] ({exc})") from None
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # listen-all: reach it here
    host = f"[{host}]" if ":" in host else host
    return normalise_url(f"{scheme}://{host}:{port}" + (f"/{path}" if path else ""))


@register("ollama", first=True)
def resolve_ollama(ref: str, model_name: str | None) -> ResolvedModel | None:
    if not ref.startswith(PREFIX):
        return None
    name = parse_name(ref)
    stores = _stores(ref)
    store, manifest = next(((s, m) for s in stores if (m := _manifest(s, name)) is not None),
                           (None, None))
    if store is None or manifest is None:
        raise _not_pulled(ref, name, stores)
    layers = _read_manifest(ref, manifest)
    blob = _model_blob(ref, store, manifest, layers)
    display = PREFIX + name.short
    spec = read_spec(blob)
    if spec.name == blob.stem:  # no general.name in the file: not the blob's hash
        spec = replace(spec, name=display)
    spec.notes.extend(_notes(layers))
    return ResolvedModel(ref=display, kind="gguf", spec=spec, endpoint=ollama_url(),
                         model_name=model_name or name.short, artefacts={"gguf": blob})
