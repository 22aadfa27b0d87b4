"""`POST /v1/completions` over HTTP: frames, usage, [DONE], text, errors, limits."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from proxy.harmony.tokens import CALL, RETURN
from proxy.simulator import SimulatorConfig
from proxy.simulator.completion_request import CompletionRequest, StreamOptions
from proxy.upstream.completions import parse_frame
from tests.simulator_helpers import FAST, SimThread
from tests.test_request_golden import COMPLETION_REQUEST_FIELDS, STREAM_OPTIONS_FIELDS

PROBE = [200006, 1428, 200008, 13225, 200007, 200006, 173781]
STOPS = [RETURN, CALL]


@pytest.fixture(scope="module")
def sim(encoding: HarmonyEncoding) -> Iterator[SimThread]:
    with SimThread(encoding, FAST) as running:
        yield running


def _body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "openai/gpt-oss-120b",
        "prompt": PROBE,
        "stream": True,
        "detokenize": False,
        "stop_token_ids": STOPS,
        "include_stop_str_in_output": True,
        "stream_options": {"include_usage": True},
    }
    body.update(overrides)
    return {key: value for key, value in body.items() if value is not None}


def test_stream_frames_as_trtllm_sends_them(sim: SimThread, encoding: HarmonyEncoding) -> None:
    streamed = sim.stream("/v1/completions", _body(), {"X-Sim-Stream-Interval": "7"})
    assert streamed.status == 200
    assert streamed.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert all(event == "message" for event, _ in streamed.messages)  # no `event:` lines
    assert streamed.data[-1] == "[DONE]"
    frames = streamed.json()
    *content, usage = frames
    sizes = [len(f["choices"][0]["token_ids"]) for f in content]
    assert sizes[0] == 1
    assert set(sizes[1:-1]) == {7}
    assert 1 <= sizes[-1] <= 7
    for frame in content:
        assert list(frame) == ["id", "object", "created", "model", "choices", "usage"]
        assert frame["id"] == f"cmpl-{sim.last.number}"
        assert frame["object"] == "text_completion"
        assert frame["choices"][0]["text"] == ""
        parsed = parse_frame(json.dumps(frame))  # the proxy's own frame parser accepts it
        assert parsed.token_ids == tuple(frame["choices"][0]["token_ids"])
    ids = [t for f in content for t in f["choices"][0]["token_ids"]]
    assert ids[-1] == RETURN
    last = content[-1]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", None)
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": len(PROBE),
        "total_tokens": len(PROBE) + len(ids),
        "completion_tokens": len(ids),
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert encoding.decode(ids).startswith("<|channel|>analysis<|message|>")
    record = sim.last
    assert (record.path, record.stream, record.finish_reason, record.completed) == (
        "/v1/completions",
        True,
        "stop",
        True,
    )
    assert record.token_ids == ids
    assert record.prompt_ids == tuple(PROBE)


def test_without_usage_option_no_usage_frame(sim: SimThread) -> None:
    streamed = sim.stream("/v1/completions", _body(stream_options=None))
    frames = streamed.json()
    assert all(frame["choices"] for frame in frames)
    assert streamed.data[-1] == "[DONE]"


def test_tool_call_stops_at_call_with_stop_reason(sim: SimThread) -> None:
    prompt = sim.http.post(
        "/v1/responses",
        json={"model": "m", "input": "Weather?", "tools": [_tool()], "stream": False},
    )
    assert prompt.status_code == 200
    prompt_ids = list(sim.last.prompt_ids)
    for include in (True, False):
        frames = sim.stream(
            "/v1/completions", _body(prompt=prompt_ids, include_stop_str_in_output=include)
        ).json()
        ids = [t for f in frames[:-1] for t in f["choices"][0]["token_ids"]]
        last = frames[-2]["choices"][0]
        assert (last["finish_reason"], last["stop_reason"]) == ("stop", CALL)
        assert (ids[-1] == CALL) is include
    # Without <|call|> among the stop tokens the call does not stop generation.
    frames = sim.stream("/v1/completions", _body(prompt=prompt_ids, stop_token_ids=[])).json()
    ids = [t for f in frames[:-1] for t in f["choices"][0]["token_ids"]]
    assert CALL in ids[:-1]
    assert ids[-1] == RETURN


def _tool() -> dict[str, Any]:
    return {
        "type": "function",
        "name": "get_weather",
        "description": "Weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }


def test_stripped_return_and_header_stop_mode(sim: SimThread) -> None:
    frames = sim.stream("/v1/completions", _body(), {"X-Sim-Stop-Mode": "stripped"}).json()
    ids = [t for f in frames[:-1] for t in f["choices"][0]["token_ids"]]
    assert RETURN not in ids
    assert frames[-2]["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_finishes_with_length(sim: SimThread) -> None:
    frames = sim.stream("/v1/completions", _body(max_tokens=5)).json()
    ids = [t for f in frames[:-1] for t in f["choices"][0]["token_ids"]]
    assert len(ids) == 5
    last = frames[-2]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"]) == ("length", None)
    assert frames[-1]["usage"]["completion_tokens"] == 5


def test_long_output_on_request(sim: SimThread) -> None:
    frames = sim.stream("/v1/completions", _body(), {"X-Sim-Tokens": "3000"}).json()
    ids = [t for f in frames[:-1] for t in f["choices"][0]["token_ids"]]
    assert 3000 <= len(ids) <= 3040
    assert len(frames) > 3000 // 20


def test_detokenized_text_joins_to_the_text_and_never_splits_a_character(
    sim: SimThread, encoding: HarmonyEncoding
) -> None:
    body = _body(detokenize=True, stream_options=None)
    frames = sim.stream("/v1/completions", body, {"X-Sim-Stream-Interval": "1"}).json()
    pieces = [f["choices"][0]["text"] for f in frames]
    assert all(f["choices"][0]["token_ids"] is None for f in frames)
    assert all("\ufffd" not in piece for piece in pieces)
    ids = list(sim.last.token_ids)
    visible = [t for t in ids if not encoding.is_special_token(t)]
    assert "".join(pieces) == encoding.decode(visible)
    assert "" in pieces  # a token that is half a character: an empty text frame
    with_specials = sim.stream(
        "/v1/completions", {**body, "skip_special_tokens": False, "stream": False}
    )
    assert with_specials.status == 200


def test_text_prompt_echo_and_logprobs(sim: SimThread) -> None:
    body = _body(prompt="<|start|>user<|message|>Hi<|end|><|start|>assistant", stream=False)
    body.pop("stream_options")
    answer = sim.http.post("/v1/completions", json={**body, "logprobs": 1, "max_tokens": 3})
    assert answer.status_code == 200
    payload = answer.json()
    assert payload["id"].startswith("cmpl-")
    choice = payload["choices"][0]
    assert list(choice) == [
        "index",
        "text",
        "token_ids",
        "logprobs",
        "context_logits",
        "finish_reason",
        "stop_reason",
        "disaggregated_params",
        "avg_decoded_tokens_per_iter",
    ]
    assert len(choice["token_ids"]) == 3
    assert len(choice["logprobs"]["tokens"]) == 3
    assert payload["usage"]["prompt_tokens"] == len(PROBE)  # special-token text is tokenized
    echoed = sim.http.post(
        "/v1/completions",
        json={**body, "detokenize": True, "echo": True, "max_tokens": 2},
    ).json()
    assert echoed["choices"][0]["text"].startswith("<|start|>user")


def test_nonstream_answer(sim: SimThread) -> None:
    body = _body(stream=False)
    body.pop("stream_options")
    answer = sim.http.post("/v1/completions", json=body)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    payload = answer.json()
    choice = payload["choices"][0]
    assert choice["token_ids"][-1] == RETURN
    assert (choice["finish_reason"], choice["stop_reason"], choice["text"]) == ("stop", None, "")
    assert payload["usage"]["completion_tokens"] == len(choice["token_ids"])
    assert payload["prompt_token_ids"] is None


def _validation_errors(answer: Any) -> list[dict[str, Any]]:
    assert answer.status_code == 400
    payload = answer.json()
    assert list(payload) == ["error"]
    errors: list[dict[str, Any]] = ast.literal_eval(payload["error"])
    return errors


def test_the_model_declares_upstreams_fields() -> None:
    assert set(CompletionRequest.model_fields) == COMPLETION_REQUEST_FIELDS
    assert set(StreamOptions.model_fields) == STREAM_OPTIONS_FIELDS


def test_unknown_fields_are_rejected_like_upstream(sim: SimThread) -> None:
    answer = sim.http.post("/v1/completions", json=_body(seed_value=1, token_budget=2))
    assert _validation_errors(answer) == [
        {
            "type": "extra_forbidden",
            "loc": ("body", "seed_value"),
            "msg": "Extra inputs are not permitted",
            "input": 1,
        },
        {
            "type": "extra_forbidden",
            "loc": ("body", "token_budget"),
            "msg": "Extra inputs are not permitted",
            "input": 2,
        },
    ]
    nested = sim.http.post("/v1/completions", json=_body(stream_options={"x": 1}))
    assert _validation_errors(nested)[0]["loc"] == ("body", "stream_options", "x")


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [
        ("max_tokens", "many", "int_parsing"),
        ("max_tokens", 2.5, "int_from_float"),
        ("temperature", "hot", "float_parsing"),
        ("stream", 2, "bool_parsing"),
        ("detokenize", [], "bool_type"),
        ("model", 5, "string_type"),
        ("stop_token_ids", "200002", "list_type"),
        ("truncate_prompt_tokens", 0, "greater_than_equal"),
        # FastAPI validates with `from_attributes=True`: a model given a non-object says so
        # in this type, nested or not.
        ("stream_options", 3, "model_attributes_type"),
    ],
)
def test_field_types_are_validated_like_upstream(
    sim: SimThread, field: str, value: Any, kind: str
) -> None:
    errors = _validation_errors(sim.http.post("/v1/completions", json=_body(**{field: value})))
    assert errors[0]["type"] == kind
    assert errors[0]["loc"] == ("body", field)


def test_lax_coercion_like_pydantic(sim: SimThread) -> None:
    answer = sim.http.post(
        "/v1/completions",
        json=_body(stream="true", max_tokens="3", temperature="0.5", stop_token_ids=[200002.0]),
    )
    assert answer.status_code == 200
    assert len(sim.last.token_ids) == 3


def test_prompt_union_and_missing_fields(sim: SimThread) -> None:
    errors = _validation_errors(sim.http.post("/v1/completions", json=_body(prompt=5)))
    assert [e["loc"] for e in errors] == [
        ("body", "prompt", "list[int]"),
        ("body", "prompt", "list[list[int]]"),
        ("body", "prompt", "str"),
        ("body", "prompt", "list[str]"),
    ]
    errors = _validation_errors(sim.http.post("/v1/completions", json={"prompt": [1]}))
    assert errors[0]["type"] == "missing"
    errors = _validation_errors(sim.http.post("/v1/completions", content=b"{not json"))
    assert errors[0]["type"] == "json_invalid"
    errors = _validation_errors(sim.http.post("/v1/completions", json=[1, 2]))
    assert errors == [
        {
            "type": "model_attributes_type",
            "loc": ("body",),
            "msg": "Input should be a valid dictionary or object to extract fields from",
            "input": [1, 2],
        }
    ]


def test_model_validators_and_handler_errors(sim: SimThread) -> None:
    # An empty dict is falsy: upstream's check lets it through.
    answer = sim.http.post("/v1/completions", json=_body(stream=False, stream_options={}))
    assert answer.status_code == 200
    answer = sim.http.post(
        "/v1/completions", json=_body(stream=False, stream_options={"include_usage": True})
    )
    assert answer.status_code == 400
    message = "Value error, Stream options can only be defined when stream is true."
    assert answer.json()["error"].startswith(
        f"[{{'type': 'value_error', 'loc': ('body',), 'msg': '{message}'"
    )
    # Both model validators would fail: pydantic runs the last-defined (suffix) first.
    answer = sim.http.post(
        "/v1/completions",
        json=_body(stream=False, stream_options={"include_usage": True}, suffix="x", seed="y"),
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error.startswith(
        "[{'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, suffix"
    )
    assert error.count("'type'") == 1  # nothing else is validated after it
    answer = sim.http.post("/v1/completions", json=_body(prompt=[]))
    assert answer.status_code == 400
    assert answer.json() == {
        "object": "error",
        "message": "list index out of range",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    answer = sim.http.post("/v1/completions", json=_body(max_tokens=200_000))
    assert answer.status_code == 400
    assert "max_seq_len" in answer.json()["message"]


def test_chunks_and_empty_outputs(sim: SimThread) -> None:
    frames = sim.stream("/v1/completions", _body(), {"X-Sim-Chunks": "3,0,0,2"}).json()
    sizes = [len(f["choices"][0]["token_ids"]) for f in frames[:-1]]
    assert sizes[:5] == [3, 0, 0, 2, 20]


def test_bad_simulator_header_is_a_400(sim: SimThread) -> None:
    for name, value in [
        ("X-Sim-Tokens", "lots"),
        ("X-Sim-Fault", "explode"),
        ("X-Sim-Replay", "1,x"),
        ("X-Sim-Stop-Mode", "maybe"),
        ("X-Sim-Uneven", "sometimes"),
        ("X-Sim-Preamble", "2"),
        ("X-Sim-Stream-Interval", "0"),
    ]:
        answer = sim.http.post("/v1/completions", json=_body(), headers={name: value})
        assert answer.status_code == 400, name
        assert name in answer.json()["message"]


def test_uneven_outputs_on_request(sim: SimThread) -> None:
    headers = {"X-Sim-Uneven": "5", "X-Sim-Stream-Interval": "1", "X-Sim-Tokens": "300"}
    first = sim.stream("/v1/completions", _body(), headers).json()
    sizes = [len(f["choices"][0]["token_ids"]) for f in first[:-1]]
    assert sizes[0] == 1
    assert set(sizes[1:-1]) <= {1, 2, 3, 4}
    assert len(set(sizes[1:-1])) > 1
    again = sim.stream("/v1/completions", _body(), headers).json()
    assert [len(f["choices"][0]["token_ids"]) for f in again[:-1]] == sizes


def test_preamble_on_request(sim: SimThread, encoding: HarmonyEncoding) -> None:
    sim.stream("/v1/completions", _body(), {"X-Sim-Preamble": "1"})
    text = encoding.decode(sim.last.token_ids)
    assert "<|channel|>commentary<|message|>" in text


def test_body_limit(encoding: HarmonyEncoding) -> None:
    config = SimulatorConfig(first_token_seconds=0, token_seconds=0, max_body_bytes=1000)
    with SimThread(encoding, config) as small:
        answer = small.http.post("/v1/completions", json=_body(prompt=[1] * 1000))
        assert answer.status_code == 413
        assert answer.json()["code"] == 413
