# The PyTorch baseline of `cuflow-bench llama`: the same Llama architecture as cuflow's
# (RMSNorm, Llama 3 rope scaling, grouped-query attention over a static KV cache, SwiGLU), on
# the same bf16 weights (the checkpoint folder the benchmark wrote), batch 1, greedy.
# Measures decode tokens/s eagerly, with the step under torch.cuda.graph, and with
# torch.compile + torch.cuda.graph, at each context length; prefill tokens/s; and dumps the
# logits after a fixed prompt. Prints one JSON object as its last line.
import json
import math
import os
import sys
import time

args = json.loads(sys.argv[1])
try:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
except Exception as e:  # noqa: BLE001
    print(json.dumps({"unavailable": f"torch or safetensors cannot be imported: {e}"}))
    sys.exit(0)
if not torch.cuda.is_available():
    print(json.dumps({"unavailable": "torch sees no CUDA device"}))
    sys.exit(0)

dev = torch.device("cuda")
folder = args["dir"]
cfg = json.load(open(os.path.join(folder, "config.json")))
W = load_file(os.path.join(folder, "model.safetensors"), device="cuda")
W = {k: v.to(torch.bfloat16) for k, v in W.items()}
H = cfg["hidden_size"]
NH = cfg["num_attention_heads"]
NKV = cfg.get("num_key_value_heads") or NH
HD = cfg.get("head_dim") or H // NH
NL = cfg["num_hidden_layers"]
EPS = cfg.get("rms_norm_eps", 1e-5)
THETA = cfg.get("rope_theta", 10000.0)
G = NH // NKV


def inv_freq():
    f = [1.0 / THETA ** (2 * i / HD) for i in range(HD // 2)]
    s = cfg.get("rope_scaling")
    if not s:
        return f
    kind = s.get("rope_type", s.get("type"))
    if kind == "linear":
        return [x / s["factor"] for x in f]
    if kind != "llama3":
        return f
    old = s["original_max_position_embeddings"]
    lo, hi, factor = s["low_freq_factor"], s["high_freq_factor"], s["factor"]
    out = []
    for x in f:
        wl = 2 * math.pi / x
        if wl < old / hi:
            out.append(x)
        elif wl > old / lo:
            out.append(x / factor)
        else:
            sm = (old / wl - lo) / (hi - lo)
            out.append((1 - sm) * x / factor + sm * x)
    return out


INV_FREQ = torch.tensor(inv_freq(), dtype=torch.float32, device=dev)
EMBED = W["model.embed_tokens.weight"]
HEAD = W.get("lm_head.weight", EMBED)
LAYERS = []
for l in range(NL):
    p = f"model.layers.{l}."
    LAYERS.append(
        dict(
            n1=W[p + "input_layernorm.weight"],
            wqkv=torch.cat([W[p + "self_attn.q_proj.weight"], W[p + "self_attn.k_proj.weight"],
                            W[p + "self_attn.v_proj.weight"]]),
            wo=W[p + "self_attn.o_proj.weight"],
            n2=W[p + "post_attention_layernorm.weight"],
            wgu=torch.cat([W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"]]),
            wd=W[p + "mlp.down_proj.weight"],
        )
    )
NORM = W["model.norm.weight"]
INTER = cfg["intermediate_size"]


def rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w


def rope(x, pos):
    ang = pos[:, None].float() * INV_FREQ[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    xf = x.float()
    a, b = xf[..., : HD // 2], xf[..., HD // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


def make_cache(max_seq):
    k = torch.zeros(NL, NKV, max_seq, HD, dtype=torch.bfloat16, device=dev)
    return k, torch.zeros_like(k)


def forward(ids, start, cache):
    """Logits (f32) after the last of `ids`, the tokens at positions start.. (start: a long
    tensor of one element on the device, so a captured step reads it at replay)."""
    K, V = cache
    S = K.shape[2]
    T = ids.shape[0]
    pos = start + torch.arange(T, device=dev)
    mask = torch.arange(S, device=dev)[None, :] <= pos[:, None]
    x = EMBED[ids]
    for l, w in enumerate(LAYERS):
        h = rms(x, w["n1"])
        qkv = h @ w["wqkv"].t()
        q = qkv[:, : NH * HD].view(T, NH, HD)
        k = qkv[:, NH * HD : (NH + NKV) * HD].view(T, NKV, HD)
        v = qkv[:, (NH + NKV) * HD :].view(T, NKV, HD)
        q, k = rope(q, pos), rope(k, pos)
        K[l].index_copy_(1, pos, k.transpose(0, 1))
        V[l].index_copy_(1, pos, v.transpose(0, 1))
        keys = K[l].repeat_interleave(G, dim=0)[None]
        vals = V[l].repeat_interleave(G, dim=0)[None]
        att = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys, vals, attn_mask=mask)
        x = x + att[0].transpose(0, 1).reshape(T, NH * HD) @ w["wo"].t()
        h = rms(x, w["n2"])
        gu = h @ w["wgu"].t()
        x = x + (F.silu(gu[:, :INTER]) * gu[:, INTER:]) @ w["wd"].t()
    h = rms(x[-1:], NORM)
    return (h @ HEAD.t()).float()[0]


def sync_time(fn, n):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def graph_rate(fn, reset, warmup, n):
    """Calls per second of `fn` replayed from a CUDA graph: `warmup` calls on a side stream,
    one captured call, then `n` timed replays, each phase after `reset()`."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        reset()
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    reset()
    with torch.cuda.graph(graph):
        fn()
    reset()
    return n / sync_time(graph.replay, n)


out = {"version": f"PyTorch {torch.__version__}", "decode": []}
gen = torch.Generator(device="cpu").manual_seed(0)
with torch.inference_mode():
    prompt = torch.tensor(args["logits_prompt"], device=dev)
    cache = make_cache(len(args["logits_prompt"]))
    out["logits"] = forward(prompt, torch.zeros(1, dtype=torch.long, device=dev), cache).tolist()

    n = args["tokens"]
    for ctx in args["contexts"]:
        cache = make_cache(ctx + n + 16)
        ids = torch.randint(0, cfg["vocab_size"], (ctx,), generator=gen).to(dev)
        zero = torch.zeros(1, dtype=torch.long, device=dev)
        tok = torch.zeros(1, dtype=torch.long, device=dev)
        pos = torch.zeros(1, dtype=torch.long, device=dev)

        def reset():
            forward(ids, zero, cache)
            tok.fill_(int(ids[-1]))
            pos.fill_(ctx)

        def step():
            logits = forward(tok, pos, cache)
            tok.copy_(logits.argmax().view(1))
            pos.add_(1)

        row = {"context": ctx}
        reset()
        for _ in range(3):
            step()
        reset()
        row["eager"] = n / sync_time(step, n)

        row["graph"] = graph_rate(step, reset, 3, n)

        try:
            compiled = torch.compile(step, mode="max-autotune-no-cudagraphs", fullgraph=False)
            row["compile_graph"] = graph_rate(compiled, reset, 5, n)
        except Exception as e:  # noqa: BLE001
            row["compile_graph"] = None
            row["compile_error"] = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        out["decode"].append(row)
        del cache

    plen = args["prefill_tokens"]
    cache = make_cache(plen)
    ids = torch.randint(0, cfg["vocab_size"], (plen,), generator=gen).to(dev)
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    for _ in range(2):
        forward(ids, zero, cache)
    times = sorted(sync_time(lambda: forward(ids, zero, cache), 1) for _ in range(5))
    out["prefill"] = plen / times[len(times) // 2]
print(json.dumps(out))
