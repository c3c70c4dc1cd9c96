"""hyspec's model against transformers (the oracle) on tiny random checkpoints of every family."""
from __future__ import annotations

import pytest
import torch

from hyspec.model.loader import load_model
from tests.model.hf_fixtures import FAMILIES, make_hf_model
from tests.model.paged_decode import greedy_paged

# fp32 on CPU: the two implementations run the same maths in a different op order
# (fused q/k/v and gate/up matmuls, paged gather); differences stay at rounding level.
ATOL = 1e-4


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_prefill_and_64_decode_steps_match_transformers(family, tmp_path):
    hf = make_hf_model(family, tmp_path)
    model = load_model(tmp_path, dtype="float32")
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 128, (11,), generator=g).tolist()
    tokens, logits = greedy_paged(model, prompt, steps=64, block_size=16)

    # The reference: one full causal forward over prompt + generated tokens.
    full = torch.tensor([prompt + tokens[:-1]])
    with torch.no_grad():
        ref = hf(full).logits[0, len(prompt) - 1:].float()
    torch.testing.assert_close(logits, ref, atol=ATOL, rtol=1e-4)

    # Greedy ids equal transformers' generate exactly.
    with torch.no_grad():
        gen = hf.generate(torch.tensor([prompt]), max_new_tokens=65, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert tokens == gen[0, len(prompt):].tolist()


def test_dense_forward_matches_transformers(tmp_path):
    hf = make_hf_model("qwen3", tmp_path)
    model = load_model(tmp_path, dtype="float32")
    x = torch.randint(3, 128, (2, 20))
    with torch.no_grad():
        ref = hf(x).logits.float()
        out = model.compute_logits(model.forward_dense(x).hidden)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-4)


def test_aux_hidden_states_match_transformers_hidden_states(tmp_path):
    hf = make_hf_model("llama_gqa", tmp_path)
    model = load_model(tmp_path, dtype="float32")
    x = torch.randint(3, 128, (1, 9))
    with torch.no_grad():
        ref = hf(x, output_hidden_states=True).hidden_states
        out = model.forward_dense(x, aux_layers=(0, 1))
    torch.testing.assert_close(out.aux_hidden[0], ref[1], atol=ATOL, rtol=1e-4)
    # HF's last entry is after the final norm, which is hyspec's `hidden`.
    torch.testing.assert_close(out.hidden, ref[-1], atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_loads_and_tracks_fp32(dtype, tmp_path):
    make_hf_model("llama_gqa", tmp_path)
    ref = load_model(tmp_path, dtype="float32")
    low = load_model(tmp_path, dtype=dtype)
    assert low.embed_tokens.weight.dtype == getattr(torch, dtype)
    prompt = list(range(3, 15))
    _, a = greedy_paged(ref, prompt, steps=4)
    _, b = greedy_paged(low, prompt, steps=4)
    # A few ulps of the dtype at each logit's magnitude (measured: bf16 within ~1 ulp, fp16 within ~2);
    # the rms term covers logits near 0, whose error comes from the hidden state, not their own size.
    eps = torch.finfo(getattr(torch, dtype)).eps
    bound = 4 * eps * (a.abs() + a.pow(2).mean().sqrt())
    worst = float(((a - b).abs() / bound).max())
    assert worst <= 1.0, f"{dtype} logits {worst:.2f}x the 4-ulp bound off fp32's"
