"""A model of upstream's unpatched `/v1/responses` emitter: what a client of trtllm-serve sees.

emitter.py  `UnpatchedStream`: the events upstream's Harmony streaming code sends per engine
            output (the simulator serves it; the recovery accounting compares against it)
output.py   the output items upstream's terminal snapshot carries

May import: the `proxy.harmony` base modules only.
"""
