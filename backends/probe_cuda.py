"""Probe the CUDA backend: torch's CUDA build, the devices it sees, and Triton.

Querying device properties initialises CUDA in this process; the probe runs
when hyspec starts working, never at import.
"""
from __future__ import annotations

import os

from hyspec.backends.installed import dist_version
from hyspec.backends.records import CudaCapabilities, CudaDevice

HINT_CUDA_TORCH = ("install a CUDA build of torch (https://pytorch.org/get-started/locally/, e.g. "
                   "pip install torch --index-url https://download.pytorch.org/whl/cu128) "
                   "and Triton with pip install 'hyspec[cuda]'")
HINT_TRITON = "pip install 'hyspec[cuda]' (installs triton)"
NO_DEVICE_FOR_TRITON = ("no CUDA device to compile for: Triton needs a GPU "
                        "(TRITON_INTERPRET=1 runs its kernels on the CPU, for tests only)")


def probe_cuda(check_triton: bool = True) -> CudaCapabilities:
    import torch

    triton_version = dist_version("triton")

    def unavailable(reason: str, hint: str | None) -> CudaCapabilities:
        triton_reason = NO_DEVICE_FOR_TRITON if triton_version else f"triton is not installed ({HINT_TRITON})"
        return CudaCapabilities(available=False, reason=reason, hint=hint, torch_cuda_version=torch.version.cuda,
                                device_count=0, devices=(), triton_version=triton_version,
                                triton_can_compile=False, triton_reason=triton_reason)

    if torch.version.cuda is None:
        if getattr(torch.version, "hip", None):
            return unavailable(f"torch {torch.__version__} is a ROCm build (HIP {torch.version.hip}); "
                               "hyspec's cuda backend supports NVIDIA CUDA builds only", HINT_CUDA_TORCH)
        return unavailable(f"torch {torch.__version__} was built without CUDA (torch.version.cuda is None)",
                           HINT_CUDA_TORCH)
    try:
        count = torch.cuda.device_count()
    except RuntimeError as exc:
        return unavailable(f"CUDA runtime error while counting devices: {exc}", "check the NVIDIA driver (nvidia-smi)")
    if count == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return unavailable(f"torch {torch.__version__} has CUDA {torch.version.cuda} but sees no device{where}",
                           "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES")
    try:
        devices = tuple(_describe_device(torch, i, check_triton and triton_version is not None)
                        for i in range(count))
    except RuntimeError as exc:  # driver too old for this torch, device in a bad state, ...
        return unavailable(f"CUDA device query failed: {str(exc).strip().splitlines()[0]}",
                           "check the NVIDIA driver (nvidia-smi) against torch's CUDA version")
    if triton_version is None:
        triton_ok, triton_reason = False, f"triton is not installed ({HINT_TRITON})"
    elif not check_triton:
        triton_ok, triton_reason = None, "not checked"
    else:
        failing = [d for d in devices if not d.triton_can_compile]
        triton_ok = not failing
        triton_reason = "; ".join(f"cuda:{d.index}: {d.triton_reason}" for d in failing) or None
    return CudaCapabilities(available=True, reason=None, hint=None, torch_cuda_version=torch.version.cuda,
                            device_count=count, devices=devices, triton_version=triton_version,
                            triton_can_compile=triton_ok, triton_reason=triton_reason)


def _describe_device(torch, index: int, check_triton: bool) -> CudaDevice:
    props = torch.cuda.get_device_properties(index)
    capability = (int(props.major), int(props.minor))
    triton_reason: str | None = None
    triton_ok: bool | None = None
    if check_triton:
        from hyspec.backends.triton_check import triton_compiles_on

        triton_reason = triton_compiles_on(torch.device("cuda", index))
        triton_ok = triton_reason is None
    return CudaDevice(
        index=index,
        name=str(props.name),
        compute_capability=capability,
        total_memory_bytes=int(props.total_memory),
        multiprocessor_count=int(props.multi_processor_count),
        bf16_supported=capability >= (8, 0),  # Ampere and newer have bf16 tensor cores
        triton_can_compile=triton_ok,
        triton_reason=triton_reason,
    )
