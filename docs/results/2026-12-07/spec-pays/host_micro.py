"""Microseconds of the host objects a speculative step builds (one thread): SamplingTensors from one request,
one row of eight selected, a DraftTree chain of 3 and a tree of 8 nodes.

    .venv/bin/python docs/results/2026-12-07/spec-pays/host_micro.py
"""
import timeit, torch
from hyspec import SamplingParams
from hyspec.ops.sampling import SamplingTensors
from hyspec.seam.tree import DraftTree, NodeScores
torch.set_num_threads(1)
ps=[SamplingParams(temperature=0.0, max_tokens=48)]
n=2000
print("from_params 1 row us", 1e6*timeit.timeit(lambda: SamplingTensors.from_params(ps), number=n)/n)
st=SamplingTensors.from_params(ps*8)
print("select us", 1e6*timeit.timeit(lambda: st.select([3]), number=n)/n)
print("DraftTree chain3 us", 1e6*timeit.timeit(lambda: DraftTree([1,2,3,4],[-1,0,1,2],vocab_size=49152, scores=NodeScores((1.0,1.0,1.0),0,3)), number=n)/n)
print("DraftTree tree8 us", 1e6*timeit.timeit(lambda: DraftTree([1,2,3,4,5,6,7,8,9],[-1,0,0,1,2,3,4,5,6],vocab_size=49152), number=n)/n)
