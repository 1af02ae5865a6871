import torch, time, ctypes, mmap
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.madvise.argtypes=[ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_HUGEPAGE=14
torch.set_num_threads(1)
x = torch.randn(4096, 12288)
def plain():
    o = torch.empty_like(x); o.copy_(x); return o
def huge():
    o = torch.empty_like(x)
    p = o.data_ptr(); n = o.numel()*4
    a = (p + (1<<21)-1) & ~((1<<21)-1); e = (p+n) & ~((1<<21)-1)
    if e > a: libc.madvise(a, e-a, MADV_HUGEPAGE)
    o.copy_(x); return o
def med(f, n=11):
    for _ in range(2): f()
    ts=[]
    for _ in range(n):
        t0=time.perf_counter(); f(); ts.append(time.perf_counter()-t0)
    ts.sort(); return ts[n//2]*1e3
for _ in range(2):
    print("plain %.1f ms  madv_huge %.1f ms" % (med(plain), med(huge)))
