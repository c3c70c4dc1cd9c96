"""hyspec inside vLLM: ``speculative_config={"method": "custom_class", "model": "hyspec.vllm.HyspecProposer"}``.

Importing this package does not import vLLM: vLLM imports it (core/vllm/proposer.py)."""
from hyspec.vllm.options import VllmOptions, load_options
from hyspec.vllm.proposer import HyspecProposer

__all__ = ["HyspecProposer", "VllmOptions", "load_options"]
