"""Endpoint refs: normalised to a base URL ending in /v1; malformed URLs are InputErrors."""

from __future__ import annotations

import pytest

from strata.errors import InputError
from strata.models.source import resolve


@pytest.mark.parametrize(("ref", "base"), [
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1"),
    ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/v1"),
    ("http://localhost:11434/v1", "http://localhost:11434/v1"),
    ("http://localhost:11434/v1/", "http://localhost:11434/v1"),
    ("http://host:8000/v1/chat/completions", "http://host:8000/v1"),
    ("HTTPS://api.example.com", "https://api.example.com/v1"),
    ("https://example.com/proxy/", "https://example.com/proxy/v1"),
    ("http://[::1]:8080", "http://[::1]:8080/v1"),
])
def test_base_url_is_normalised(ref: str, base: str) -> None:
    model = resolve(ref)
    assert (model.kind, model.endpoint, model.spec, model.ref) == ("endpoint", base, None, ref)
    assert model.model_name is None  # the backend asks /v1/models


def test_model_name_passes_through() -> None:
    assert resolve("http://127.0.0.1:8080", "qwen2.5:0.5b").model_name == "qwen2.5:0.5b"


def test_endpoint_has_no_weights_to_load() -> None:
    with pytest.raises(InputError, match="llamacpp backend needs a gguf model"):
        resolve("http://127.0.0.1:8080").path("gguf", "llamacpp")


@pytest.mark.parametrize(("ref", "why"), [
    ("http://", "no host"),
    ("http://:8080", "no host"),
    ("http://host:99999", "bad port"),
    ("http://host:port", "bad port"),
    ("http://host:", "empty port"),
    ("http://host:8080/v1?key=1", "no ?query"),
    ("http://ho st:8080", "whitespace"),
])
def test_malformed_urls(ref: str, why: str) -> None:
    with pytest.raises(InputError) as err:
        resolve(ref)
    msg = str(err.value)
    assert why in msg and ref in msg and "\n" not in msg


def test_other_schemes_are_not_endpoints() -> None:
    with pytest.raises(InputError, match="no such file or directory"):
        resolve("ftp://host/model")
