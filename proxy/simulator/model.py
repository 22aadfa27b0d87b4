"""The scripted "model": a deterministic Harmony completion chosen from the prompt ids.

Theory of operation
-------------------
gpt-oss continues a prompt that ends in `<|start|>assistant` with Harmony messages. This model
reads the prompt (`prompt.py`) and writes, as token ids:

    <|channel|>analysis<|message|>{reasoning}<|end|>                            always
    <|start|>assistant<|channel|>commentary<|message|>{preamble}<|end|>         when asked for
    then one of
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
        {args}<|call|>
        when functions are declared and no tool answer follows the last user turn
        (NAME is the first declared function, `NS.NAME` for another namespace; args fill its
        required parameters); with `[each tool]` in the user message, each declared function
        in turn until all have answered
    <|start|>assistant<|channel|>final<|message|>{answer}<|return|>
        otherwise: an answer quoting the last user message, or using the tool's answer;
        asked for a checkpoint summary (the proxy's compaction instruction as the last
        message), a summary quoting each user message, tool answer and earlier summary

Given a guided-decoding constraint (`guided.py`), the model writes the first of its candidate
answers the constraint accepts, as a masked engine steers gpt-oss: the answer above, a call to
each other declared function in turn, a prose final answer, a JSON final answer made from the
constraint's schema. None accepted is `GuidedError`. A constraint that allows one constant text
only (the proxy's guided probe) is written as that text.

When nothing enforces the constraint (a server without a guided-decoding backend ignores
`response_format`: `enforced=False`) the model is an adversary of a proxy that would trust
upstream: it writes the first of its candidates the constraint *rejects* — its own answer when
that breaks it (a call under tool_choice "none", a call to another function, prose where JSON is
asked), else a call to another function, a prose answer (under "required"), or, when the
constraint asks for JSON of a schema, first a JSON answer that breaks the schema.

The texts carry unicode on purpose (accents, CJK, emoji that take several tokens each, so a
character is split across tokens and often across engine outputs). `min_tokens` pads reasoning
and answer with filler sentences (a fixed list, in turn) until it has at least that many tokens.

The model writes stop tokens; whether they stop it is the engine's business. When they do not
(`<|call|>` not among `stop_token_ids`, or `ignore_eos`), `generate` goes on the way gpt-oss
tends to: after an unstopped call it invents the tool's answer and a final message; after an
ignored `<|return|>` it rambles in a new final message until the engine's length limit.

Text is encoded segment by segment between specials with `disallowed_special=()`, so a user who
types `<|end|>` gets it quoted as text, never as a special token. Sans-IO.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import orjson
from openai_harmony import HarmonyEncoding

from proxy.harmony.tokens import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START
from proxy.simulator.guided import Constraint, GuidedError, json_breaking, json_instance
from proxy.simulator.prompt import Function, Prompt, read_prompt

Piece = str | int  # text, or a special token id

_QUOTE_CHARS: Final = 160
#: In the last user message: call every declared function in turn, one per completion, before
#: the answer (a multi-call tool loop), instead of the first one only.
EACH_TOOL: Final = "[each tool]"

FILLER: Final = (
    "Let me think this through step by step.",
    "Café au lait, naïve façade, jalapeño: accents must survive the stream.",
    "東京と大阪は日本の都市です。",
    "Emoji take several tokens each: 🎉 🦜 ⏳ 👩‍💻.",
    "Some mathematical letters: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢.",  # noqa: RUF001 - 4-byte characters on purpose
    "Привет, мир! Γειά σου κόσμε!",  # noqa: RUF001 - Cyrillic and Greek on purpose
    "Numbers such as 3.14159 and 2,718 appear too.",
    "So far, everything checks out.",
)


@dataclass(frozen=True, slots=True)
class Completion:
    """The scripted completion: its ids (ending in `<|return|>` or `<|call|>`) and the messages
    as (channel, recipient, text), for tests and demos."""

    token_ids: tuple[int, ...]
    messages: tuple[tuple[str, str | None, str], ...]


class ScriptedModel:
    """Deterministic completions for Harmony prompts (module doc)."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._encoding = encoding
        self._filler = [self._encode(" " + sentence) for sentence in FILLER]

    def complete(
        self,
        prompt_ids: Sequence[int],
        *,
        min_tokens: int | None = None,
        preamble: bool = False,
        constraint: Constraint | None = None,
        enforced: bool = True,
    ) -> Completion:
        """The completion this model writes for `prompt_ids`, steered by `constraint` — or, not
        `enforced`, against it (module doc)."""
        forced = None if constraint is None or not enforced else constraint.forced_text()
        if forced is not None:
            ids = self._encoding.encode(forced, allowed_special="all")
            return Completion((*ids, RETURN), (("final", None, forced),))
        prompt = read_prompt(self._encoding, prompt_ids)
        if enforced:
            plan = self._steered(prompt, preamble, constraint)
        else:
            plan = self._unguided(prompt, preamble, constraint)
        completion = self._render(plan)
        if min_tokens is not None and len(completion.token_ids) < min_tokens:
            completion = self._padded(plan, min_tokens, len(completion.token_ids))
        return completion

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        min_tokens: int | None = None,
        preamble: bool = False,
        constraint: Constraint | None = None,
        enforced: bool = True,
    ) -> Iterator[int]:
        """The completion's ids, then what the model writes when nothing stops it (module doc);
        endless: the engine takes what it needs."""
        completion = self.complete(
            prompt_ids,
            min_tokens=min_tokens,
            preamble=preamble,
            constraint=constraint,
            enforced=enforced,
        )
        yield from completion.token_ids
        yield from self.continuation(completion)

    def guided_text(self, token_ids: Sequence[int]) -> str:
        """The text a constraint matches: specials as their text, without the end-of-sequence
        token (xgrammar's stop token, not grammar text)."""
        ids = list(token_ids)
        if ids and ids[-1] == RETURN:
            ids.pop()
        return self._encoding.decode(ids)

    def _steered(
        self, prompt: Prompt, preamble: bool, constraint: Constraint | None
    ) -> list[_Message]:
        plans = _plans(prompt, preamble, constraint)
        first = next(plans)
        if constraint is None:
            return first
        for plan in itertools.chain([first], plans):
            if constraint.accepts(self.guided_text(self._render(plan).token_ids)):
                return plan
        raise GuidedError("the scripted model has no answer that this response_format accepts")

    def _unguided(
        self, prompt: Prompt, preamble: bool, constraint: Constraint | None
    ) -> list[_Message]:
        """The first candidate `constraint` rejects (its own answer when there is none)."""
        plans = list(_plans(prompt, preamble, constraint))
        if constraint is None:
            return plans[0]
        schema = constraint.json_schema()
        if schema is not None and schema != {"type": "object"}:
            question = _quote(prompt.user_text) or "(nothing)"
            plans.insert(0, _json_answer(question, preamble, json_breaking(schema)))
        for plan in plans:
            if not constraint.accepts(self.guided_text(self._render(plan).token_ids)):
                return plan
        return plans[0]

    def continuation(self, completion: Completion) -> Iterator[int]:
        """What follows the completion's last token when the engine does not stop there."""
        _, recipient, _ = completion.messages[-1]
        if completion.token_ids[-1] == CALL and recipient is not None:
            invented = orjson.dumps({"note": "no tool ran: the call was not stopped"}).decode()
            yield from self._ids(
                [START, f"{recipient} to=assistant", CHANNEL, "commentary", MESSAGE, invented, END]
            )
            yield from self._ids(
                [START, "assistant", CHANNEL, "final", MESSAGE, "I could not run the tool.", RETURN]
            )
        yield from self._ids([START, "assistant", CHANNEL, "final", MESSAGE])
        for filler in itertools.cycle(self._filler):  # no end: the length limit ends it
            yield from filler

    # -- rendering ---------------------------------------------------------------------------

    def _render(self, plan: list[_Message]) -> Completion:
        pieces: list[Piece] = []
        for index, message in enumerate(plan):
            if index:
                pieces += [START, "assistant"]
            pieces += message.pieces()
        messages = tuple((m.channel, m.recipient, m.text) for m in plan)
        return Completion(tuple(self._ids(pieces)), messages)

    def _padded(self, plan: list[_Message], min_tokens: int, length: int) -> Completion:
        """Filler sentences added to the reasoning (half the missing tokens) and to the last
        message when it is the answer (the rest), until the completion is long enough."""
        reasoning, last = plan[0], plan[-1]
        targets = [reasoning, last] if last.channel == "final" and not last.json else [reasoning]
        missing = min_tokens - length
        shares = [missing // len(targets)] * len(targets)
        shares[-1] += missing % len(targets)
        counter = itertools.count(1)
        for message, share in zip(targets, shares, strict=True):
            message.text += self._filler_text(share, counter)
        completion = self._render(plan)
        while len(completion.token_ids) < min_tokens:  # tokenization at the joins may differ
            targets[-1].text += self._filler_text(min_tokens - len(completion.token_ids), counter)
            completion = self._render(plan)
        return completion

    def _filler_text(self, tokens: int, counter: Iterator[int]) -> str:
        parts: list[str] = []
        while tokens > 0:
            number = next(counter)
            index = (number - 1) % len(FILLER)
            parts.append(f" {FILLER[index]}")
            tokens -= len(self._filler[index])
        return "".join(parts)

    def _ids(self, pieces: Sequence[Piece]) -> list[int]:
        ids: list[int] = []
        for piece in pieces:
            if isinstance(piece, int):
                ids.append(piece)
            else:
                ids += self._encode(piece)
        return ids

    def _encode(self, text: str) -> list[int]:
        return self._encoding.encode(text, disallowed_special=())


@dataclass(slots=True)
class _Message:
    """One message of the plan; `text` grows when the completion is padded."""

    channel: str
    text: str
    recipient: str | None = None
    json: bool = False  # a JSON answer: never padded with filler

    def pieces(self) -> list[Piece]:
        if self.recipient is not None:  # a function call: JSON arguments, stopped by <|call|>
            return [
                CHANNEL,
                f"{self.channel} to={self.recipient} ",
                CONSTRAIN,
                "json",
                MESSAGE,
                self.text,
                CALL,
            ]
        end = RETURN if self.channel == "final" else END
        return [CHANNEL, self.channel, MESSAGE, self.text, end]


def _plan(prompt: Prompt, preamble: bool) -> list[_Message]:
    question = _quote(prompt.user_text) or "(nothing)"
    if prompt.checkpoint is not None:
        return _summary(prompt.checkpoint)
    if EACH_TOOL in prompt.user_text:
        waiting = [f for f in prompt.functions if f.recipient not in prompt.answered]
        if waiting and prompt.tool_name is not None:
            return _call(waiting[0], prompt, question, preamble)
    if prompt.tool_name is not None:
        answer = _quote(prompt.tool_output or "") or "(nothing)"
        name = prompt.tool_name
        return [
            _Message("analysis", f"The tool {name} answered: “{answer}”. Now I can answer."),
            *_preamble(preamble, "Got the result, writing it up… ⏳"),
            _Message("final", f"Here is what {name} says: “{answer}” ✅ Hope that helps! 🎉"),
        ]
    if prompt.functions:
        return _call(prompt.functions[0], prompt, question, preamble)
    return [
        _Message(
            "analysis",
            f"The user asks: “{question}”. I will answer briefly, with café, naïve, 日本語 "
            "and 🦜 in it.",
        ),
        *_preamble(preamble, "Let me think about that for a moment… ⏳"),
        _Message("final", f"You asked: “{question}”. Here is my answer: ¡hola! 你好 🎉 ✅"),
    ]


def _summary(facts: Sequence[str]) -> list[_Message]:
    """A checkpoint summary: each fact of the history quoted short, then the next step."""
    lines = [f"- {_quote(fact)}" for fact in facts] or ["- (nothing happened yet)"]
    return [
        _Message("analysis", f"A checkpoint: I summarise {len(facts)} facts of the conversation."),
        _Message(
            "final",
            "Checkpoint summary.\n" + "\n".join(lines) + "\nNext: continue from the last request.",
        ),
    ]


def _call(function: Function, prompt: Prompt, question: str, preamble: bool) -> list[_Message]:
    arguments = orjson.dumps(_arguments(function, prompt.user_text)).decode()
    return [
        _Message("analysis", f"The user asks: “{question}”. I should call {function.name}."),
        *_preamble(preamble, "Let me look that up for you… ⏳"),
        _Message("commentary", arguments, recipient=function.recipient),
    ]


def _plans(
    prompt: Prompt, preamble: bool, constraint: Constraint | None
) -> Iterator[list[_Message]]:
    """The answer this model wants, then the ones a constraint may steer it to (module doc)."""
    yield _plan(prompt, preamble)
    question = _quote(prompt.user_text) or "(nothing)"
    for function in prompt.functions:
        arguments = orjson.dumps(_arguments(function, prompt.user_text)).decode()
        yield [
            _Message("analysis", f"The user asks: “{question}”. I should call {function.name}."),
            *_preamble(preamble, "Let me look that up for you… ⏳"),
            _Message("commentary", arguments, recipient=function.recipient),
        ]
    yield _plan(Prompt(prompt.user_text, (), prompt.tool_name, prompt.tool_output), preamble)
    schema = None if constraint is None else constraint.json_schema()
    if schema is not None:
        yield _json_answer(question, preamble, json_instance(schema))


def _json_answer(question: str, preamble: bool, value: object) -> list[_Message]:
    return [
        _Message("analysis", f"The user asks: “{question}”. I answer in the JSON asked for."),
        *_preamble(preamble, "Writing the JSON… ⏳"),
        _Message("final", orjson.dumps(value).decode(), json=True),
    ]


def _preamble(wanted: bool, text: str) -> list[_Message]:
    return [_Message("commentary", text)] if wanted else []


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 1] + "…"


def _arguments(function: Function, user_text: str) -> dict[str, object]:
    """A value for each required parameter, by its TypeScript type."""
    value = _quote(user_text)[:60] or "example"
    arguments: dict[str, object] = {}
    for name, type_ in function.required:
        if type_.endswith("[]"):
            arguments[name] = [value] if type_.startswith("string") else []
        elif type_.startswith('"'):
            arguments[name] = type_.split('"')[1]  # the first literal of a union
        elif type_.startswith("number"):
            arguments[name] = 1
        elif type_.startswith("boolean"):
            arguments[name] = True
        elif type_.startswith("{"):
            arguments[name] = {}
        else:
            arguments[name] = value
    return arguments
