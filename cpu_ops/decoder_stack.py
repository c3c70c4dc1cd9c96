"""The decoder layers of a model in one C call per forward (decoder_stack.c).

Why: with the projections in hyspec's block kernel (qgemm.c) a decode step of
the default model spent more time between kernels than in them -- about 400
op calls per token through Python and torch's dispatcher (norms, RoPE, KV
writes, SiLU, splits, views), each a few microseconds.  The stack runs the
same kernels (qgemm and the paged attention are compiled into it) and does the
small element-wise work in C, row by row.

A model qualifies when every decoder projection is a :class:`BlockLinear`
(GGML blocks, fp32 or 8-bit activations), a :class:`RowConcatLinear` (row ranges
in different block types) or a :class:`PackedLinear`
with fp32 / bf16 weights served by hyspec's batch-invariant dense kernel
(dense_gemm.c), it has no q/k norm, its RoPE table covers the whole head
and its caches are fp32 or bf16; then
:func:`attach` gives it a ``layer_stack`` that ``CausalLM.forward`` calls
instead of its layer loop.  Every forward of that model (prefill, decode,
verification) then goes through the stack, so plain decoding and speculative
verification still compute each row identically.  ``HYSPEC_DECODER_STACK=0``
keeps the layer-by-layer path (for comparisons).
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch

from hyspec.cpu_ops.qgemm import A8_TYPES, QTYPES, BlockLinear, RowConcatLinear

log = logging.getLogger(__name__)

LAYER_ENTRIES = 14  # decoder_stack.c: 4 weight pointers, 4 types, 4 bias pointers, 2 norm weights
DENSE_TYPES = {torch.float32: 16, torch.bfloat16: 17}  # decoder_stack.c's DENSE_F32 / DENSE_BF16
PARTS = 48  # decoder_stack.c: row ranges in different block types (RowConcatLinear), its descriptor as the weight


@functools.cache
def library() -> ctypes.CDLL | None:
    if os.environ.get("HYSPEC_DECODER_STACK", "1") == "0":
        log.info("hyspec decoder stack disabled by HYSPEC_DECODER_STACK=0")
        return None
    if os.environ.get("HYSPEC_QGEMM", "1") == "0":
        return None
    return variant("native")


@functools.cache
def variant(march: str) -> ctypes.CDLL | None:
    """The stack built for ``-march=march`` (tests run the AVX2 and portable paths on any x86 CPU)."""
    from hyspec.cpu_ops.native import load

    lib = load("decoder_stack.c", march)
    if lib is None:
        return None
    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    lib.hyspec_decoder_stack.restype = ctypes.c_int
    lib.hyspec_decoder_stack.argtypes = [
        ptr, i64, i64, ptr, i64, i64, i64, i64, i64, i64, f32, ptr, ptr, ctypes.c_int, ptr, ptr, ptr,
        i64, i64, i64, i64, ptr, i64, ptr, ptr, ptr, ptr, ptr, i64, f32, ctypes.c_int, ptr, ptr, i64, ptr]
    return lib


def _dense_gemm_address() -> int | None:
    """The address of hyspec_dense_gemm (dense_gemm.c, its own library): the stack calls it for dense weights."""
    from hyspec.cpu_ops import dense_gemm

    lib = dense_gemm.library()
    return None if lib is None else ctypes.cast(lib.hyspec_dense_gemm, ctypes.c_void_p).value


def _weight_type(lin: torch.nn.Module) -> int | None:
    """The stack's type code for a projection module (None: the stack cannot run it)."""
    from hyspec.cpu_ops.packed_linear import PackedLinear, invariant_kernel_available

    if isinstance(lin, BlockLinear):
        return QTYPES[lin.block_type] + (A8_TYPES if lin.a8 else 0)
    if isinstance(lin, RowConcatLinear):
        return PARTS
    if (isinstance(lin, PackedLinear) and lin.weight.dtype in DENSE_TYPES and lin.weight.is_contiguous()
            and invariant_kernel_available(lin.weight.dtype) and _dense_gemm_address() is not None
            and (lin.bias is None or lin.bias.dtype == lin.weight.dtype)):
        return DENSE_TYPES[lin.weight.dtype]
    return None


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot run on the stack (None: it can)."""
    cfg = getattr(model, "config", None)
    layers = getattr(model, "layers", None)
    if cfg is None or layers is None or not hasattr(model, "cos_sin"):
        return "not a hyspec CausalLM"
    if cfg.model_type in ("gemma2", "gemma3_text"):
        return "Gemma's layers (post-norms, GeGLU, soft-capping, two RoPE tables) are not in the stack"
    if cfg.qk_norm:
        return "q/k norms (Qwen3) are not in the stack"
    if getattr(cfg, "moe", None) is not None:
        return "routed MoE blocks (Mixtral, Qwen MoE) are not in the stack"
    if any(getattr(layer.self_attn, "sliding_window", None) is not None for layer in layers):
        return "sliding-window attention is not in the stack"
    if model.cos_sin.dtype != torch.float32 or model.cos_sin.shape[-1] != cfg.head_dim:
        return "the RoPE table does not cover the whole head in fp32"
    if cfg.hidden_size % 32 or cfg.intermediate_size % 32 or cfg.head_dim % 8:
        return "sizes the block kernel cannot take"
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        for name, lin in (("qkv_proj", attn.qkv_proj), ("o_proj", attn.o_proj), ("gate_up_proj", mlp.gate_up_proj),
                          ("down_proj", mlp.down_proj)):
            if _weight_type(lin) is None:
                return (f"layer {i} {name} is neither GGUF blocks nor a dense fp32/bf16 weight hyspec's dense "
                        f"kernel serves ({type(lin).__name__})")
    return None


def _weight(lin: torch.nn.Module) -> torch.Tensor:
    """What the stack's weight pointer of a projection points at (its type: _weight_type)."""
    if isinstance(lin, BlockLinear):
        return lin.blocks
    return lin.descriptor if isinstance(lin, RowConcatLinear) else lin.weight


class DecoderStack:
    """Runs layers ``[first, last)`` of one model in a single call (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, lib: ctypes.CDLL):
        cfg = model.config
        self.lib, self.model = lib, model
        self.num_layers = cfg.num_hidden_layers
        self.dims = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                     cfg.intermediate_size)
        self.eps = float(cfg.rms_norm_eps)
        self.scale = float(model.layers[0].self_attn.scale)
        # fp32 copies of the norm weights (a bf16 model's are bf16; the stack's norms are fp32)
        self._norms = [(layer.input_layernorm.weight.detach().float().contiguous(),
                        layer.post_attention_layernorm.weight.detach().float().contiguous()) for layer in model.layers]
        self._dense = _dense_gemm_address()
        rows = []
        for layer, norms in zip(model.layers, self._norms):
            attn, mlp = layer.self_attn, layer.mlp
            # raw pointers: the tensors they point into belong to the model (which holds this stack) or to it
            lins = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            rows.append([_weight(lin).data_ptr() for lin in lins]
                        + [_weight_type(lin) for lin in lins]
                        + [0 if lin.bias is None else lin.bias.data_ptr() for lin in lins]
                        + [norms[0].data_ptr(), norms[1].data_ptr()])
        self.table = torch.tensor(rows, dtype=torch.int64)
        self._kv_ptrs: torch.Tensor | None = None
        self._kv_src: tuple | None = None  # the (k, v) pairs _kv_ptrs was read from

    def accepts(self, h: torch.Tensor, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Activations in the model's dtype, fp32 or bf16 caches with a contiguous head dimension (anything
        else: the layer loop)."""
        k0, v0 = kv_caches[0]
        return (h.dtype in (torch.float32, torch.bfloat16) and k0.dtype in (torch.float32, torch.bfloat16)
                and v0.dtype == k0.dtype and k0.stride() == v0.stride() and k0.stride(-1) == 1
                and not torch.is_grad_enabled())

    def _kv(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The layers' K / V base pointers as one tensor, read again only when the engine hands other (k, v) pair
        objects than last time (the ones read are held, so an identical object is the same tensors)."""
        src = self._kv_src
        if src is None or len(src) != len(kv_caches) or not all(a is b for a, b in zip(src, kv_caches)):
            stride = kv_caches[0][0].stride()
            if any(k.stride() != stride or v.stride() != stride for k, v in kv_caches):
                raise ValueError("decoder stack: the layers' KV caches differ in layout")
            self._kv_ptrs = torch.tensor([p for k, v in kv_caches for p in (k.data_ptr(), v.data_ptr())],
                                         dtype=torch.int64)
            self._kv_src = tuple(kv_caches)
        return self._kv_ptrs

    def run(self, h: torch.Tensor, residual: torch.Tensor | None, first: int, last: int, positions: torch.Tensor,
            kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta) -> tuple[torch.Tensor, torch.Tensor]:
        """Layers ``[first, last)`` on the ``(h, residual)`` pair, as the layer loop of CausalLM.forward.

        Returns fp32 tensors whatever the input's dtype: between segments of one forward the residual
        stream stays fp32; the caller casts to the model's dtype at the end."""
        h, residual, _ = self.run_aux(h, residual, first, last, positions, kv_caches, meta, ())
        return h, residual

    def run_aux(self, h: torch.Tensor, residual: torch.Tensor | None, first: int, last: int,
                positions: torch.Tensor, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta,
                aux_layers) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
        """:meth:`run`, plus the fp32 hidden state ``h + residual`` after each of ``aux_layers`` (those in
        ``[first, last)``), captured in the same C call: exactly what one call per segment between aux
        layers computed, without the extra calls."""
        from hyspec.cpu_ops.paged_attention import _rows

        H, Hq, Hkv, D, inter = self.dims
        T = h.shape[0]
        has_residual = residual is not None  # False: the stack's first layer starts the residual stream
        h = h.to(torch.float32).contiguous().clone()  # updated in place; the caller's tensors stay as they were
        residual = torch.empty_like(h) if residual is None else residual.to(torch.float32).contiguous().clone()
        seq_lens, query_lens, row_seq, row_i, table = meta.derived("cpu_rows", lambda: _rows(meta))
        tree = None
        if meta.tree_mask is not None:
            tree = meta.derived("cpu_tree", lambda: meta.tree_mask.to(torch.uint8).contiguous())
        k0 = kv_caches[0][0]
        sb, so, sh, _ = k0.stride()
        positions = positions.to(torch.int64).contiguous()
        slots = meta.slot_mapping.to(torch.int64).contiguous()
        wanted = sorted({int(i) for i in aux_layers if first <= int(i) < last})
        # no aux layers (plain decoding, most forwards): null pointers, nothing allocated
        aux_index = torch.tensor(wanted, dtype=torch.int64) if wanted else None
        aux_out = torch.empty(len(wanted), T, H, dtype=torch.float32) if wanted else None
        rc = self.lib.hyspec_decoder_stack(
            self.table.data_ptr(), first, last, self._kv(kv_caches).data_ptr(), T, H, Hq, Hkv, D, inter, self.eps,
            h.data_ptr(), residual.data_ptr(), int(has_residual), positions.data_ptr(),
            self.model.cos_sin.data_ptr(), slots.data_ptr(), sb, so, sh, k0.shape[1], table.data_ptr(),
            table.stride(0), seq_lens.data_ptr(), query_lens.data_ptr(), row_seq.data_ptr(), row_i.data_ptr(),
            0 if tree is None else tree.data_ptr(), meta.max_query_len, self.scale, int(k0.dtype == torch.bfloat16),
            self._dense, 0 if aux_index is None else aux_index.data_ptr(), len(wanted),
            0 if aux_out is None else aux_out.data_ptr())
        if rc == -2:
            raise MemoryError("hyspec_decoder_stack: out of memory for its buffers")
        if rc != 0:
            raise RuntimeError(f"hyspec_decoder_stack rejected its arguments (rc={rc})")
        return h, residual, {layer: aux_out[j] for j, layer in enumerate(wanted)} if wanted else {}


def attach(model: torch.nn.Module) -> bool:
    """Give ``model`` a ``layer_stack`` when it qualifies and the kernel builds here (returns whether it did)."""
    reason = unsupported_reason(model)
    lib = library() if reason is None else None
    if reason is None and lib is None:
        reason = "the decoder_stack kernel is not available here"
    if reason is not None:
        if getattr(model, "layer_stack", None) is not None:
            model.layer_stack = None
        log.debug("decoder stack not used for %s: %s", type(model).__name__, reason)
        return False
    model.layer_stack = DecoderStack(model, lib)
    log.info("decoder stack: %d layers of %s in one C call per forward", model.config.num_hidden_layers,
             type(model).__name__)
    return True


__all__ = ["DecoderStack", "attach", "library", "unsupported_reason", "variant"]
