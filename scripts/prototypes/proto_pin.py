#!/usr/bin/env python3
# How fast can host memory be page-locked? cudaHostAlloc against mmap + (transparent huge
# pages or not) + prefault + cudaHostRegister, per GB. Run on the GPU machine (CuPy, NumPy).
import ctypes, mmap, time, os
from concurrent.futures import ThreadPoolExecutor
import numpy as np, cupy as cp

libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MADV_HUGEPAGE = 14
PROT = mmap.PROT_READ | mmap.PROT_WRITE
FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
rt = cp.cuda.runtime
cp.cuda.Device(0).use(); cp.zeros(1)  # context up
print("THP:", open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip(),
      "| defrag:", open("/sys/kernel/mm/transparent_hugepage/defrag").read().strip())

def touch(ptr, size, threads):
    step = size // threads
    def one(i):
        a = np.ctypeslib.as_array((ctypes.c_uint8 * step).from_address(ptr + i * step))
        a[::4096] = 1
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, range(threads)))

def trial(size, huge, threads, register_flags=0):
    t0 = time.perf_counter()
    p = libc.mmap(None, size, PROT, FLAGS, -1, 0)
    if huge:
        libc.madvise(p, size, MADV_HUGEPAGE)
    touch(p, size, threads)
    t1 = time.perf_counter()
    rt.hostRegister(p, size, register_flags)
    t2 = time.perf_counter()
    # copy speed check
    d = cp.empty(size, dtype=cp.uint8)
    s = cp.cuda.Stream(non_blocking=True)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record(s); rt.memcpyAsync(d.data.ptr, p, size, rt.memcpyHostToDevice, s.ptr); e1.record(s); e1.synchronize()
    up = size / cp.cuda.get_elapsed_time(e0, e1) / 1e6
    t3 = time.perf_counter()
    rt.hostUnregister(p)
    t4 = time.perf_counter()
    libc.munmap(p, size)
    del d
    g = size / 1e9
    print(f"mmap huge={huge} threads={threads:2}: fault {g/(t1-t0):6.1f} GB/s, register {g/(t2-t1):6.1f} GB/s, "
          f"together {g/(t2-t0):6.1f} GB/s, unregister {g/(t4-t3):6.1f} GB/s, upload {up:5.1f} GB/s")

def host_alloc(size):
    t0 = time.perf_counter()
    p = rt.hostAlloc(size, 0)
    t1 = time.perf_counter()
    rt.freeHost(p)
    t2 = time.perf_counter()
    print(f"cudaHostAlloc: {size/1e9/(t1-t0):6.1f} GB/s, free {size/1e9/(t2-t1):6.1f} GB/s")

for size in (256 << 20, 2 << 30):
    print(f"--- {size >> 20} MB")
    host_alloc(size)
    for huge in (False, True):
        for threads in (1, 8, 16):
            trial(size, huge, threads)
