"""The CPU backend's ``attention`` op: paged attention read straight from the pages (paged_attention.c).

The reference op gathers each sequence's pages into a contiguous copy every
layer and calls SDPA; on the default model that was 22 % of a decode step's
wall time (py-spy, AVX2 VM).  The kernel reads the pages in place, computes
each (query row, head) alone in position order, and so gives a verified
draft token exactly the output its plain decode step gets.  It takes fp32
or bf16 caches (bf16: computed in fp32, rounded once) with a head size that is
a multiple of 8 and a contiguous last dimension; anything else, or no C
compiler here, runs the reference op.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from hyspec.ops import AttentionMetadata
from hyspec.ops.attention import paged_attention as reference_attention


@functools.cache
def library() -> ctypes.CDLL | None:
    return variant("native")


@functools.cache
def variant(march: str) -> ctypes.CDLL | None:
    """The kernel built for ``-march=march`` (tests run the AVX2 and portable paths on any x86 CPU)."""
    from hyspec.cpu_ops.native import load

    lib = load("paged_attention.c", march)
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.hyspec_paged_attention.restype = ctypes.c_int
    lib.hyspec_paged_attention.argtypes = [ptr, i64, i64, i64, ptr, ptr, i64, i64, i64, i64, i64, ptr, i64, ptr,
                                           ptr, ptr, ptr, ptr, i64, ctypes.c_float, ptr, ctypes.c_int]
    lib.hyspec_paged_attention_windowed.restype = ctypes.c_int
    lib.hyspec_paged_attention_windowed.argtypes = lib.hyspec_paged_attention.argtypes + [ptr, i64]
    return lib


def _rows(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per step (shared by every layer): int32 seq_lens, query_lens, row -> sequence, row -> query index, table."""
    n = meta.num_seqs
    if n and max(meta.query_lens) == 1 and sum(meta.query_lens) == n:  # decoding: row i is sequence i's one query
        query_lens = torch.ones(n, dtype=torch.int32)
        seq = torch.arange(n, dtype=torch.int32)
        idx = torch.zeros(n, dtype=torch.int32)
    else:
        query_lens = torch.tensor(meta.query_lens, dtype=torch.int32)
        seq = torch.repeat_interleave(torch.arange(n, dtype=torch.int32), query_lens.to(torch.int64))
        idx = torch.cat([torch.arange(q, dtype=torch.int32) for q in meta.query_lens])
    return (torch.tensor(meta.seq_lens_host, dtype=torch.int32), query_lens, seq, idx,
            meta.block_tables.to(torch.int32).contiguous())


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, lib: ctypes.CDLL | None = None,
                    sliding_window: int | None = None, softcap: float | None = None) -> torch.Tensor:  # [T, Hq, D]
    """The op (``lib``: a :func:`variant` to run instead of the native build, for tests).

    ``sliding_window``: a query at position p sees only entries at positions > p - w, by position as the
    reference op masks; a step in which no sequence is longer than the window runs without it (the same
    entries, the same bits).  ``softcap`` (Gemma 2's soft-capped scores) is not in the kernel: such a model's
    attention runs the reference op."""
    if softcap is not None:
        return reference_attention(q, k_cache, v_cache, meta, scale, sliding_window=sliding_window, softcap=softcap)
    if sliding_window is not None and meta.max_seq_len <= sliding_window:
        sliding_window = None
    lib = lib or library()
    if not (q.dtype == k_cache.dtype == v_cache.dtype and q.dtype in (torch.float32, torch.bfloat16)
            and q.shape[-1] % 8 == 0
            and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
            and not (torch.is_grad_enabled() and q.requires_grad)) or lib is None:
        return reference_attention(q, k_cache, v_cache, meta, scale, sliding_window=sliding_window)
    T, Hq, D = q.shape
    seq_lens, query_lens, row_seq, row_i, table = meta.derived("cpu_rows", lambda: _rows(meta))
    tree = None
    if meta.tree_mask is not None:
        tree = meta.derived("cpu_tree", lambda: meta.tree_mask.to(torch.uint8).contiguous())
    qc = q.contiguous()
    out = torch.empty_like(qc)
    sb, so, sh, _ = k_cache.stride()
    args = (qc.data_ptr(), T, Hq, D, k_cache.data_ptr(), v_cache.data_ptr(), sb, so, sh, k_cache.shape[1],
            k_cache.shape[2], table.data_ptr(), table.stride(0), seq_lens.data_ptr(), query_lens.data_ptr(),
            row_seq.data_ptr(), row_i.data_ptr(), 0 if tree is None else tree.data_ptr(),
            meta.max_query_len, float(scale), out.data_ptr(), int(q.dtype == torch.bfloat16))
    if sliding_window is None:
        rc = lib.hyspec_paged_attention(*args)
    else:
        positions = meta.derived("cpu_positions", lambda: meta.positions.to(torch.int64).contiguous())  # [T]
        rc = lib.hyspec_paged_attention_windowed(*args, positions.data_ptr(), int(sliding_window))
    if rc != 0:
        raise MemoryError("hyspec_paged_attention: out of memory for its score buffers")
    return out


paged_attention.supports_sliding_window = True
paged_attention.supports_softcap = True  # by handing soft-capped attention to the reference op

__all__ = ["library", "paged_attention", "variant"]
