import torch, time, sys
torch.manual_seed(0)
torch.set_num_threads(2)
H,I,L,G=576,1536,30,32
shapes=[(960,H),(H,H),(2*I,H),(H,I)]
def mk(N,K,dt):
    q = torch.randint(0,16,(N,K),dtype=torch.int32)
    d = torch.rand(N,K//G)*0.02+0.001; m = -torch.rand(N,K//G)*0.1
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
    sz = torch.stack([d.t(), (m+8*d).t()], dim=-1).to(dt).contiguous()
    return packed, sz
for dt in (torch.float32, torch.bfloat16):
    ws=[mk(N,K,dt) for _ in range(L) for (N,K) in shapes]
    for M in (1,4):
        xs={K: torch.randn(M,K).to(dt) for K in (H,I)}
        def run():
            for (p,sz),(N,K) in zip(ws, shapes*L):
                torch.ops.aten._weight_int4pack_mm_for_cpu(xs[K], p, G, sz)
        for _ in range(3): run()
        t=time.perf_counter(); n=20
        for _ in range(n): run()
        print('int4',dt,'M',M, f'{(time.perf_counter()-t)/n*1e3:.2f} ms / 120 proj')
# batch invariance
p,sz=mk(2*I,H,torch.float32)
x=torch.randn(5,H)
a=torch.ops.aten._weight_int4pack_mm_for_cpu(x,p,G,sz)
b=torch.cat([torch.ops.aten._weight_int4pack_mm_for_cpu(x[i:i+1],p,G,sz) for i in range(5)])
print('batch-invariant fp32:', torch.equal(a,b), (a-b).abs().max().item())
# fp32 mkl packed reference
from hyspec.cpu_ops.packed_linear import PackedLinear
for dt in (torch.float32,):
    lins=[PackedLinear(torch.randn(N,K).to(dt)*0.02, None) for _ in range(L) for (N,K) in shapes]
    for M in (1,4):
        xs={K: torch.randn(M,K).to(dt) for K in (H,I)}
        with torch.inference_mode():
            for _ in range(3):
                for l in lins: l(xs[l.in_features])
            t=time.perf_counter(); n=10
            for _ in range(n):
                for l in lins: l(xs[l.in_features])
        print('mkl packed',dt,'M',M, f'{(time.perf_counter()-t)/n*1e3:.2f} ms')
# int8
ws8=[(torch.randint(-128,127,(N,K),dtype=torch.int8), torch.rand(N)) for _ in range(L) for (N,K) in shapes]
for dt in (torch.float32, torch.bfloat16):
    for M in (1,4):
        xs={K: torch.randn(M,K).to(dt) for K in (H,I)}
        def run8():
            for (w,s),(N,K) in zip(ws8, shapes*L):
                torch.ops.aten._weight_int8pack_mm(xs[K], w, s.to(dt))
        for _ in range(3): run8()
        t=time.perf_counter(); n=10
        for _ in range(n): run8()
        print('int8',dt,'M',M, f'{(time.perf_counter()-t)/n*1e3:.2f} ms')
