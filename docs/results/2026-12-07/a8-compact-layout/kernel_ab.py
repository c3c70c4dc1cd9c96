"""qgemm_a8.c at BASE (built into a temporary directory) against the checked-out one: every output bit-identical for
every block type, builds and layout shape, then one-row and eight-row times on 7B- and SmolLM2-shaped matrices,
the two kernels interleaved (best of 7 passes).

    .venv/bin/python docs/results/2026-12-07/a8-compact-layout/kernel_ab.py BASE_COMMIT
"""
import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root, for tests' block makers
from hyspec.cpu_ops import qgemm_a8 as a8  # noqa: E402
from hyspec.cpu_ops.qgemm import QTYPES  # noqa: E402
from tests.test_cpu_ops_kquants import random_blocks  # noqa: E402
from tests.test_cpu_ops_qgemm import _blocks  # noqa: E402

TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


def build_base(commit: str, march: str, out: Path) -> ctypes.CDLL:
    for name in ("qgemm_a8.c", "hsum16.h"):
        (out / name).write_bytes(subprocess.check_output(["git", "show", f"{commit}:cpu_ops/{name}"]))
    so = out / f"base-{march}.so"
    subprocess.check_call(["cc", "-O3", f"-march={march}", "-fopenmp", "-shared", "-fPIC", "-std=gnu11",
                           str(out / "qgemm_a8.c"), "-o", str(so), "-lm"])
    lib = ctypes.CDLL(str(so))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.hyspec_qgemm_a8.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr]
    lib.hyspec_qgemm_a8_pack.argtypes = [ctypes.c_int, ptr, i64, i64, ptr]
    lib.hyspec_qgemm_a8_row_bytes.restype = i64
    lib.hyspec_qgemm_a8_row_bytes.argtypes = [ctypes.c_int, i64]
    return lib


def blocks(qtype: str, n: int, k: int, seed: int) -> torch.Tensor:
    if qtype in ("Q4_0", "Q4_1", "Q8_0"):
        return _blocks(qtype, n, k, seed=seed)[0].blocks  # gguf's own quantizer
    return torch.as_tensor(np.asarray(random_blocks(qtype, n, k, seed=seed))).reshape(n, -1).to(torch.uint8)


def product(lib, qtype, w, x, n):
    return a8.qgemm_a8(qtype, x, a8.pack(qtype, w, n, x.shape[1], lib=lib), n, lib=lib)


def main() -> None:
    base_commit = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        base = build_base(base_commit, "native", Path(tmp))
        head = {"native": a8.variant("native"), "portable": a8.variant("x86-64")}
        print(f"base {base_commit}, head {subprocess.check_output(['git', 'rev-parse', '--short', 'HEAD']).decode().strip()}"
              f" ({a8.isa(head['native'])} and {a8.isa(head['portable'])} builds)")
        differ = 0
        for qtype in TYPES:
            # pairs only, groups only, groups and pairs, an odd last block
            ks = (256, 512, 768, 2304, 4096) if qtype.endswith("_K") else (32, 64, 544, 576, 1536, 4096)
            for k in ks:
                w = blocks(qtype, 13, k, seed=k)
                for m in (1, 3, 9):
                    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k + m))
                    x[0, min(40, k - 1)] = 9.0
                    ref = product(base, qtype, w, x, 13)
                    differ += sum(not torch.equal(product(lib, qtype, w, x, 13), ref) for lib in head.values())
            q = QTYPES[qtype]
            print(f"{qtype}: bytes per 32 weights of a 4096-wide row, base {base.hyspec_qgemm_a8_row_bytes(q, 4096) / 128:g}"
                  f", head {head['native'].hyspec_qgemm_a8_row_bytes(q, 4096) / 128:g}")
        print(f"outputs that differ from the base's: {differ} (of {sum(3 * 2 * (5 if t.endswith('_K') else 6) for t in TYPES)})")

        torch.set_num_threads(2)
        shapes = [("Q4_K", 4096, 4096), ("Q4_K", 11008, 4096), ("Q4_K", 4096, 11008), ("Q6_K", 4096, 4096),
                  ("Q6_K", 4096, 11008), ("Q6_K", 49152, 4096), ("Q5_K", 4096, 4096), ("Q5_0", 4096, 4096),
                  ("Q5_0", 576, 576), ("Q8_0", 1536, 576), ("Q4_K", 576, 1536), ("Q4_0", 4096, 4096)]
        print("\nshape (type N x K), rows of x: ms base / head, head / base time, head / base bytes, head GB/s")
        for qtype, n, k in shapes:
            w = blocks(qtype, n, k, seed=1)
            packs = {"base": a8.pack(qtype, w, n, k, lib=base), "head": a8.pack(qtype, w, n, k, lib=head["native"])}
            libs = {"base": base, "head": head["native"]}
            for m in (1, 8):
                x = torch.randn(m, k)
                best = {name: float("inf") for name in libs}
                reps = max(3, int(2e8 / (n * k)))
                for _ in range(7):
                    for name, lib in libs.items():
                        t = time.perf_counter()
                        for _ in range(reps):
                            a8.qgemm_a8(qtype, x, packs[name], n, lib=lib)
                        best[name] = min(best[name], (time.perf_counter() - t) / reps)
                print(f"{qtype} {n}x{k}, {m}: {best['base'] * 1e3:.3f} / {best['head'] * 1e3:.3f} ms, "
                      f"{best['head'] / best['base']:.3f}, {packs['head'].numel() / packs['base'].numel():.3f}, "
                      f"{packs['head'].numel() / best['head'] / 1e9:.1f}")


if __name__ == "__main__":
    main()
