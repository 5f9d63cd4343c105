# How long pinning host memory takes: cuMemHostAlloc, and cuMemHostRegister of an anonymous
# mapping with and without transparent huge pages, for a few sizes.
import ctypes, ctypes.util, time, mmap
cu = ctypes.CDLL("libcuda.so.1")
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
def ck(r, what):
    if r != 0: raise RuntimeError(f"{what}: {r}")
ck(cu.cuInit(0), "init")
dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "dev")
ctx = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "ctx")
ck(cu.cuCtxSetCurrent(ctx), "set")
cu.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cu.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
cu.cuMemFreeHost.argtypes = [ctypes.c_void_p]
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
print(open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip())
for mib in [1, 4, 16, 64]:
    n = mib << 20
    for rep in range(3):
        p = ctypes.c_void_p()
        t = time.perf_counter(); ck(cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), 0), "hostalloc"); a = time.perf_counter() - t
        t = time.perf_counter(); ck(cu.cuMemFreeHost(p), "free"); f = time.perf_counter() - t
        res = [f"hostalloc {a*1e3:.2f} ms free {f*1e3:.2f}"]
        for huge in [False, True]:
            q = libc.mmap(None, n + (2 << 20), 3, 0x22, -1, 0)
            base = (q + (2 << 20) - 1) & ~((2 << 20) - 1)
            if huge: libc.madvise(base, n, 14)
            t = time.perf_counter(); libc.memset(base, 0, n); z = time.perf_counter() - t
            t = time.perf_counter(); ck(cu.cuMemHostRegister_v2(base, n, 0), "reg"); r = time.perf_counter() - t
            t = time.perf_counter(); ck(cu.cuMemHostUnregister(base), "unreg"); u = time.perf_counter() - t
            libc.munmap(q, n + (2 << 20))
            res.append(f"{'thp' if huge else '4k '} touch {z*1e3:.2f} register {r*1e3:.2f} unregister {u*1e3:.2f}")
        print(f"{mib:3d} MiB rep {rep}: " + " | ".join(res))
