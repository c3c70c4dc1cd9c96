import torch, time, sys
torch.set_num_threads(int(sys.argv[1]))
from hyspec.assets import default_model
from hyspec.model.gguf_checkpoint import GGUFCheckpoint
from hyspec.model.quant import concat_rows
from hyspec.cpu_ops.qgemm import qgemm
c = GGUFCheckpoint(default_model())
ws=[]
for i in range(30):
    a=f"model.layers.{i}.self_attn."; m=f"model.layers.{i}.mlp."
    for names in ([a+"q_proj",a+"k_proj",a+"v_proj"],[a+"o_proj"],[m+"gate_proj",m+"up_proj"],[m+"down_proj"]):
        w = concat_rows([c.group_quantized(n+".weight") for n in names]); ws.append(w)
head = c.group_quantized("model.embed_tokens.weight")
for M in (1,2,5):
    xs={K: torch.randn(M,K) for K in (576,1536)}
    for _ in range(2):
        for w in ws: qgemm(w.block_type, xs[w.shape[1]], w.blocks, w.shape[0])
    t=time.perf_counter(); n=10
    for _ in range(n):
        for w in ws: qgemm(w.block_type, xs[w.shape[1]], w.blocks, w.shape[0])
    lin=(time.perf_counter()-t)/n*1e3
    x=xs[576]
    t=time.perf_counter()
    for _ in range(n): qgemm("Q8_0", x, head.blocks, 49152)
    print(sys.argv[1], 'threads M', M, f'linears {lin:.2f} ms, head {(time.perf_counter()-t)/n*1e3:.2f} ms')
