"""CPU fast paths: packed linear weights (oneDNN bf16 / MKL fp32), int4 / int8 weight-only linears
(``quantized_linear.py``: GGUF Q4 / Q8 codes as stored) and the ONNX Runtime drafter.

The op table's one CPU op is ``logits`` (``cpu_op_overrides``): the lm-head
matmul against a copy of the weight packed once (``packed_linear.packed_logits``).
The other ops are the pure-torch references: profiling the embedded model showed
the time in the linear layers, which the backend packs once per model
(``optimize.py``, swapping ``nn.Linear`` modules for ``PackedLinear``), not in
the ops.  ``onnx_drafter.py`` runs the draft_model drafter in ONNX Runtime for
CPU draft workers.
"""


def cpu_op_overrides() -> dict:
    """``logits`` through packed (fp32 / bf16) or quantized (int8) weights where this CPU and torch build can."""
    import torch

    from hyspec.cpu_ops.packed_linear import packed_logits, packing_available
    from hyspec.cpu_ops.quantized_linear import int8_kernel_available

    overrides = {}
    if packing_available(torch.float32) or packing_available(torch.bfloat16) or int8_kernel_available():
        overrides["logits"] = packed_logits
    from hyspec.cpu_ops import paged_attention

    if paged_attention.library() is not None:  # fp32 / bf16 caches from the pages; other dtypes: the reference op
        overrides["attention"] = paged_attention.paged_attention
    return overrides
