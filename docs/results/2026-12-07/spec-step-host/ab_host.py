"""Old vs new host code (TreeBatch on host lists, SamplingTensors.from_params shared), one process, passes
interleaved (order reversed every round): plain, suffix and hybrid engines, each speculative engine run with the
functions of git revision REV ("old") and of the working tree ("new"); tokens checked against plain.

    Q=a8 .venv/bin/python docs/results/2026-12-07/spec-step-host/ab_host.py chat 1 5 REV     (Q unset: exact path)
"""
import sys, time, statistics, importlib.util, os, subprocess, tempfile
from pathlib import Path
from hyspec import LLM, SamplingParams
from hyspec.bench.interleaved_ab import workload_prompts
from hyspec.seam import tree as T
from hyspec.ops import sampling as S
def load(name, rev, path):
    f = Path(tempfile.mkdtemp()) / f"{name}.py"
    f.write_text(subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout)
    spec = importlib.util.spec_from_file_location(name, f); m = importlib.util.module_from_spec(spec); sys.modules[name] = m
    spec.loader.exec_module(m); return m
old_T = load("old_tree", sys.argv[4], "core/seam/tree.py")
new_fns = (T.TreeBatch.__post_init__, T.TreeBatch.__dict__["from_trees"], S.SamplingTensors.__dict__["from_params"])
def old_from_trees(cls, trees, vocab_size=None, device=None):  # the old body, building this module's class
    return old_T.TreeBatch.from_trees.__func__(cls, trees, vocab_size, device)
def use(old):
    if old:
        T.TreeBatch.__post_init__ = old_T.TreeBatch.__post_init__
        T.TreeBatch.from_trees = classmethod(old_from_trees)
        S.SamplingTensors.from_params = classmethod(lambda cls, params, device="cpu": cls.from_lists(
            [p.temperature for p in params], [getattr(p, "top_k", None) for p in params],
            [getattr(p, "top_p", None) for p in params], [getattr(p, "min_p", None) for p in params], device=device))
    else:
        T.TreeBatch.__post_init__, T.TreeBatch.from_trees, S.SamplingTensors.from_params = new_fns
wl, B, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kw = {"quantization": os.environ["Q"]} if os.environ.get("Q") else {}
prompts = workload_prompts(wl, 8)
p = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
engines = {"plain": LLM(**kw), "suffix": LLM(**kw, speculative_config={"method": "suffix"}),
           "hybrid": LLM(**kw, speculative_config={"method": "hybrid"})}
runs = [("plain", False)] + [(m, o) for m in ("suffix", "hybrid") for o in (True, False)]
times = {r: [] for r in runs}; toks = {}; outs_all = []
for rnd in range(rounds + 1):
    order = runs if rnd % 2 else runs[::-1]
    for name, old in order:
        use(old); llm = engines[name]
        if llm.engine.spec.enabled: llm.engine.spec.forget_shared_history()
        llm.reset_prefix_cache()
        t = time.perf_counter()
        outs = llm.generate(prompts, [p] * 8) if B > 1 else [o for q in prompts for o in llm.generate([q], p)]
        dt = time.perf_counter() - t
        ids = [o.outputs[0].token_ids for o in outs]
        if name == "plain": toks.setdefault("plain", ids)
        outs_all.append((name, ids))
        if rnd: times[(name, old)].append(dt)
assert all(ids == toks["plain"] for _, ids in outs_all)
use(False)
med = {r: statistics.median(v) for r, v in times.items()}
print(f"{wl} batch {B} {kw or 'exact'}, {rounds} rounds, median s per pass (tokens identical to plain: yes)")
for r, v in med.items(): print(f"  {r[0]:7s} {'old' if r[1] else 'new':3s} {v:.3f}  x plain {med[('plain', False)] / v:.3f}")
for m in ("suffix", "hybrid"):
    print(f"  {m}: new / old speed {med[(m, True)] / med[(m, False)]:.3f}")
for llm in engines.values(): llm.close()
