"""Harmony special-token ids of gpt-oss's encoding (o200k_harmony).

The core detects message boundaries from these ids instead of reading the parser's state, which
re-serialises the whole parser on every read: openai-harmony's `state` and `messages` cost O(n)
per token read, O(n²) per response.
"""

from typing import Final

RETURN: Final = 200002  # <|return|>: end of the final answer, gpt-oss's EOS
CONSTRAIN: Final = 200003  # <|constrain|>: content-type marker in a header
CHANNEL: Final = 200005  # <|channel|>
START: Final = 200006  # <|start|>: opens every message after the first
END: Final = 200007  # <|end|>: closes a message that is not the last
MESSAGE: Final = 200008  # <|message|>: the header is complete, content follows
CALL: Final = 200012  # <|call|>: closes a tool call; generation stops here

#: Tokens that close a message's content.
MESSAGE_ENDS: Final = frozenset({END, CALL, RETURN})

#: What trtllm-serve's Responses path passes as stop tokens (stop_tokens_for_assistant_actions).
ASSISTANT_ACTION_STOPS: Final = (RETURN, CALL)
