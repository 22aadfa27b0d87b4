"""The OpenTelemetry GenAI semantic conventions' values for this proxy, declared once for the
spans (tracing.py: `gen_ai.operation.name`, `gen_ai.provider.name`, the span names) and the
GenAI server metrics (metrics/genai.py: the same attributes as labels)."""

from __future__ import annotations

#: The GenAI operation of `POST /v1/responses` (and of each WebSocket turn).
OPERATION = "chat"
#: The system behind the proxy: trtllm-serve.
PROVIDER = "tensorrt_llm"
