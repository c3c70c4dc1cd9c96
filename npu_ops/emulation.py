"""A stand-in ``torch_npu`` in pure torch: our reading of the documented semantics, for CPU tests.

This is not torch_npu and proves nothing about the real kernels.  It checks
the documented argument rules (shapes, dtypes, contiguity, layouts, mask
forms, length lists) strictly, so that the wrappers' argument plumbing is
tested, and computes what the documentation says the op computes, in fp32
with one rounding at the end (how fused kernels round; the reference ops
round after each torch op, hence the tolerances in hyspec.npu_ops.tolerances).

``fake_torch_npu(missing=...)`` builds a module object to put in
``sys.modules["torch_npu"]``; ``calls`` records every call by name.  The
``.out`` variant and the ``*_get_workspace`` helpers used under NPU graph
capture run eagerly (there is no graph here).
"""
from __future__ import annotations

import math
import types
from typing import Iterable

import torch

class EmulationError(RuntimeError):
    """An argument the documentation rules out: a real NPU fails the op's aclnn/ATB check (RuntimeError)."""


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise EmulationError(message)


def _contiguous(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        _need(t.is_contiguous(), f"{name} must be contiguous (不支持非连续的Tensor)")


def _paged_kv(cache: torch.Tensor, table_row: torch.Tensor, length: int, heads: int) -> torch.Tensor:
    """[length, heads, D] fp32 gathered through a block table row from [num_blocks, block_size, heads*D]."""
    bs = cache.shape[1]
    blocks = table_row[: math.ceil(length / bs)].long()
    _need(bool((blocks >= 0).all() and (blocks < cache.shape[0]).all()), "block_table id out of range")
    return cache[blocks].reshape(-1, cache.shape[2])[:length].float().view(length, heads, -1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """q [n, Hq, D], k/v [L, Hkv, D] fp32, visible [n, L] bool -> [n, Hq, D] fp32."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * scale
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v)


def npu_fused_infer_attention_score(query, key, value, *, atten_mask=None, actual_seq_lengths=None,
                                    actual_seq_lengths_kv=None, block_table=None, num_heads=1, scale=1.0,
                                    input_layout="BSH", num_key_value_heads=0, sparse_mode=0, block_size=0,
                                    inner_precise=0, pre_tokens=2147483647, next_tokens=2147483647, _limits=None,
                                    **unused):
    _need(not unused, f"emulation does not cover FIA arguments {sorted(unused)}")
    _need(query.dtype in (torch.float16, torch.bfloat16), f"query dtype {query.dtype}")
    _need(key.dtype == query.dtype and value.dtype == query.dtype, "key/value dtype must match the query's here")
    _need(key.shape == value.shape, "key and value shapes must be identical")
    _contiguous(query=query, key=key, value=value)
    _need(block_table is not None and block_table.dtype == torch.int32 and block_table.dim() == 2,
          "emulation covers PageAttention only: block_table int32 [B, maxBlockNumPerSeq]")
    _need(key.dim() == 3 and key.shape[1] == block_size, "paged key must be [blocknum, block_size, KV_N*D]")
    _need(actual_seq_lengths_kv is not None, "PageAttention needs actual_seq_lengths_kv")
    kv_heads = num_key_value_heads or num_heads
    _need(num_heads % kv_heads == 0 and num_heads // kv_heads <= 64, "num_heads / num_key_value_heads")
    if input_layout == "TND":
        _need(query.dim() == 3 and query.shape[1] == num_heads, "TND query must be [T, N, D]")
        ends = list(actual_seq_lengths)
        _need(len(ends) <= 4096 and all(b >= a for a, b in zip([0, *ends], ends)),
              "TND actual_seq_lengths: cumulative, non-decreasing, at most 4096")
        _need(ends[-1] == query.shape[0], "TND: the last cumulative length must equal T")
        starts = [0, *ends[:-1]]
        batches = [(slice(s, e), e - s) for s, e in zip(starts, ends)]
    elif input_layout == "BSND":
        _need(query.dim() == 4 and query.shape[2] == num_heads, "BSND query must be [B, S, N, D]")
        lens = list(actual_seq_lengths) if actual_seq_lengths is not None else [query.shape[1]] * query.shape[0]
        _need(len(lens) >= query.shape[0] and all(0 < n <= query.shape[1] for n in lens[:query.shape[0]]),
              "BSND actual_seq_lengths: per batch, each <= S")
        batches = [((b, slice(0, n)), n) for b, n in enumerate(lens[:query.shape[0]])]
    else:
        raise EmulationError(f"emulation covers input_layout TND and BSND, not {input_layout!r}")
    _fia_release_rules(_limits, input_layout, max(n for _, n in batches), query.shape[-1], block_size, query.dtype)
    B = len(batches)
    kv_lens = list(actual_seq_lengths_kv)
    _need(len(kv_lens) >= B and block_table.shape[0] == B, "actual_seq_lengths_kv / block_table rows != batch")
    _need(all(L <= block_table.shape[1] * block_size for L in kv_lens[:B]), "block_table narrower than KV length")
    if sparse_mode == 3:
        _need(atten_mask is not None and tuple(atten_mask.shape[-2:]) == (2048, 2048),
              "sparse_mode 3 needs the (2048, 2048) optimised mask")
        canonical = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
        _need(torch.equal(atten_mask.reshape(2048, 2048).bool().cpu(), canonical),
              "sparse_mode 3 mask must be the lower-triangular triu(1) mask (1 = masked)")
    elif sparse_mode == 0:
        _need(input_layout != "TND" or atten_mask is None, "emulation: TND takes sparse_mode 0 without a mask only")
        if atten_mask is not None:
            _need(atten_mask.dtype in (torch.bool, torch.int8, torch.uint8), "atten_mask dtype")
            _need(atten_mask.dim() == 4 and atten_mask.shape[0] == B and atten_mask.shape[1] == 1
                  and atten_mask.shape[2] == query.shape[1], "sparse_mode 0 mask must be (B, 1, Q_S, KV_S)")
            _need(atten_mask.shape[3] >= block_table.shape[1] * block_size,
                  "PageAttention with a mask needs KV_S >= maxBlockNumPerSeq * block_size")
            _contiguous(atten_mask=atten_mask)
    else:
        raise EmulationError(f"emulation covers sparse_mode 0 and 3, not {sparse_mode} (4, the band of pre_tokens/"
                             "next_tokens, has no documented alignment or inclusivity to emulate)")
    _band_is_ignored(sparse_mode, atten_mask, max(n for _, n in batches), pre_tokens, next_tokens)
    out = torch.zeros_like(query)
    for b, (rows, n) in enumerate(batches):
        L = kv_lens[b]
        k = _paged_kv(key, block_table[b], L, kv_heads)
        v = _paged_kv(value, block_table[b], L, kv_heads)
        i = torch.arange(n)[:, None]
        j = torch.arange(L)[None, :]
        if sparse_mode == 3:
            _need(n <= L, "sparse_mode 3: a batch has more queries than keys")
            visible = j <= L - n + i  # rightDownCausal
        elif atten_mask is None:
            visible = torch.ones(n, L, dtype=torch.bool)
        else:
            visible = ~atten_mask[b, 0, :n, :L].bool().cpu()
        _need(bool(visible.any(-1).all()), "a query row is entirely masked (needs inner_precise 2/3)")
        out[rows] = _attend(query[rows], k, v, visible.to(query.device), scale).to(query.dtype)
    return out, torch.zeros(1, dtype=torch.float32, device=query.device)


_NO_BAND = 2147483647  # pre_tokens / next_tokens default: no band


def _band_is_ignored(sparse_mode: int, atten_mask, max_rows: int, pre_tokens: int, next_tokens: int) -> None:
    """pre_tokens / next_tokens as the FIA doc states them (op-plugin docs/zh/custom_APIs/torch_npu/
    torch_npu-npu_fused_infer_attention_score.md, 09fca6f6): no effect when Q_S = 1, in sparse_mode 1/2/3,
    and in sparse_mode 0 without a mask; with a mask in sparse_mode 0 the band applies, and the doc does not
    say where it is anchored, so a non-default band there is refused rather than guessed."""
    if (pre_tokens, next_tokens) == (_NO_BAND, _NO_BAND) or max_rows == 1 or sparse_mode in (1, 2, 3):
        return
    if sparse_mode == 0 and atten_mask is None:
        return
    raise EmulationError(f"pre_tokens={pre_tokens} / next_tokens={next_tokens} with sparse_mode {sparse_mode} and a "
                         "mask: the band's anchoring is not documented, the emulation does not guess it")


def _fia_release_rules(limits: dict | None, layout: str, max_rows: int, head_dim: int, block_size: int,
                       dtype: torch.dtype) -> None:
    """The documented PageAttention limits of the emulated release (op_plugin_data/<branch>.json)."""
    if not limits:
        return
    paged = limits.get("paged_layouts", {})
    _need(layout in paged, f"input_layout {layout!r} with block_table (PageAttention) is not documented in this "
                           f"release (documented: {sorted(paged)})")
    rules = paged[layout]
    dims = rules.get("head_dims")
    _need(dims is None or head_dim in dims, f"PageAttention {layout}: head dim {head_dim} not in {dims}")
    _need(head_dim % rules.get("head_dim_multiple", 16) == 0 and head_dim <= rules.get("max_head_dim", 512),
          f"PageAttention {layout}: head dim {head_dim}")
    dtypes = rules.get("dtypes")
    _need(dtypes is None or str(dtype).removeprefix("torch.") in dtypes, f"PageAttention {layout}: dtype {dtype}")
    multiple = rules.get("multi_query_block_size_multiple")
    _need(max_rows == 1 or multiple is None or block_size % multiple == 0,
          f"PageAttention {layout} with Q_S > 1: block_size {block_size} must be a multiple of {multiple}")
    low, high = rules.get("block_size_range", (16, 512))
    _need(low <= block_size <= high and block_size % rules.get("block_size_multiple", 16) == 0,
          f"PageAttention {layout}: block_size {block_size} outside the documented range")


def _npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                         context_lens, out, workspace=None, _limits=None):
    _need(query.dim() == 3 and query.shape[1] == num_heads, "query must be [num_tokens, num_heads, head_size]")
    _need(key_cache.dim() == 4 and key_cache.shape[2] == num_kv_heads, "key_cache [nb, bs, kv_heads, head_size]")
    _need(key_cache.shape[1] % 16 == 0 and key_cache.shape[1] * key_cache.shape[3] <= 128 * 128,
          "block_size % 16 == 0 and head_size * block_size <= 128*128")
    _need(block_table.dtype == torch.int32 and context_lens.dtype == torch.int32, "block_table/context_lens int32")
    _need(block_table.shape[0] == query.shape[0] == context_lens.shape[0], "one block-table row per query token")
    flat_k = key_cache.reshape(*key_cache.shape[:2], -1)
    flat_v = value_cache.reshape(*value_cache.shape[:2], -1)
    for t in range(query.shape[0]):
        L = int(context_lens[t])
        k = _paged_kv(flat_k, block_table[t], L, num_kv_heads)
        v = _paged_kv(flat_v, block_table[t], L, num_kv_heads)
        out[t] = _attend(query[t:t + 1], k, v, torch.ones(1, L, dtype=torch.bool), scale_value)[0].to(out.dtype)


def npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None,
                            compress_seq_offsets=None, seq_lens=None, cache_mode="PA_NZ", _limits=None):
    modes = (_limits or {}).get("cache_modes")
    _need(modes is None or cache_mode in modes, f"cache_mode {cache_mode!r} is not documented in this release")
    _need(cache_mode in (None, "Norm"), f"cache_mode {cache_mode!r}: the emulation covers ND caches ('Norm') only")
    _need(compress_lens is None and compress_seq_offsets is None and seq_lens is None, "compression not emulated")
    _contiguous(key=key, value=value, key_cache=key_cache, value_cache=value_cache, slot_mapping=slot_mapping)
    _need(key.dtype == value.dtype == key_cache.dtype == value_cache.dtype, "key, value and caches share a dtype")
    _need(key_cache.dim() == 4 and key.dim() == 3, "3-D key/value into 4-D caches")
    _need(slot_mapping.dtype in (torch.int32, torch.int64), "slot_mapping int32/int64")
    _scatter(key, value, key_cache, value_cache, slot_mapping, unique=True)


def _npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices):
    _need(slot_indices.dtype == torch.int32, "slot_indices int32")
    _need(key.dtype == key_cache.dtype and key.dtype in (torch.float16, torch.bfloat16, torch.int8), "dtype")
    _contiguous(key_cache=key_cache, value_cache=value_cache)  # ATB makes a contiguous copy: writes would be lost
    _scatter(key, value, key_cache, value_cache, slot_indices, unique=False)


def _scatter(key, value, key_cache, value_cache, slots, unique: bool) -> None:
    bs = key_cache.shape[1]
    s = slots.long()
    _need(bool((s >= 0).all() and (s < key_cache.shape[0] * bs).all()), "slot out of [0, num_blocks*block_size)")
    if unique:
        _need(s.unique().numel() == s.numel(), "slot_mapping values must be unique")
    key_cache[s // bs, s % bs] = key.view(-1, *key_cache.shape[2:])
    value_cache[s // bs, s % bs] = value.view(-1, *value_cache.shape[2:])


def npu_rms_norm(self, gamma, epsilon=1e-6):  # noqa: PLW0211 - the schema names its input `self`
    x = self
    _need(2 <= x.dim() <= 8 and gamma.shape == x.shape[x.dim() - gamma.dim():], "shapes")
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + epsilon)
    return (x.float() * rstd * gamma.float()).to(x.dtype), rstd


def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6):
    _need(x1.shape == x2.shape and x1.dtype == x2.dtype == gamma.dtype, "x1/x2/gamma shapes and dtypes")
    x = x1 + x2  # xOut, in the input dtype; the norm reads this rounded sum (our reading of the formula)
    y, rstd = npu_rms_norm(x, gamma, epsilon)
    return y, rstd, x


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def npu_apply_rotary_pos_emb(query, key, cos, sin, layout="BSND", rotary_mode="half", *, _limits=None):
    limits = _limits or {}
    _need(layout in limits.get("layouts", ("BSND",)), f"layout {layout!r} is not documented for this release")
    _need(layout == "BSND" and rotary_mode == "half", "emulation covers BSND, rotary_mode 'half'")
    _need(query.dim() == 4 and key.dim() == 4 and cos.shape == sin.shape, "4-D BSND tensors")
    dims = tuple(limits.get("head_dims", (64, 128)))
    _need(query.shape[-1] in dims and key.shape[-1] == query.shape[-1], f"A2/A3: D must be one of {dims}")
    _need(cos.shape == (*query.shape[:2], 1, query.shape[-1]), "cos/sin (B, S, 1, D)")
    _need(query.dtype == key.dtype == cos.dtype == sin.dtype, "query, key, cos, sin share a dtype")
    c, s = cos.float(), sin.float()
    query.copy_(query.float() * c + _rotate_half(query.float()) * s)
    key.copy_(key.float() * c + _rotate_half(key.float()) * s)
    return query, key


def npu_rotary_mul(self, r1, r2, rotary_mode="half", rotate=None, *, _limits=None):  # noqa: PLW0211
    """``x * r1 + rotate_half(x) * r2``, a new tensor (the documented formula for rotary_mode 'half')."""
    limits, x = _limits or {}, self
    _need(rotary_mode in limits.get("rotary_modes", ("half",)), f"rotary_mode {rotary_mode!r}")
    _need(rotary_mode == "half" and rotate is None, "emulation covers rotary_mode 'half' without `rotate`")
    _need(x.dim() == 4 and r1.dim() == 4 and r1.shape == r2.shape, "x, r1, r2 must be 4-D")
    _need(x.shape[-1] % int(limits.get("head_dim_multiple", 2)) == 0
          and x.shape[-1] <= int(limits.get("max_head_dim", 1024)), f"D = {x.shape[-1]}")
    _need(x.dtype == r1.dtype == r2.dtype, "x, r1 and r2 share a dtype")
    _need(all(a == b or b == 1 for a, b in zip(x.shape, r1.shape)), "r1/r2 must broadcast to x")
    return (x.float() * r1.float() + _rotate_half(x.float()) * r2.float()).to(x.dtype)


def _fia_out(query, key, value, *, workspace=None, out, **kwargs):
    """``npu_fused_infer_attention_score.out``: the same op writing into ``out = [attention_out, softmax_lse]``."""
    result, _ = npu_fused_infer_attention_score(query, key, value, **kwargs)
    out[0].copy_(result)
    return tuple(out)


def _fia_workspace(query, key, value, **kwargs):
    npu_fused_infer_attention_score(query, key, value, **kwargs)  # the real one validates its arguments too
    return torch.empty(0, dtype=torch.uint8, device=query.device)


def _pa_workspace(**kwargs):
    _npu_paged_attention(**kwargs)
    return torch.empty(0, dtype=torch.uint8, device=kwargs["query"].device)


class _AtbRope:
    """ATB's _npu_rotary_embedding: cos/sin from the FIRST table it sees, kept in statics (RopeAtb.cpp)."""

    def __init__(self) -> None:
        self.table: torch.Tensor | None = None

    def __call__(self, positions, query, key, head_size, cos_sin_cache, is_neox_style):
        _need(is_neox_style, "emulation covers the NeoX layout")
        _need(query.dim() == 2 and key.dim() == 2, "query/key must be [T, heads * head_size]")
        if self.table is None:
            self.table = cos_sin_cache.clone()
        half = self.table.shape[-1] // 2
        cs = self.table[positions.flatten()]
        cos = torch.cat([cs[:, :half], cs[:, :half]], -1).float()[:, None, :]
        sin = torch.cat([cs[:, half:], cs[:, half:]], -1).float()[:, None, :]
        for t in (query, key):
            heads = t.view(t.shape[0], -1, head_size).float()
            t.copy_((heads * cos + _rotate_half(heads) * sin).reshape(t.shape))


_IMPLEMENTATIONS = {
    "npu_fused_infer_attention_score": npu_fused_infer_attention_score,
    "_npu_paged_attention": _npu_paged_attention,
    "npu_scatter_pa_kv_cache": npu_scatter_pa_kv_cache,
    "_npu_reshape_and_cache": _npu_reshape_and_cache,
    "npu_rms_norm": npu_rms_norm,
    "npu_add_rms_norm": npu_add_rms_norm,
    "npu_apply_rotary_pos_emb": npu_apply_rotary_pos_emb,
    "npu_rotary_mul": npu_rotary_mul,
    "_npu_fused_infer_attention_score_get_max_workspace": _fia_workspace,
    "_npu_paged_attention_get_workspace": _pa_workspace,
}
_TAKES_LIMITS = ("npu_fused_infer_attention_score", "npu_apply_rotary_pos_emb", "npu_rotary_mul",
                 "npu_scatter_pa_kv_cache", "_npu_paged_attention",
                 "_npu_fused_infer_attention_score_get_max_workspace")
#: the op whose documented limits a helper shares
_LIMITS_OF = {"_npu_fused_infer_attention_score_get_max_workspace": "npu_fused_infer_attention_score",
              "_npu_paged_attention_get_workspace": "_npu_paged_attention"}
ATB_FUNCTIONS = ("_npu_paged_attention", "_npu_paged_attention_get_workspace", "_npu_reshape_and_cache",
                 "_npu_rotary_embedding")
#: what the lazy ATB wrappers raise when NNAL's set_env.sh was not sourced (hyspec.npu_ops.plan.check_atb)
ATB_NOT_LOADED = ("Please check that the nnal package is installed. Please run 'source set_env.sh' in the NNAL "
                  "installation path.")  # op_plugin/python/atb/_atb_ops.py: OSError(errno, msg) on the first call


def fake_torch_npu(missing: Iterable[str] = (), version: str | None = None,
                   atb_loaded: bool = True) -> types.ModuleType:
    """A module named ``torch_npu`` emulating op-plugin branch ``version`` (default: the pinned one).

    Only the functions that branch defines exist, each with that branch's
    signature: a call with a keyword it does not take raises TypeError as
    torch's argument parser does, and the signature is readable as ``_schema``
    like a real op's.  Documented limits of the branch (head dims, layouts,
    cache modes, block sizes) raise EmulationError, a RuntimeError like a
    failed aclnn check.  ``atb_loaded=False``: the ATB ops raise OSError on
    every call, as their lazy wrappers do without NNAL.  ``missing`` removes
    more functions by name.
    """
    from hyspec.npu_ops.op_schemas import PINNED_BRANCH, Signature, load_release

    release = load_release(version or PINNED_BRANCH)
    module = types.ModuleType("torch_npu")
    module.__version__ = release.torch_npu[0]
    module.HYSPEC_EMULATION = release.branch
    module.HYSPEC_CANN = release.cann
    module.HYSPEC_ATB = atb_loaded
    module.calls = []
    module.npu = _fake_device_module()
    module._C = types.SimpleNamespace(_npu_get_soc_version=lambda: 223)  # an Ascend910B3
    impls = dict(_IMPLEMENTATIONS, _npu_rotary_embedding=_AtbRope())
    unknown = set(missing) - set(impls)
    if unknown:
        raise ValueError(f"unknown torch_npu function(s) {sorted(unknown)}; emulated: {sorted(impls)}")
    for name, impl in impls.items():
        schema = release.functions.get(name)
        if name in missing or schema is None:
            continue
        fn = _bound(module.calls, name, impl, Signature.from_schema(schema), release.limits(_LIMITS_OF.get(name, name)),
                    broken=name in ATB_FUNCTIONS and not atb_loaded)
        fn._schema = _parse(schema)
        setattr(module, name, fn)
        out_schema = release.functions.get(f"{name}.out")
        if name == "npu_fused_infer_attention_score" and out_schema is not None:
            fn.out = _bound(module.calls, f"{name}.out", _fia_out, _out_signature(out_schema), release.limits(name))
            fn.out._schema = _parse(out_schema)
    return module


def _parse(schema: str):
    return torch._C.parse_schema(schema)


def _out_signature(schema: str):
    """The Python binding of an ``.out`` overload: its mutable outputs are passed as one ``out=[...]``."""
    from hyspec.npu_ops.op_schemas import Signature

    sig = Signature.from_schema(schema)
    outs = {a.name for a in _parse(schema).arguments if a.alias_info is not None and a.alias_info.is_write}
    keyword_only = tuple(k for k in sig.keyword_only if k not in outs) + ("out",)
    return Signature(sig.name, sig.positional, keyword_only, (sig.required - outs) | {"out"}, sig.text)


def _bound(calls: list, name: str, impl, signature, limits: dict, broken: bool = False):
    def call(*args, **kwargs):
        bound = signature.bind(args, kwargs)  # TypeError for what this release's signature does not take
        calls.append((name, args, kwargs))
        if broken:
            raise OSError(2, ATB_NOT_LOADED)
        if name.split(".")[0] in _TAKES_LIMITS:
            bound["_limits"] = limits
        return impl(**bound)

    call.__name__ = name
    return call


def _fake_device_module() -> types.SimpleNamespace:
    """``torch_npu.npu`` for the emulated device: one 910B whose memory is the host's."""
    total = 64 << 30

    def props(index: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(name="Ascend910B3 (emulated)", total_memory=total)

    return types.SimpleNamespace(
        device_count=lambda: 1, get_device_name=lambda index=0: "Ascend910B3 (emulated)",
        get_soc_version=lambda: 223,
        get_device_properties=props, mem_get_info=lambda device=None: (total // 2, total),
        set_per_process_memory_fraction=lambda fraction, device=None: None, synchronize=lambda device=None: None,
        Stream=lambda device=None, priority=0: None, stream=lambda s: __import__("contextlib").nullcontext())


def install_emulation(branch: str, atb_loaded: bool = True) -> types.ModuleType:
    """Put an emulated torch_npu of ``branch`` in ``sys.modules`` (kept if one of that branch is there already).

    Refuses to shadow a real torch_npu that this process imported.
    """
    import sys

    current = sys.modules.get("torch_npu")
    if current is not None and not getattr(current, "HYSPEC_EMULATION", None):
        raise RuntimeError("a real torch_npu is imported in this process; unset HYSPEC_NPU_EMULATE")
    if current is not None and current.HYSPEC_EMULATION == branch and current.HYSPEC_ATB == atb_loaded:
        return current
    module = fake_torch_npu(version=branch, atb_loaded=atb_loaded)
    sys.modules["torch_npu"] = module
    return module


def install_from_env() -> types.ModuleType | None:
    """``install_emulation`` as HYSPEC_NPU_EMULATE asks (``<branch>[:no-atb]``); None when it is unset."""
    from hyspec.backends.probe_npu import emulation_request

    request = emulation_request()
    return install_emulation(*request) if request is not None else None
