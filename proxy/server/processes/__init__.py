"""Serving processes: uvicorn with the drain (runner.py), the supervisor of worker processes
(supervisor.py, worker.py), their one /metrics (multiproc.py), the CPUs to use (cpus.py)."""
