"""The CUDA op table hook, lazy triton import, and the CPU-tensor guard of compiled kernels."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules import triton's jit

import pytest  # noqa: E402

pytest.importorskip("triton")

from hyspec.cuda_ops import cuda_op_overrides  # noqa: E402
from hyspec.ops import OP_NAMES, reference_ops  # noqa: E402


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environment, timeout=120)


def test_overrides_cover_the_kernel_ops_and_install_in_the_table() -> None:
    ops = cuda_op_overrides()
    assert set(ops) == {"attention", "write_kv", "compact_kv", "rms_norm", "rotary", "rejection_sample"} <= set(OP_NAMES)
    table = reference_ops().with_overrides("triton", **ops)
    assert table.sources == {name: "triton" if name in ops else "reference" for name in OP_NAMES}
    assert table.attention is ops["attention"] and table.rms_norm is ops["rms_norm"]


def test_package_imports_without_triton() -> None:
    result = run_python("""
        import sys
        sys.modules["triton"] = None  # any `import triton` now raises ImportError
        import hyspec.cuda_ops, hyspec.cuda_ops.tolerances, hyspec.cuda_ops.cases
        try:
            hyspec.cuda_ops.cuda_op_overrides()
        except ImportError:
            print("lazy")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "lazy"


def test_compiled_kernels_refuse_cpu_tensors_with_a_clear_error() -> None:
    result = run_python("""
        import torch
        from hyspec.cuda_ops.norm import triton_rms_norm
        from hyspec.cuda_ops.common import KernelInputError
        try:
            triton_rms_norm(torch.zeros(2, 8), torch.ones(8), 1e-6)
        except KernelInputError as e:
            print(e)
    """)
    assert result.returncode == 0, result.stderr
    assert "needs CUDA tensors" in result.stdout and "TRITON_INTERPRET=1" in result.stdout
