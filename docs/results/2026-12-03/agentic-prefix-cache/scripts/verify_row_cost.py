import time, torch
from hyspec import LLM
from hyspec.engine.model_runner import NO_LOGITS, Feed
from hyspec.kv.sequence_kv import SequenceKV
llm = LLM(quantization="a8")
e = llm.engine; runner, layout, pool = e.runner, e.layout, e.pool
CTX = 250
@torch.inference_mode()
def measure(batch, tokens, logits=True):
    kvs = [SequenceKV(pool, layout) for _ in range(batch)]
    for kv in kvs: kv.reserve(CTX + tokens)
    ids = torch.randint(0, 49152, (CTX + tokens,)).tolist()
    runner.run([Feed(kv, ids[:CTX], 0, logits=NO_LOGITS) for kv in kvs])
    feeds = [Feed(kv, ids[CTX:], CTX) if logits else Feed(kv, ids[CTX:], CTX, logits=NO_LOGITS) for kv in kvs]
    ts = []
    for _ in range(3):
        t0 = time.perf_counter(); runner.run(feeds); ts.append(time.perf_counter() - t0)
    for kv in kvs: kv.release()
    return min(ts) * 1000
for b in (1, 8):
    print(b, [(n, round(measure(b, n), 1), round(measure(b, n, False), 1)) for n in (1, 2, 4, 8, 16, 32)])
