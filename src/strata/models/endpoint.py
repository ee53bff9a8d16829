"""OpenAI-compatible endpoints: `http(s)://host[:port][/v1]` -> a base URL ending in /v1.

llama.cpp's server, Ollama, vLLM and LM Studio all serve the OpenAI API under /v1, so
whatever the user typed (with or without /v1, with a trailing slash, or a full route such
as /v1/chat/completions) becomes one base URL the openai backend appends routes to.
No request is made here: reachability is the backend's concern, with its own timeouts.
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit, urlunsplit

from strata.errors import InputError
from strata.models.source import ResolvedModel, register

SCHEMES = ("http", "https")
API_ROOT = "/v1"


def _bad(ref: str, why: str) -> InputError:
    return InputError(f"MODEL {ref}: {why} (expected http://host:port or "
                      "https://host[:port][/v1], e.g. http://127.0.0.1:8080/v1)")


def _checked(ref: str) -> SplitResult:
    if any(c.isspace() for c in ref):
        raise _bad(ref, "the URL contains whitespace")
    parts = urlsplit(ref)
    if not parts.hostname:
        raise _bad(ref, "the URL has no host")
    try:
        parts.port  # noqa: B018  (raises ValueError for a non-numeric or out-of-range port)
    except ValueError as exc:
        raise _bad(ref, f"bad port ({exc})") from exc
    if parts.netloc.endswith(":"):
        raise _bad(ref, "empty port after ':'")
    if parts.query or parts.fragment:
        raise _bad(ref, "a base URL takes no ?query or #fragment")
    return parts


def _api_path(path: str) -> str:
    """'' -> /v1; /v1/ -> /v1; /v1/chat/completions -> /v1; /proxy -> /proxy/v1."""
    path = path.rstrip("/")
    head, sep, _route = path.partition(API_ROOT + "/")
    if sep:
        return head + API_ROOT
    return path if path.endswith(API_ROOT) else path + API_ROOT


def normalise_url(ref: str) -> str:
    """Base URL ending in /v1 (InputError for a malformed URL)."""
    parts = _checked(ref)
    return urlunsplit((parts.scheme.lower(), parts.netloc, _api_path(parts.path), "", ""))


@register("endpoint")
def resolve_endpoint(ref: str, model_name: str | None) -> ResolvedModel | None:
    scheme, sep, _rest = ref.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        return None
    # model_name None: the openai backend asks the server's /v1/models.
    return ResolvedModel(ref=ref, kind="endpoint", spec=None, endpoint=normalise_url(ref),
                         model_name=model_name or None)
