"""The `openai` SDK as a strict consumer of our events, without HTTP.

`validate_events` checks every event against openai-python's models the way
`OpenAI(_strict_response_validation=True)` does; `accumulate` feeds them through the
`client.responses.stream()` accumulator (`ResponseStreamState`), which raises on the lifecycle
errors strict clients hit, and returns the response it assembled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openai import omit
from openai._models import validate_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ParsedResponse, ResponseStreamEvent


def validate_events(events: Sequence[dict[str, Any]]) -> list[ResponseStreamEvent]:
    parsed = []
    for event in events:
        model = validate_type(type_=ResponseStreamEvent, value=event)  # type: ignore[arg-type]
        assert model.type == event["type"], f"{event['type']} parsed as {model.type}"
        parsed.append(model)
    return parsed


def accumulate(events: Sequence[dict[str, Any]]) -> ParsedResponse[object] | None:
    state: ResponseStreamState[object] = ResponseStreamState(input_tools=omit, text_format=omit)
    for model in validate_events(events):
        state.handle_event(model)  # type: ignore[arg-type]
    return state._completed_response
