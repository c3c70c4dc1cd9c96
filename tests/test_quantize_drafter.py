"""speculative_config.quantization: a drafter's own linears on the backend's int8 / int4 kernels, what stays
dense and why, the refusals, and the config key's checks."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from hyspec.backends.registry import get_backend
from hyspec.errors import ConfigError
from hyspec.model.quantize_drafter import describe, quantize_drafter
from hyspec.spec.config import SpeculativeConfig


class _Head(nn.Module):
    """A drafter-shaped module: a fusion layer, an MLP, a reduced lm_head, one odd width, one kept dense."""

    keep_dense_linears = ("read_directly",)

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(96, 64, bias=True)
        self.mlp = nn.Sequential(nn.Linear(64, 128, bias=False), nn.SiLU(), nn.Linear(128, 64, bias=False))
        self.lm_head = nn.Linear(64, 256, bias=False)
        self.odd = nn.Linear(80, 64, bias=False)  # 80 is not a multiple of the 32-wide block
        self.read_directly = nn.Linear(64, 64, bias=False)

    def forward(self, x):
        return self.lm_head(self.mlp(self.fc(x)))


class _NoKernels:
    name = "nokernels"

    def quantized_linear(self, w, bias, dtype, activations="native"):
        return None


def _cpu_has_kernels() -> bool:
    backend = get_backend("cpu")
    return bool(set(backend.quantization_kernels()) & {"gguf-blocks-fp32", "int8"})


needs_kernels = pytest.mark.skipif(not _cpu_has_kernels(), reason="no CPU weight-only kernel builds here")


@needs_kernels
def test_default_puts_the_linears_on_int8_kernels_close_to_dense():
    head = _Head().eval()
    head.odd = nn.Identity()
    x = torch.randn(5, 96)
    with torch.no_grad():
        dense = head(x)
        kinds = quantize_drafter(head, None, get_backend("cpu"))
        quantized = head(x)
    assert kinds == {"int8": 4}, kinds  # fc, the two MLP layers, lm_head
    assert type(head.read_directly) is nn.Linear  # its parent reads its .weight itself
    assert all(type(m) is not nn.Linear for m in (head.fc, head.mlp[0], head.mlp[2], head.lm_head))
    err = (quantized - dense).abs().max() / dense.abs().max()
    assert 0 < err < 0.02, err  # Q8_0: quantized, and close
    assert describe(kinds) == "4 int8"


@needs_kernels
def test_by_default_one_layer_that_cannot_be_int8_keeps_the_whole_drafter_dense():
    head = _Head()
    kinds = quantize_drafter(head, None, get_backend("cpu"))
    assert kinds == {"dense (in_features 80 not a multiple of 32)": 1, "dense (kept with the 1 that must be)": 4}
    assert all(type(m) is nn.Linear for m in (head.fc, head.mlp[0], head.mlp[2], head.lm_head, head.odd))


@needs_kernels
def test_int4_is_coarser_than_int8_and_none_keeps_every_layer_dense():
    x = torch.randn(5, 96)
    errors = {}
    for q in ("int8", "int4"):
        head = _Head().eval()
        head.odd = nn.Identity()  # a demanded kind refuses the 80-wide layer (tested below)
        with torch.no_grad():
            dense = head(x)
            quantize_drafter(head, q, get_backend("cpu"))
            errors[q] = float((head(x) - dense).abs().max())
    assert errors["int4"] > errors["int8"] > 0
    head = _Head()
    assert quantize_drafter(head, "none", get_backend("cpu"))["dense"] == 5  # read_directly is not counted
    assert all(type(m) is nn.Linear for m in head.modules() if "Linear" in type(m).__name__)


@needs_kernels
def test_a_demanded_kind_names_the_layer_it_cannot_quantize():
    head = _Head()
    with pytest.raises(ConfigError) as info:
        quantize_drafter(head, "int8", get_backend("cpu"))
    assert info.value.key == "speculative_config.quantization"
    assert "odd" in str(info.value) and "80" in str(info.value)


def test_without_kernels_the_default_stays_dense_and_a_demand_is_refused_naming_the_backend():
    head = _Head()
    kinds = quantize_drafter(head, None, _NoKernels())
    assert kinds["dense (no nokernels kernel for torch.float32 activations)"] == 4
    assert all(type(m) is nn.Linear for m in (head.fc, head.lm_head))
    head.odd = nn.Identity()  # only kernel-less layers left to refuse
    with pytest.raises(ConfigError, match="no nokernels kernel"):
        quantize_drafter(head, "int8", _NoKernels())


def test_the_config_key_takes_null_none_int8_int4_and_names_bad_values():
    assert SpeculativeConfig.from_dict({"method": "eagle3"}).quantization is None
    for q in ("none", "int8", "int4"):
        assert SpeculativeConfig.from_dict({"method": "eagle3", "quantization": q}).quantization == q
    with pytest.raises(ConfigError) as info:
        SpeculativeConfig.from_dict({"method": "eagle3", "quantization": "int9"})
    assert info.value.key == "speculative_config.quantization" and "int8" in str(info.value)
    with pytest.raises(ConfigError):
        quantize_drafter(_Head(), "fp8", _NoKernels())
