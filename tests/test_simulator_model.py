"""The scripted model: valid Harmony, and what the request implies (answer, call, answer after a
tool's output, length on request, unicode); and the prompt reader it relies on."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding, Message, Role

from proxy.harmony.request.prepare import prepare_request
from proxy.harmony.tokens import CALL, RETURN
from proxy.simulator.model import ScriptedModel
from proxy.simulator.prompt import declared_functions, read_prompt, split_turns

MODEL = "openai/gpt-oss-120b"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
        "required": ["location", "unit", "days"],
    },
}
PROBE = [200006, 1428, 200008, 13225, 200007, 200006, 173781]  # the proxy's capability probe


def _prompt(encoding: HarmonyEncoding, **body: Any) -> list[int]:
    return prepare_request({"model": MODEL, **body}, encoding).prompt_token_ids


def _messages(encoding: HarmonyEncoding, ids: tuple[int, ...]) -> list[Message]:
    return encoding.parse_messages_from_completion_tokens(list(ids), role=Role.ASSISTANT)


def _text(message: Message) -> str:
    return "".join(getattr(content, "text", "") for content in message.content)


@pytest.fixture(scope="module")
def model(encoding: HarmonyEncoding) -> ScriptedModel:
    return ScriptedModel(encoding)


def test_plain_request_reasons_then_answers_quoting_the_user(
    encoding: HarmonyEncoding, model: ScriptedModel
) -> None:
    completion = model.complete(_prompt(encoding, input="Where is my order? 🙂"))
    messages = _messages(encoding, completion.token_ids)
    assert [m.channel for m in messages] == ["analysis", "final"]
    assert completion.token_ids[-1] == RETURN
    assert "Where is my order? 🙂" in _text(messages[1])
    assert "Where is my order? 🙂" in _text(messages[0])
    assert [(c, r) for c, r, _ in completion.messages] == [("analysis", None), ("final", None)]


def test_declared_function_is_called_with_json_arguments(
    encoding: HarmonyEncoding, model: ScriptedModel
) -> None:
    prompt = _prompt(encoding, input="Weather in Paris?", tools=[WEATHER])
    completion = model.complete(prompt)
    analysis, call = _messages(encoding, completion.token_ids)
    assert completion.token_ids[-1] == CALL
    assert (call.channel, call.recipient) == ("commentary", "functions.get_weather")
    assert call.content_type == "<|constrain|>json"
    assert json.loads(_text(call)) == {
        "location": "Weather in Paris?",
        "unit": "celsius",
        "days": 1,
    }
    assert "get_weather" in _text(analysis)


def test_answer_uses_the_tool_output_after_the_last_user_turn(
    encoding: HarmonyEncoding, model: ScriptedModel
) -> None:
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "18 °C, cloudy"},
    ]
    completion = model.complete(_prompt(encoding, input=items, tools=[WEATHER]))
    messages = _messages(encoding, completion.token_ids)
    assert [m.channel for m in messages] == ["analysis", "final"]
    assert "18 °C, cloudy" in _text(messages[1])
    assert "functions.get_weather" in _text(messages[1])
    # A new user turn after the tool output: call again.
    again = [
        *items,
        {"role": "assistant", "content": "18 °C."},
        {"role": "user", "content": "Rome?"},
    ]
    completion = model.complete(_prompt(encoding, input=again, tools=[WEATHER]))
    assert completion.token_ids[-1] == CALL


def test_preamble_is_a_commentary_message_without_recipient(
    encoding: HarmonyEncoding, model: ScriptedModel
) -> None:
    for tools in ([], [WEATHER]):
        completion = model.complete(_prompt(encoding, input="Hi", tools=tools), preamble=True)
        messages = _messages(encoding, completion.token_ids)
        assert (messages[1].channel, messages[1].recipient) == ("commentary", None)
        assert len(messages) == 3


@pytest.mark.parametrize("length", [1, 200, 1000, 4000])
def test_length_on_request(encoding: HarmonyEncoding, model: ScriptedModel, length: int) -> None:
    for tools in ([], [WEATHER]):
        completion = model.complete(
            _prompt(encoding, input="Go on.", tools=tools), min_tokens=length
        )
        assert length <= len(completion.token_ids) <= max(length + 40, 80)
        messages = _messages(encoding, completion.token_ids)
        assert messages[-1].channel in ("final", "commentary")
        if tools:
            json.loads(_text(messages[-1]))  # padding never touches the arguments


def test_unicode_and_characters_split_across_tokens(
    encoding: HarmonyEncoding, model: ScriptedModel
) -> None:
    completion = model.complete(_prompt(encoding, input="Bonjour, ça va ?"), min_tokens=400)
    text = encoding.decode(list(completion.token_ids))
    for sample in ("café", "日本", "🦜", "🎉", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Привет", "ça va"):
        assert sample in text
    broken = [t for t in completion.token_ids if "\ufffd" in encoding.decode([t])]
    assert len(broken) > 10  # many tokens are parts of a character


def test_deterministic_and_canonically_tokenized(
    encoding: HarmonyEncoding, model: ScriptedModel
) -> None:
    prompt = _prompt(encoding, input="What's the weather?", tools=[WEATHER])
    first, second = model.complete(prompt, preamble=True), model.complete(prompt, preamble=True)
    assert first == second
    # The ids are what the tokenizer makes of their own text (the fixtures' ids are too).
    assert encoding.encode(encoding.decode(list(first.token_ids)), allowed_special="all") == list(
        first.token_ids
    )


def test_special_token_text_from_the_user_stays_text(
    encoding: HarmonyEncoding, model: ScriptedModel
) -> None:
    completion = model.complete(_prompt(encoding, input="say <|end|><|call|> please"))
    messages = _messages(encoding, completion.token_ids)
    assert [m.channel for m in messages] == ["analysis", "final"]
    assert "<|end|><|call|>" in _text(messages[1])


@pytest.mark.parametrize("prompt", [[], [1, 2, 3], [200006] * 4, [10**9, 200008], PROBE])
def test_any_prompt_gets_an_answer(
    encoding: HarmonyEncoding, model: ScriptedModel, prompt: list[int]
) -> None:
    completion = model.complete(prompt)
    assert [m.channel for m in _messages(encoding, completion.token_ids)] == ["analysis", "final"]


def test_probe_prompt_quotes_its_user_message(
    encoding: HarmonyEncoding, model: ScriptedModel
) -> None:
    assert "“Hello”" in encoding.decode(list(model.complete(PROBE).token_ids))


def test_unstopped_call_continues_with_an_invented_answer(
    encoding: HarmonyEncoding, model: ScriptedModel
) -> None:
    prompt = _prompt(encoding, input="Weather?", tools=[WEATHER])
    completion = model.complete(prompt)
    ids = list(itertools.islice(model.generate(prompt), len(completion.token_ids) + 200))
    rest = ids[len(completion.token_ids) :]
    end = rest.index(RETURN) + 1
    turns = split_turns(encoding, rest[:end])
    assert [(t.role, t.channel) for t in turns] == [
        ("functions.get_weather", "commentary"),
        ("assistant", "final"),
    ]
    after_return = rest[end:]
    assert len(after_return) == 200 - end  # then it rambles without end
    assert RETURN not in after_return


def test_prompt_reader(encoding: HarmonyEncoding) -> None:
    items = [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "second question"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    prompt = read_prompt(encoding, _prompt(encoding, input=items, tools=[WEATHER]))
    assert prompt.user_text == "second question"
    assert (prompt.tool_name, prompt.tool_output) == ("functions.get_weather", "sunny")
    assert [f.name for f in prompt.functions] == ["get_weather"]
    assert prompt.functions[0].required == (
        ("location", "string"),
        ("unit", '"celsius" | "fahrenheit"'),
        ("days", "number"),
    )


def test_declared_functions_reads_nested_and_optional_parameters() -> None:
    text = """# Tools

## functions

namespace functions {

// Runs a shell command.
type shell = (_: {
// The command
command: string[],
workdir?: string,
obj: {
    x: string,
    },
flag: boolean,
}) => any;

type noargs = () => any;

} // namespace functions"""
    shell, noargs = declared_functions(text)
    assert shell.required == (("command", "string[]"), ("obj", "{"), ("flag", "boolean"))
    assert (noargs.name, noargs.required) == ("noargs", ())
    assert declared_functions("no tools here") == ()
