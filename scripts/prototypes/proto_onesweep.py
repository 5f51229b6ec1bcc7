#!/usr/bin/env python3
# Prototype of the one-sweep LSD pass (crates/gpusort-cuda/kernels/onesweep.cu) against SRTS (crates/gpusort-cuda/kernels/srts.cu) and
# CUB (through CuPy), on the GPU machine (it has no Rust). Run from the repository root:
#
#   python3 scripts/prototypes/proto_onesweep.py            # correctness cases, then the timing table
#   IPT=12 ONESWEEP_MIN_BLOCKS=2 ONESWEEP_LOOKBACK_WINDOW=1 python3 scripts/prototypes/proto_onesweep.py
#   ONESWEEP_IPT=24 ONESWEEP_KEEP_WORDS=2 python3 ...  # the one-sweep tile apart from SRTS's (IPT)
#   PROTO_SKIP_CHECKS=1 / PROTO_SKIP_TIMING=1    # one half only
#   PROTO_OS_GRID=tiles                          # one block per tile instead of persistent blocks
#
# One RawModule of crates/gpusort-cuda/kernels/common.cuh + grs.cu (only for the engine's three-kernel scan of long
# SRTS spines) + srts.cu + onesweep.cu, compiled by NVRTC. Lane tables are built as the engine
# builds them (lsd.rs: per lane u64 src, u64 dst, u64 flags << 32 | width). Sorts are 4
# passes of 8 bits over u32 keys; buffers ping-pong, so results are in the "B" buffers.
#
# The cases run in child processes of this script: a CUDA error in a kernel is sticky (the
# process's context is lost) and a look-back bug would hang, so the parent starts a new child
# after the case that crashed or hung, and the remaining cases still run.
import os, subprocess, sys, tempfile, threading, time, traceback

def parent():
    t0, wrong, crashed = time.time(), 0, 0
    parts = [p for p, skip in (("checks", "PROTO_SKIP_CHECKS"), ("timing", "PROTO_SKIP_TIMING"))
             if not os.environ.get(skip)]
    for part in parts:
        start = 0
        while True:
            with tempfile.NamedTemporaryFile("r", suffix=".case") as st:
                env = dict(os.environ, PROTO_CHILD=part, PROTO_FROM=str(start), PROTO_STATE=st.name,
                           PROTO_HEADER="1" if start == 0 else "")
                proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                hung = []
                timer = threading.Timer(150, lambda: (hung.append(1), proc.kill()))
                timer.start()
                for line in proc.stdout:
                    print(line, end="", flush=True)
                    wrong += "WRONG" in line
                rc = proc.wait()
                timer.cancel()
                if rc == 0:
                    break
                st.seek(0)
                last = st.read().strip()
            crashed += 1
            why = "killed after 150 s (a look-back hang?)" if hung else f"exit status {rc}"
            if not last:
                print(f"{part}: the child failed before its first case ({why})", flush=True)
                break
            print(f"{part} case {last}: CRASHED ({why}); going on with the next case", flush=True)
            start = int(last) + 1
    print(f"\n{wrong} WRONG, {crashed} crashed; total {time.time() - t0:.0f} s")

if not os.environ.get("PROTO_CHILD"):
    parent()
    sys.exit(0)

CHILD = os.environ["PROTO_CHILD"]
FROM = int(os.environ.get("PROTO_FROM", "0"))
HEADER = bool(os.environ.get("PROTO_HEADER"))

def started(i):
    with open(os.environ["PROTO_STATE"], "w") as f:
        f.write(str(i))

def after_error():
    """Exit (the parent goes on in a new process) if the error left the CUDA context unusable."""
    traceback.print_exc()
    try:
        cp.cuda.runtime.deviceSynchronize()
        cp.zeros(1).sum().get()
    except Exception:  # noqa: BLE001
        sys.stdout.flush()
        os._exit(3)

import numpy as np
import cupy as cp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
IPT = int(os.environ.get("IPT", "16"))
TILE = 256 * IPT
OS_IPT = int(os.environ.get("ONESWEEP_IPT", str(IPT)))
OS_BLOCK = int(os.environ.get("ONESWEEP_BLOCK", "256"))
OS_TILE = OS_BLOCK * OS_IPT  # the one-sweep pass's tile (ONESWEEP_BLOCK threads x ONESWEEP_IPT rows)
BLOCK = 256
LANE_IOTA, LANE_DIGIT = 1, 2
opts = ["-std=c++17", f"-DIPT={IPT}"]
if os.environ.get("ONESWEEP_IPT"):
    opts.append(f"-DONESWEEP_IPT={OS_IPT}")
if os.environ.get("ONESWEEP_BLOCK"):
    opts.append(f"-DONESWEEP_BLOCK={OS_BLOCK}")
if os.environ.get("ONESWEEP_MIN_BLOCKS"):
    opts.append(f"-DONESWEEP_MIN_BLOCKS={int(os.environ['ONESWEEP_MIN_BLOCKS'])}")
if os.environ.get("ONESWEEP_KEEP_WORDS"):
    opts.append(f"-DONESWEEP_KEEP_WORDS={int(os.environ['ONESWEEP_KEEP_WORDS'])}")
if os.environ.get("ONESWEEP_LOOKBACK_WINDOW"):
    opts.append(f"-DONESWEEP_LOOKBACK_WINDOW={int(os.environ['ONESWEEP_LOOKBACK_WINDOW'])}")
src = ""
for name in ("common.cuh", "grs.cu", "srts.cu", "onesweep.cu"):
    src += f"// ---- {name} ----\n" + open(os.path.join(ROOT, "crates", "gpusort-cuda", "kernels", name)).read() + "\n"
# A probe that tells how this CuPy passes a struct by value (below).
src += """
extern "C" __global__ void proto_records_probe(Records r, u64* out) {
    out[0] = (u64)r.src; out[1] = (u64)r.dst; out[2] = r.bytes; out[3] = r.piece;
}
"""
mod = cp.RawModule(code=src, options=tuple(opts), backend="nvrtc")
K = {name: mod.get_function(name) for name in (
    "srts_upsweep_b8", "srts_spine", "srts_downsweep_b8", "scan_reduce", "scan_spine", "scan_down",
    "onesweep_histogram", "onesweep_scan", "onesweep_pass_b8", "proto_records_probe")}
dev = cp.cuda.Device()
SMS = cp.cuda.runtime.getDeviceProperties(dev.id)["multiProcessorCount"]
U = np.uint32
if HEADER: print(f"device {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()} SMs={SMS} IPT={IPT} "
      f"TILE={TILE} ONESWEEP_TILE={OS_TILE} ({OS_BLOCK} threads) cupy {cp.__version__} options {opts} onesweep grid "
      f"{'a block per tile' if os.environ.get('PROTO_OS_GRID') == 'tiles' else 'persistent'}")

# struct Records {const u8* src; u8* dst; u32 bytes; u32 piece;} by value (24 bytes). CuPy
# passes a NumPy structured value as its bytes (a numpy.void scalar, or a 1-element structured
# ndarray in older versions); the probe finds which form this CuPy takes. If none does, the
# fallback is a thin extern "C" wrapper per kernel without the Records argument (piece = 0).
REC_DT = np.dtype([("src", "<u8"), ("dst", "<u8"), ("bytes", "<u4"), ("piece", "<u4")])
def records_arg(src=0, dst=0, nbytes=0, piece=0, form=None):
    a = np.zeros(1, dtype=REC_DT)
    a[0] = (src, dst, nbytes, piece)
    return a[0] if form == "void" else a
REC_FORM = None
for form in ("void", "array"):
    try:
        out = cp.zeros(4, dtype=cp.uint64)
        K["proto_records_probe"]((1,), (1,), (records_arg(0x1111, 0x2222, 33, 16, form), out))
        if out.get().tolist() == [0x1111, 0x2222, 33, 16]:
            REC_FORM = form
            break
    except Exception as e:  # noqa: BLE001
        print(f"records as {form}: {type(e).__name__}: {e}")
if REC_FORM is None:
    sys.exit("this CuPy passes no struct by value: add no-Records wrappers of the pass kernels")
NOREC = records_arg(form=REC_FORM)
if HEADER: print(f"Records passed as a numpy {'void scalar' if REC_FORM == 'void' else '1-element structured array'}")

def occupancy(kernel, dyn_smem, default, threads=BLOCK):
    try:
        return max(1, cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, threads, dyn_smem))
    except Exception:  # noqa: BLE001
        return default

def allow_dyn_smem(kernel, dyn_smem):
    # Over 48 KB of shared memory in all (IPT > 16) needs the opt-in, as the engine sets it.
    try:
        kernel.max_dynamic_shared_size_bytes = max(kernel.max_dynamic_shared_size_bytes, dyn_smem)
    except Exception as e:  # noqa: BLE001
        print(f"max_dynamic_shared_size_bytes not set: {e}")

def stream_ptr():
    return cp.cuda.get_current_stream().ptr

def lane_table(lanes):
    a = np.zeros(3 * len(lanes), dtype=np.uint64)
    for i, (s, d, w, f) in enumerate(lanes):
        a[3 * i], a[3 * i + 1], a[3 * i + 2] = s, d, (f << 32) | w
    return cp.asarray(a)

class Sort:
    """A 4-pass LSD sort of u32 `keys`: keys only, key + row index (`index`), or key + u32
    columns moved in every pass (`cols`, direct). Buffers and lane tables are made here; run
    with srts() or onesweep() (both leave the sorted keys in self.kout, the index in self.iout,
    the columns in self.cout)."""
    PASSES = 4

    def __init__(self, keys, index=False, cols=()):
        n = self.n = keys.size
        assert 0 < n < 2 ** 30, "n < 2^30 (the look-back words keep 30-bit values)"
        self.keys = keys
        kb = [cp.empty_like(keys), cp.empty_like(keys)]
        ib = [cp.empty(n, dtype=cp.uint32), cp.empty(n, dtype=cp.uint32)] if index else None
        cb = [[cp.empty_like(c), cp.empty_like(c)] for c in cols]
        self.digit_src, self.tables = [], []
        for p in range(self.PASSES):
            ksrc = keys if p == 0 else kb[(p - 1) % 2]
            self.digit_src.append(ksrc)
            lanes = [(ksrc.data.ptr, kb[p % 2].data.ptr, 4, LANE_DIGIT)]
            if index:
                lanes.append((0, ib[0].data.ptr, 4, LANE_IOTA) if p == 0
                             else (ib[(p - 1) % 2].data.ptr, ib[p % 2].data.ptr, 4, 0))
            for c, bufs in zip(cols, cb):
                csrc = c if p == 0 else bufs[(p - 1) % 2]
                lanes.append((csrc.data.ptr, bufs[p % 2].data.ptr, 4, 0))
            self.tables.append((lane_table(lanes), len(lanes)))
        last = (self.PASSES - 1) % 2
        self.kout = kb[last]
        self.iout = ib[last] if index else None
        self.cout = [bufs[last] for bufs in cb]
        self._bufs = (kb, ib, cb)
        self.num_tiles = (n + TILE - 1) // TILE
        self.dyn_smem = TILE * 4 + TILE * 4  # slots' positions + staging (every lane is 4 bytes)
        self.os_tiles = (n + OS_TILE - 1) // OS_TILE
        self.os_smem = OS_TILE * 4 + OS_TILE * 4
        # SRTS geometry, as srts.rs srts_grid.
        per_sm = occupancy(K["srts_downsweep_b8"], self.dyn_smem, 3)
        want = SMS * per_sm
        self.tpb = -(-self.num_tiles // max(1, min(want, self.num_tiles)))
        self.grid = -(-self.num_tiles // self.tpb)
        self.counts = cp.empty(256 * self.grid, dtype=cp.uint32)
        self.spine_len = 256 * self.grid
        self.chunks = -(-self.spine_len // TILE)
        self.spine_sums = cp.empty(max(1, self.chunks), dtype=cp.uint32)
        # One-sweep state, cleared by one memset per sort: the 4 x 256 histogram, then per pass
        # a 256-word header (word 0: the tile counter) and num_tiles * 256 look-back words.
        self.region = 256 + self.os_tiles * 256
        self.state = cp.empty(4 * 256 + self.PASSES * self.region, dtype=cp.uint32)
        self.hist = self.state[: 4 * 256]
        self.counter = [self.state[4 * 256 + p * self.region:][:1] for p in range(self.PASSES)]
        self.lookback = [self.state[4 * 256 + p * self.region + 256:][: self.os_tiles * 256]
                         for p in range(self.PASSES)]
        self.constant = cp.zeros(4, dtype=cp.uint32)
        self.hist_grid = SMS * occupancy(K["onesweep_histogram"], 0, 4)
        # The pass: persistent blocks taking tiles in turn (default), or one block per tile.
        if os.environ.get("PROTO_OS_GRID") == "tiles":
            self.os_grid = self.os_tiles
        else:
            self.os_grid = min(self.os_tiles, SMS * occupancy(K["onesweep_pass_b8"], self.os_smem, 2, OS_BLOCK))

    # Each step is (label, launch) so that timing can put events between kernels.
    def srts_steps(self):
        n, steps = U(self.n), []
        for p in range(self.PASSES):
            src, (lanes, nl) = self.digit_src[p], self.tables[p]
            steps.append(("srts_upsweep", lambda src=src, p=p: K["srts_upsweep_b8"](
                (self.grid,), (BLOCK,), (n, src, U(8 * p), U(255), U(self.tpb), U(self.num_tiles), self.counts))))
            if self.spine_len <= 16 * 1024:  # srts.rs SINGLE_BLOCK_SPINE
                steps.append(("srts_spine", lambda: K["srts_spine"]((1,), (BLOCK,), (self.counts, U(self.spine_len)))))
            else:
                def spine():
                    K["scan_reduce"]((self.chunks,), (BLOCK,), (self.counts, U(self.spine_len), self.spine_sums))
                    K["scan_spine"]((1,), (BLOCK,), (self.spine_sums, U(self.chunks)))
                    K["scan_down"]((self.chunks,), (BLOCK,), (self.counts, U(self.spine_len), self.spine_sums, self.counts))
                steps.append(("srts_spine", spine))
            steps.append(("srts_downsweep", lambda src=src, lanes=lanes, nl=nl, p=p: K["srts_downsweep_b8"](
                (self.grid,), (BLOCK,), (n, src, U(8 * p), U(255), U(self.tpb), U(self.num_tiles), self.counts,
                                         lanes, U(nl), NOREC), shared_mem=self.dyn_smem)))
        return steps

    def onesweep_steps(self, constant=False):
        n, steps = U(self.n), []
        steps.append(("os_memset", lambda: cp.cuda.runtime.memsetAsync(
            self.state.data.ptr, 0, self.state.nbytes, stream_ptr())))
        steps.append(("os_histogram", lambda: K["onesweep_histogram"](
            (self.hist_grid,), (BLOCK,), (n, self.keys, U(0x18100800), U(4), U(0x08080808), self.hist))))
        steps.append(("os_scan", lambda: K["onesweep_scan"](
            (4,), (BLOCK,), (self.hist, n, self.constant if constant else None))))
        for p in range(self.PASSES):
            src, (lanes, nl) = self.digit_src[p], self.tables[p]
            steps.append(("os_pass", lambda src=src, lanes=lanes, nl=nl, p=p: K["onesweep_pass_b8"](
                (self.os_grid,), (OS_BLOCK,), (n, src, U(8 * p), U(255), U(self.os_tiles), self.hist[256 * p:],
                                              self.counter[p], self.lookback[p], lanes, U(nl), NOREC),
                shared_mem=self.os_smem)))
        return steps

    def srts(self):
        for _, f in self.srts_steps(): f()

    def onesweep(self, constant=False):
        for _, f in self.onesweep_steps(constant): f()

allow_dyn_smem(K["srts_downsweep_b8"], 2 * TILE * 4)
allow_dyn_smem(K["onesweep_pass_b8"], 2 * OS_TILE * 4)
if HEADER: print("blocks/SM (occupancy query, or the assumed default): " + ", ".join(
    f"{k} {occupancy(K[k], d, '?', t)}" for k, d, t in (("srts_downsweep_b8", 2 * TILE * 4, BLOCK),
                                                        ("onesweep_pass_b8", 2 * OS_TILE * 4, OS_BLOCK),
                                                        ("onesweep_histogram", 0, BLOCK))))

def sync():
    cp.cuda.get_current_stream().synchronize()

def best_ms(fn, reps=10):
    fn(); sync()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    best = 1e30
    for _ in range(reps):
        s.record(); fn(); e.record(); e.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(s, e))
    return best

def per_kernel_ms(steps, reps=10):
    """Best time of each step over reps (steps with one label summed within a rep, e.g. the 4
    passes): dict label -> (best total per rep, launches per rep)."""
    labels = {}
    for l, _ in steps: labels[l] = labels.get(l, 0) + 1
    best = {l: 1e30 for l in labels}
    for _ in range(reps):
        ev = [cp.cuda.Event() for _ in range(len(steps) + 1)]
        ev[0].record()
        for i, (_, f) in enumerate(steps):
            f(); ev[i + 1].record()
        ev[-1].synchronize()
        tot = {l: 0.0 for l in labels}
        for i, (l, _) in enumerate(steps): tot[l] += cp.cuda.get_elapsed_time(ev[i], ev[i + 1])
        for l in labels: best[l] = min(best[l], tot[l])
    return {l: (best[l], labels[l]) for l in labels}

rng = cp.random.default_rng(1)
def uniform(n):
    return rng.integers(0, 2 ** 32, size=n, dtype=cp.uint64).astype(cp.uint32)
def make_keys(dist, n):
    if dist == "uniform": return uniform(n)
    if dist == "equal": return cp.full(n, 0xDEADBEEF, dtype=cp.uint32)
    if dist == "two": return cp.where(uniform(n) < 2 ** 31, U(7), U(0x80000001)).astype(cp.uint32)
    if dist == "sorted": return cp.sort(uniform(n))
    if dist == "reverse": return cp.sort(uniform(n))[::-1].copy()
    raise ValueError(dist)

def is_stable_argsort(keys, idx):
    """idx is a permutation, keys[idx] is ascending, and idx ascends within equal keys: then idx
    is THE stable argsort."""
    n = keys.size
    if idx.size != n or int(idx.max()) >= n: return False
    if not bool((cp.bincount(idx, minlength=n) == 1).all()): return False
    k = keys[idx]
    return bool(((k[1:] > k[:-1]) | ((k[1:] == k[:-1]) & (idx[1:] > idx[:-1]))).all())

def check(n, dist, mode, algo):
    keys = make_keys(dist, n)
    cols = ()
    if mode == "cols2":  # column 1 is the row index, so its output is the permutation applied
        cols = (uniform(n), cp.arange(n, dtype=cp.uint32))
    srt = Sort(keys, index=(mode == "index"), cols=cols)
    if algo == "onesweep": srt.onesweep(constant=True)
    else: srt.srts()
    sync()
    ok = bool((srt.kout == cp.sort(keys)).all())
    note = ""
    if mode == "index" or mode == "cols2":
        perm = srt.iout if mode == "index" else srt.cout[1]
        ok &= is_stable_argsort(keys, perm)
        if n <= 100003:
            ok &= bool((perm.get() == np.argsort(keys.get(), kind="stable")).all())
        if mode == "cols2":
            ok &= bool((srt.cout[0] == cols[0][perm]).all())
    if algo == "onesweep":
        hk = keys.get()
        want = [int(np.all(((hk >> (8 * p)) & 255) == ((hk[0] >> (8 * p)) & 255))) for p in range(4)]
        got = srt.constant.get().tolist()
        if got != want:
            ok = False
            note = f" (constant digits {got}, expected {want})"
        else:
            note = f" (constant digits {got})"
    return ok, note

# ---- correctness ----
if CHILD == "checks":
    cases = [(n, dist, mode, algo)
             for n in sorted({1, 4095, 4096, 4097, OS_TILE - 1, OS_TILE, OS_TILE + 1, 100003, 10_000_000})
             for dist in ("uniform", "equal", "two", "sorted", "reverse")
             for mode in ("keys", "index", "cols2")
             for algo in ("onesweep",) + (("srts",) if n in (4097, 100003) and dist == "uniform" else ())]
    if HEADER:
        print("\n== correctness: keys vs cp.sort; index (and the row-index column of cols2) vs the stable "
              "argsort; constant digits: onesweep_scan's flags vs NumPy ==", flush=True)
    for i, (n, dist, mode, algo) in enumerate(cases):
        if i < FROM: continue
        started(i)
        try:
            ok, note = check(n, dist, mode, algo)
        except Exception as e:  # noqa: BLE001
            ok, note = False, f" ({type(e).__name__}: {e})"
            print(f"{algo:8s} n={n:<9d} {dist:8s} {mode:6s}: WRONG{note}", flush=True)
            after_error()
            continue
        print(f"{algo:8s} n={n:<9d} {dist:8s} {mode:6s}: {'ok' if ok else 'WRONG'}{note}", flush=True)
        cp.get_default_memory_pool().free_all_blocks()

# ---- timing ----
def cub_keys(keys):
    return lambda: cp.sort(keys)  # CuPy: a copy, then CUB's radix sort in place
def cub_argsort(keys, cols=()):
    def f():
        idx = cp.argsort(keys)
        for c in cols: c.take(idx)
    return f

if CHILD == "timing":
    cases = [("100M u32 keys", 100_000_000, "keys", 0), ("10M u32 keys", 10_000_000, "keys", 0),
             ("10M key+index", 10_000_000, "index", 0), ("10M key+2 cols direct", 10_000_000, "cols", 2),
             ("10M key+20 cols direct", 10_000_000, "cols", 20)]
    if HEADER:
        print("\n== timing: best of 10, ms. CUB = CuPy: keys-only cp.sort minus one copy of the keys; "
              "key+index cp.argsort; columns cp.argsort + take per column ==")
        print(f"{'case':28s} {'SRTS':>8s} {'onesweep':>9s} {'CUB':>8s} {'os/CUB':>7s} {'os/SRTS':>8s}", flush=True)
    for i, (label, n, mode, m) in enumerate(cases):
        if i < FROM: continue
        started(i)
        try:
            keys = uniform(n)
            cols = tuple(uniform(n) for _ in range(m))
            srt = Sort(keys, index=(mode == "index"), cols=cols)
            t_srts = best_ms(srt.srts)
            t_os = best_ms(srt.onesweep)
            sync()
            ok = bool((srt.kout == cp.sort(keys)).all())
            if mode == "keys":
                t_cub = best_ms(cub_keys(keys)) - best_ms(lambda: keys.copy())
            else:
                t_cub = best_ms(cub_argsort(keys, cols))
            print(f"{label:28s} {t_srts:8.3f} {t_os:9.3f} {t_cub:8.3f} {t_os / t_cub:7.2f} {t_os / t_srts:8.2f}"
                  f"{'' if ok else '  WRONG'}", flush=True)
            if n == 100_000_000 and mode == "keys":
                s, o = per_kernel_ms(srt.srts_steps()), per_kernel_ms(srt.onesweep_steps())
                print("  per kernel at 100M (best of 10 runs; ms per launch x launches per sort):")
                for d in (s, o):
                    print("   " + "  ".join(f"{l} {t / k:.3f} x{k}" for l, (t, k) in d.items()))
                print(f"   one onesweep pass {o['os_pass'][0] / 4:.3f} ms vs SRTS upsweep+spine+downsweep "
                      f"{(s['srts_upsweep'][0] + s['srts_spine'][0] + s['srts_downsweep'][0]) / 4:.3f} ms "
                      f"(downsweep alone {s['srts_downsweep'][0] / 4:.3f})", flush=True)
            del srt, keys, cols
        except Exception as e:  # noqa: BLE001
            print(f"{label:28s} failed: {type(e).__name__}: {e}", flush=True)
            after_error()
        cp.get_default_memory_pool().free_all_blocks()
