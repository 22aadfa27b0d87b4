"""Golden tests of the request side against requests run through the real upstream code.

`tests/fixtures/trtllm-prompts/` holds, per request, the prompt ids and sampling parameters
trtllm-serve's Responses path handed to the engine, or the status it answered; `*.expected_fixed`
files give the prompt where upstream is wrong (the proxy serves those requests).
`trtllm-oracle/manifest.json` holds the requests and prompt ids of the recorded streams.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from proxy.errors import ClientError
from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.response import DEFAULT_ECHO, ResponseContext, response_object
from tests.conftest import FIXTURES
from tests.spec_departures import normalised

PROMPTS = FIXTURES / "trtllm-prompts"
ORACLE = FIXTURES / "trtllm-oracle" / "manifest.json"

#: Fields of trtllm's `CompletionRequest` (openai_protocol.py, commit 0076e93 — the version the
#: fixtures' Responses models come from). It forbids anything else (`extra="forbid"`).
COMPLETION_REQUEST_FIELDS = frozenset(
    {
        *("model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs"),
        *("max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options"),
        *("suffix", "temperature", "top_p", "user", "lora_request", "prompt_ignore_length"),
        *("use_beam_search", "top_k", "top_p_min", "min_p", "repetition_penalty"),
        *("length_penalty", "early_stopping", "stop_token_ids", "include_stop_str_in_output"),
        *("ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens"),
        *("truncate_prompt_tokens", "return_context_logits", "detokenize"),
        *("thinking_token_budget", "add_special_tokens", "response_format"),
        *("disaggregated_params", "priority", "conversation_params"),
    }
)
RESPONSE_FORMAT_FIELDS = frozenset({"type", "schema", "json_schema", "regex", "ebnf", "format"})
STREAM_OPTIONS_FIELDS = frozenset({"include_usage", "continuous_usage_stats"})


def _steps() -> list[tuple[str, dict[str, Any]]]:
    """(id, step) for every request in every case file; expected_fixed files override."""
    steps: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(PROMPTS.glob("d*.json")):
        if path.name.endswith(".expected_fixed.json"):
            continue
        case = json.loads(path.read_text())
        fixed_path = path.with_name(path.stem + ".expected_fixed.json")
        fixed = json.loads(fixed_path.read_text()) if fixed_path.exists() else None
        for number, step in enumerate(case.get("steps") or [case]):
            steps.append((f"{path.stem}[{number}]", {**step, "fixed": fixed}))
    return steps


STEPS = _steps()


def _wire(value: Any) -> Any:
    """Upstream echoes Python field names of the openai models; the wire uses the aliases."""
    if isinstance(value, dict):
        names = {"schema_": "schema", "async_": "async"}
        return {names.get(key, key): _wire(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_wire(item) for item in value]
    return value


def assert_sampling(body: dict[str, Any], sampling: dict[str, Any]) -> None:
    """The completions body asks for what upstream's Responses path handed to the engine."""
    assert set(body) <= COMPLETION_REQUEST_FIELDS
    assert set(body["stream_options"]) <= STREAM_OPTIONS_FIELDS
    assert body["temperature"] == sampling["temperature"]
    assert body["top_p"] == sampling["top_p"]
    assert body["max_tokens"] == sampling["max_tokens"]
    assert sorted(body["stop_token_ids"]) == sampling["stop_token_ids"]
    assert body.get("thinking_token_budget") == sampling["thinking_token_budget"]
    assert (body["stream"], body["detokenize"], body["n"]) == (True, False, 1)
    assert body["include_stop_str_in_output"] is True
    guided = sampling["guided_decoding"]
    if guided is None:
        assert "response_format" not in body
        return
    response_format = body["response_format"]
    assert set(response_format) <= RESPONSE_FORMAT_FIELDS
    assert response_format == guided["structural_tag_parsed"]
    # CompletionRequest builds GuidedDecodingParams(structural_tag=response_format.model_dump_json(
    # by_alias=True, exclude_none=True)): compact JSON in the xgrammar models' field order.
    dumped = json.dumps(response_format, separators=(",", ":"), ensure_ascii=False)
    assert dumped == guided["structural_tag"]


def test_every_case_file_is_exercised() -> None:
    assert len({name.split("[")[0] for name, _ in STEPS}) == 29
    assert len(STEPS) == 30  # d27 has two steps


@pytest.mark.parametrize(("name", "step"), STEPS, ids=[name for name, _ in STEPS])
def test_fixture_request(name: str, step: dict[str, Any], encoding: HarmonyEncoding) -> None:
    body = step["request_body"]
    fixed = step["fixed"]
    if fixed is not None:
        # Upstream rejects or mangles this valid request; we render what expected_fixed says.
        prepared = prepare_request(body, encoding)
        assert prepared.prompt_token_ids == fixed["expected_prompt_token_ids"]
        assert_sampling(prepared.completion_body, fixed["sampling_params"])
        return
    if "previous_response_id" in body:
        # Upstream answers from its in-memory store (404 for d20). The proxy's shell resolves
        # it from its own store (tests/test_stateful_*.py) and renders the merged body
        # without it: one that reaches prepare_request means the store is off.
        with pytest.raises(ClientError) as caught:
            prepare_request(body, encoding)
        assert caught.value.status == 400
        assert caught.value.param == "previous_response_id"
        assert "store is off" in caught.value.message
        return
    if step["http_status"] != 200:
        assert 400 <= step["http_status"] < 500
        with pytest.raises(ClientError) as caught:
            prepare_request(body, encoding)
        assert 400 <= caught.value.status < 500
        return
    prepared = prepare_request(body, encoding)
    assert prepared.prompt_token_ids == step["prompt_token_ids"]
    assert prepared.completion_body["prompt"] == step["prompt_token_ids"]
    assert prepared.completion_body["model"] == body["model"]
    completion_body = dict(prepared.completion_body)
    if body.get("tool_choice", "auto") != "auto":
        # Upstream ignores tool_choice; the proxy enforces it by guided decoding
        # (request/guided.py): same prompt and sampling, plus that constraint.
        assert step["sampling_params"]["guided_decoding"] is None
        heads = allowed_headers(completion_body.pop("response_format"))
        assert "<|channel|>final<|message|>" not in heads  # d18: "required"
        assert {h for h in heads if " to=" in h} == {
            f"<|channel|>commentary to=functions.{tool['name']} <|constrain|>json<|message|>"
            for tool in body["tools"]
        }
    assert_sampling(completion_body, step["sampling_params"])


def allowed_headers(response_format: dict[str, Any]) -> set[str]:
    """The message headers a tool_choice constraint lets gpt-oss write."""
    first, later = response_format["format"]["elements"]
    assert later["tags"][0]["content"] == first  # every later message: the same headers
    return {head["value"] for head in first["elements"] if head["type"] == "const_string"}


#: Requests upstream answered 200 and we serve as they are (previous_response_id: not yet).
SERVED = [
    (name, step)
    for name, step in STEPS
    if step["http_status"] == 200
    and step["fixed"] is None
    and "previous_response_id" not in step["request_body"]
]


@pytest.mark.parametrize(("name", "step"), SERVED, ids=[name for name, _ in SERVED])
def test_echo_matches_upstream_response(
    name: str, step: dict[str, Any], encoding: HarmonyEncoding
) -> None:
    prepared = prepare_request(step["request_body"], encoding)
    upstream = _wire(step["response_body"])
    ours = response_object(
        ResponseContext(
            response_id=upstream["id"],
            created_at=upstream["created_at"],
            model=prepared.model,
            echo=prepared.echo,
        ),
        status=upstream["status"],
        output=upstream["output"],
        usage=upstream["usage"],
    )
    # Equal but for the fields where the echo follows OpenAI's spec instead of upstream
    # (tests/spec_departures.py).
    ours, upstream = normalised(ours), normalised(upstream)
    compared = [key for key in upstream if key in {*DEFAULT_ECHO, "user"}]
    assert {key: ours[key] for key in compared} == {key: upstream[key] for key in compared}
    # Same key order inside nested echoes too (tools, reasoning, text): compare serialised.
    for key in compared:
        assert json.dumps(ours[key]) == json.dumps(upstream[key]), key


def _oracle_scenarios() -> list[tuple[str, dict[str, Any]]]:
    manifest = json.loads(Path(ORACLE).read_text())
    return sorted(manifest["scenarios"].items())


SCENARIOS = _oracle_scenarios()


@pytest.mark.parametrize(("name", "scenario"), SCENARIOS, ids=[name for name, _ in SCENARIOS])
def test_oracle_manifest_request(
    name: str, scenario: dict[str, Any], encoding: HarmonyEncoding
) -> None:
    prepared = prepare_request(scenario["request_body"], encoding)
    assert prepared.prompt_token_ids == scenario["prompt_token_ids"]
    sampling = {
        "thinking_token_budget": None,
        "guided_decoding": None,
        **scenario["sampling_params"],
    }
    assert_sampling(prepared.completion_body, sampling)
