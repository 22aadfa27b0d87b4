"""Sample gpt-oss outputs and guided-decoding formats, with real xgrammar's verdicts on them.

Shared by tests/test_tool_choice.py (the simulator must agree) and
scripts/check-guided-xgrammar (which reruns xgrammar on them); light on imports so the script
runs wherever xgrammar is installed.
"""

from __future__ import annotations

from proxy.harmony.request.guided import ANALYSIS, FINAL, PREAMBLE, call_header, tool_choice_format
from proxy.harmony.request.text import read_text
from proxy.harmony.request.tools import read_tools

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}

_CALL_G = f"<|start|>assistant{call_header('functions.g')}{{}}<|call|>"
SAMPLES = {
    "final": f"{ANALYSIS}Think.<|end|><|start|>assistant{FINAL}Hi there.",
    "call_f": f"{ANALYSIS}Think.<|end|><|start|>assistant{call_header('functions.f')}{{}}<|call|>",
    "call_g": f"{ANALYSIS}Think.<|end|><|start|>assistant{call_header('functions.g')}{{}}<|call|>",
    "preamble_call_f": f"{ANALYSIS}T.<|end|><|start|>assistant{PREAMBLE}Looking.<|end|>"
    f"<|start|>assistant{call_header('functions.f')}{{}}<|call|>",
    "only_analysis": f"{ANALYSIS}Think.<|end|>",
    "recipient_before_channel": f"{ANALYSIS}T.<|end|><|start|>assistant to=functions.f"
    "<|channel|>commentary json<|message|>{}<|call|>",
    "final_json": f'{ANALYSIS}T.<|end|><|start|>assistant{FINAL}{{"answer": 4}}',
    "call_inside_analysis": f"{ANALYSIS}T{_CALL_G}",
    "call_after_final": f"{FINAL}ok<|end|>{_CALL_G}",
    "twelve_messages_then_call_f": f"{ANALYSIS}a<|end|><|start|>assistant" * 12
    + f"{call_header('functions.f')}{{}}<|call|>",
    "json_then_text": f'{ANALYSIS}T.<|end|><|start|>assistant{FINAL}{{"answer": 4}} junk',
    "final_first": f"{FINAL}Hi",
}
_F_G = read_tools([{"type": "function", "name": "f"}, {"type": "function", "name": "g"}])
_JSON = {"type": "json_schema", "json_schema": SCHEMA}
FORMATS = {
    "none": tool_choice_format("none", _F_G, None),
    "none_json": tool_choice_format("none", _F_G, _JSON),
    "required": tool_choice_format("required", _F_G, None),
    "named_f": tool_choice_format({"type": "function", "name": "f"}, _F_G, None),
    "allowed_auto_f": tool_choice_format(
        {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]},
        _F_G,
        None,
    ),
    "upstream_text_format": read_text(
        {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}}
    ).response_format,
}
#: What xgrammar 0.1.25 — the version TensorRT-LLM pins — accepts of SAMPLES for each of FORMATS:
#: each format validated with `xgrammar.structural_tag.StructuralTag` (as trtllm's
#: `ResponseFormat.format` is), compiled with `Grammar.from_structural_tag` and matched with
#: `xgrammar.testing._is_grammar_accept_string` (scripts/check-guided-xgrammar reruns it).
XGRAMMAR_ACCEPTS = {
    "none": {"final", "only_analysis", "final_json", "json_then_text", "final_first"},
    "none_json": {"only_analysis", "final_json", "json_then_text"},
    "required": {
        *("call_f", "call_g", "preamble_call_f", "only_analysis"),
        *("call_inside_analysis", "twelve_messages_then_call_f"),
    },
    "named_f": {"call_f", "preamble_call_f", "only_analysis", "twelve_messages_then_call_f"},
    "allowed_auto_f": {
        *("final", "call_f", "preamble_call_f", "only_analysis", "final_json"),
        *("twelve_messages_then_call_f", "json_then_text", "final_first"),
    },
    "upstream_text_format": {
        *("call_f", "call_g", "preamble_call_f", "only_analysis", "recipient_before_channel"),
        *("final_json", "call_inside_analysis", "call_after_final"),
        *("twelve_messages_then_call_f", "final_first"),
    },
}
