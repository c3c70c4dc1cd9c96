"""The CPU decoder stack (cpu_ops/decoder_stack.c): a model over GGUF blocks runs its layers in one C call.

What must hold: the stack computes the layer loop's function (to fp32 rounding), every row is computed
alone (a token's hidden state is the same in a prefill, a decode step and a verification, bit for bit:
what lets speculative decoding reproduce plain decoding), aux layers come out as the loop gives them,
and models it cannot run keep the loop."""
from __future__ import annotations

import pytest
import torch

from hyspec.backends.registry import get_backend
from hyspec.cpu_ops import decoder_stack
from hyspec.model.loader import load_model
from hyspec.ops.attention import AttentionMetadata

pytest.importorskip("gguf")
pytest.importorskip("transformers")
from tests.model.gguf_fixtures import make_source_checkpoint, write_gguf  # noqa: E402

needs_kernel = pytest.mark.skipif(decoder_stack.library() is None, reason="no C compiler: the stack cannot build")
BLOCK = 8


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(arch, qtype) -> a model loaded on the CPU backend as serving loads it (blocks, fp32, optimized)."""
    root = tmp_path_factory.mktemp("stack")
    backend = get_backend("cpu")
    out = {}
    for arch, qtype in (("llama", "Q4_1"), ("qwen2", "Q4_0"), ("llama", "Q8_0"), ("qwen3", "Q4_1")):
        src = root / f"{arch}-{qtype}"
        make_source_checkpoint(src, arch)
        path = write_gguf(src, root / f"{arch}-{qtype}.gguf", qtype, arch)
        model = backend.optimize_model(load_model(path, dtype="float32", backend=backend))
        model.gguf_path = path
        out[arch, qtype] = model
    return out


@pytest.fixture(scope="module")
def dense_models(models):
    """dtype -> the llama Q8_0 file dequantized to dense fp32 / bf16 weights, as serving loads it (PackedLinear)."""
    from hyspec.cpu_ops.packed_linear import invariant_kernel_available

    backend = get_backend("cpu")
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        if invariant_kernel_available(dtype):
            out[dtype] = backend.optimize_model(load_model(models["llama", "Q8_0"].gguf_path, dtype=dtype,
                                                           quantization="none", backend=backend))
    return out


def _caches(model, blocks: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cfg = model.config
    shape = (blocks, BLOCK, cfg.num_key_value_heads, cfg.head_dim)
    dtype = model.embed_tokens.weight.dtype
    return [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(cfg.num_hidden_layers)]


def _forward(model, caches, ids: list[int], start: int, aux: tuple[int, ...] = ()):
    """Tokens ``ids`` at positions start.. of one sequence whose pages are 0, 1, 2, ... (causal)."""
    n = len(ids)
    positions = torch.arange(start, start + n)
    meta = AttentionMetadata(query_start_loc=torch.tensor([0, n], dtype=torch.int32),
                             seq_lens=torch.tensor([start + n], dtype=torch.int32),
                             block_tables=torch.arange(8, dtype=torch.int32)[None], slot_mapping=positions.clone(),
                             positions=positions, tree_mask=None, query_lens=[n], seq_lens_host=[start + n])
    with torch.inference_mode():
        return model(torch.tensor(ids), positions, caches, meta, aux_layers=aux)


IDS = [5, 17, 3, 40, 22, 9, 31, 12, 7]


@needs_kernel
@pytest.mark.parametrize("key", [("llama", "Q4_1"), ("qwen2", "Q4_0"), ("llama", "Q8_0")])
def test_the_stack_computes_the_layer_loop(models, key):
    model = models[key]
    stack = model.layer_stack
    assert isinstance(stack, decoder_stack.DecoderStack)
    caches_a, caches_b = _caches(model), _caches(model)
    got = [_forward(model, caches_a, IDS[:6], 0, aux=(0,)), _forward(model, caches_a, IDS[6:7], 6, aux=(0,))]
    model.layer_stack = None
    try:
        ref = [_forward(model, caches_b, IDS[:6], 0, aux=(0,)), _forward(model, caches_b, IDS[6:7], 6, aux=(0,))]
    finally:
        model.layer_stack = stack
    for g, r in zip(got, ref):
        # fp32 with another summation order in RMSNorm and contracted multiply-adds in RoPE: rounding only
        torch.testing.assert_close(g.hidden, r.hidden, atol=1e-4, rtol=1e-4)
        assert g.aux_hidden.keys() == r.aux_hidden.keys() == {0}
        torch.testing.assert_close(g.aux_hidden[0], r.aux_hidden[0], atol=1e-4, rtol=1e-4)
    for (ka, va), (kb, vb) in zip(caches_a, caches_b):  # the stack wrote the same keys and values
        torch.testing.assert_close(ka, kb, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(va, vb, atol=1e-4, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("key", [("llama", "Q4_1"), ("qwen2", "Q4_0")])
def test_a_token_is_the_same_in_prefill_decode_and_verification(models, key):
    model = models[key]
    whole = _forward(model, _caches(model), IDS, 0).hidden  # one prefill of 9 rows
    caches = _caches(model)
    parts = [_forward(model, caches, IDS[:4], 0).hidden]  # prefill 4
    parts.append(_forward(model, caches, IDS[4:5], 4).hidden)  # one decode step
    parts.append(_forward(model, caches, IDS[5:9], 5).hidden)  # a verification of four rows
    assert torch.equal(torch.cat(parts), whole)


@needs_kernel
def test_aux_layers_do_not_change_the_result(models):
    model = models["llama", "Q4_1"]
    plain = _forward(model, _caches(model), IDS[:5], 0)
    with_aux = _forward(model, _caches(model), IDS[:5], 0, aux=(0, 1))
    assert torch.equal(with_aux.hidden, plain.hidden) and sorted(with_aux.aux_hidden) == [0, 1]


@needs_kernel
def test_aux_states_captured_in_one_call_equal_one_call_per_segment(models):
    model = models["llama", "Q4_1"]
    stack = model.layer_stack
    one_call = _forward(model, _caches(model), IDS[:5], 0, aux=(0, 1))
    # the same forward as one stack call per segment between the aux layers, each aux state h + residual in fp32
    caches, n = _caches(model), 5
    positions = torch.arange(n)
    meta = AttentionMetadata(query_start_loc=torch.tensor([0, n], dtype=torch.int32),
                             seq_lens=torch.tensor([n], dtype=torch.int32),
                             block_tables=torch.arange(8, dtype=torch.int32)[None], slot_mapping=positions.clone(),
                             positions=positions, tree_mask=None, query_lens=[n], seq_lens_host=[n])
    with torch.inference_mode():
        h, residual, aux = model.embed(torch.tensor(IDS[:5])), None, {}
        for first, end in ((0, 1), (1, 2), (2, model.config.num_hidden_layers)):
            h, residual = stack.run(h, residual, first, end, positions, caches, meta)
            if end - 1 in (0, 1):
                aux[end - 1] = h + residual
        hidden, _ = model.ops.rms_norm(h, model.norm.weight, model.norm.eps, residual)
    assert torch.equal(one_call.hidden, hidden)
    for layer in (0, 1):
        assert torch.equal(one_call.aux_hidden[layer], aux[layer])


def test_models_the_stack_cannot_run_keep_the_layer_loop(models):
    assert models["qwen3", "Q4_1"].layer_stack is None  # q/k norms
    assert "q/k norms" in decoder_stack.unsupported_reason(models["qwen3", "Q4_1"])
    # no backend: dequantized into plain nn.Linear modules, which no kernel of the stack serves
    dense = load_model(models["llama", "Q4_1"].gguf_path, dtype="float32")
    assert "is neither GGUF blocks nor a dense" in decoder_stack.unsupported_reason(dense)
    assert not decoder_stack.attach(dense) and dense.layer_stack is None


@needs_kernel
def test_fp16_caches_take_the_layer_loop(models):
    model = models["llama", "Q4_1"]
    caches = [(k.half(), v.half()) for k, v in _caches(model)]
    assert not model.layer_stack.accepts(torch.zeros(1, model.config.hidden_size), caches)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_dense_weights_run_on_the_stack_row_by_row(dense_models, dtype):
    if dtype not in dense_models:
        pytest.skip(f"no batch-invariant dense {dtype} kernel on this CPU")
    model = dense_models[dtype]
    stack = model.layer_stack
    assert isinstance(stack, decoder_stack.DecoderStack)
    whole = _forward(model, _caches(model), IDS, 0, aux=(0,))
    caches = _caches(model)
    parts = [_forward(model, caches, IDS[:4], 0), _forward(model, caches, IDS[4:5], 4),
             _forward(model, caches, IDS[5:9], 5, aux=(0,))]
    assert whole.hidden.dtype == dtype and whole.aux_hidden[0].dtype == dtype
    # every row alone, whatever the batch and whether aux layers split the stack
    assert torch.equal(torch.cat([p.hidden for p in parts]), whole.hidden)
    model.layer_stack = None
    try:
        ref = _forward(model, _caches(model), IDS, 0, aux=(0,))
    finally:
        model.layer_stack = stack
    # the layer loop rounds every op to the model's dtype; the stack keeps fp32 between them
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)
    torch.testing.assert_close(whole.hidden.float(), ref.hidden.float(), **tol)


@needs_kernel
@pytest.mark.parametrize("march", ["x86-64", "haswell"], ids=["portable", "avx2"])
def test_the_portable_and_avx2_builds_keep_rows_alone(models, march):
    """What an AVX2-only CPU, or one without a vector ISA the kernels use, would run (built here for its ISA)."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the ISA levels are x86's")
    lib = decoder_stack.variant(march)
    if lib is None:
        pytest.skip(f"the stack does not build for -march={march} here")
    model = models["llama", "Q4_1"]
    native = model.layer_stack
    model.layer_stack = decoder_stack.DecoderStack(model, lib)
    try:
        whole = _forward(model, _caches(model), IDS, 0).hidden
        caches = _caches(model)
        parts = [_forward(model, caches, IDS[:3], 0).hidden, _forward(model, caches, IDS[3:4], 3).hidden,
                 _forward(model, caches, IDS[4:9], 4).hidden]
    finally:
        model.layer_stack = native
    assert torch.equal(torch.cat(parts), whole)
    torch.testing.assert_close(whole, _forward(model, _caches(model), IDS, 0).hidden, atol=1e-4, rtol=1e-4)
