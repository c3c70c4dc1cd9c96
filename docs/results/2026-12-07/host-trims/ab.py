"""Per-call wall time, inside a running engine, of three host functions every decoding step calls: the versions
at a base revision against the working tree's, switched per pass on one engine (chat, batch 1 and 8, 8 prompts x
48 greedy tokens), tokens compared.  KVPool.check_owner (one page: no arrays), DecoderStack._kv (the same pairs:
no pointer walk), build_inputs (the block table from one list), paged_attention._rows (decoding rows: no
repeat_interleave / cat).

    .venv/bin/python docs/results/2026-12-07/host-trims/ab.py [BASE_REV] [ROUNDS]
"""
import importlib.util, statistics, subprocess, sys, tempfile, time
from pathlib import Path
from hyspec import LLM, SamplingParams
from hyspec.bench.interleaved_ab import workload_prompts
from hyspec.kv import pool as pool_mod
from hyspec.cpu_ops import decoder_stack as ds_mod
from hyspec.seam import forward as fw_mod
from hyspec.cpu_ops import paged_attention as pa_mod

BASE = sys.argv[1] if len(sys.argv) > 1 else "8a2f6c0"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 4
REPO = Path(__file__).resolve().parents[4]


def old_module(path: str, name: str):
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{BASE}:{path}"], check=True, capture_output=True,
                         text=True).stdout
    f = Path(tempfile.mkdtemp()) / f"{name}.py"
    f.write_text(src)
    spec = importlib.util.spec_from_file_location(name, f)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


old = {"check_owner": old_module("core/kv/pool.py", "old_pool").KVPool.check_owner,
       "_kv": old_module("cpu_ops/decoder_stack.py", "old_stack").DecoderStack._kv,
       "build_inputs": old_module("core/seam/forward.py", "old_forward").build_inputs,
       "_rows": old_module("cpu_ops/paged_attention.py", "old_attention")._rows}
new = {"check_owner": pool_mod.KVPool.check_owner, "_kv": ds_mod.DecoderStack._kv,
       "build_inputs": fw_mod.build_inputs, "_rows": pa_mod._rows}
times = {}
current = ["new"]


def timed(name, impls):
    def call(*a, **k):
        t = time.perf_counter()
        r = impls[current[0]][name](*a, **k)
        times.setdefault((current[0], name), []).append(time.perf_counter() - t)
        return r
    return call


impls = {"old": old, "new": new}
pool_mod.KVPool.check_owner = timed("check_owner", impls)
ds_mod.DecoderStack._kv = timed("_kv", impls)
fw_mod.build_inputs = timed("build_inputs", impls)
pa_mod._rows = timed("_rows", impls)

p = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
llm = LLM()
for batch in (1, 8):
    prompts = workload_prompts("chat", 8)
    times.clear()
    outs = {}
    for r in range(ROUNDS + 1):
        for which in (("old", "new") if r % 2 else ("new", "old")):
            current[0] = which
            llm.reset_prefix_cache()
            res = [llm.generate([q], p)[0] for q in prompts] if batch == 1 else llm.generate(prompts, [p] * 8)
            outs[which] = [list(o.outputs[0].token_ids) for o in res]
            if r == 0:
                for key in [k for k in times if k[0] == which]:
                    del times[key]
    print(f"batch {batch}: tokens identical {outs['old'] == outs['new']}; median us per call, {BASE} -> working tree:")
    for name in ("check_owner", "_kv", "build_inputs", "_rows"):
        o, n = statistics.median(times[("old", name)]), statistics.median(times[("new", name)])
        print(f"  {name:12s} {1e6 * o:7.1f} -> {1e6 * n:7.1f}   ({len(times[('new', name)])} calls)")
llm.close()
