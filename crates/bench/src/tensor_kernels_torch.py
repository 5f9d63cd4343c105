"""PyTorch baseline of `cuflow-bench kernels`.

Usage: python3 tensor_kernels_torch.py '<json>'

The argument is one JSON object: {"trials": T, "launches": L, "warmup": W, "cases": [...]},
where each case is one of

    {"op": "saxpy", "n": N, "a": A}
    {"op": "rms_norm", "rows": R, "cols": C, "eps": E}
    {"op": "softmax", "rows": R, "cols": C}
    {"op": "matmul", "dtype": "f32" | "bf16", "m": M, "n": N, "k": K}
    {"op": "broadcast_add", "n": N}             x + col, x [N, N], col [N, 1]
    {"op": "transposed_add", "n": N}            x.t() + y, both [N, N]
    {"op": "sum_axis", "n": N, "axis": A}       x.sum(A), x [N, N]
    {"op": "argmax_axis", "n": N, "axis": A}    x.argmax(A), x [N, N]

Each case is timed as the benchmark times cuflow's kernels: after W warm-up calls, T trials of L
back-to-back calls on the current stream between two CUDA events; a trial's figure is the
milliseconds between the events divided by L.

Prints one JSON object on stdout:

    {"torch_version": ..., "cuda_version": ..., "device_name": ..., "notes": [...],
     "cases": [{"ms": [per-trial ms per call, ...]} or {"error": "..."}, ...]}

in the order of the cases, or {"unavailable": "why"} when torch or a CUDA device is missing.
A case that fails (out of memory, an unsupported dtype) reports its error and the others still
run.
"""

import json
import sys


def time_calls(torch, fn, trials, launches, warmup):
    """Milliseconds per call of `fn`, for each of `trials` trials of `launches` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(trials):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / launches)
    return per_call


def rms_norm_fn(torch, notes):
    """torch.nn.functional.rms_norm where this torch has it, else the same formula in eager ops."""
    functional = torch.nn.functional
    if hasattr(functional, "rms_norm"):
        return lambda x, w, eps: functional.rms_norm(x, (x.shape[-1],), w, eps)
    notes.append(
        "torch.nn.functional.rms_norm is missing in torch %s: the rms_norm baseline is "
        "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w" % torch.__version__
    )
    return lambda x, w, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def case_fn(torch, case, rms_norm, device):
    """The call to time for `case`, with its inputs allocated on `device`."""
    op = case["op"]
    if op == "saxpy":
        n, a = case["n"], case["a"]
        x = torch.rand(n, device=device) * 2 - 1
        y = torch.rand(n, device=device) * 2 - 1
        return lambda: y.add_(x, alpha=a)
    if op == "rms_norm":
        rows, cols, eps = case["rows"], case["cols"], case["eps"]
        x = torch.randn(rows, cols, device=device)
        w = torch.rand(cols, device=device) + 0.5
        return lambda: rms_norm(x, w, eps)
    if op == "softmax":
        x = torch.randn(case["rows"], case["cols"], device=device)
        return lambda: torch.softmax(x, -1)
    if op == "matmul":
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[case["dtype"]]
        m, n, k = case["m"], case["n"], case["k"]
        a = (torch.rand(m, k, device=device) * 2 - 1).to(dtype)
        b = (torch.rand(k, n, device=device) * 2 - 1).to(dtype)
        return lambda: torch.matmul(a, b)
    if op == "broadcast_add":
        x = torch.randn(case["n"], case["n"], device=device)
        col = torch.randn(case["n"], 1, device=device)
        return lambda: x + col
    if op == "transposed_add":
        x = torch.randn(case["n"], case["n"], device=device)
        y = torch.randn(case["n"], case["n"], device=device)
        return lambda: x.t() + y
    if op == "sum_axis":
        x = torch.randn(case["n"], case["n"], device=device)
        axis = case["axis"]
        return lambda: x.sum(axis)
    if op == "argmax_axis":
        x = torch.randn(case["n"], case["n"], device=device)
        axis = case["axis"]
        return lambda: x.argmax(axis)
    raise ValueError("unknown case %r" % op)


def main():
    args = json.loads(sys.argv[1])
    try:
        import torch
    except Exception as e:  # not installed, or an install that fails to load
        print(json.dumps({"unavailable": "torch could not be imported: %s" % e}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"unavailable": "torch %s sees no CUDA device" % torch.__version__}))
        return 0

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    # Full-precision f32 matmul, as cuflow's f32 matmul computes it (no TF32).
    torch.backends.cuda.matmul.allow_tf32 = False
    notes = []
    rms_norm = rms_norm_fn(torch, notes)
    trials, launches, warmup = args["trials"], args["launches"], args["warmup"]

    results = []
    for case in args["cases"]:
        try:
            torch.manual_seed(0)
            fn = case_fn(torch, case, rms_norm, device)
            results.append({"ms": time_calls(torch, fn, trials, launches, warmup)})
        except Exception as e:  # one failed case leaves the others measured
            results.append({"error": "%s: %s" % (type(e).__name__, e)})
        fn = None
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:  # a sticky CUDA error: the next cases report it themselves
            pass

    print(
        json.dumps(
            {
                "torch_version": torch.__version__,
                "cuda_version": torch.version.cuda,
                "device_name": torch.cuda.get_device_name(device),
                "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                "notes": notes,
                "cases": results,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
