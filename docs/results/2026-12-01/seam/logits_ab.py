import time, statistics, torch
import torch.nn.functional as F
from hyspec import LLM
llm = LLM(kv_cache_bytes=256 << 20)
m = llm.engine.model
h = torch.randn(1, m.config.hidden_size, dtype=llm.engine.dtype)
old = lambda x: F.linear(x, m.lm_head_weight).float()
new = m.compute_logits
res = {"old": [], "new": []}
with torch.inference_mode():
    for _ in range(20): old(h); new(h)
    for r in range(15):
        for name, fn in (("old", old), ("new", new)):
            t0 = time.perf_counter()
            for _ in range(50): fn(h)
            res[name].append((time.perf_counter() - t0) / 50 * 1e3)
    assert torch.equal(old(h), new(h))
print({k: round(statistics.median(v), 3) for k, v in res.items()}, "identical outputs")
