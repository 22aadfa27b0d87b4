"""Conversations in tests: SDK clients whose every answer from a conversation route —
and every non-streamed `/v1/responses` answer — is validated against OpenAI's published spec
(tests/openapi.py) on its way to the SDK, whatever else the test asserts.

The one departure: an empty item list carries `first_id`/`last_id` null (OpenAI's own empty
lists do; the spec says string, with nothing to name), checked as exactly that.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson
from openai import AsyncOpenAI, OpenAI

from tests.openapi import assert_matches_spec

_ONE = r"/v1/conversations/[^/]+"
#: (method, path) → the component schema of a successful answer.
_SCHEMAS = [
    ("POST", re.compile(r"/v1/conversations"), "ConversationResource"),
    ("GET", re.compile(_ONE), "ConversationResource"),
    ("POST", re.compile(_ONE), "ConversationResource"),
    ("DELETE", re.compile(_ONE), "DeletedConversationResource"),
    ("GET", re.compile(_ONE + "/items"), "ConversationItemList"),
    ("POST", re.compile(_ONE + "/items"), "ConversationItemList"),
    ("GET", re.compile(_ONE + "/items/[^/]+"), "ConversationItem"),
    ("DELETE", re.compile(_ONE + "/items/[^/]+"), "ConversationResource"),
    ("POST", re.compile(r"/v1/responses"), "Response"),
]
_EMPTY_LIST = {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


class SpecLog:
    """What the hooks validated: (method, path, schema) of each answer."""

    def __init__(self) -> None:
        self.checked: list[tuple[str, str, str]] = []
        self._clients: list[OpenAI] = []

    def close_clients(self) -> None:
        """Close the sync clients made here (their pooled sockets with them)."""
        while self._clients:
            self._clients.pop().close()

    def schemas(self) -> set[str]:
        return {schema for _, _, schema in self.checked}

    @staticmethod
    def wanted(response: httpx.Response) -> bool:
        """A JSON answer (an event stream is left to the SDK, unread: assert_well_formed
        validates its events, and a test may drop it half-way)."""
        return "json" in response.headers.get("content-type", "")

    def check(self, response: httpx.Response) -> None:
        method, path = response.request.method, response.request.url.path
        body = orjson.loads(response.content)
        if response.status_code >= 400:
            assert_matches_spec(body, "ErrorResponse")
            self.checked.append((method, path, "ErrorResponse"))
            return
        for wanted, pattern, schema in _SCHEMAS:
            if method == wanted and pattern.fullmatch(path):
                if schema == "ConversationItemList" and not body["data"]:
                    assert body == _EMPTY_LIST
                else:
                    assert_matches_spec(body, schema)
                self.checked.append((method, path, schema))
                return

    def client(self, base_url: str, key: str, **kwargs: Any) -> OpenAI:
        """A strict SDK client checked by this log (`close_clients` closes it)."""

        def hook(response: httpx.Response) -> None:
            if self.wanted(response):
                response.read()
                self.check(response)

        made = OpenAI(
            base_url=base_url,
            api_key=key,
            _strict_response_validation=True,
            http_client=httpx.Client(event_hooks={"response": [hook]}),
            **kwargs,
        )
        self._clients.append(made)
        return made

    def async_client(self, base_url: str, key: str, **kwargs: Any) -> AsyncOpenAI:
        """The same, async (openai-agents)."""

        async def hook(response: httpx.Response) -> None:
            if self.wanted(response):
                await response.aread()
                self.check(response)

        return AsyncOpenAI(
            base_url=base_url,
            api_key=key,
            _strict_response_validation=True,
            http_client=httpx.AsyncClient(event_hooks={"response": [hook]}),
            **kwargs,
        )


def dumped_items(items: Any) -> list[dict[str, Any]]:
    """SDK items as JSON, as the wire carried them."""
    return [item.model_dump(mode="json", exclude_unset=True) for item in items]
