"""Time PyTorch's CPU int4 kernel and bf16 matmul at the project's shapes: the recorded anchor in docs/perf.md.

Run by hand, once, in the throwaway virtualenv of scripts/pytorch_int4pack_fixture.py (PyTorch is an
anchor, never a dependency):

    /tmp/torchenv/bin/python scripts/pytorch_int4mm_anchor.py

Two threads; per shape the median of five rounds of: `_weight_int4pack_mm_for_cpu` at M = 1 and M = 4
(bf16 scales and zeros, group 128, or 64 where 128 does not divide K: PyTorch needs K % group == 0),
bf16 `linear` at M = 1 (GEMV) and M = 512 (GEMM).
"""
import torch, time, sys
torch.set_num_threads(2)
print("torch", torch.__version__, "capability", torch.backends.cpu.get_cpu_capability(), "threads", torch.get_num_threads())
shapes=[("qkv",2048,2048),("qkv_gqa",3072,2048),("gate_up",13312,2048),("down",2048,6656),("qkv",960,576),("o_proj",576,576),("gate_up",3072,576),("down",576,1536),("lm_head",49152,576)]
def tm(f, budget=0.06):
    f(); t=time.perf_counter(); n=0
    while n<2 or time.perf_counter()-t<budget: f(); n+=1
    return (time.perf_counter()-t)/n
g=128
rows=[]
for name,N,K in shapes:
    Kp = K
    codes=torch.randint(0,16,(N,Kp),dtype=torch.int32)
    packed=torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes,1)
    G=(Kp+g-1)//g
    if Kp % g: 
        # tinygemm needs K % groupsize == 0: use group 64 for K=576 (576 = 9*64)
        gg=64; G=Kp//gg
    else: gg=g
    sz=torch.randn(G,N,2,dtype=torch.bfloat16)*0.01
    x1=torch.randn(1,Kp,dtype=torch.bfloat16); x4=torch.randn(4,Kp,dtype=torch.bfloat16); x512=torch.randn(512,Kp,dtype=torch.bfloat16)
    wb=torch.randn(N,Kp,dtype=torch.bfloat16)
    res=[]
    for r in range(5):
        d1=tm(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x1,packed,gg,sz))
        d4=tm(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x4,packed,gg,sz))
        mm=tm(lambda: torch.nn.functional.linear(x512,wb))
        gv=tm(lambda: torch.nn.functional.linear(x1,wb))
        res.append((d1,d4,mm,gv))
    med=lambda i: sorted(r[i] for r in res)[2]
    d1,d4,mm,gv=med(0),med(1),med(2),med(3)
    bytes_=N*Kp//2 + G*N*2*2
    print(f"| {name} | {N}x{K} | g{gg} | int4mm M=1 {d1*1e6:.1f} us = {bytes_/d1/1e9:.1f} GB/s | M=4/M=1 {d4/d1:.2f} | bf16 GEMV {N*K*2/gv/1e9:.1f} GB/s | bf16 mm M=512 {2*512*N*K/mm/1e9:.1f} GFLOP/s |")
