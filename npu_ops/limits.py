"""What the torch_npu ops accept, as their documentation states it, checked before launch.

A shape the fused kernels cannot serve must fail here with a message naming
the limit, not later as an AiCore fault on the device.  Sources (read
2026-08, see docs/npu.md for the exact files and commits):

* FIA = ``torch_npu.npu_fused_infer_attention_score``, op-plugin
  ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md``
  and its older ``docs/context/`` version.
* PA = ``torch_npu._npu_paged_attention`` (ATB ``PagedAttentionOperation``),
  CANN ascendtb API reference ``ascendtb_01_0070``.

The generic limits below hold in every release hyspec knows; what differs
between releases (which layouts take PageAttention, for which head dims and
block sizes) comes from ``op_plugin_data/<branch>.json`` (``layout_problems``).
Where the documents disagree (FIA's paged ``block_size`` for more than one
query row: "min 128, max 512, a multiple of 128" in the PageAttention section,
"16-aligned, <= 1024" in the TND section) the stricter rule is kept.  A shape
outside them runs the reference op, never a kernel call the docs rule out.
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
#: Query tokens per request that one FIA call verifies against a tree mask.  The documented FIA paths
#: for masked multi-token decode (MTP, rope/MLA, KV-antiquant) all stop at Q_S <= 16 and vllm-ascend
#: asserts its speculative decode threshold <= 16; hyspec splits bigger trees into 16-row pieces.
MAX_TREE_QUERY_TOKENS = 16

# ATB PagedAttentionOperation: "embedding * blockSize <= 128 * 128", "block_size % 16 == 0", head_size (0, 256]
PA_MAX_HEAD_DIM = 256
PA_MAX_HEAD_DIM_X_BLOCK = 128 * 128

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def check_fia_shapes(q: torch.Tensor, k_cache: torch.Tensor, num_seqs: int, block_size: int,
                     max_seq_len: int) -> list[str]:
    """What stops FIA (any layout, paged) from serving these shapes; [] when nothing does.

    ``q: [T, Hq, D]``, ``k_cache: [num_blocks, block_size, Hkv, D]``.  Shapes
    that are inconsistent in themselves (the reference could not serve them
    either) raise NpuOpUnsupportedError; shapes only FIA cannot take are
    returned, and the caller runs the reference instead.
    """
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    broken = []
    if k_cache.dtype != q.dtype:
        broken.append(f"KV cache dtype {k_cache.dtype} differs from the query dtype {q.dtype}")
    if k_cache.shape[3] != D:
        broken.append(f"KV head_dim {k_cache.shape[3]} != query head_dim {D}")
    if Hq % Hkv:
        broken.append(f"{Hq} query heads are not a multiple of {Hkv} KV heads")
    if broken:
        raise NpuOpUnsupportedError("NPU attention cannot serve this call: " + "; ".join(broken))
    problems = []
    if q.dtype not in FIA_DTYPES:
        problems.append(f"dtype {q.dtype} (npu_fused_infer_attention_score takes float16/bfloat16 queries; "
                        "load the model in bfloat16 on the NPU backend)")
    if D > MAX_HEAD_DIM or D % HEAD_DIM_ALIGN:
        problems.append(f"head_dim {D} (must be a multiple of {HEAD_DIM_ALIGN} and <= {MAX_HEAD_DIM})")
    if Hq > MAX_HEADS or Hkv > MAX_HEADS:
        problems.append(f"{Hq} query / {Hkv} KV heads (at most {MAX_HEADS} each)")
    elif Hq // Hkv > MAX_GQA_RATIO:
        problems.append(f"GQA ratio {Hq // Hkv} > {MAX_GQA_RATIO}")
    if block_size % BLOCK_SIZE_ALIGN or block_size > MAX_BLOCK_SIZE:
        problems.append(f"block_size {block_size} (must be a multiple of {BLOCK_SIZE_ALIGN} and <= {MAX_BLOCK_SIZE})")
    if max_seq_len > MAX_KV_LEN:
        problems.append(f"a sequence of {max_seq_len} tokens (FIA takes at most {MAX_KV_LEN})")
    if T > MAX_TND_TOKENS:
        problems.append(f"{T} query tokens in one step (at most {MAX_TND_TOKENS})")
    return problems


def layout_problems(rules: dict | None, layout: str, head_dim: int, dtype: torch.dtype, block_size: int,
                    multi_query: bool, num_seqs: int) -> list[str]:
    """Why FIA's PageAttention in ``layout`` cannot serve this call under a release's documented rules.

    ``rules`` is the release's ``paged_layouts`` table (op_plugin_data/<branch>.json); None = no data, the
    generic limits above only.  A layout absent from a table is not documented with PageAttention.
    """
    if rules is None:
        return [] if layout != "TND" or num_seqs <= MAX_TND_BATCH else [f"{num_seqs} sequences (TND: <= 4096)"]
    if layout not in rules:
        return [f"{layout} with PageAttention is not documented in this release"]
    rule = rules[layout]
    problems = []
    dims = rule.get("head_dims")
    if dims is not None and head_dim not in dims:
        problems.append(f"{layout} with PageAttention documents head_dim {'/'.join(map(str, dims))}, not {head_dim}")
    dtypes = rule.get("dtypes")
    if dtypes is not None and str(dtype).removeprefix("torch.") not in dtypes:
        problems.append(f"{layout} with PageAttention documents {'/'.join(dtypes)}, not {dtype}")
    multiple = rule.get("multi_query_block_size_multiple")
    if multi_query and multiple and block_size % multiple:
        problems.append(f"PageAttention with more than one query row needs block_size a multiple of {multiple} "
                        f"(got {block_size}; start hyspec with block_size={multiple})")
    low, high = rule.get("block_size_range", (BLOCK_SIZE_ALIGN, MAX_BLOCK_SIZE))
    if not low <= block_size <= high:
        problems.append(f"block_size {block_size} outside [{low}, {high}]")
    if layout == "TND" and num_seqs > MAX_TND_BATCH:
        problems.append(f"{num_seqs} sequences in one step (TND takes at most {MAX_TND_BATCH})")
    return problems


def check_tree_entries(num_entries: int) -> None:
    if num_entries > MAX_BATCH:
        raise NpuOpUnsupportedError(f"NPU tree attention: {num_entries} (sequence, 16-row piece) entries in one "
                                    f"step, FIA takes at most {MAX_BATCH}")


def paged_attention_fits(head_dim: int, block_size: int, max_seq_len: int) -> bool:
    """Whether ATB PagedAttention (single-token decode) documents support for these shapes."""
    return (head_dim <= PA_MAX_HEAD_DIM and block_size % BLOCK_SIZE_ALIGN == 0
            and head_dim * block_size <= PA_MAX_HEAD_DIM_X_BLOCK and max_seq_len <= MAX_DECODE_KV_LEN)
