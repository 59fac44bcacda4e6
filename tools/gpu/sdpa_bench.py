#!/usr/bin/env python3
"""The decode of kvcheck_bench_cuda's shapes with PyTorch's scaled_dot_product_attention over a contiguous cache,
on the same GPU, for the goal "our decode >= 1.0x PyTorch SDPA" (docs/gpu.md).

    python3 tools/gpu/sdpa_bench.py [--json FILE] [--ours bench.json] [--quick]

Shapes (as kvcheck_bench_cuda's; bf16, head_dim 128): MHA 32 query over 32 KV heads, 32 sequences x 4096 tokens
(2 GiB of K/V); GQA 8:1, 32 over 4, 64 x 8192 (1 GiB). The cache is K, V [seqs, n_kv_heads, tokens, head_dim], one
contiguous tensor each, values uniform in (-1, 1) and never zero. One decode step: q [seqs, n_q_heads, 1, head_dim]
attends every cached row (SDPA with enable_gqa for GQA). Timed with CUDA events, warm-up first, the median of the
repeats, two ways:
  device   q already on the GPU, the output left there: SDPA alone
  host io  q copied from page-locked host memory before and the output copied back after, as an ABI call must
Baseline of the same run: a device-to-device copy (torch's copy_) of 2 GiB, bytes read plus written.
With --ours, kvcheck_bench_cuda's JSON of this run: ours / SDPA for each shape (ours is an ABI call that also
appends the new token: compare it with the "host io" figure; the "device" one is the stricter bound).
Exit: 0 measured; 2 bad arguments; 77 torch is not importable or sees no GPU (nothing measured).
"""

import argparse
import json
import statistics
import sys

SKIP = 77


def load_torch():
    try:
        import torch
    except Exception as e:
        print(f"sdpa_bench.py: skipped: torch is not importable here ({type(e).__name__}: {e})")
        sys.exit(SKIP)
    if not torch.cuda.is_available():
        print(f"sdpa_bench.py: skipped: torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False)")
        sys.exit(SKIP)
    return torch


def timed(torch, fn, warmup, repeats):
    """Median milliseconds of fn between two CUDA events on the current stream, after warm-up calls."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for i in range(warmup + repeats):
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= warmup:
            ms.append(a.elapsed_time(b))
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "repeats": len(ms)}


def nonzero_uniform(torch, shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(shape, generator=g, device="cuda", dtype=torch.float32) * 2 - 1
    x = torch.where(x == 0, torch.full_like(x, 0.5), x)
    return x.to(dtype)


def decode_case(torch, name, hq, hkv, d, seqs, tokens, warmup, repeats):
    F = torch.nn.functional
    dt = torch.bfloat16
    K = nonzero_uniform(torch, (seqs, hkv, tokens, d), dt, 1)
    V = nonzero_uniform(torch, (seqs, hkv, tokens, d), dt, 2)
    q = nonzero_uniform(torch, (seqs, hq, 1, d), dt, 3)
    q_host = torch.empty(q.shape, dtype=torch.float32, pin_memory=True).uniform_(-1, 1)
    out_host = torch.empty(q.shape, dtype=torch.float32, pin_memory=True)
    kw = {"scale": d ** -0.5}
    if hq != hkv:
        kw["enable_gqa"] = True

    def device():
        F.scaled_dot_product_attention(q, K, V, **kw)

    def host_io():  # float32 in and out, as the ABI's q and out
        qd = q_host.to("cuda", non_blocking=True).to(dt)
        out = F.scaled_dot_product_attention(qd, K, V, **kw)
        out_host.copy_(out.float(), non_blocking=True)

    kv_bytes = K.numel() * K.element_size() + V.numel() * V.element_size()
    r = {"shape": name, "n_q_heads": hq, "n_kv_heads": hkv, "head_dim": d, "seqs": seqs, "tokens": tokens,
         "dtype": "bf16", "kv_bytes": kv_bytes}
    for label, fn in (("device", device), ("host_io", host_io)):
        t = timed(torch, fn, warmup, repeats)
        r[label] = {"time": t, "bytes_per_s": kv_bytes / (t["median_ms"] * 1e-3)}
    del K, V
    torch.cuda.empty_cache()
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--ours", help="kvcheck_bench_cuda --json output of this run, to print ours / SDPA")
    ap.add_argument("--quick", action="store_true", help="small shapes (a smoke run, as kvcheck_bench_cuda --quick)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    if args.warmup < 0 or args.repeats < 1:
        ap.error("--warmup >= 0 and --repeats >= 1")
    torch = load_torch()

    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.1f} GiB; "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    copy_bytes = (256 << 20) if args.quick else (2 << 30)
    src = torch.full((copy_bytes,), 0x5A, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = timed(torch, lambda: dst.copy_(src), args.warmup, args.repeats)
    copy_bw = 2 * copy_bytes / (copy["median_ms"] * 1e-3)
    del src, dst
    print(f"device-to-device copy of {copy_bytes >> 20} MiB: {copy['median_ms']:.3f} ms, {copy_bw / 1e12:.3f} TB/s "
          f"(read + written)")

    shapes = [("decode MHA 32:32", 32, 32, 128, 4 if args.quick else 32, 1024 if args.quick else 4096),
              ("decode GQA 32:4 (8:1)", 32, 4, 128, 8 if args.quick else 64, 1024 if args.quick else 8192)]
    cases = []
    for s in shapes:
        r = decode_case(torch, *s, args.warmup, args.repeats)
        r["device"]["over_copy"] = r["device"]["bytes_per_s"] / copy_bw
        r["host_io"]["over_copy"] = r["host_io"]["bytes_per_s"] / copy_bw
        cases.append(r)
        print(f"  {r['shape']:24} {r['kv_bytes'] / 2**20:7.0f} MiB  device {r['device']['time']['median_ms']:.3f} ms "
              f"{r['device']['bytes_per_s'] / 1e12:.3f} TB/s ({r['device']['over_copy']:.2f} of copy)  host io "
              f"{r['host_io']['time']['median_ms']:.3f} ms {r['host_io']['bytes_per_s'] / 1e12:.3f} TB/s")

    comparisons = []
    if args.ours:
        try:
            with open(args.ours) as f:
                ours = {d["shape"]: d for d in json.load(f).get("decode", []) if d.get("order") == "contiguous"}
        except (OSError, ValueError) as e:
            ours = {}
            print(f"  ours / SDPA: n/a: cannot read {args.ours}: {e}")
        for r in cases:
            o = ours.get(r["shape"])
            if not o or not o.get("ran"):
                print(f"  ours / SDPA, {r['shape']}: n/a: no figure of ours" + (f" ({o['why_not']})" if o else ""))
                continue
            c = {"shape": r["shape"], "ours_bytes_per_s": o["bytes_per_s"],
                 "over_sdpa_host_io": o["bytes_per_s"] / r["host_io"]["bytes_per_s"],
                 "over_sdpa_device": o["bytes_per_s"] / r["device"]["bytes_per_s"]}
            comparisons.append(c)
            print(f"  ours / SDPA, {r['shape']}: {c['over_sdpa_host_io']:.2f} (both with host io; goal >= 1.0), "
                  f"{c['over_sdpa_device']:.2f} (SDPA device-only)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sdpa_bench": 1, "gpu": props.name, "torch": torch.__version__, "quick": args.quick,
                       "device_copy": {"bytes": copy_bytes, "time": copy, "bytes_per_s": copy_bw},
                       "decode": cases, "ours_over_sdpa": comparisons}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
