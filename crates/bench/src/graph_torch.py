"""PyTorch baseline of `cuflow-bench graph`.

Usage: python3 graph_torch.py '<json>'

The argument is one JSON object:

    {"trials": T,
     "replay": [{"nodes": N, "replays": K}, ...],
     "model": {"d_model": D, "heads": H, "layers": L, "mlp": M, "vocab": V, "max_seq": S,
               "tokens": N, "eps": E, "seed": SEED, "first": TOKEN} or null}

replay: for each entry, a CUDA graph of N tiny kernels (`x.add_(1.0)` on a one-element tensor)
is captured with torch.cuda.graph and replayed K times back to back, then the stream is
synchronized; a trial's figure is the wall time of that divided by K * N, in microseconds per
node. After the trials the tensor's value is checked against the number of nodes run.

model: the decoder of cuflow's inference-loop example, the same architecture and sizes (token
embedding; per layer rms_norm, q/k/v projections, a KV cache written at the position, attention
over the positions so far, output projection, residual, rms_norm, MLP with GELU, residual; final
rms_norm, logits, argmax), f32, random weights (q, k and v from one fused projection). One
decode step reads the token and the position from device tensors; each step the position is
copied into its tensor from a table on the device, and the next token is copied into the token
tensor and into a history, as cuflow's loop does. It generates
`tokens` tokens eagerly and then by replaying one captured step, each T times, and reports
tokens per second; it checks that both produce the same tokens.

Prints one JSON object on stdout:

    {"torch_version": ..., "cuda_version": ..., "device_name": ...,
     "replay": [{"us_per_node": [per-trial, ...]}, ...],
     "model": {"eager_tokens_per_s": [...], "graph_tokens_per_s": [...]} or null}

or {"unavailable": "why"} when torch or a CUDA device is missing.
"""

import json
import sys
import time


def replay_trials(torch, nodes, replays, trials):
    x = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(nodes):
            x.add_(1.0)
    expected = 3
    for _ in range(3):
        graph.replay()
    expected += 3 * nodes
    torch.cuda.synchronize()
    out = []
    for _ in range(trials):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - start) * 1e6 / (replays * nodes))
        expected += replays * nodes
    got = x.item()
    if got != float(expected):
        raise RuntimeError(f"graph of {nodes} nodes: counted {got}, expected {expected}")
    return out


class Decoder:
    def __init__(self, torch, cfg):
        self.torch = torch
        d, h, m, v, s = cfg["d_model"], cfg["heads"], cfg["mlp"], cfg["vocab"], cfg["max_seq"]
        self.d, self.h, self.hd, self.s = d, h, d // h, s
        self.eps = cfg["eps"]
        g = torch.Generator(device="cuda")
        g.manual_seed(cfg["seed"])

        def w(rows, cols):
            return torch.randn(rows, cols, device="cuda", generator=g) / (cols ** 0.5)

        def norm():
            return 1.0 + 0.1 * torch.randn(d, device="cuda", generator=g)

        self.embed = torch.randn(v, d, device="cuda", generator=g)
        self.layers = []
        for _ in range(cfg["layers"]):
            self.layers.append({
                "n1": norm(), "wqkv": w(3 * d, d), "wo": w(d, d),
                "n2": norm(), "up": w(m, d), "down": w(d, m),
                "k": torch.zeros(s, h, self.hd, device="cuda"),
                "v": torch.zeros(s, h, self.hd, device="cuda"),
            })
        self.nf = norm()
        self.head = w(v, d)
        self.ids = torch.zeros(1, dtype=torch.long, device="cuda")
        self.pos = torch.zeros(1, dtype=torch.long, device="cuda")
        self.slots = torch.arange(s, device="cuda")

    def rms(self, x, w):
        return self.torch.nn.functional.rms_norm(x, (self.d,), w, self.eps)

    def step(self):
        torch, F = self.torch, self.torch.nn.functional
        x = F.embedding(self.ids, self.embed)  # [1, d]
        mask = (self.slots > self.pos).view(1, 1, self.s)  # positions after pos are hidden
        for l in self.layers:
            hdn = self.rms(x, l["n1"])
            qkv = (hdn @ l["wqkv"].t()).view(3, 1, self.h, self.hd)
            q = qkv[0].view(self.h, 1, self.hd)
            l["k"].index_copy_(0, self.pos, qkv[1])
            l["v"].index_copy_(0, self.pos, qkv[2])
            k = l["k"].transpose(0, 1)  # [h, s, hd]
            v = l["v"].transpose(0, 1)
            scores = (q @ k.transpose(1, 2)) / (self.hd ** 0.5)  # [h, 1, s]
            scores = scores.masked_fill(mask, float("-inf"))
            att = torch.softmax(scores, dim=-1) @ v  # [h, 1, hd]
            x = x + att.reshape(1, self.d) @ l["wo"].t()
            hdn = self.rms(x, l["n2"])
            x = x + F.gelu(hdn @ l["up"].t()) @ l["down"].t()
        logits = self.rms(x, self.nf) @ self.head.t()
        return torch.argmax(logits, dim=-1)

    def generate(self, step, first, n, pos_table):
        """Runs `step` n times from token `first`; tokens stay on the device until the end."""
        torch = self.torch
        self.ids.fill_(first)
        out = torch.empty(n, dtype=torch.long, device="cuda")
        for p in range(n):
            self.pos.copy_(pos_table[p])
            nxt = step()
            self.ids.copy_(nxt)
            out[p : p + 1].copy_(nxt)
        return out.tolist()


def model_trials(torch, cfg, trials):
    dec = Decoder(torch, cfg)
    n = cfg["tokens"]
    # Positions come from a table on the device, as in cuflow's loop.
    pos_table = [torch.tensor([p], dtype=torch.long, device="cuda") for p in range(n)]
    first = cfg["first"]
    eager_tokens = dec.generate(dec.step, first, n, pos_table)  # warm-up
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dec.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_next = dec.step()

    def replay():
        graph.replay()
        return static_next

    graph_tokens = dec.generate(replay, first, n, pos_table)
    if graph_tokens != eager_tokens:
        raise RuntimeError("PyTorch eager and graph decoding disagree")
    eager, graphed = [], []
    for _ in range(trials):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dec.generate(dec.step, first, n, pos_table)
        eager.append(n / (time.perf_counter() - start))
        torch.cuda.synchronize()
        start = time.perf_counter()
        dec.generate(replay, first, n, pos_table)
        graphed.append(n / (time.perf_counter() - start))
    return {"eager_tokens_per_s": eager, "graph_tokens_per_s": graphed,
            "distinct_tokens": len(set(eager_tokens))}


def main():
    args = json.loads(sys.argv[1])
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"unavailable": f"torch could not be imported: {e}"}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"unavailable": "torch sees no CUDA device"}))
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    reply = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "device_name": torch.cuda.get_device_name(0),
        "replay": [replay_trials(torch, r["nodes"], r["replays"], args["trials"])
                   for r in args["replay"]],
        "model": None,
    }
    reply["replay"] = [{"us_per_node": r} for r in reply["replay"]]
    if args.get("model"):
        with torch.no_grad():
            reply["model"] = model_trials(torch, args["model"], args["trials"])
    print(json.dumps(reply))


if __name__ == "__main__":
    main()
