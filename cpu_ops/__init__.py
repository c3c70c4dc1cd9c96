"""CPU fast paths: packed linear weights (oneDNN bf16 / MKL fp32) and the ONNX Runtime drafter.

The op table's CPU ops are the pure-torch references (``cpu_op_overrides``
returns none): profiling the embedded model showed the time in the linear
layers, which the backend rewrites once per model (``optimize.py``), not in
the ops.  ``onnx_drafter.py`` runs the draft_model drafter in ONNX Runtime for
CPU draft workers.
"""


def cpu_op_overrides() -> dict:
    """No op of the table is faster than the reference on the CPU yet (see the module docstring)."""
    return {}
