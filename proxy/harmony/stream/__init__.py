"""Token ids → Responses events: the repair core, one token at a time, at any chunking.

repair.py     `ResponseStream`: the response's lifecycle (start, feed, finish/fail, record)
machine.py    the per-token state machine: tokens → messages → items → events
parser.py     openai-harmony's `StreamableParser` rules, fast on what gpt-oss writes
items.py      which item a Harmony message becomes, and each item's events
events.py     one builder per wire type; `EventLog` stamps sequence numbers
logprobs.py   token logprobs of output text
record.py     what the repair did, as data (metrics and logs read it)
recovery.py   what the unpatched upstream would have sent for the same frames

May import: `proxy.harmony.unpatched` and the `proxy.harmony` base modules. Never the request
side, the shell or I/O.
"""
