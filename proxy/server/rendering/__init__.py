"""Rendering requests where they cannot hold the event loop: the pool and its worker processes
(issue 12)."""
