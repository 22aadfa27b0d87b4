"""responses-repair-proxy: correct OpenAI Responses streaming for gpt-oss on trtllm-serve."""

__version__ = "0.1.0"
