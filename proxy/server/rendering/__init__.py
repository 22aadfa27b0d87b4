"""Rendering requests where they cannot hold the event loop: the pool (pool.py) and its worker
processes (worker.py)."""
