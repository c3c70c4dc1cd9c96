"""A quantized MoE GGUF's experts computed as the file stores them (hyspec.model.moe_stored) on the CPU backend:
no dense expert stacks exist, the logits are the dequantize-then-fp32 model's up to the block kernel's fp32
rounding (the bound the dense projections are held to, tests/test_cpu_ops_qgemm.py), and an expert's output for a
token does not depend on how many tokens share that expert in a step."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hyspec.backends.registry import get_backend
from hyspec.model.loader import load_model
from hyspec.model.moe import SparseMoE
from tests.model.gguf_moe_fixtures import write_moe_gguf
from tests.model.moe_fixtures import make_moe_checkpoint
from tests.model.paged_decode import greedy_paged
from tests.model.test_gguf_moe import IDS, PROMPT, SOURCES

qgemm = pytest.importorskip("hyspec.cpu_ops.qgemm")
needs_kernel = pytest.mark.skipif(qgemm.library() is None, reason="hyspec's qgemm kernel does not build here")


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model.forward_dense(IDS).hidden)[0]


def _blocks(model) -> list[SparseMoE]:
    return [layer.mlp for layer in model.layers if isinstance(layer.mlp, SparseMoE)]


def _gguf(name: str, qtype: str, tmp_path):
    family, changes = SOURCES[name]
    make_moe_checkpoint(tmp_path / "src", family, seed=3, **changes)
    return write_moe_gguf(tmp_path / "src", tmp_path / f"{name}-{qtype}.gguf", qtype)


@needs_kernel
@pytest.mark.parametrize(("name", "qtype"), [("mixtral", "Q4_1"), ("qwen2_moe", "Q8_0"), ("qwen3_moe", "Q4_0")])
def test_experts_run_as_stored_and_give_the_dequantized_models_logits(name, qtype, tmp_path):
    path = _gguf(name, qtype, tmp_path)
    backend = get_backend("cpu")
    stored = load_model(path, dtype="float32", backend=backend)
    dense = load_model(path, dtype="float32", backend=backend, quantization="none")
    blocks = _blocks(stored)
    experts = sum(b.num_experts for b in blocks)
    shared = sum(b.shared_expert is not None for b in blocks)
    report = stored.quantization
    assert report.linears[f"expert int{qtype[1]} ({qtype})"] == 2 * (experts + shared), report.to_dict()
    assert report.kernels == {"hyspec qgemm, fp32": sum(report.linears.values())} and not report.fallbacks
    for block in blocks:  # the dense stacks are gone, not merely unused
        assert block.experts_gate_up is None and block.experts_down is None
        assert len(block.stored_gate_up) == len(block.stored_down) == block.num_experts
    assert not any(n.endswith(("experts_gate_up", "experts_down")) for n, _ in stored.named_parameters())
    assert all(b.stored_gate_up is None for b in _blocks(dense))
    la, lb = _logits(stored), _logits(dense)
    assert (la - lb).abs().max() < 1e-4 * lb.abs().max(), float((la - lb).abs().max())
    tokens, _ = greedy_paged(stored, PROMPT, steps=12)
    assert tokens == greedy_paged(dense, PROMPT, steps=12)[0]


@needs_kernel
@pytest.mark.parametrize(("dtype", "kernel"), [(torch.float32, "hyspec qgemm, fp32"),
                                               (torch.bfloat16, "torch int4, bf16")])
def test_an_experts_output_does_not_depend_on_how_many_tokens_share_it(dtype, kernel, tmp_path):
    """The grouped path hands each expert every token routed to it in a step; a token's output must be the one it
    gets alone (what makes verifying n drafted tokens equal n plain steps).  The model as the engine runs it: the
    router on the backend's batch-invariant dense kernel (optimize_model), the experts on the block kernel (fp32)
    or, with bf16 activations, torch's int4 kernel, as the dense projections."""
    from hyspec.cpu_ops.quantized_linear import int4_kernel_available

    if dtype == torch.bfloat16 and not int4_kernel_available():
        pytest.skip("this torch build has no CPU int4 kernel")
    backend = get_backend("cpu")
    model = backend.optimize_model(load_model(_gguf("qwen3_moe", "Q4_0", tmp_path), dtype=dtype, backend=backend))
    assert model.quantization.kernels[kernel] == sum(model.quantization.linears.values())
    block = _blocks(model)[0]
    x = torch.randn(23, model.config.hidden_size, generator=torch.Generator().manual_seed(0)).to(dtype)
    with torch.no_grad():
        together = block(x)
        alone = torch.cat([block(x[t:t + 1]) for t in range(x.shape[0])])
        _, experts = block.route(x)
    assert int(torch.bincount(experts.reshape(-1)).max()) > 2  # experts really were shared
    assert torch.equal(together, alone)


@needs_kernel
def test_a_captured_step_over_stored_experts_is_refused(tmp_path):
    model = load_model(_gguf("mixtral", "Q8_0", tmp_path), dtype="float32", backend=get_backend("cpu"))
    block = _blocks(model)[0]
    block.static_shapes = True
    with pytest.raises(NotImplementedError, match="quantized blocks is not implemented.*quantization='none'"):
        block(torch.zeros(2, model.config.hidden_size))


def test_without_a_backend_or_with_quantization_none_the_experts_are_dense(tmp_path):
    path = _gguf("qwen3_moe", "Q8_0", tmp_path)
    for model in (load_model(path, dtype="float32"),
                  load_model(path, dtype="float32", backend=get_backend("cpu"), quantization="none")):
        assert all(b.stored_gate_up is None and b.experts_gate_up.dtype == torch.float32 for b in _blocks(model))


def _k_quant_moe_gguf(path):
    """A one-layer Qwen3-MoE GGUF as a Q4_K_M file holds its experts: gate / up Q4_K, down Q6_K (random blocks:
    the gguf package quantizes no K-quant), hidden and expert width 256 (whole super-blocks), the rest F32."""
    import gguf

    from tests.test_cpu_ops_kquants import random_blocks

    H, I, E, V, heads = 256, 256, 4, 320, 4
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_head_count(heads)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(V)
    w.add_expert_count(E)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(I)
    rng = np.random.default_rng(0)

    def f32(*shape, scale=0.05):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    hd = H // heads
    for name, values in (("token_embd.weight", f32(V, H, scale=1.0)), ("output_norm.weight", 1 + f32(H)),
                         ("output.weight", f32(V, H)), ("blk.0.attn_q.weight", f32(H, H)),
                         ("blk.0.attn_k.weight", f32(2 * hd, H)), ("blk.0.attn_v.weight", f32(2 * hd, H)),
                         ("blk.0.attn_output.weight", f32(H, H)), ("blk.0.attn_q_norm.weight", 1 + f32(hd)),
                         ("blk.0.attn_k_norm.weight", 1 + f32(hd)), ("blk.0.attn_norm.weight", 1 + f32(H)),
                         ("blk.0.ffn_norm.weight", 1 + f32(H)), ("blk.0.ffn_gate_inp.weight", f32(E, H, scale=1.0))):
        w.add_tensor(name, values)
    for seed, (part, qtype, rows, cols) in enumerate((("gate", "Q4_K", I, H), ("up", "Q4_K", I, H),
                                                      ("down", "Q6_K", H, I))):
        blocks = np.stack([random_blocks(qtype, rows, cols, seed=10 * seed + e) for e in range(E)])
        w.add_tensor(f"blk.0.ffn_{part}_exps.weight", blocks, raw_dtype=getattr(gguf.GGMLQuantizationType, qtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@needs_kernel
def test_k_quant_experts_run_as_stored_in_fp32_and_stay_dense_in_bf16(tmp_path):
    path = _k_quant_moe_gguf(tmp_path / "moe-q4_k_m.gguf")
    backend = get_backend("cpu")
    stored = load_model(path, dtype="float32", backend=backend)
    report = stored.quantization
    assert report.linears["expert int4 (Q4_K)"] == 4 and report.linears["expert int6 (Q6_K)"] == 4, report.to_dict()
    assert not any("expert" in f for f in report.fallbacks), report.fallbacks  # (the F32 attention stays dense)
    [block] = _blocks(stored)
    assert [m.block_type for m in (block.stored_gate_up[0], block.stored_down[0])] == ["Q4_K", "Q6_K"]
    dense = load_model(path, dtype="float32", backend=backend, quantization="none")
    la, lb = _logits(stored), _logits(dense)
    assert (la - lb).abs().max() < 1e-4 * lb.abs().max(), float((la - lb).abs().max())
    # the CPU's K-quant kernel takes fp32 activations only: in bf16 the layer keeps today's dense experts, and says so
    half = load_model(path, dtype="bfloat16", backend=backend)
    assert _blocks(half)[0].stored_gate_up is None
    assert any("experts of layer 0 stay dense: the cpu backend has no kernel for Q4_K blocks with torch.bfloat16"
               in f for f in half.quantization.fallbacks), half.quantization.fallbacks


def test_experts_stored_in_a_type_without_a_block_kernel_stay_dense_and_say_so(tmp_path):
    model = load_model(_gguf("qwen3_moe", "F16", tmp_path), dtype="float32", backend=get_backend("cpu"))
    assert all(b.stored_gate_up is None for b in _blocks(model))
    assert "experts of layers 0, 1 stay dense: stored as F16, which hyspec computes dequantized" in \
        model.quantization.fallbacks, model.quantization.fallbacks
