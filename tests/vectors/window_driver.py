#!/usr/bin/env python3
"""A KV cache in numpy with sliding windows, attention sinks and latent (MLA) shapes, run on kvcheck's vectors.

    window_driver.py [--example tools/python_example] --vectors V --results R [--bug BUG] [--pipeline P]

It reads what a case's config carries beyond an ordinary cache (docs/windowed-caches.md): "windows" (W of each
layer, 0 = full attention), "sinks" (S), "head_dim_v" (V and output rows of their own size) and "rope_dim_begin",
"rope_dims" (RoPE on that range of the head dims only, as if it were a head of rope_dims dims). It keeps every row
and masks: the query at position i sees the key at j iff j <= i and (W == 0 or j < S or i - j < W). It does not
evict (the vectors route does not judge eviction). Attention runs in float64 over the rows as stored, so it
declares the "f32" pipeline. A --bug breaks one thing on purpose:

    window-plus-one   a query sees W + 1 keys (EQUIV names the window)
    v-from-k          V rows are read from the call's v with K's row stride (head_dim values a KV head)
    rope-all          RoPE turns every dim of q and k although a range is declared
"""

import argparse
import os
import sys

import numpy as np

# vectors_io and kvcache_example (rope, cache dtypes, the storage this cache shares) are found through --example,
# parsed before anything else
EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "python_example")
_pre = argparse.ArgumentParser(add_help=False)
_pre.add_argument("--example", default=EXAMPLE)
sys.dont_write_bytecode = True
sys.path.insert(0, _pre.parse_known_args()[0].example)
import kvcache_example  # noqa: E402
import vectors_io  # noqa: E402

CAPABILITIES = ["dtype f32", "dtype f16", "dtype bf16", "rope neox", "rope gptj", "gqa", "chunked", "fork", "release",
                "batch", "window", "sinks", "head_dim_v", "rope_range"]
BUGS = ["window-plus-one", "v-from-k", "rope-all"]


class WindowCache(kvcache_example.KVCache):
    """The example cache's storage, dump, fork and release; its own V width, RoPE range and visibility mask."""

    def __init__(self, cfg, bug):
        self.ex, self.bug = kvcache_example, bug
        self.layers, self.hq, self.hkv = cfg["n_layers"], cfg["n_q_heads"], cfg["n_kv_heads"]
        self.d = cfg["head_dim"]
        self.dv = cfg.get("head_dim_v", self.d)
        self.dtype, self.rope = cfg["dtype"], cfg["rope"]
        self.theta = kvcache_example.f32_from_bits(cfg["rope_theta_bits"])
        self.scale = kvcache_example.f32_from_bits(cfg["scale_bits"])
        self.windows = cfg.get("windows") or [0] * self.layers
        self.sinks = cfg.get("sinks", 0)
        self.rope_begin = cfg.get("rope_dim_begin", 0)
        self.rope_dims = cfg.get("rope_dims", 0) or self.d
        self.max_tokens = cfg["max_tokens"]
        self.k, self.v, self.length = {}, {}, {}

    def _stream(self, seq, layer):
        key = (seq, layer)
        if key not in self.k:
            store = self.ex.STORAGE[self.dtype]
            self.k[key] = np.zeros((self.max_tokens, self.hkv, self.d), store)
            self.v[key] = np.zeros((self.max_tokens, self.hkv, self.dv), store)
            self.length[key] = 0
        return key

    def _rotate(self, x, positions):
        """x [n, heads, d] float64 rotated on the declared range (the whole head under the rope-all bug)."""
        if self.rope == "none":
            return x
        b, r = (0, self.d) if self.bug == "rope-all" else (self.rope_begin, self.rope_dims)
        out = x.copy()
        out[..., b : b + r] = self.ex.rope(x[..., b : b + r], positions, self.rope, self.theta)
        return out

    def _v_rows(self, v):
        """The call's V rows [n, hkv, dv] as stored; the v-from-k bug reads them with K's row stride."""
        if self.bug != "v-from-k" or self.dv == self.d:
            return v
        flat, n = v.reshape(-1), v.shape[0]
        rows = np.arange(n * self.hkv)[:, None] * self.d + np.arange(self.dv)[None, :]
        return flat[rows % flat.size].reshape(n, self.hkv, self.dv)

    def append_attend(self, seq, layer, q, k, v):
        key = self._stream(seq, layer)
        n, before = q.shape[0], self.length[key]
        if n == 0:
            return np.zeros((0, self.hq, self.dv), np.float32)
        positions = np.arange(before, before + n)
        q = self._rotate(q.astype(np.float64), positions)
        k = self._rotate(k.astype(np.float64), positions).astype(np.float32)
        self.k[key][before : before + n] = self.ex.to_cache(k, self.dtype)
        self.v[key][before : before + n] = self.ex.to_cache(self._v_rows(v), self.dtype)
        self.length[key] = total = before + n
        group = self.hq // self.hkv
        K = np.repeat(self.ex.widen(self.k[key][:total], self.dtype), group, axis=1)  # [T, hq, d]
        V = np.repeat(self.ex.widen(self.v[key][:total], self.dtype), group, axis=1)  # [T, hq, dv]
        scores = np.einsum("ihd,thd->hit", q, K) * np.float64(self.scale)
        j = np.arange(total)[None, :]
        i = (before + np.arange(n))[:, None]
        w = self.windows[layer] + (1 if self.bug == "window-plus-one" and self.windows[layer] else 0)
        visible = (j <= i) & ((w == 0) | (j < self.sinks) | (i - j < w))
        scores = np.where(visible[None, :, :], scores, -np.inf)
        p = np.exp(scores - scores.max(axis=2, keepdims=True))  # a query always sees itself: the max is finite
        p = p / p.sum(axis=2, keepdims=True)
        return np.einsum("hit,thd->ihd", p, V).astype(np.float32)

    def live_bytes(self):
        size = np.dtype(self.ex.STORAGE[self.dtype]).itemsize
        return sum(n * self.hkv * (self.d + self.dv) * size for n in self.length.values())


def main():
    ap = vectors_io.arguments(__doc__.split("\n")[0])
    ap.add_argument("--example", default=EXAMPLE, help="tools/python_example (vectors_io, safetensors_np, rope)")
    ap.add_argument("--bug", choices=BUGS)
    ap.add_argument("--declare", help="a JSON object of extra declaration fields (limits) to declare")
    args = ap.parse_args()
    declaration = {"capabilities": CAPABILITIES, "pipeline": "f32"}
    if args.declare:
        import json

        declaration.update(json.loads(args.declare))
    return vectors_io.drive(args, lambda cfg: WindowCache(cfg, args.bug),
                            "numpy-window" + ("-" + args.bug if args.bug else ""), "1.0", declaration)


if __name__ == "__main__":
    sys.exit(main())
