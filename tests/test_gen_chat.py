"""The generation chat client against a scripted OpenAI-compatible server on real loopback
HTTP (tests/replay_server.py): replies, streaming, retries, timeouts, bad servers, keys."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from strata.kernels.gen.chat import MAX_REPLY_CHARS, ChatClient, EndpointError
from strata.kernels.gen.records import Reply
from tests.replay_server import replay_server
from tests.server_fixture import free_port, silent_socket

MSG = [{"role": "system", "content": "You write kernels."},
       {"role": "user", "content": "Write rmsnorm in C please"}]
KEY_VAR = "STRATA_TEST_CHAT_KEY"
SECRET = "sk-test-0123456789abcdef"


def fast(url: str, **kw: object) -> ChatClient:
    """A client with short timeouts and backoff, so failure tests run in well under a second."""
    opts: dict[str, object] = {"timeout_s": 2.0, "connect_timeout_s": 1.0, "retries": 2,
                               "backoff_s": 0.01}
    opts.update(kw)
    return ChatClient(url, **opts)  # type: ignore[arg-type]


def one_line(exc: pytest.ExceptionInfo[EndpointError]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert exc.value.exit_code == 2
    return msg


# -- replies ----------------------------------------------------------------------------------


def test_non_streaming_reply_with_usage() -> None:
    with replay_server(["```c\nint x;\n```"]) as srv, fast(srv.url) as client:
        reply = client.chat("replay-model", MSG, temperature=0.2, max_tokens=64, seed=7)
    assert isinstance(reply, Reply)
    assert reply.text == "```c\nint x;\n```"
    assert reply.model == "replay-model"
    assert (reply.tokens_in, reply.tokens_out) == (8, 4)  # the replay server counts words
    assert reply.finish_reason == "stop"
    assert 0 < reply.latency_s < 5
    sent = srv.requests[0]
    assert sent["messages"] == MSG
    assert (sent["temperature"], sent["max_tokens"], sent["seed"]) == (0.2, 64, 7)
    assert "stream" not in sent


def test_optional_fields_are_not_sent_when_unset() -> None:
    with replay_server(["ok"]) as srv, fast(srv.url) as client:
        client.chat("replay-model", MSG, temperature=0.0)
    assert "max_tokens" not in srv.requests[0] and "seed" not in srv.requests[0]


def test_streaming_reply_with_usage() -> None:
    text = "Here is the kernel:\n```c\n" + "float acc = 0.0f;\n" * 20 + "```\n"
    with replay_server([text]) as srv, fast(srv.url, stream=True) as client:
        reply = client.chat("replay-model", MSG, temperature=0.0)
    assert reply.text == text
    assert reply.tokens_out == len(text.split()) and reply.tokens_in == 8
    assert reply.finish_reason == "stop"
    sent = srv.requests[0]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_streaming_without_usage_counts_deltas() -> None:
    text = "a" * 100  # 16 characters per delta -> 7 deltas
    with replay_server([{"text": text, "usage": None}]) as srv, \
            fast(srv.url, stream=True) as client:
        reply = client.chat("replay-model", MSG, temperature=0.0)
    assert reply.text == text
    assert reply.tokens_in is None and reply.tokens_out == 7


def test_non_streaming_without_usage_has_no_token_counts() -> None:
    with replay_server([{"text": "hi", "usage": None}]) as srv, fast(srv.url) as client:
        reply = client.chat("replay-model", MSG, temperature=0.0)
    assert (reply.text, reply.tokens_in, reply.tokens_out) == ("hi", None, None)


def test_server_that_ignores_stream_flag_is_still_read() -> None:
    with replay_server([{"text": "plain json", "stream": False}]) as srv, \
            fast(srv.url, stream=True) as client:
        assert client.chat("replay-model", MSG, temperature=0.0).text == "plain json"


def test_keepalive_pings_before_the_first_token_are_waited_through() -> None:
    with replay_server([{"text": "late", "ping_s": 0.3}]) as srv, \
            fast(srv.url, stream=True) as client:
        assert client.chat("replay-model", MSG, temperature=0.0).text == "late"


def test_keepalive_pings_alone_time_out() -> None:
    with replay_server([{"text": "never", "ping_s": 5.0}]) as srv, \
            fast(srv.url, stream=True, timeout_s=0.3, retries=0) as client, \
            pytest.raises(EndpointError) as exc:
        client.chat("replay-model", MSG, temperature=0.0)
    assert "read timeout" in one_line(exc)


# -- models -----------------------------------------------------------------------------------


def test_models_in_server_order_and_default_is_first() -> None:
    with replay_server(models=["zeta", "alpha", "mid"]) as srv, fast(srv.url) as client:
        assert client.models() == ["zeta", "alpha", "mid"]
        assert client.resolve_model(None) == "zeta"
        assert client.resolve_model("alpha") == "alpha"
    assert [c.path for c in srv.calls] == ["/v1/models"]  # asked once, then remembered


def test_unknown_model_lists_the_servers_models() -> None:
    with replay_server(models=["qwen-coder", "llama-3"]) as srv, fast(srv.url) as client, \
            pytest.raises(EndpointError) as exc:
        client.resolve_model("gpt-9")
    msg = one_line(exc)
    assert "gpt-9" in msg and "qwen-coder, llama-3" in msg


def test_server_with_no_models_is_an_error() -> None:
    with replay_server(models=[""]) as srv, fast(srv.url) as client, \
            pytest.raises(EndpointError) as exc:
        client.resolve_model(None)
    assert "lists no models" in one_line(exc)


@pytest.mark.parametrize("typed", ["{url}", "{url}/", "{root}", "{url}/chat/completions"])
def test_endpoint_is_normalised_to_v1(typed: str) -> None:
    with replay_server() as srv:
        url = typed.format(url=srv.url, root=srv.url.removesuffix("/v1"))
        with fast(url) as client:
            assert client.endpoint == srv.url
            assert client.models() == ["replay-model"]


@pytest.mark.parametrize("bad", ["ftp://host/v1", "localhost:8080", "http://", "http://h:x"])
def test_malformed_endpoint_is_one_line(bad: str) -> None:
    with pytest.raises(EndpointError) as exc:
        ChatClient(bad)
    assert bad in one_line(exc)


# -- retries ----------------------------------------------------------------------------------


def test_http_500_then_success_is_retried() -> None:
    retried: list[str] = []
    with replay_server([{"status": 500}, {"status": 503}, "fine"]) as srv, \
            fast(srv.url, on_retry=retried.append) as client:
        reply = client.chat("replay-model", MSG, temperature=0.0)
    assert reply.text == "fine"
    assert len(srv.requests) == 3 and len(retried) == 2 and "HTTP 500" in retried[0]


def test_429_honours_retry_after() -> None:
    step = {"status": 429, "headers": {"Retry-After": "0.4"},
            "body": {"error": {"message": "slow down"}}}
    with replay_server([step, "after the wait"]) as srv, fast(srv.url) as client:
        t0 = time.perf_counter()
        reply = client.chat("replay-model", MSG, temperature=0.0)
        waited = time.perf_counter() - t0
    assert reply.text == "after the wait"
    assert waited >= 0.4  # backoff_s is 0.01: only Retry-After explains the wait


def test_persistent_500_gives_up_after_retries() -> None:
    with replay_server([{"status": 502, "body": "<html><body>Bad\nGateway</body></html>",
                         "content_type": "text/html"}] * 3) as srv, \
            fast(srv.url) as client, pytest.raises(EndpointError) as exc:
        client.chat("replay-model", MSG, temperature=0.0)
    msg = one_line(exc)
    assert "HTTP 502" in msg and "3 tries" in msg
    assert len(srv.requests) == 3


def test_server_that_never_answers_times_out_after_retries() -> None:
    hang = {"text": "too late", "delay_s": 30}
    with replay_server([hang, hang]) as srv, fast(srv.url, timeout_s=0.3, retries=1) as client:
        t0 = time.perf_counter()
        with pytest.raises(EndpointError) as exc:
            client.chat("replay-model", MSG, temperature=0.0)
        took = time.perf_counter() - t0
    msg = one_line(exc)
    assert "read timeout" in msg and "2 tries" in msg
    assert len(srv.requests) == 2
    assert 0.6 <= took < 5


def test_timeout_then_success() -> None:
    with replay_server([{"delay_s": 30}, "second try"]) as srv, \
            fast(srv.url, timeout_s=0.3) as client:
        assert client.chat("replay-model", MSG, temperature=0.0).text == "second try"


def test_silent_socket_times_out() -> None:
    with silent_socket() as url, fast(url, timeout_s=0.2, retries=0) as client, \
            pytest.raises(EndpointError) as exc:
        client.models()
    assert "read timeout" in one_line(exc)


# -- servers that are not what they should be --------------------------------------------------


def test_connection_refused_is_one_line_and_not_retried() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with fast(url, retries=3, backoff_s=5.0) as client, pytest.raises(EndpointError) as exc:
        t0 = time.perf_counter()
        client.chat("m", MSG, temperature=0.0)
    assert "refused" in one_line(exc)
    assert time.perf_counter() - t0 < 2  # a backoff of 5 s would show


def test_unresolvable_host_is_one_line() -> None:
    with fast("http://no-such-host.invalid/v1") as client, pytest.raises(EndpointError) as exc:
        client.models()
    assert "no-such-host.invalid" in one_line(exc)


def test_html_page_is_one_line() -> None:
    page = "<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n</html>"
    with replay_server([{"body": page, "content_type": "text/html"}]) as srv, \
            fast(srv.url) as client, pytest.raises(EndpointError) as exc:
        client.chat("replay-model", MSG, temperature=0.0)
    msg = one_line(exc)
    assert "text/html" in msg and "not JSON" in msg
    assert len(srv.requests) == 1  # not retried: the same page would come back


def test_client_error_is_not_retried() -> None:
    step = {"status": 400, "body": {"error": {"message": "context length exceeded"}}}
    with replay_server([step, "unused"]) as srv, fast(srv.url) as client, \
            pytest.raises(EndpointError) as exc:
        client.chat("replay-model", MSG, temperature=0.0)
    assert "HTTP 400: context length exceeded" in one_line(exc)
    assert len(srv.requests) == 1


def test_reply_without_choices_is_one_line() -> None:
    with replay_server([{"body": {"object": "chat.completion", "choices": []}}]) as srv, \
            fast(srv.url) as client, pytest.raises(EndpointError) as exc:
        client.chat("replay-model", MSG, temperature=0.0)
    assert "no choices" in one_line(exc)


def test_error_event_mid_stream_is_one_line() -> None:
    body = 'data: {"choices":[{"delta":{"content":"x"}}]}\n\ndata: {"error":{"message":"oom"}}\n\n'
    with replay_server([{"body": body, "content_type": "text/event-stream"}]) as srv, \
            fast(srv.url, stream=True) as client, pytest.raises(EndpointError) as exc:
        client.chat("replay-model", MSG, temperature=0.0)
    assert "oom" in one_line(exc)


def test_stream_cut_before_done_is_retried() -> None:
    cut = {"body": 'data: {"choices":[{"delta":{"content":"half"}}]}\n\n',
           "content_type": "text/event-stream"}
    with replay_server([cut, "whole"]) as srv, fast(srv.url, stream=True) as client:
        assert client.chat("replay-model", MSG, temperature=0.0).text == "whole"


@pytest.mark.parametrize("stream", [False, True])
def test_megabyte_of_junk_is_capped_not_fatal(stream: bool) -> None:
    junk = ("\x00garbage ünïcödé {[<" * 90_000)[: MAX_REPLY_CHARS + 300_000]
    step = {"text": junk, "chunk_chars": 8192, "usage": None}
    with replay_server([step]) as srv, fast(srv.url, stream=stream) as client:
        reply = client.chat("replay-model", MSG, temperature=0.0)
    assert len(reply.text) == MAX_REPLY_CHARS
    assert reply.text == junk[:MAX_REPLY_CHARS]
    assert reply.finish_reason == "length"  # cut, as if max_tokens had stopped it
    if stream:  # a runaway stream is not read to its end: fewer deltas than were sent
        assert reply.tokens_out is not None and reply.tokens_out * 8192 < len(junk) - 8192


# -- the API key --------------------------------------------------------------------------------


def test_api_key_from_env_is_sent_as_bearer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, SECRET)
    with replay_server(["ok"]) as srv, fast(srv.url, api_key_env=KEY_VAR) as client:
        client.resolve_model(None)
        client.chat("replay-model", MSG, temperature=0.0)
    assert [h.get("authorization") for h in srv.headers] == [f"Bearer {SECRET}"] * 2
    assert SECRET not in repr(vars(client))  # not kept as an attribute of its own


def test_api_key_never_in_error_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, SECRET)

    def echo(request: dict[str, object]) -> dict[str, object]:  # a server that echoes it
        return {"status": 401, "body": {"error": {"message": f"invalid key {SECRET}"}}}

    with replay_server(echo) as srv, fast(srv.url, api_key_env=KEY_VAR) as client, \
            pytest.raises(EndpointError) as exc:
        client.chat("replay-model", MSG, temperature=0.0)
    msg = one_line(exc)
    assert SECRET not in msg and "invalid key ***" in msg and KEY_VAR in msg


def test_api_key_never_in_retry_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, SECRET)
    step = {"status": 503, "body": {"error": {"message": f"busy, key {SECRET}"}}}
    said: list[str] = []
    with replay_server([step] * 2) as srv, \
            fast(srv.url, api_key_env=KEY_VAR, retries=1, on_retry=said.append) as client, \
            pytest.raises(EndpointError) as exc:
        client.chat("replay-model", MSG, temperature=0.0)
    assert SECRET not in one_line(exc) and said and SECRET not in said[0]


def test_missing_key_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_VAR, raising=False)
    with pytest.raises(EndpointError) as exc:
        ChatClient("http://127.0.0.1:1/v1", api_key_env=KEY_VAR)
    assert f"${KEY_VAR}" in one_line(exc)


def test_no_key_variable_sends_no_authorization() -> None:
    with replay_server() as srv, fast(srv.url) as client:
        client.models()
    assert "authorization" not in srv.headers[0]


# -- router mode --------------------------------------------------------------------------------


def test_router_per_model() -> None:
    routes = {"small": ["small 1", "small 2"], "big": ["big 1"]}
    with replay_server(by_model=routes) as srv, fast(srv.url) as client:
        assert client.models() == ["small", "big"]
        got = [client.chat(m, MSG, temperature=0.0).text for m in ("big", "small", "small")]
        with pytest.raises(EndpointError) as exc:
            client.chat("other", MSG, temperature=0.0)
    assert got == ["big 1", "small 1", "small 2"]
    assert "not found" in one_line(exc)
    assert [r["model"] for r in srv.requests] == ["big", "small", "small", "other"]


def test_exhausted_script_is_a_clear_error() -> None:
    with replay_server(["only one"]) as srv, fast(srv.url) as client:
        client.chat("replay-model", MSG, temperature=0.0)
        with pytest.raises(EndpointError) as exc:
            client.chat("replay-model", MSG, temperature=0.0)
    assert "exhausted at request 2" in one_line(exc)


def test_router_by_last_user_message_under_concurrency() -> None:
    ops = [f"op{i}" for i in range(8)]
    routes = {f"Write {op} ": f"kernel for {op}" for op in ops}
    with replay_server(by_content=routes) as srv, fast(srv.url) as client:

        def ask(op: str) -> str:
            messages = [{"role": "user", "content": f"Write {op} now"},
                        {"role": "assistant", "content": "Write op0 (earlier turn)"},
                        {"role": "user", "content": f"Write {op} again, faster"}]
            return client.chat("replay-model", messages, temperature=0.0).text

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(ask, ops * 3))
    assert got == [f"kernel for {op}" for op in ops * 3]
    assert len(srv.requests) == 24


def test_callable_step_sees_the_request() -> None:
    def answer(request: dict[str, object]) -> str:
        return f"temperature was {request['temperature']}"

    with replay_server([answer]) as srv, fast(srv.url) as client:
        assert client.chat("replay-model", MSG, temperature=0.7).text == "temperature was 0.7"
