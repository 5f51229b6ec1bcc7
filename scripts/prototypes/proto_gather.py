#!/usr/bin/env python3
# Prototype of the packed gather (crates/gpusort-cuda/kernels/gather.cu pack_rows / gather_unpack) against the
# column-by-column gather, timed with CuPy on the GPU machine (it has no Rust): run from a
# folder holding a copy of crates/gpusort-cuda/kernels/gather.cu named gather_new.cu. Figures: crates/gpusort-cuda/kernels/NOTES.md v7.
import cupy as cp, numpy as np
HDR = "typedef unsigned char u8;\ntypedef unsigned short u16;\ntypedef unsigned int u32;\ntypedef unsigned long long u64;\n#define FULL_MASK 0xffffffffu\n"
mod = cp.RawModule(code=HDR + open("gather_new.cu").read(), options=("-std=c++17",), backend="nvrtc")
pack, unpack, g4 = mod.get_function("pack_rows"), mod.get_function("gather_unpack"), mod.get_function("gather_w4")
def ms(fn, reps=5):
    fn(); cp.cuda.Device().synchronize()
    s, e = cp.cuda.Event(), cp.cuda.Event(); best = 1e9
    for _ in range(reps):
        s.record(); fn(); e.record(); e.synchronize(); best = min(best, cp.cuda.get_elapsed_time(s, e))
    return best
sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
rng = cp.random.default_rng(1)
def group_run(cols, perm, n_out, widths, odd=False):
    # offsets: widest first
    order = sorted(range(len(cols)), key=lambda k: -widths[k]); off = {}; o = 0
    for k in order: off[k] = o; o += widths[k]
    R = (o + 15) // 16 * 16
    if odd and (R // 16) % 2 == 0: R += 16
    n = cols[0].size if widths[0] else 0
    n_src = cols[0].nbytes // widths[0]
    rows = cp.empty(n_src * R, dtype=cp.uint8)
    outs = [cp.empty(n_out * w // c.itemsize, dtype=c.dtype) for c, w in zip(cols, widths)]
    tab_in = np.zeros(len(cols) * 2, dtype=np.uint64); tab_out = np.zeros(len(cols) * 2, dtype=np.uint64)
    for k, (c, w) in enumerate(zip(cols, widths)):
        tab_in[2*k] = c.data.ptr; tab_in[2*k+1] = w | (off[k] << 32)
        tab_out[2*k] = outs[k].data.ptr; tab_out[2*k+1] = w | (off[k] << 32)
    tin, tout = cp.asarray(tab_in), cp.asarray(tab_out)
    smem = 256 * R
    def go():
        pack((min((n_src + 255)//256, sms*8),), (256,), (cp.uint32(n_src), tin, cp.uint32(len(cols)), cp.uint32(R), rows), shared_mem=smem)
        unpack((min((n_out + 255)//256, sms*8),), (256,), (cp.uint32(n_out), rows, cp.uint32(R), perm, tout, cp.uint32(len(cols))), shared_mem=smem)
    return go, outs, R
# correctness: mixed widths, odd n
for n in (1, 255, 256, 257, 100003):
    widths = [1, 2, 4, 8, 16, 4, 1, 8]
    dts = {1: cp.uint8, 2: cp.uint16, 4: cp.uint32, 8: cp.uint64, 16: cp.uint64}
    cols = [rng.integers(0, 200, size=n * (2 if w == 16 else 1), dtype=cp.uint64).astype(dts[w]) for w in widths]
    perm = cp.random.permutation(n).astype(cp.uint32)
    n_out = max(1, n // 3) if n > 3 else n
    go, outs, R = group_run(cols, perm, n_out, widths); go(); cp.cuda.Device().synchronize()
    ok = True
    for c, o, w in zip(cols, outs, widths):
        ref = c.reshape(n, 2)[perm[:n_out]].reshape(-1) if w == 16 else c[perm[:n_out]]
        ok &= bool((o == ref).all())
    print(f"mixed widths n={n} out={n_out} R={R}: {'ok' if ok else 'WRONG'}")
n = 10_000_000
perm = cp.argsort(rng.integers(0, 2**32, size=n, dtype=cp.uint64).astype(cp.uint32)).astype(cp.uint32)
for m in (2, 4, 8, 16, 20, 32):
    cols = [rng.integers(0, 2**32, size=n, dtype=cp.uint64).astype(cp.uint32) for _ in range(m)]
    outs1 = [cp.empty_like(c) for c in cols]
    def per_col():
        for c, o in zip(cols, outs1): g4((min((n + 2047)//2048, sms*16),), (256,), (cp.uint32(n), c, perm, o))
    t1 = ms(per_col)
    go, outs, R = group_run(cols, perm, n, [4]*m)
    t2 = ms(go)
    ok = all(bool((o == c[perm]).all()) for o, c in zip(outs, cols))
    print(f"m={m:2d} R={R:3d}: per-column gather {t1:7.3f} ms | packed {t2:7.3f} ms ({t1/t2:4.2f}x) ok={ok}")
    del cols, outs, outs1
for m in (16, 20, 28, 32):
    cols = [rng.integers(0, 2**32, size=n, dtype=cp.uint64).astype(cp.uint32) for _ in range(m)]
    res = []
    for odd in (False, True):
        gs = [cols[i:i+28] for i in range(0, m, 28)]
        runs = [group_run(g, perm, n, [4]*len(g), odd) for g in gs]
        t = ms(lambda: [r[0]() for r in runs])
        ok = all(bool((o == c[perm]).all()) for r, g in zip(runs, gs) for o, c in zip(r[1], g))
        res.append(f"R={[r[2] for r in runs]} {t:.3f} ms ok={ok}")
    print(f"m={m}: " + " | ".join(res))
    del cols, runs
