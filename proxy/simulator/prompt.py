"""What the scripted model reads in a Harmony prompt: the last user turn, the declared functions,
and a tool's answer to the model's last call.

The real server hands the model nothing but prompt token ids, so the simulator reads only those.
The ids are split into messages at the Harmony specials (`<|start|>` header `<|message|>` content
`<|end|>`/`<|call|>`/`<|return|>`) without openai-harmony's parser, which rejects some valid
prompts (a tool message's author `functions.NAME` is "Unknown role" to
`parse_messages_from_completion_tokens(role=None)`) and raises on garbage; this reader never
raises: a prompt it cannot read is an empty conversation.

Functions come from the developer message's `namespace NS { … }` blocks (`functions` first, then
any other namespace — a `namespace` tool, a hosted MCP server's tools), as openai-harmony renders
`ToolDescription`s (TypeScript-like: `type NAME = (_: { prop: type, … }) => any;`). A tool's
answer is a message whose author is a declared function (`NS.NAME`). Sans-IO.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from openai_harmony import HarmonyEncoding, HarmonyError

from proxy.harmony.tokens import CALL, END, MESSAGE, RETURN, START

_CLOSERS = frozenset({END, CALL, RETURN})
_TYPE_LINE = re.compile(r"^type ([^\s=]+) = \((.*)$")
_PROPERTY = re.compile(r"^([A-Za-z_$][\w$-]*)(\?)?: (.*?),?$")
_NAMESPACE = re.compile(r"^namespace ([^\s{]+) \{$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Turn:
    """One message of the prompt: its author (`user`, `functions.get_weather`, …), channel,
    recipient and text."""

    role: str
    channel: str | None
    recipient: str | None
    text: str


@dataclass(frozen=True, slots=True)
class Function:
    """A declared function and its required top-level parameters as (name, TypeScript type)."""

    name: str
    required: tuple[tuple[str, str], ...] = ()
    namespace: str = "functions"

    @property
    def recipient(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class Prompt:
    """What the scripted model answers to."""

    user_text: str
    functions: tuple[Function, ...]
    tool_name: str | None  # the `functions.*` author answering after the last user turn
    tool_output: str | None
    #: Asked for a checkpoint summary (a last developer message asking for one): what the
    #: summary should hold — earlier summaries, the user's requests, the tools' answers.
    checkpoint: tuple[str, ...] | None = None
    #: the authors of every tool answer after the last user turn
    answered: frozenset[str] = frozenset()


#: What a summarisation request says (the proxy's compaction instruction).
CHECKPOINT_ASK = "CONTEXT CHECKPOINT COMPACTION"
#: How the proxy introduces an earlier summary.
CHECKPOINT_HEADING = "Checkpoint summary of the conversation so far:"


def read_prompt(encoding: HarmonyEncoding, prompt_ids: Sequence[int]) -> Prompt:
    """Read a prompt (module doc); never raises."""
    turns = split_turns(encoding, prompt_ids)
    last_user = max((i for i, turn in enumerate(turns) if turn.role == "user"), default=-1)
    user_text = turns[last_user].text if last_user >= 0 else ""
    functions: tuple[Function, ...] = ()
    for turn in turns:
        if turn.role == "developer":
            functions = declared_functions(turn.text) or functions
    tools = {function.recipient for function in functions}
    answers = [
        t for t in turns[last_user + 1 :] if t.role.startswith("functions.") or t.role in tools
    ]
    tool = answers[-1] if answers else None
    checkpoint = None
    if turns and turns[-1].role == "developer" and CHECKPOINT_ASK in turns[-1].text:
        checkpoint = tuple(_checkpoint_facts(turns[:-1]))
    return Prompt(
        user_text=user_text,
        functions=functions,
        tool_name=tool.role if tool else None,
        tool_output=tool.text if tool else None,
        checkpoint=checkpoint,
        answered=frozenset(t.role for t in answers),
    )


def _checkpoint_facts(turns: Sequence[Turn]) -> list[str]:
    facts = []
    for turn in turns:
        if turn.role == "developer" and turn.text.startswith(CHECKPOINT_HEADING):
            facts.append("Earlier: " + turn.text[len(CHECKPOINT_HEADING) :].strip())
        elif turn.role == "user":
            facts.append(f"The user asked: {turn.text}")
        elif turn.role.startswith("functions."):
            facts.append(f"{turn.role} answered: {turn.text}")
    return facts


def split_turns(encoding: HarmonyEncoding, ids: Sequence[int]) -> list[Turn]:
    """The complete messages of a Harmony token sequence (an unfinished last one is left out)."""
    turns: list[Turn] = []
    header: list[int] | None = None
    content: list[int] | None = None
    for token in ids:
        if token == START:
            header, content = [], None
        elif header is None:
            continue  # outside any message: skip to the next <|start|>
        elif content is None:
            if token == MESSAGE:
                content = []
            else:
                header.append(token)
        elif token in _CLOSERS:
            turns.append(_turn(encoding, header, content))
            header = content = None
        else:
            content.append(token)
    return turns


def _turn(encoding: HarmonyEncoding, header: list[int], content: list[int]) -> Turn:
    head = _decode(encoding, header)
    role = re.split(r"\s|<\|", head, maxsplit=1)[0]
    channel = re.search(r"<\|channel\|>([^\s<]+)", head)
    recipient = re.search(r"to=([^\s<]+)", head)
    return Turn(
        role=role,
        channel=channel[1] if channel else None,
        recipient=recipient[1] if recipient else None,
        text=_decode(encoding, content),
    )


def _decode(encoding: HarmonyEncoding, ids: list[int]) -> str:
    try:
        return encoding.decode(ids)
    except (HarmonyError, ValueError, OverflowError):  # ids outside the vocab or not u32
        return ""


def declared_functions(developer_text: str) -> tuple[Function, ...]:
    """The functions of the `namespace` blocks of a rendered developer message, `functions`
    first."""
    names = [match[1] for match in _NAMESPACE.finditer(developer_text)]
    ordered = sorted(names, key=lambda name: name != "functions")
    return tuple(f for name in ordered for f in _namespace_functions(developer_text, name))


def _namespace_functions(developer_text: str, namespace: str) -> list[Function]:
    start = developer_text.find(f"namespace {namespace} {{")
    end = developer_text.find(f"}} // namespace {namespace}", start)
    block = developer_text[start : end if end >= 0 else None].splitlines()
    functions: list[Function] = []
    line_no = 0
    while line_no < len(block):
        match = _TYPE_LINE.match(block[line_no])
        line_no += 1
        if match is None:
            continue
        name, rest = match[1], match[2]
        required: list[tuple[str, str]] = []
        if rest.startswith("_: {"):
            depth = 1
            while line_no < len(block) and depth > 0:
                line = block[line_no].strip()
                line_no += 1
                if depth == 1 and (prop := _PROPERTY.match(line)) and not prop[2]:
                    required.append((prop[1], prop[3]))
                depth += line.count("{") - line.count("}")
        functions.append(Function(name, tuple(required), namespace))
    return functions
