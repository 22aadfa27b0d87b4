"""What `/metrics` answers: the whole registry's text, in the format the scraper asks for.

OpenMetrics when the `Accept` header asks for it (`application/openmetrics-text`, as Prometheus
does with exemplar storage on): only that format carries the exemplars (genai.py); else
Prometheus' text format."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics


def exposition(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """The registry's text and content type (module doc)."""
    if "application/openmetrics-text" in accept:
        text: bytes = openmetrics.generate_latest(registry)  # type: ignore[no-untyped-call]
        return text, openmetrics.CONTENT_TYPE_LATEST
    return generate_latest(registry), CONTENT_TYPE_LATEST
