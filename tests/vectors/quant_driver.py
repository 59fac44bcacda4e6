#!/usr/bin/env python3
"""A quantized KV cache in numpy (fp8 E4M3FN / E5M2, int8 per token, q8_0), run on kvcheck's exported vectors.

    quant_driver.py [--example tools/python_example] --vectors V --results R [--bug BUG] [--q-rounding R]
                    [--pipeline P]

It stores each appended head row as codes and scales made by quant_np (docs/quantized.md written again in numpy),
keys rotated first, and attends in float64 over the rows dequantized from what it stored. --q-rounding rounds the
queries before RoPE as a FlashAttention-3 (fp8) or ggml (q8_0) kernel does; --pipeline declares a pipeline (by
default the f32 one, with "q" set to what --q-rounding does). A --bug breaks one thing on purpose:

    code-off-by-one     the first V code of every (sequence, layer) stream is one step off
    k-scale-for-v       an fp8 cache encodes V with K's scale (and stores that scale)
    scales-uncounted    live bytes leave out the scales stored with each row
    attend-unquantized  stores the right codes but attends the rows before quantization
"""

import argparse
import os
import sys

import numpy as np

QUANT_CAPABILITIES = ["dtype fp8_e4m3", "dtype fp8_e5m2", "dtype int8_token", "dtype q8_0", "fp8 scale per tensor",
                      "fp8 scale per kv head", "int8 scale in f16", "rope neox", "rope gptj", "gqa", "chunked",
                      "fork", "release", "batch"]
BUGS = ["code-off-by-one", "k-scale-for-v", "scales-uncounted", "attend-unquantized"]


def round_queries(q, how, quant_np):
    """q [n, hq, d] float32 as the declared q stage rounds it: fp8 unscaled and saturating, or q8_0 blocks."""
    if how in quant_np.FP8:
        return quant_np.fp8_decode(quant_np.fp8_encode(q.astype(np.float32), how), how).reshape(q.shape)
    if how == "q8_0":
        codes, d = quant_np.quantize_q8_0_blocks(q.reshape(-1))
        return quant_np.dequantize_q8_0(codes, d).reshape(q.shape)
    return q


class QuantCache:
    def __init__(self, cfg, example, quant_np, bug, q_rounding):
        self.cfg, self.ex, self.qn, self.bug, self.q_rounding = cfg, example, quant_np, bug, q_rounding
        self.layers, self.hq, self.hkv, self.d = cfg["n_layers"], cfg["n_q_heads"], cfg["n_kv_heads"], cfg["head_dim"]
        self.theta = example.f32_from_bits(cfg["rope_theta_bits"])
        self.scale = example.f32_from_bits(cfg["scale_bits"])
        self.codes_dtype = np.uint8 if cfg["dtype"] in quant_np.FP8 else np.int8
        self.scales_dtype = np.float16 if cfg["scales_dtype"] == "F16" else np.float32
        self.streams = {}  # (seq, layer) -> {"k", "v": codes, "ks", "vs": scales, "kx", "vx": values attended, "n"}

    def _stream(self, seq, layer):
        key = (seq, layer)
        if key not in self.streams:
            t, nb = self.cfg["max_tokens"], self.cfg["scales_per_head_row"]
            s = {"n": 0}
            for kv in "kv":
                s[kv] = np.zeros((t, self.hkv, self.d), self.codes_dtype)
                s[kv + "s"] = np.zeros((t, self.hkv, nb), self.scales_dtype)
                s[kv + "x"] = np.zeros((t, self.hkv, self.d), np.float64)
            self.streams[key] = s
        return self.streams[key]

    def _store(self, s, which, pos, layer, rows32):
        for i in range(rows32.shape[0]):
            for h in range(self.hkv):
                codes, scales = self.qn.quantize_row(rows32[i, h], self.cfg, which, layer, h, self.bug)
                if self.bug == "code-off-by-one" and which == "v" and pos + i == 0 and h == 0:
                    codes = codes.copy()
                    codes[0] = codes[0] ^ 1 if codes.dtype == np.uint8 else (codes[0] + 1 if codes[0] < 127 else 126)
                s[which][pos + i, h], s[which + "s"][pos + i, h] = codes, scales
                s[which + "x"][pos + i, h] = (rows32[i, h] if self.bug == "attend-unquantized"
                                              else self.qn.dequantize_row(codes, scales, self.cfg))

    def append_attend(self, seq, layer, q, k, v):
        s = self._stream(seq, layer)
        n, before = q.shape[0], s["n"]
        if n == 0:
            return np.zeros((0, self.hq, self.d), np.float32)
        positions = np.arange(before, before + n)
        q = round_queries(q, self.q_rounding, self.qn).astype(np.float64)
        if self.cfg["rope"] != "none":
            q = self.ex.rope(q, positions, self.cfg["rope"], self.theta)
            k = self.ex.rope(k.astype(np.float64), positions, self.cfg["rope"], self.theta).astype(np.float32)
        self._store(s, "k", before, layer, k.astype(np.float32))
        self._store(s, "v", before, layer, v.astype(np.float32))
        s["n"] = total = before + n
        group = self.hq // self.hkv
        K, V = np.repeat(s["kx"][:total], group, axis=1), np.repeat(s["vx"][:total], group, axis=1)
        scores = np.einsum("ihd,thd->hit", q, K) * np.float64(self.scale)
        visible = np.arange(total)[None, :] <= (before + np.arange(n))[:, None]
        scores = np.where(visible[None, :, :], scores, -np.inf)
        p = np.exp(scores - scores.max(axis=2, keepdims=True))
        p /= p.sum(axis=2, keepdims=True)
        return np.einsum("hit,thd->ihd", p, V).astype(np.float32)

    def dump(self, seq, layer):
        s = self._stream(seq, layer)
        n = s["n"]
        shape = (n, self.hkv) if self.cfg["dtype"] != "q8_0" else (n, self.hkv, self.cfg["scales_per_head_row"])
        return (s["k"][:n].copy(), s["v"][:n].copy(), s["ks"][:n].reshape(shape).copy(),
                s["vs"][:n].reshape(shape).copy())

    def fork(self, parent, child):
        for layer in range(self.layers):
            src = self._stream(parent, layer)
            self.streams[(child, layer)] = {name: (a.copy() if isinstance(a, np.ndarray) else a)
                                            for name, a in src.items()}

    def release(self, seq):
        for layer in range(self.layers):
            self._stream(seq, layer)["n"] = 0

    def live_bytes(self):
        scales = 0 if self.bug == "scales-uncounted" else self.qn.scale_bytes_per_head_row(self.cfg)
        row = self.hkv * (self.d + scales)
        return sum(2 * s["n"] * row for s in self.streams.values())


def main():
    # vectors_io, kvcache_example (rope) and quant_np are found through --example and this directory: parsed first
    example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "python_example")
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--example", default=example)
    known, _ = pre.parse_known_args()
    sys.dont_write_bytecode = True
    sys.path[:0] = [known.example, os.path.dirname(os.path.abspath(__file__))]
    import kvcache_example
    import quant_np
    import vectors_io

    ap = vectors_io.arguments(__doc__.split("\n")[0])
    ap.add_argument("--example", default=example, help="tools/python_example (vectors_io, safetensors_np, rope)")
    ap.add_argument("--bug", choices=BUGS)
    ap.add_argument("--q-rounding", default="f32", choices=["f32", "fp8_e4m3", "fp8_e5m2", "q8_0"])
    args = ap.parse_args()
    # the declared pipeline: f32 stages with q as --q-rounding rounds it, unless --pipeline says otherwise
    return vectors_io.drive(args, lambda cfg: QuantCache(cfg, kvcache_example, quant_np, args.bug, args.q_rounding),
                            "numpy-quant" + ("-" + args.bug if args.bug else ""), "1.0",
                            {"capabilities": QUANT_CAPABILITIES, "pipeline": {"q": args.q_rounding}})


if __name__ == "__main__":
    sys.exit(main())
