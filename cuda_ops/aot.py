"""Compile every Triton kernel variant hyspec launches, ahead of time, for GPUs this machine does not have.

The interpreter (``TRITON_INTERPRET=1``) runs a program's threads one after
another and never compiles: a kernel that does not compile for sm_90a, or
spills every register, passes every CPU test.  This module closes that gap in
two steps, because one process runs the kernels either interpreted or compiled:

1. **record** (interpreter on): ``record_launches()`` runs workloads on CPU
   tensors and notes every launch: the kernel, the type of each runtime
   argument (pointer dtype, i32/i64), the constexprs, the launch options, and
   the integers Triton's JIT would specialise (value 1 becomes a constant);
2. **compile** (interpreter off): ``compile_variant`` feeds each distinct
   variant to ``triton.compile`` for ``GPUTarget("cuda", arch, 32)`` and runs
   the bundled ``ptxas -v`` on the PTX for registers, spills and shared memory;
   it also counts ``bar.sync`` and global stores in the PTX (the rejection
   sampler's race fix is checked on them).

No GPU and no CUDA driver are needed: Triton's compiler and ptxas ship in its
wheel.  ``tests/test_cuda_ops_aot.py`` runs both steps;
``scripts/cuda_aot_report.py`` writes the table in docs/cuda_kernels.md.
"""
from __future__ import annotations

import contextlib
import json
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

#: the GPUs the kernels must compile for: Hopper (H100/H200, wgmma) and Ampere (A100)
ARCHS = (90, 80)
KERNEL_MODULES = ("hyspec.cuda_ops.attention", "hyspec.cuda_ops.kv", "hyspec.cuda_ops.norm",
                  "hyspec.cuda_ops.rotary", "hyspec.cuda_ops.verify")
#: launch options that change the binary (the rest - stream, grid - do not)
OPTION_KEYS = ("num_warps", "num_stages", "num_ctas", "enable_fp_fusion")
#: spill budget: a variant may spill at most this many bytes (stores) or the report marks it over budget
SPILL_BUDGET_BYTES = 0

_TORCH_TO_TRITON = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
                    "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


@dataclass(frozen=True)
class Variant:
    """One compiled binary: a kernel and everything that specialises it."""

    module: str
    kernel: str
    signature: tuple[tuple[str, str], ...]  # (argument, triton type or "constexpr")
    constexprs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]

    def key(self) -> str:
        return json.dumps([self.module, self.kernel, self.signature, self.constexprs, self.options], default=str)

    def label(self) -> str:
        """The kernel with its declared constexprs (UPPER_CASE here) and launch options; integers Triton
        specialised (strides of 1, ...) are part of the variant but left out of the label."""
        shown = [f"{k}={_short(v)}" for k, v in self.constexprs if k.isupper() and not k.startswith(("TINY", "SOFT"))]
        shown += [f"{k}={v}" for k, v in self.options if k != "enable_fp_fusion"]
        ints = [k for k, v in self.constexprs if not k.isupper()]
        pointers = "/".join(sorted({t[1:] for _, t in self.signature if t.startswith("*")}))
        wide = [k for k, t in self.signature if t == "i64"]
        return (f"{self.kernel}[{', '.join(shown)}] ptrs {pointers}" + (f" i64 {','.join(wide)}" if wide else "")
                + (f" (=1: {', '.join(ints)})" if ints else ""))


@dataclass
class CompileResult:
    variant: str
    arch: str
    ok: bool
    seconds: float
    registers: int | None = None
    spill_store_bytes: int | None = None
    spill_load_bytes: int | None = None
    shared_bytes: int | None = None
    stack_bytes: int | None = None
    bar_sync: int | None = None
    global_stores: int | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


def _arg_type(value: Any) -> str | None:
    """Triton's type for a runtime argument, or None for one it specialises as a constant (the int 1)."""
    import torch

    if isinstance(value, torch.Tensor):
        return "*" + _TORCH_TO_TRITON[str(value.dtype).removeprefix("torch.")]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        if value == 1:
            return None  # Triton's JIT specialises 1 (equal_to_1): compiled as a constant
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    if value is None:
        return "constexpr"
    raise TypeError(f"no Triton type for {type(value).__name__}")


@contextlib.contextmanager
def record_launches(execute: bool = True) -> Iterator[dict[str, Variant]]:
    """Record every interpreted launch inside the block (TRITON_INTERPRET=1 must be set): key -> Variant.

    ``execute=False`` skips the kernels (outputs stay uninitialised): shapes alone decide a variant, so
    GPU-sized launches can be recorded without running them.  ``SOFT_BF16`` (the interpreter's own bf16
    rounding) is recorded as the GPU path passes it, False.
    """
    import inspect

    from triton.runtime.interpreter import InterpretedFunction

    seen: dict[str, Variant] = {}
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        params = inspect.signature(fn).parameters
        bound = dict(zip(self.arg_names, args))
        bound.update({k: v for k, v in kwargs.items() if k in params})
        options = tuple((k, kwargs[k]) for k in OPTION_KEYS if k in kwargs)
        unspecialised = set(self.kwargs.get("do_not_specialize") or ())
        signature, constexprs = [], []
        for name, param in params.items():
            value = bound.get(name, param.default)
            if "constexpr" in str(param.annotation):
                signature.append((name, "constexpr"))
                constexprs.append((name, False if name == "SOFT_BF16" else _constexpr_value(value)))
                continue
            kind = _arg_type(value)
            if kind is None and name in unspecialised:  # do_not_specialize: 1 stays a runtime integer
                kind = "i32"
            if kind is None or kind == "constexpr":
                signature.append((name, "constexpr"))
                constexprs.append((name, value))
            else:
                signature.append((name, kind))
        variant = Variant(fn.__module__, fn.__name__, tuple(signature), tuple(constexprs), options)
        seen.setdefault(variant.key(), variant)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs) if execute else None

    InterpretedFunction.run = run
    try:
        yield seen
    finally:
        InterpretedFunction.run = original


def _short(value: Any) -> Any:
    return value["dtype"] if isinstance(value, dict) and "dtype" in value else value


def _constexpr_value(value: Any) -> Any:
    """A constexpr as data: Triton dtypes by name (tl.bfloat16 -> "bf16"), the rest as they are."""
    import triton.language as tl

    if isinstance(value, tl.dtype):
        return {"dtype": str(value)}
    return value


def _constexpr_object(value: Any) -> Any:
    import triton.language as tl

    if isinstance(value, dict) and set(value) == {"dtype"}:
        return getattr(tl, {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}.get(
            value["dtype"], value["dtype"]))
    return value


def ptxas_path(arch: int = 90) -> str:
    """The ptxas Triton itself uses for ``arch`` (its wheel ships two: CUDA 12.8 for sm < 90, 13.x above)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(arch).path


def compile_variant(variant: Variant, arch: int) -> CompileResult:
    """Compile for ``sm_<arch>`` (``sm_90a`` for Hopper) and read the binary's resource use. Interpreter off."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name = "sm_90a" if arch == 90 else f"sm_{arch}"
    started = time.perf_counter()
    result = CompileResult(variant.label(), name, ok=False, seconds=0.0)
    try:
        kernel = getattr(importlib.import_module(variant.module), variant.kernel)
        constexprs = {k: _constexpr_object(v) for k, v in variant.constexprs}
        src = ASTSource(fn=kernel, signature=dict(variant.signature), constexprs=constexprs)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(variant.options))
        ptx = compiled.asm["ptx"]
        result.shared_bytes = int(compiled.metadata.shared)
        result.bar_sync = len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b", ptx))
        result.global_stores = len(re.findall(r"\bst\.global\b", ptx))
        # which tensor-core path the dots took: Hopper's warpgroup MMA, or the Ampere-style per-warp mma.sync
        result.extra["wgmma"] = len(re.findall(r"\bwgmma\.mma_async\b", ptx))
        result.extra["mma_sync"] = len(re.findall(r"\bmma\.sync\b", ptx))
        result.__dict__.update(_ptxas_usage(ptx, name, arch))
        result.ok = True
    except Exception as exc:  # a compile error is the finding: reported per variant
        result.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:400] if str(exc).strip() else ''}"
    result.seconds = round(time.perf_counter() - started, 2)
    return result


def _ptxas_usage(ptx: str, arch: str, arch_number: int) -> dict[str, int]:
    """Registers, spills, stack and shared memory of the kernel as ptxas reports them (``-v``)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        proc = subprocess.run([ptxas_path(arch_number), f"-arch={arch}", "-v", str(path), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed: {text[-400:]}")

    def grab(pattern: str) -> int | None:
        match = re.search(pattern, text)
        return int(match.group(1)) if match else None

    return {"registers": grab(r"Used (\d+) registers"), "spill_store_bytes": grab(r"(\d+) bytes spill stores"),
            "spill_load_bytes": grab(r"(\d+) bytes spill loads"), "stack_bytes": grab(r"(\d+) bytes stack frame")}


def save_variants(variants: dict[str, Variant], path: Path) -> None:
    path.write_text(json.dumps([asdict(v) for v in variants.values()], default=str, indent=1))


def load_variants(path: Path) -> list[Variant]:
    out = []
    for d in json.loads(path.read_text()):
        out.append(Variant(d["module"], d["kernel"], tuple(map(tuple, d["signature"])),
                           tuple(map(tuple, d["constexprs"])), tuple(map(tuple, d["options"]))))
    return out


__all__ = ["ARCHS", "CompileResult", "SPILL_BUDGET_BYTES", "Variant", "compile_variant", "load_variants",
           "ptxas_path", "record_launches", "save_variants"]
