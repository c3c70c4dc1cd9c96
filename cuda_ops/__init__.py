"""Triton kernels for the CUDA backend, each matching its pure-torch reference in ``hyspec.ops``.

Importing this package does not import triton: the kernel modules do, and
``cuda_op_overrides()`` imports them only when the CUDA backend asks for its
op table.  Under ``TRITON_INTERPRET=1`` (set before the first call) the same
kernels run on CPU tensors, which is how the test suite checks them.

=============  ==========================================  =====================================
op             kernel module                               reference
=============  ==========================================  =====================================
attention      ``hyspec.cuda_ops.attention``               ``hyspec.ops.attention.paged_attention``
write_kv       ``hyspec.cuda_ops.kv``                      ``hyspec.ops.kv.write_kv``
compact_kv     ``hyspec.cuda_ops.kv``                      ``hyspec.ops.kv.compact_kv``
rms_norm       ``hyspec.cuda_ops.norm``                    ``hyspec.ops.norm.rms_norm``
rotary         ``hyspec.cuda_ops.rotary``                  ``hyspec.ops.rotary.rotary``
rejection_     ``hyspec.cuda_ops.verify``                  ``hyspec.ops.rejection``
sample                                                     ``.rejection_sample``
=============  ==========================================  =====================================

``sample`` (one inverse-CDF draw per row) stays torch: it is a cumsum and a
searchsorted, nothing a kernel would save a pass on.
"""
from __future__ import annotations

from typing import Callable


def cuda_op_overrides() -> dict[str, Callable]:
    """The Triton versions of the ops, keyed by ``OpTable`` op name.

    Pass the result to ``OpTable.with_overrides("triton", **ops)``.  Raises
    ImportError when triton is not installed.
    """
    from hyspec.cuda_ops.attention import triton_paged_attention
    from hyspec.cuda_ops.kv import triton_compact_kv, triton_write_kv
    from hyspec.cuda_ops.norm import triton_rms_norm
    from hyspec.cuda_ops.rotary import triton_rotary
    from hyspec.cuda_ops.verify import triton_rejection_sample

    return {
        "attention": triton_paged_attention,
        "write_kv": triton_write_kv,
        "compact_kv": triton_compact_kv,
        "rms_norm": triton_rms_norm,
        "rotary": triton_rotary,
        "rejection_sample": triton_rejection_sample,
    }


__all__ = ["cuda_op_overrides"]
