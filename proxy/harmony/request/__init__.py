"""A `/v1/responses` request → the prompt ids, sampling and echo upstream would use, or a 400.

prepare.py  the entry: `parse_body`, `prepare_request` → `PreparedRequest` (theory of operation)
check.py    typed reads of the body; every 400 of the request side is raised here
shapes.py   the keys each request object may hold (from OpenAI's spec)
fields.py   the top-level fields, validated once into a frozen `Fields`
items.py    `input` items → Harmony messages
inputs.py   `input` as a list of items (a string is one user message), for every reader
tools.py    `tools` → Harmony tool namespaces
text.py     `text` (its echo) and `text.format` as upstream's guided decoding
guided.py   `tool_choice` as guided decoding on the message headers
fit.py      `truncation`: the prompt within the model's context
prefix.py   the rendered system + developer head, cached
compaction.py  the `compaction` item (sealed summary), what it keeps, the summarisation pass

May import: `proxy.errors`, `proxy.harmony` base modules (`tokens`, `constraint`,
`reasoning_seal`, `response`). Never the stream, the shell or I/O.
"""
