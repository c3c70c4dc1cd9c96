"""What the torch_npu ops accept, as their documentation states it, checked before launch.

A shape the fused kernels cannot serve must fail here with a message naming
the limit, not later as an AiCore fault on the device.  Sources (read
2026-08, see docs/npu.md for the exact files and commits):

* FIA = ``torch_npu.npu_fused_infer_attention_score``, op-plugin
  ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md``
  and its older ``docs/context/`` version.
* PA = ``torch_npu._npu_paged_attention`` (ATB ``PagedAttentionOperation``),
  CANN ascendtb API reference ``ascendtb_01_0070``.

Where the documents disagree (FIA's paged ``block_size``: "multiple of 128"
in the PageAttention section, "multiple of 16, <= 1024" in the TND section;
vllm-ascend's tree backend runs multiples of 16) the looser rule that
vllm-ascend runs in production is enforced and the stricter one is logged.
"""
from __future__ import annotations

import logging

import torch

from hyspec.errors import HyspecError

log = logging.getLogger(__name__)


class NpuOpUnsupportedError(HyspecError):
    """An NPU op was called with shapes or dtypes its torch_npu kernel cannot serve."""


class NpuKVLayoutError(HyspecError):
    """A KV cache view cannot be handed to the torch_npu paged ops (see hyspec.npu_ops.layout)."""


FIA_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEADS = 256  # Q_N and KV_N
MAX_GQA_RATIO = 64  # num_heads / num_key_value_heads
MAX_HEAD_DIM = 512
HEAD_DIM_ALIGN = 16  # "D 轴需 16 对齐" for float16/bfloat16 (the newer text says 16 bytes; 16 elements satisfies both)
MAX_BATCH = 65536  # B for Q_S > 1 and Q_S = 1
MAX_TND_BATCH = 4096  # elements of actual_seq_lengths / actual_seq_lengths_kv with input_layout TND
MAX_TND_TOKENS = 1 << 20  # T <= 1M
MAX_DECODE_KV_LEN = 262144  # KV_S for Q_S = 1
MAX_KV_LEN = 20971520  # KV_S for Q_S > 1 (20M)
BLOCK_SIZE_ALIGN = 16
MAX_BLOCK_SIZE = 512
RECOMMENDED_BLOCK_SIZE = 128
#: the newest FIA text lists Q_D = K_D = V_D = 128 (or Q/K 192, V 128/192) for TND without rope, while
#: vllm-ascend calls TND for every head size; other head dims are let through with a warning
TND_DOCUMENTED_HEAD_DIMS = (128, 192)
#: Query tokens per request that one FIA call verifies against a tree mask.  The documented FIA paths
#: for masked multi-token decode (MTP, rope/MLA, KV-antiquant) all stop at Q_S <= 16 and vllm-ascend
#: asserts its speculative decode threshold <= 16; hyspec splits bigger trees into 16-row pieces.
MAX_TREE_QUERY_TOKENS = 16

# ATB PagedAttentionOperation: "embedding * blockSize <= 128 * 128", "block_size % 16 == 0", head_size (0, 256]
PA_MAX_HEAD_DIM = 256
PA_MAX_HEAD_DIM_X_BLOCK = 128 * 128

_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def check_fia_shapes(q: torch.Tensor, k_cache: torch.Tensor, num_seqs: int, block_size: int,
                     max_seq_len: int) -> None:
    """Raise NpuOpUnsupportedError unless FIA (TND or BSND, paged) can serve these shapes.

    ``q: [T, Hq, D]``, ``k_cache: [num_blocks, block_size, Hkv, D]``.
    """
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    problems = []
    if q.dtype not in FIA_DTYPES:
        problems.append(f"dtype {q.dtype} (npu_fused_infer_attention_score takes float16/bfloat16 queries; "
                        "load the model in bfloat16 on the NPU backend)")
    if k_cache.dtype != q.dtype:
        problems.append(f"KV cache dtype {k_cache.dtype} differs from the query dtype {q.dtype}")
    if k_cache.shape[3] != D:
        problems.append(f"KV head_dim {k_cache.shape[3]} != query head_dim {D}")
    if D > MAX_HEAD_DIM or D % HEAD_DIM_ALIGN:
        problems.append(f"head_dim {D} (must be a multiple of {HEAD_DIM_ALIGN} and <= {MAX_HEAD_DIM})")
    if Hq > MAX_HEADS or Hkv > MAX_HEADS:
        problems.append(f"{Hq} query / {Hkv} KV heads (at most {MAX_HEADS} each)")
    if Hq % Hkv:
        problems.append(f"{Hq} query heads are not a multiple of {Hkv} KV heads")
    elif Hq // Hkv > MAX_GQA_RATIO:
        problems.append(f"GQA ratio {Hq // Hkv} > {MAX_GQA_RATIO}")
    if block_size % BLOCK_SIZE_ALIGN or block_size > MAX_BLOCK_SIZE:
        problems.append(f"block_size {block_size} (must be a multiple of {BLOCK_SIZE_ALIGN} and <= {MAX_BLOCK_SIZE})")
    if num_seqs > MAX_TND_BATCH:
        problems.append(f"{num_seqs} sequences in one step (TND takes at most {MAX_TND_BATCH})")
    if max_seq_len > MAX_KV_LEN:
        problems.append(f"a sequence of {max_seq_len} tokens (FIA takes at most {MAX_KV_LEN})")
    if T > MAX_TND_TOKENS:
        problems.append(f"{T} query tokens in one step (TND takes at most {MAX_TND_TOKENS})")
    if problems:
        raise NpuOpUnsupportedError("NPU attention (npu_fused_infer_attention_score) cannot serve this call: "
                                    + "; ".join(problems))
    if D not in TND_DOCUMENTED_HEAD_DIMS:
        _warn_once(f"d{D}", f"head_dim {D}: the FIA documentation's TND section lists head_dim 128/192; vllm-ascend "
                   "runs TND with other head dims, but if FIA rejects this one, that is why")
    if block_size % RECOMMENDED_BLOCK_SIZE:
        _warn_once(f"bs{block_size}", f"KV block_size {block_size} is not a multiple of {RECOMMENDED_BLOCK_SIZE}: "
                   "the FIA PageAttention section asks for multiples of 128 when Q_S > 1 (its TND section and "
                   "vllm-ascend's tree backend accept multiples of 16); use block_size 128 if FIA rejects it")


def check_tree_entries(num_entries: int) -> None:
    if num_entries > MAX_BATCH:
        raise NpuOpUnsupportedError(f"NPU tree attention: {num_entries} (sequence, 16-row piece) entries in one "
                                    f"step, FIA takes at most {MAX_BATCH}")


def paged_attention_fits(head_dim: int, block_size: int, max_seq_len: int) -> bool:
    """Whether ATB PagedAttention (single-token decode) documents support for these shapes."""
    return (head_dim <= PA_MAX_HEAD_DIM and block_size % BLOCK_SIZE_ALIGN == 0
            and head_dim * block_size <= PA_MAX_HEAD_DIM_X_BLOCK and max_seq_len <= MAX_DECODE_KV_LEN)
