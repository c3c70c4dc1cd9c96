"""Paged attention for prefill, decode and tree verification in one Triton kernel.

Contract: ``hyspec.ops.attention.paged_attention`` (same arguments, same
visibility rules: context entries always, new entries causally or through the
packed ancestor mask ``tree_mask``).

How the work is cut:

* A program owns one query tile of one sequence (``block_q`` query tokens) for
  one KV head, and serves all ``Hq / Hkv`` query heads of that KV group at
  once (rows = token x group head), so each K/V tile is loaded once per group.
* Keys are visited in tiles of ``block_n`` from index 0 upwards; each key row
  finds its page through the block table, so any block size works and the
  cache may be a strided view of the shared pool.
* Online softmax in fp32 (base-2 exponent with the scale folded in).  bf16 /
  fp16 inputs feed the tensor cores as they are (``DOT_PRECISION="native"``):
  Q.K^T multiplies them exactly into fp32 accumulators, and P is rounded to
  the input dtype (nearest even) before P.V, as SDPA / flash attention do;
  the row sums l use the unrounded fp32 P.  K and V are never copied to fp32
  (that halved the tensor-core rate and kept fp32 tiles in registers).  fp32
  inputs use ``ieee`` dots.  (Until this change P was fed unrounded to
  ``mma.tf32``, which truncates it: the old "exact" claim did not hold, and
  the interpreter, which ignores ``input_precision``, could not show it.)
  FMA contraction is switched off (``enable_fp_fusion=False``) so results do
  not change with Triton's default (3.9 fuses, 3.10 will not).
* Split-KV ("flash decoding"): when the longest query is short (decode and
  verification), each program covers one ``partition_size`` slice of the keys
  and a second kernel merges the partial softmaxes; otherwise (prefill) one
  program walks the whole range.  Whether a step splits depends on its
  lengths only; a batch whose split workspace would pass
  ``max_workspace_bytes`` runs as several launches of whole sequences.
  On a GPU the partition size is fixed per device and model
  (:func:`partition_size_for`: enough programs for every SM at batch 1).
* Tiles: :func:`default_attention_config` (32-row tiles for decode and
  verification, 64-row tiles on 8 warps for long bf16/fp16 prefill chunks,
  which Triton lowers to Hopper's wgmma); docs/cuda_kernels.md has every
  variant's registers, spills and tensor-core instructions.

Numerics for 1 vs n query tokens (docs/architecture.md §4): tile and partition
boundaries are absolute key indices, fixed by the config alone, and the
block sizes do not depend on the number of queries.  A chain token verified
among n others therefore sees exactly the key tiles it would see when decoded
alone; extra keys it may not see contribute exact zeros (``exp2(-inf)``) and
leave the running max unchanged, and a partial softmax merged with empty
partitions equals the unsplit one.  So decode and chain verification agree
bit for bit whenever both use split-KV or both do not: both do (up to
``split_max_query_len`` rows), whatever the batch.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from hyspec.cuda_ops.common import (TRITON_DTYPES, KernelInputError, check_device, check_dtype,
                                    interpreted, next_power_of_2, round_to, round_trip)
from hyspec.ops.attention import AttentionMetadata

#: Widest head the kernel keeps in registers (q and the accumulator are [rows, head_dim] fp32).
MAX_HEAD_DIM = 256
_LOG2E = 1.0 / math.log(2.0)  # exp(x) == exp2(x * _LOG2E)


@dataclass(frozen=True)
class AttentionConfig:
    """Tile sizes of the attention kernel.  None of them depends on the step's query count; the default
    configuration does, once: prefill chunks longer than ``split_max_query_len`` take the prefill tiles
    (:func:`default_attention_config`)."""

    block_m: int = 32  # query rows (token x head of a KV group) per program
    block_n: int = 32  # keys per inner step
    partition_size: int = 512  # keys per program under split-KV; a multiple of block_n
    split_max_query_len: int = 64  # split-KV only for steps whose longest query is at most this
    max_workspace_bytes: int = 1 << 30  # split-KV scratch cap per launch; more sequences take more launches
    merge_block: int = 8  # partitions merged per inner step of the merge kernel
    merge_heads: int = 4  # query heads per merge program
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name, least in (("block_m", 16), ("block_n", 16), ("merge_block", 1), ("merge_heads", 1)):
            value = getattr(self, name)
            if value < least or value & (value - 1):
                raise ValueError(f"AttentionConfig.{name} must be a power of two >= {least}, got {value}")
        if self.partition_size < self.block_n or self.partition_size % self.block_n:
            raise ValueError(f"AttentionConfig.partition_size {self.partition_size} must be a positive "
                             f"multiple of block_n {self.block_n}")
        if self.split_max_query_len < 0 or self.max_workspace_bytes < 0:
            raise ValueError("AttentionConfig: split_max_query_len and max_workspace_bytes must be >= 0")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"AttentionConfig: bad num_warps {self.num_warps} / num_stages {self.num_stages}")


#: Integers that change from step to step.  Triton specialises integer arguments (a value of 1 becomes a
#: constant, multiples of 16 get alignment hints), so each new value would compile a new binary mid-serving
#: (~1 s each); these stay runtime values.  The static ones (heads, head_dim, block_size, model strides) keep
#: their specialisation.
PER_STEP_ATTENTION = ["num_q_tiles", "num_partitions", "partition_size", "stride_bt", "stride_tree_t"]


#: the widest head the prefill configuration is used for (wider heads keep the decode tiles)
PREFILL_MAX_HEAD_DIM = 128


def default_attention_config(head_dim: int, prefill: bool = False, fp32: bool = False) -> AttentionConfig:
    """Register-budget driven defaults, checked by compiling for sm_90a and sm_80 (docs/cuda_kernels.md).

    * decode, chains and trees (the split path, up to ``split_max_query_len`` query rows): 32-row tiles on
      4 warps for bf16/fp16 with D <= 64; 8 warps for wider heads and for fp32 (ieee dots, no tensor cores:
      on 4 warps D = 128 spilled 116-280 bytes a variant in bf16 and up to 1.7 KB in fp32, on 8 none or
      44 bytes); 16-key tiles past D = 128.  Decode and verification share this configuration, which is
      what keeps them bitwise equal.
    * ``prefill`` (longer queries without a tree mask, bf16/fp16, D <= 128): 64-row tiles on 8 warps, the
      shape Triton lowers to Hopper's warpgroup MMA (``wgmma``) instead of per-warp ``mma.sync``.
    """
    if prefill and head_dim <= PREFILL_MAX_HEAD_DIM:
        return AttentionConfig(block_m=64, block_n=32, num_warps=8)
    return AttentionConfig(block_n=16 if head_dim > 128 else 32, num_warps=4 if head_dim <= 64 and not fp32 else 8)


#: the context length at which a batch-1 decode should give every SM a split-KV program
FILL_CONTEXT = 2048
#: the partition sizes the SM-filling choice ranges over (smaller: more merge work and workspace per key)
MIN_PARTITION, MAX_PARTITION = 128, 512


def partition_size_for(num_sms: int, num_kv_heads: int) -> int:
    """Keys per split-KV program on a GPU with ``num_sms`` SMs, for a model with ``num_kv_heads``.

    A batch-1 decode launches (context / partition) x KV heads programs; the largest power of two in
    [128, 512] that still gives ``num_sms`` programs at FILL_CONTEXT tokens (128 on an H200, 132 SMs, for
    8 KV heads: 16 x 8 = 128 programs at 2k tokens instead of 4 x 8 = 32 with 512).  The choice depends on
    the device and the model only, never on a step: decode and verification split the keys identically,
    which keeps them bitwise equal.
    """
    if num_sms < 1 or num_kv_heads < 1:
        raise ValueError(f"partition_size_for: num_sms {num_sms} and num_kv_heads {num_kv_heads} must be >= 1")
    target = FILL_CONTEXT * num_kv_heads // num_sms
    size = MIN_PARTITION
    while size * 2 <= min(target, MAX_PARTITION):
        size *= 2
    return size


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_partition_size(q: torch.Tensor, num_kv_heads: int) -> int | None:
    """:func:`partition_size_for` the GPU ``q`` lives on; None off a GPU (the interpreter keeps the config's)."""
    if q.device.type != "cuda":
        return None
    return partition_size_for(_sm_count(q.device.index or 0), num_kv_heads)


@triton.jit(do_not_specialize=PER_STEP_ATTENTION)
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, m_ws_ptr, l_ws_ptr, acc_ws_ptr,
    qsl_ptr, seq_lens_ptr, block_tables_ptr, tree_ptr, positions_ptr,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ko, stride_kh, stride_kd,
    stride_vb, stride_vo, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_od,
    stride_bt, stride_tree_t, stride_tree_k,
    scale_log2, num_q_tiles, num_q_heads, head_dim, block_size, num_partitions, partition_size, window,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, D_PAD: tl.constexpr, HAS_TREE: tl.constexpr, HAS_WINDOW: tl.constexpr,
    SPLIT: tl.constexpr, OUT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, SOFT_BF16: tl.constexpr,
):
    seq = tl.program_id(0) // num_q_tiles
    i0 = (tl.program_id(0) % num_q_tiles) * BLOCK_Q
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    q_start = tl.load(qsl_ptr + seq)
    n = tl.load(qsl_ptr + seq + 1) - q_start
    if i0 < n:
        seq_len = tl.load(seq_lens_ptr + seq)
        ctx = seq_len - n  # committed context; the n new entries follow it in query order
        rows = tl.arange(0, BLOCK_M)
        qi = i0 + rows // GROUP_PAD  # query index within the sequence
        head = kv_head * GROUP + rows % GROUP_PAD
        row_ok = (qi < n) & (rows % GROUP_PAD < GROUP)
        tok = (q_start + qi).to(tl.int64)
        d = tl.arange(0, D_PAD)
        d_ok = d < head_dim
        q = tl.load(q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :] * stride_qd,
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, D_PAD], the input dtype

        if HAS_TREE:
            kv_end = seq_len  # an ancestor mask may point anywhere among the new entries
        else:
            kv_end = ctx + tl.minimum(i0 + BLOCK_Q, n)  # causal: nothing past the tile's last query
        lo = part * partition_size
        hi = tl.minimum(lo + partition_size, kv_end)
        if HAS_WINDOW:
            q_pos = tl.load(positions_ptr + tok, mask=row_ok, other=0).to(tl.int32)  # [BLOCK_M]; int32: registers
            # No row of the tile sees a key before its earliest query's position - window + 1 (new entries sit
            # at positions <= their index): start there, rounded down to a key tile so that tile boundaries
            # stay absolute (docstring: a skipped tile is one that would have contributed exact zeros).
            q_reach = q_pos - window  # a row sees positions above this
            first_pos = tl.min(tl.where(row_ok, q_reach, 0x7FFFFFFF), axis=0) + 1
            lo = tl.maximum(lo, tl.maximum(first_pos, 0) // BLOCK_N * BLOCK_N)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
        table = block_tables_ptr + seq.to(tl.int64) * stride_bt
        for start in range(lo, hi, BLOCK_N):
            j = start + tl.arange(0, BLOCK_N)
            j_ok = j < hi
            page = tl.load(table + j // block_size, mask=j_ok, other=0).to(tl.int64)
            slot_in_page = (j % block_size).to(tl.int64)
            k_rows = page * stride_kb + slot_in_page * stride_ko + kv_head * stride_kh
            v_rows = page * stride_vb + slot_in_page * stride_vo + kv_head * stride_vh
            kv_mask = j_ok[:, None] & d_ok[None, :]
            k = tl.load(k_cache_ptr + k_rows[:, None] + d[None, :] * stride_kd, mask=kv_mask, other=0.0)
            if DOT_PRECISION == "native":  # bf16/fp16 tensor cores, fp32 accumulation: products are exact
                if SOFT_BF16:  # the interpreter's bf16 dot is unreliable: the same exact products, in fp32
                    s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee") * scale_log2
                else:
                    s = tl.dot(q, tl.trans(k)) * scale_log2
            else:
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2

            new_index = j - ctx  # index among this step's new entries (negative: context)
            if HAS_TREE:
                ancestor = tl.load(tree_ptr + tok[:, None] * stride_tree_t + new_index[None, :] * stride_tree_k,
                                   mask=row_ok[:, None] & (new_index >= 0)[None, :] & j_ok[None, :], other=0)
                visible = (new_index < 0)[None, :] | (ancestor != 0)
            else:
                visible = new_index[None, :] <= qi[:, None]
            if HAS_WINDOW:  # a context entry's position is its index, a new entry's its query row's position
                new_pos = tl.load(positions_ptr + (q_start + new_index), mask=(new_index >= 0) & j_ok, other=0)
                kv_pos = tl.where(new_index >= 0, new_pos.to(tl.int32), j)
                visible = visible & (kv_pos[None, :] > q_reach[:, None])
            s = tl.where(visible & j_ok[None, :], s, float("-inf"))

            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet stay at 0
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_cache_ptr + v_rows[:, None] + d[None, :] * stride_vd, mask=kv_mask, other=0.0)
            if DOT_PRECISION == "native":  # P rounded to the input dtype, as SDPA/flash attention round it
                if SOFT_BF16:  # the interpreter's bf16 dot is unreliable: the same products, exact, in fp32
                    acc = tl.dot(round_trip(p, OUT_DTYPE, SOFT_BF16), v.to(tl.float32), acc * alpha[:, None],
                                 input_precision="ieee")
                else:
                    acc = tl.dot(round_to(p, OUT_DTYPE, SOFT_BF16), v, acc * alpha[:, None])
            else:
                acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
            m_i = m_new

        out_mask = row_ok[:, None] & d_ok[None, :]
        if SPLIT:  # the workspace holds this launch's rows only: index from its first row
            local = tok - tl.load(qsl_ptr).to(tl.int64)
            ws = (local * num_q_heads + head) * num_partitions + part  # [BLOCK_M]
            tl.store(m_ws_ptr + ws, m_i, mask=row_ok)
            tl.store(l_ws_ptr + ws, l_i, mask=row_ok)
            tl.store(acc_ws_ptr + ws[:, None] * D_PAD + d[None, :], acc, mask=out_mask)
        else:
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a row that sees nothing gives 0
            tl.store(out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :] * stride_od,
                     round_to(out, OUT_DTYPE, SOFT_BF16), mask=out_mask)


@triton.jit(do_not_specialize=["num_partitions", "num_seqs"])
def _merge_partitions_kernel(
    out_ptr, m_ws_ptr, l_ws_ptr, acc_ws_ptr, qsl_ptr,
    stride_ot, stride_oh, stride_od,
    num_q_heads, num_partitions, head_dim, num_seqs,
    BLOCK_HEADS: tl.constexpr, P_BLOCK: tl.constexpr, D_PAD: tl.constexpr, OUT_DTYPE: tl.constexpr,
    SOFT_BF16: tl.constexpr,
):
    """out[t, h] = sum_p acc_p * 2^(m_p - m) / sum_p l_p * 2^(m_p - m), m = max_p m_p.

    Program ``i`` merges row ``query_start_loc[0] + i`` of the launch's ``num_seqs`` sequences (``qsl_ptr``
    starts at the launch's first sequence); programs past their last row exit: a captured step's padding
    rows, or the next launch's rows, are not touched."""
    local = tl.program_id(0).to(tl.int64)
    first = tl.load(qsl_ptr).to(tl.int64)
    tok = first + local
    if tok >= tl.load(qsl_ptr + num_seqs).to(tl.int64):
        return
    head = tl.program_id(1) * BLOCK_HEADS + tl.arange(0, BLOCK_HEADS)  # [BLOCK_HEADS]
    head_ok = head < num_q_heads
    base = (local * num_q_heads + head) * num_partitions  # [BLOCK_HEADS]
    p = tl.arange(0, P_BLOCK)
    d = tl.arange(0, D_PAD)
    m_max = tl.full([BLOCK_HEADS, P_BLOCK], float("-inf"), tl.float32)
    for start in range(0, num_partitions, P_BLOCK):
        ok = head_ok[:, None] & (start + p < num_partitions)[None, :]
        m_max = tl.maximum(m_max, tl.load(m_ws_ptr + base[:, None] + start + p[None, :], mask=ok,
                                          other=float("-inf")))
    m_all = tl.max(m_max, axis=1)
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)  # [BLOCK_HEADS]
    l_total = tl.zeros([BLOCK_HEADS, P_BLOCK], tl.float32)
    acc_total = tl.zeros([BLOCK_HEADS, D_PAD], tl.float32)
    for start in range(0, num_partitions, P_BLOCK):
        ok = head_ok[:, None] & (start + p < num_partitions)[None, :]  # [BLOCK_HEADS, P_BLOCK]
        idx = base[:, None] + start + p[None, :]
        weight = tl.exp2(tl.load(m_ws_ptr + idx, mask=ok, other=float("-inf")) - m_all[:, None])
        l_total += tl.load(l_ws_ptr + idx, mask=ok, other=0.0) * weight
        acc = tl.load(acc_ws_ptr + idx[:, :, None] * D_PAD + d[None, None, :], mask=ok[:, :, None], other=0.0)
        acc_total += tl.sum(acc * weight[:, :, None], axis=1)
    l_sum = tl.sum(l_total, axis=1)
    out = acc_total / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
    tl.store(out_ptr + tok * stride_ot + head[:, None] * stride_oh + d[None, :] * stride_od,
             round_to(out, OUT_DTYPE, SOFT_BF16), mask=head_ok[:, None] & (d < head_dim)[None, :])


def _check_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  meta: AttentionMetadata, sliding_window: int | None) -> None:
    op = "attention"
    if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                       or sliding_window < 1):
        raise KernelInputError(f"{op}: sliding_window must be a positive integer or None, got {sliding_window!r}")
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise KernelInputError(f"{op}: expected q [T, Hq, D] and equal caches [num_blocks, block_size, Hkv, D]; "
                               f"got q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, "
                               f"v_cache {tuple(v_cache.shape)}")
    T, Hq, D = q.shape
    _, block_size, Hkv, Dk = k_cache.shape
    check_dtype(op, "q", q)
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise KernelInputError(f"{op}: q {q.dtype} and caches {k_cache.dtype}/{v_cache.dtype} must share a dtype")
    if Dk != D or D > MAX_HEAD_DIM:
        raise KernelInputError(f"{op}: head_dim {D} (cache {Dk}) must match and be at most {MAX_HEAD_DIM}")
    if Hq % Hkv:
        raise KernelInputError(f"{op}: {Hq} query heads are not a multiple of {Hkv} KV heads")
    if T != sum(meta.query_lens) or T != meta.num_tokens:
        raise KernelInputError(f"{op}: q has {T} tokens but the metadata counts {sum(meta.query_lens)} queries "
                               f"and {meta.num_tokens} slots")
    pages_needed = -(-meta.max_seq_len // block_size)
    if meta.block_tables.dim() != 2 or meta.block_tables.shape[1] < pages_needed:
        raise KernelInputError(f"{op}: block_tables {tuple(meta.block_tables.shape)} cannot hold "
                               f"{pages_needed} pages of {block_size} tokens (max_seq_len {meta.max_seq_len})")
    for name in ("query_start_loc", "seq_lens", "block_tables"):
        if getattr(meta, name).dtype not in (torch.int32, torch.int64):
            raise KernelInputError(f"{op}: meta.{name} must be an int32 tensor, got {getattr(meta, name).dtype}")
    tensors = [q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables]
    if meta.tree_mask is not None:
        if meta.tree_mask.dtype != torch.bool:
            raise KernelInputError(f"{op}: tree_mask must be bool, got {meta.tree_mask.dtype}")
        tensors.append(meta.tree_mask)
    if sliding_window is not None:
        if meta.positions.dtype not in (torch.int32, torch.int64) or meta.positions.shape != (T,):
            raise KernelInputError(f"{op}: a sliding window needs meta.positions as [{T}] int32/int64, got "
                                   f"{tuple(meta.positions.shape)} {meta.positions.dtype}")
        tensors.append(meta.positions)
    check_device(op, _paged_attention_kernel, *tensors)


def triton_paged_attention(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    *,
    config: AttentionConfig | None = None,
    static_bounds: tuple[int, int] | None = None,
) -> torch.Tensor:  # [T, Hq, D]
    """Same contract as ``hyspec.ops.attention.paged_attention`` (new KV already written).

    ``sliding_window=w``: a query at position ``p`` sees, of what it would see, the entries at positions
    ``> p - w`` (a context entry's position is its index, a new entry's the position of its query row, as
    the reference).  Each program starts its key walk at the key tile holding its earliest query's
    ``p - w + 1``, so a step costs O(w) keys a query, not O(context).  That start is exact when every new
    entry's position is at most its index (``c + k`` in a chain or a prefill, ``c + depth`` in a tree: what the
    engine builds); keys inside the walked range are masked by their positions whatever they are.

    ``static_bounds=(max_query_len, max_seq_len)`` (default: ``meta.static_bounds``): launch for these bounds
    instead of this step's
    lengths, so the grid, the split decision and the partition count are the same for every step
    under the bounds (what a captured CUDA graph needs: its launches are replayed as recorded).
    Programs past a sequence's queries or keys exit on the device (``seq_lens``/``query_start_loc``
    are read there); empty partitions carry ``m = -inf, l = 0`` and weigh nothing in the merge, so
    the output equals the step's own launch bit for bit whenever that one splits too.
    """
    _check_inputs(q, k_cache, v_cache, meta, sliding_window)
    static_bounds = static_bounds if static_bounds is not None else meta.static_bounds
    if static_bounds is not None:
        bound_q, bound_len = static_bounds
        if bound_q < meta.max_query_len or bound_len < meta.max_seq_len:
            raise KernelInputError(f"attention: static_bounds {static_bounds} are below this step's "
                                   f"({meta.max_query_len}, {meta.max_seq_len})")
        max_query_len, max_seq_len = bound_q, bound_len
    else:
        max_query_len, max_seq_len = meta.max_query_len, meta.max_seq_len
    T, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    if config is None:  # long untreed bf16/fp16 queries (prefill chunks) take the tensor-core prefill tiles
        prefill = (max_query_len > AttentionConfig.split_max_query_len and meta.tree_mask is None
                   and q.dtype != torch.float32)
        config = default_attention_config(D, prefill=prefill, fp32=q.dtype == torch.float32)
        partition = device_partition_size(q, Hkv)
        if partition is not None and partition % config.block_n == 0:
            config = replace(config, partition_size=partition)
    cfg = config
    group = Hq // Hkv
    group_pad = next_power_of_2(group)
    block_q = max(1, cfg.block_m // group_pad)
    d_pad = max(16, next_power_of_2(D))  # tl.dot needs K >= 16
    # padding rows of a captured step (past query_start_loc[num_seqs]) have no program: zeros, not leftovers
    alloc = torch.zeros if static_bounds is not None else torch.empty
    out = alloc((T, Hq, D), dtype=q.dtype, device=q.device)
    if T == 0:
        return out

    num_partitions = -(-max_seq_len // cfg.partition_size)
    # Split or not depends on the lengths only, never on the batch: decode and verification must split alike
    # (bitwise equal rows).  The workspace cap bounds one launch; more sequences take more launches.
    split = num_partitions > 1 and max_query_len <= cfg.split_max_query_len
    num_seqs = meta.num_seqs
    if split:
        partition_size = cfg.partition_size
        row_bytes = Hq * num_partitions * (d_pad + 2) * 4
        per_launch = min(num_seqs, max(1, cfg.max_workspace_bytes // (row_bytes * max_query_len)))
        ws_rows = min(T, per_launch * max_query_len)
        m_ws = torch.empty((ws_rows, Hq, num_partitions), dtype=torch.float32, device=q.device)
        l_ws = torch.empty_like(m_ws)
        acc_ws = torch.empty((ws_rows, Hq, num_partitions, d_pad), dtype=torch.float32, device=q.device)
    else:
        per_launch = num_seqs
        num_partitions = 1
        partition_size = -(-max_seq_len // cfg.block_n) * cfg.block_n
        m_ws = l_ws = acc_ws = out  # unused (SPLIT=False)

    tree = meta.tree_mask.view(torch.uint8) if meta.tree_mask is not None else meta.block_tables
    num_q_tiles = -(-max_query_len // block_q)
    merge_heads = min(cfg.merge_heads, next_power_of_2(Hq))
    for first in range(0, num_seqs, per_launch):
        seqs = min(per_launch, num_seqs - first)
        qsl = meta.query_start_loc[first:]  # views: the launch sees its sequences only; rows stay absolute
        _paged_attention_kernel[(seqs * num_q_tiles, Hkv, num_partitions)](
            q, k_cache, v_cache, out, m_ws, l_ws, acc_ws,
            qsl, meta.seq_lens[first:], meta.block_tables[first:], tree, meta.positions,
            *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
            meta.block_tables.stride(0), tree.stride(0), tree.stride(1),
            float(scale) * _LOG2E, num_q_tiles, Hq, D, block_size, num_partitions, partition_size,
            min(sliding_window or 0, 1 << 30),  # int32 in the kernel; a window this wide cuts nothing anyway
            GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, BLOCK_M=block_q * group_pad, BLOCK_N=cfg.block_n,
            D_PAD=d_pad,
            HAS_TREE=meta.tree_mask is not None, HAS_WINDOW=sliding_window is not None, SPLIT=split, OUT_DTYPE=TRITON_DTYPES[q.dtype],
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "native",
            SOFT_BF16=interpreted(_paged_attention_kernel),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=False,
        )
        if split:
            _merge_partitions_kernel[(T if seqs == num_seqs else min(T, seqs * max_query_len),
                                      triton.cdiv(Hq, merge_heads))](
                out, m_ws, l_ws, acc_ws, qsl, *out.stride(), Hq, num_partitions, D, seqs,
                BLOCK_HEADS=merge_heads, P_BLOCK=cfg.merge_block, D_PAD=d_pad, OUT_DTYPE=TRITON_DTYPES[q.dtype],
                SOFT_BF16=interpreted(_merge_partitions_kernel), num_warps=4, enable_fp_fusion=False,
            )
    return out


triton_paged_attention.supports_sliding_window = True


__all__ = ["AttentionConfig", "MAX_HEAD_DIM", "PREFILL_MAX_HEAD_DIM", "default_attention_config",
           "device_partition_size", "partition_size_for", "triton_paged_attention"]
