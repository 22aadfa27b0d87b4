"""Stored responses and conversations as data: what the shell keeps, and what a later request
makes of it. The shell moves the bytes; these modules only read and build.

stored.py        a stored response: its record, its event log, what a reader makes of them
chain.py         `previous_response_id` and `item_reference`: a stored chain merged into a body
conversation.py  the Conversations API's checks, bodies and pages

May import: `proxy.harmony.request` (items are checked as `input` is), `proxy.harmony.stream`
(event shapes) and the base modules.
"""
