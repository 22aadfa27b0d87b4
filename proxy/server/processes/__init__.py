"""Serving processes: uvicorn with the drain, the supervisor of worker processes, their metrics
(issues 12, 17)."""
