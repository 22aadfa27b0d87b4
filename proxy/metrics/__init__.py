"""Prometheus metrics on an injected registry: the adapters that read what the core recorded.

Label values come only from small fixed sets (routes, outcomes, channels, event types the core
emits, error kinds); models only from the configured `metrics_models` list, others are `other`.
Never ids, text or client-supplied strings.

With worker processes (`workers` above 1) every process writes its values to prometheus_client's
multiprocess files (proxy/server/processes/multiproc.py) and `/metrics` reads them all: counters
and histograms are summed; each gauge says how its values combine (`multiprocess_mode`, ignored
in a single process): what a process holds is summed over the live ones (`livesum`), a condition
of the whole proxy is the worst live process's (`livemin` for "ready", `livemax` for
"draining"), and what every process reads from one shared source is the same anywhere
(`livemax`). No gauge is read at scrape time (`set_function`): a scrape answered by one process
would never see another's.
"""
