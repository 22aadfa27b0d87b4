"""`truncation`: the prompt and `max_output_tokens` within the model's context.

The prompt plus the tokens asked for (`max_output_tokens`, else at least one) must fit in the
model's context, `max_prompt_tokens` (a setting; 131,072 for gpt-oss). When they do not:

- `truncation: "disabled"` (the default): a 400 `context_length_exceeded` that names the sizes,
  as OpenAI answers it, instead of upstream's engine error after the request was queued;
- `truncation: "auto"`: OpenAI's rule — whole input items are dropped from the start of the
  conversation until it fits. The system and developer messages (instructions, tools) and the
  `developer`/`system` input messages are never dropped, and a tool's output whose call was
  dropped goes with it. Even the last item not fitting is a 400.

Efficiency: the conversation is rendered once; only when it does not fit is each input message
rendered on its own, once, for its length. Harmony renders messages one by one with nothing
carried between them for the messages request/items.py builds (request/prefix.py explains why),
so a kept suffix is as long as the sum of its messages and the first cut found fits; the result
is rendered once more, and checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from openai_harmony import Conversation, HarmonyEncoding, Message, Role

from proxy.errors import ClientError

#: gpt-oss's context (its `max_position_embeddings`), the default of `max_prompt_tokens`.
GPT_OSS_CONTEXT = 131_072
_KEPT_ROLES = frozenset({Role.SYSTEM, Role.DEVELOPER})

Render = Callable[[Sequence[Message]], list[int]]


def fit_prompt(
    encoding: HarmonyEncoding,
    inputs: Sequence[Message],
    render: Render,
    *,
    context: int | None,
    max_output_tokens: int | None,
    truncation: str,
) -> list[int]:
    """The prompt ids of `render(inputs)`, truncated as `truncation` says to fit `context`
    (None: no limit); `ClientError` 400 when it cannot fit (module doc)."""
    prompt = render(inputs)
    reserve = max_output_tokens or 1
    if context is None or len(prompt) + reserve <= context:
        return prompt
    if truncation != "auto":
        raise _too_long(
            f"The prompt is {len(prompt):,} tokens",
            max_output_tokens,
            len(prompt),
            context,
            "shorten the input, or set truncation to 'auto' to drop its oldest items",
        )
    lengths = [
        len(encoding.render_conversation(Conversation.from_messages([message])))
        for message in inputs
    ]
    pinned = [message.author.role in _KEPT_ROLES for message in inputs]
    fixed = len(prompt) - sum(n for n, pin in zip(lengths, pinned, strict=True) if not pin)
    droppable = [i for i, pin in enumerate(pinned) if not pin]
    # The kept conversation may begin at any droppable item but a tool's output: its call would
    # be gone, and it would answer nothing.
    cuts = [p for p, i in enumerate(droppable) if inputs[i].author.role != Role.TOOL]
    suffix = [0] * (len(droppable) + 1)  # suffix[p]: the length of droppable[p:]
    for position in reversed(range(len(droppable))):
        suffix[position] = suffix[position + 1] + lengths[droppable[position]]
    rest = [suffix[p] for p in cuts]
    budget = context - reserve - fixed
    for position, size in zip(cuts, rest, strict=True):
        if size > budget:
            continue
        kept = set(droppable[position:])
        prompt = render([m for i, m in enumerate(inputs) if pinned[i] or i in kept])
        if len(prompt) + reserve <= context:
            return prompt
        # lengths were not additive after all (never seen): drop more, and check again
    smallest = fixed + (rest[-1] if rest else 0)
    raise _too_long(
        f"Even with every input item dropped but the last that can begin a conversation, "
        f"the prompt is {smallest:,} tokens",
        max_output_tokens,
        smallest,
        context,
        "shorten the last input item, the instructions or the tools",
    )


def _too_long(
    what: str, max_output_tokens: int | None, size: int, context: int, advice: str
) -> ClientError:
    asked = max_output_tokens or 1
    return ClientError(
        f"{what}; with max_output_tokens {asked:,} that is {size + asked:,} tokens, above the "
        f"model's context of {context:,} tokens: {advice}.",
        param="input",
        code="context_length_exceeded",
    )
