"""What a host-to-host sort over several GPUs of one machine can reach: PCIe copies on each
GPU alone and on all at once (pinned and pageable host memory), host memory copies on all
cores (into fresh and into reused memory), registering memory that is already faulted in, and
peer copies between GPUs. Issue 26's question: is the host (memory, PCIe root) or the GPUs the
bound of a sort that starts and ends in host memory?

    python3 proto_multi_pcie.py [GB per copy, default 4]
"""

import sys
import threading
import time

import torch

GB = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
N = int(GB * (1 << 30))
GPUS = torch.cuda.device_count()


def best(f, reps=3):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def gbs(nbytes, s):
    return f"{nbytes / s / 1e9:6.1f} GB/s ({s * 1e3:7.1f} ms)"


def at_once(fns):
    """Runs each fn on a thread of its own, all started together; the wall time of all."""
    barrier = threading.Barrier(len(fns) + 1)

    def wrap(f):
        barrier.wait()
        f()

    threads = [threading.Thread(target=wrap, args=(f,)) for f in fns]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


print(f"{GPUS} GPUs, {torch.get_num_threads()} torch threads, {GB} GB a copy")
dev = [torch.empty(N, dtype=torch.uint8, device=f"cuda:{g}") for g in range(GPUS)]
pinned = [torch.empty(N, dtype=torch.uint8).pin_memory() for _ in range(GPUS)]
pageable = [torch.ones(N, dtype=torch.uint8) for _ in range(GPUS)]
streams = [torch.cuda.Stream(device=g) for g in range(GPUS)]


def h2d(g, src):
    def f():
        with torch.cuda.stream(streams[g]):
            dev[g].copy_(src[g], non_blocking=True)
        streams[g].synchronize()

    return f


def d2h(g, dst):
    def f():
        with torch.cuda.stream(streams[g]):
            dst[g].copy_(dev[g], non_blocking=True)
        streams[g].synchronize()

    return f


for name, host in (("pinned", pinned), ("pageable", pageable)):
    for direction, make in (("h2d", h2d), ("d2h", d2h)):
        for g in range(GPUS):
            make(g, host)()
            print(f"{name:8} {direction} GPU {g} alone: {gbs(N, best(make(g, host)))}")
        if GPUS > 1:
            s = min(at_once([make(g, host) for g in range(GPUS)]) for _ in range(3))
            print(f"{name:8} {direction} all {GPUS} at once: {gbs(N * GPUS, s)} in all")
    if GPUS > 1:
        s = min(
            at_once([h2d(g, host) for g in range(GPUS)] + [d2h(g, host) for g in range(GPUS)])
            for _ in range(2)
        )
        print(f"{name:8} h2d+d2h on all {GPUS} at once: {gbs(2 * N * GPUS, s)} in all")

# Host memory: a copy on all cores into reused memory, and into fresh memory.
src = pageable[0]
dst = torch.empty(N, dtype=torch.uint8)
dst.copy_(src)
print(f"host copy into reused memory ({torch.get_num_threads()} threads): {gbs(N, best(lambda: dst.copy_(src)))}")


def fresh_copy():
    d = torch.empty(N, dtype=torch.uint8)
    d.copy_(src)
    return d


print(f"host copy into fresh memory: {gbs(N, best(fresh_copy))}")
t = time.perf_counter()
fresh = torch.empty(N, dtype=torch.uint8)
fresh.fill_(1)
print(f"fresh memory filled: {gbs(N, time.perf_counter() - t)}")

# Registering memory already faulted in, and unregistering it.
try:
    rt = torch.cuda.cudart()
    buf = torch.ones(N, dtype=torch.uint8)
    t = time.perf_counter()
    r = rt.cudaHostRegister(buf.data_ptr(), N, 1)
    reg = time.perf_counter() - t
    t = time.perf_counter()
    with torch.cuda.stream(streams[0]):
        dev[0].copy_(buf, non_blocking=True)
    streams[0].synchronize()
    up = time.perf_counter() - t
    t = time.perf_counter()
    rt.cudaHostUnregister(buf.data_ptr())
    unreg = time.perf_counter() - t
    print(f"register faulted memory: {gbs(N, reg)} (rc {r}); h2d from it: {gbs(N, up)}; unregister {unreg * 1e3:.1f} ms")
except Exception as e:  # noqa: BLE001
    print("register:", e)

# Peer copies.
if GPUS > 1:
    for a in range(GPUS):
        for b in range(GPUS):
            if a != b:
                print(f"peer access {a}->{b}: {torch.cuda.can_device_access_peer(a, b)}")

    def peer(a, b):
        def f():
            with torch.cuda.stream(streams[a]):
                dev[b].copy_(dev[a], non_blocking=True)
            streams[a].synchronize()

        return f

    peer(0, 1)()
    print(f"peer copy 0->1: {gbs(N, best(peer(0, 1)))}")
    s = min(at_once([peer(0, 1), peer(1, 0)]) for _ in range(3))
    print(f"peer copies 0->1 and 1->0 at once: {gbs(2 * N, s)} in all")
