# The PyTorch baseline of `cuflow-bench collectives`: torch.distributed.all_reduce (NCCL) over
# the same sizes and the same number of GPUs, one process per GPU (torch.multiprocessing),
# in-place sum of float32 buffers. Each size is warmed up, then `iters` all-reduces are
# enqueued back to back and timed from a barrier to a synchronize. Rank 0 prints one JSON object
# as its last line: the seconds per all-reduce of each size.
import json
import os
import socket
import sys
import time

args = json.loads(sys.argv[1])
try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except Exception as e:  # noqa: BLE001
    print(json.dumps({"unavailable": f"torch cannot be imported: {e}"}))
    sys.exit(0)
if not torch.cuda.is_available():
    print(json.dumps({"unavailable": "torch sees no CUDA device"}))
    sys.exit(0)
if not dist.is_nccl_available():
    print(json.dumps({"unavailable": "this torch has no NCCL backend"}))
    sys.exit(0)
RANKS = args["ranks"]
if torch.cuda.device_count() < RANKS:
    print(json.dumps({"unavailable": f"torch sees {torch.cuda.device_count()} GPUs, {RANKS} needed"}))
    sys.exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, port, queue):
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS
    )
    out = []
    for nbytes in args["sizes"]:
        x = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        iters = max(1, min(args["iters"], (1 << 34) // max(nbytes, 1)))
        for _ in range(args["warmup"]):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        out.append({"bytes": nbytes, "seconds": (time.perf_counter() - start) / iters})
    if rank == 0:
        queue.put(out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, port, queue)) for r in range(RANKS)]
    for p in procs:
        p.start()
    result = queue.get()
    for p in procs:
        p.join()
    print(json.dumps({"version": f"PyTorch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}", "sizes": result}))
