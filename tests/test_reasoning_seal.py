"""`include: ["reasoning.encrypted_content"]`: reasoning sealed on the way out, opened on the way
back in, rendered as the plain item would be (proxy/harmony/reasoning_seal.py)."""

from __future__ import annotations

import base64
import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from openai_harmony import HarmonyEncoding

from proxy.config.settings import Settings
from proxy.config.sources import ConfigError, load_settings
from proxy.errors import ClientError
from proxy.harmony.reasoning_seal import ReasoningKeys, SealError, parse_keys
from proxy.harmony.request.prepare import prepare_request
from proxy.server.app import create_app
from proxy.simulator import simulator_state
from proxy.simulator.app import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from tests.harmony import context, ids_of, run
from tests.live import LiveServer, wait_for
from tests.request_clients import CODEX_FIRST
from tests.wellformed import assert_well_formed

K1 = ("2025-12", b"1" * 32)
K2 = ("2026-01", b"2" * 32)
OLD, ROTATED = ReasoningKeys((K1,)), ReasoningKeys((K2, K1))
REASONING = "The user wants the docs; I will search them. Ünïcödé 日本 🦜."


def _b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


# -- the blob --------------------------------------------------------------------------------


def test_sealed_reasoning_opens_to_the_same_text() -> None:
    blob = OLD.seal([REASONING])
    assert REASONING not in blob
    assert OLD.open(blob) == [REASONING]
    assert OLD.seal([REASONING]) != blob  # a fresh nonce every time


def test_rotation_seals_with_the_newest_and_opens_with_any() -> None:
    old_blob = OLD.seal([REASONING])
    assert ROTATED.open(old_blob) == [REASONING]
    new_blob = ROTATED.seal([REASONING])
    assert ROTATED.open(new_blob) == [REASONING]
    with pytest.raises(SealError, match="any key"):
        OLD.open(new_blob)  # sealed under 2026-01, which the old set does not hold


@pytest.mark.parametrize(
    "blob",
    [
        "not base64 at all!",
        base64.urlsafe_b64encode(b"\x07" * 60).decode(),  # not our version byte
        "gAAAAABoXt1vYhQ0" * 8,  # an OpenAI-looking blob
        "",
    ],
)
def test_foreign_blobs_do_not_open(blob: str) -> None:
    with pytest.raises(SealError):
        ROTATED.open(blob)


def test_a_changed_byte_does_not_open() -> None:
    raw = bytearray(base64.urlsafe_b64decode(OLD.seal([REASONING])))
    for position in (1, len(raw) // 2, len(raw) - 1):  # key id length, ciphertext, tag
        altered = bytearray(raw)
        altered[position] ^= 0x01
        with pytest.raises(SealError):
            OLD.open(base64.urlsafe_b64encode(bytes(altered)).decode())


def test_keys_never_show() -> None:
    assert "1111" not in repr(OLD)
    assert "1111" not in repr(Settings(reasoning_keys=(K1,)))
    with pytest.raises(ConfigError) as caught:
        load_settings({"PROXY_REASONING_KEYS": "k1:" + _b64(b"short-secret-key")})
    assert "PROXY_REASONING_KEYS=<secret>" in str(caught.value)
    assert _b64(b"short-secret-key") not in str(caught.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "at least one"),
        ("nocolon", "ID:BASE64"),
        ("k1:!!!", "not base64"),
        (f"k1:{_b64(b'x' * 16)}", "32 bytes"),
        (f"k1:{_b64(b'x' * 32)},k1:{_b64(b'y' * 32)}", "distinct"),
    ],
)
def test_bad_key_settings_name_the_problem(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_keys(value)


def test_key_setting_from_env_and_rotation_order() -> None:
    value = f"{K2[0]}:{_b64(K2[1])}, {K1[0]}:{base64.urlsafe_b64encode(K1[1]).decode()}"
    settings = load_settings({"PROXY_REASONING_KEYS": value})
    assert settings.reasoning_keys == (K2, K1)


# -- the core: sealed on the way out ---------------------------------------------------------------


def test_reasoning_items_carry_the_sealed_text(encoding: HarmonyEncoding) -> None:
    text = (
        f"<|channel|>analysis<|message|>{REASONING}<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done.<|return|>"
    )
    ids = ids_of(encoding, text)
    events, _ = run(encoding, [ids[:7], ids[7:]], ctx=context(seal=ROTATED.seal))
    response = assert_well_formed(events)
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["encrypted_content"] is None  # the spec: may be incomplete there
    reasoning = response["output"][0]
    assert ROTATED.open(reasoning["encrypted_content"]) == [REASONING]
    plain, _ = run(encoding, [ids])
    assert assert_well_formed(plain)["output"][0]["encrypted_content"] is None  # not included


# -- the request: opened on the way in ------------------------------------------------------


def _turn(reasoning: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "openai/gpt-oss-120b",
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "input": [
            {"role": "user", "content": "Which docs mention the cache?"},
            {"type": "reasoning", "summary": [], **reasoning},
            {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "call_1"},
            {"type": "function_call_output", "call_id": "call_1", "output": "docs/cache.md"},
        ],
        "tools": [{"type": "function", "name": "f"}],
    }


def test_an_opened_item_renders_as_the_plain_item(encoding: HarmonyEncoding) -> None:
    plain = _turn({"content": [{"type": "reasoning_text", "text": REASONING}]})
    sealed = _turn({"encrypted_content": ROTATED.seal([REASONING])})
    expected = prepare_request(plain, encoding).prompt_token_ids
    opened = prepare_request(sealed, encoding, reasoning_keys=ROTATED)
    assert opened.prompt_token_ids == expected
    assert opened.sealed_reasoning is True
    # the sealed text is what the model wrote: it wins over a client's copy of the content
    edited = _turn(
        {
            "content": [{"type": "reasoning_text", "text": "edited by the client"}],
            "encrypted_content": ROTATED.seal([REASONING]),
        }
    )
    assert prepare_request(edited, encoding, reasoning_keys=ROTATED).prompt_token_ids == expected


def test_a_blob_that_does_not_open_is_a_400(encoding: HarmonyEncoding) -> None:
    foreign = ReasoningKeys((("other", b"9" * 32),)).seal([REASONING])
    with pytest.raises(ClientError) as caught:
        prepare_request(_turn({"encrypted_content": foreign}), encoding, reasoning_keys=ROTATED)
    error = caught.value
    assert (error.status, error.param, error.code) == (
        400,
        "input[1].encrypted_content",
        "invalid_encrypted_content",
    )
    assert "cannot be opened" in error.message


def test_unknown_include_values_are_a_400(encoding: HarmonyEncoding) -> None:
    body = {**_turn({"content": []}), "include": ["reasoning.plaintext"]}
    with pytest.raises(ClientError) as caught:
        prepare_request(body, encoding)
    assert caught.value.param == "include[0]"


# -- end to end: a Codex-style tool loop with store: false ----------------------------------


@pytest.fixture(scope="module")
def servers(encoding: HarmonyEncoding) -> Iterator[tuple[Any, str, str]]:
    config = SimulatorConfig(stream_interval=20, token_seconds=0.0, first_token_seconds=0.0)
    simulator_app = create_simulator_app(config, encoding)
    with LiveServer(simulator_app) as simulator:
        settings = Settings(upstream_url=simulator.url, reasoning_keys=(K2, K1))
        app = create_app(settings, encoding)
        with LiveServer(app) as proxy:
            assert wait_for(lambda: app.state.proxy.capability.token_ids, 10)
            yield simulator_app, simulator.url, proxy.url


def _stream(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + "/v1/responses", json=body, timeout=20)


def _events(answer: httpx.Response) -> list[dict[str, Any]]:
    assert answer.status_code == 200, answer.text
    return [
        orjson.loads(line[6:]) for line in answer.content.split(b"\n") if line.startswith(b"data: ")
    ]


def test_codex_tool_loop_carries_sealed_reasoning(
    servers: tuple[Any, str, str], encoding: HarmonyEncoding
) -> None:
    simulator_app, _, proxy_url = servers
    first = {**CODEX_FIRST, "input": CODEX_FIRST["input"][-1:]}
    response = assert_well_formed(_events(_stream(proxy_url, first)))
    reasoning, call = response["output"][0], response["output"][-1]
    assert call["type"] == "function_call"
    blob = reasoning["encrypted_content"]
    assert ROTATED.open(blob) == [reasoning["content"][0]["text"]]

    def after_tool(item: dict[str, Any]) -> dict[str, Any]:
        return {
            **first,
            "input": [
                *first["input"],
                {"type": "reasoning", "summary": [], **item},  # as Codex sends it back
                {k: call[k] for k in ("type", "name", "arguments", "call_id")},
                {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"},
            ],
        }

    second = assert_well_formed(
        _events(_stream(proxy_url, after_tool({"encrypted_content": blob})))
    )
    assert second["status"] == "completed"
    seen = list(simulator_state(simulator_app).requests[-1].prompt_ids)
    plain = after_tool({"content": reasoning["content"]})
    assert seen == prepare_request(plain, encoding).prompt_token_ids  # the same prompt ids

    altered = blob[:-6] + ("A" if blob[-6] != "A" else "B") + blob[-5:]
    rejected = _stream(proxy_url, after_tool({"encrypted_content": altered}))
    assert rejected.status_code == 400
    assert rejected.json()["error"]["code"] == "invalid_encrypted_content"


def test_configured_keys_open_on_another_replica_generated_ones_do_not(
    servers: tuple[Any, str, str], encoding: HarmonyEncoding, caplog: pytest.LogCaptureFixture
) -> None:
    _, simulator_url, proxy_url = servers
    first = {**CODEX_FIRST, "input": CODEX_FIRST["input"][-1:]}
    blob = assert_well_formed(_events(_stream(proxy_url, first)))["output"][0]["encrypted_content"]
    body = {
        **first,
        "input": [*first["input"], {"type": "reasoning", "summary": [], "encrypted_content": blob}],
    }
    replica = Settings(upstream_url=simulator_url, reasoning_keys=(K2, K1))
    with caplog.at_level(logging.WARNING):
        fresh = create_app(dataclasses.replace(replica, reasoning_keys=()), encoding)
    assert "reasoning key generated" in caplog.text
    for app, status in ((create_app(replica, encoding), 200), (fresh, 400)):
        with LiveServer(app) as other:
            assert wait_for(lambda app=app: app.state.proxy.capability.token_ids, 10)
            assert _stream(other.url, body).status_code == status
