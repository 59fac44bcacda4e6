#!/usr/bin/env python3
"""A small, correct KV cache in numpy, run on kvcheck's exported conformance vectors.

    build/bin/kvcheck export --out vectors
    python3 tools/python_example/kvcache_example.py --vectors vectors --results results
    build/bin/kvcheck grade --vectors vectors --results results

The cache keeps, per (sequence, layer), the K and V rows of every past token in one contiguous array, in the cache
dtype (f32, f16 or bf16), keys already rotated when the model uses RoPE. A call appends the new tokens' rows and
attends with their queries: query i sees every cached row plus new rows 0..i (causal, bottom-right aligned). Q is
used once and never kept. Attention runs in float64 on the rows as stored, so this implementation declares the
"f32" precision class. docs/vectors.md describes the files.

--bug skip-self makes a query miss its own key, to show what a failure looks like. --bug unrounded-new-rows makes
a 16-bit cache attend a call's new rows as given (f32) while storing them rounded, as some real kernels do; declared
with --pipeline '{"new_rows_unrounded": true}' that is graded for what it is.
"""

import sys

import numpy as np

import vectors_io

# What this implementation supports, in the words kvcheck's manifest uses for a case's "requires".
CAPABILITIES = ["dtype f32", "dtype f16", "dtype bf16", "rope neox", "rope gptj", "gqa", "chunked", "fork", "release",
                "batch"]
# the numpy dtype each cache dtype is stored in (numpy has no bfloat16: bf16 is kept as its bit patterns)
STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


# ---- cache dtypes: float32 -> what the cache stores, and back --------------------------------------------------


def bf16_bits(x32):
    """float32 -> bfloat16 bit patterns, rounded to nearest even (finite inputs)."""
    bits = x32.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def to_cache(x32, dtype):
    if dtype == "f32":
        return x32.astype(np.float32)
    if dtype == "f16":
        return x32.astype(np.float32).astype(np.float16)  # numpy rounds to nearest even
    return bf16_bits(x32)


def widen(stored, dtype):
    """Stored rows -> float64, exactly."""
    if dtype == "bf16":
        return (stored.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return stored.astype(np.float64)


# ---- rotary position embedding -----------------------------------------------------------------------------------


def rope(x, positions, variant, theta):
    """Rotates x [n, heads, d] (float64) by positions [n]. Pair j turns by pos * theta^(-2j/d).
    neox pairs (j, j + d/2); gptj pairs (2j, 2j + 1)."""
    d = x.shape[-1]
    half = d // 2
    inv_freq = np.float64(theta) ** (-2.0 * np.arange(half, dtype=np.float64) / d)
    angle = positions.astype(np.float64)[:, None] * inv_freq  # [n, half]
    c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]  # [n, 1, half]
    out = x.copy()
    if variant == "neox":
        a, b = x[..., :half], x[..., half:]
        out[..., :half], out[..., half:] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    return out


# ---- the cache ---------------------------------------------------------------------------------------------------


def f32_from_bits(text):
    return float(np.array([int(text, 16)], dtype=np.uint32).view(np.float32)[0])


class KVCache:
    def __init__(self, cfg, skip_self=False, unrounded_new_rows=False):
        self.layers = cfg["n_layers"]
        self.hq, self.hkv, self.d = cfg["n_q_heads"], cfg["n_kv_heads"], cfg["head_dim"]
        self.dtype = cfg["dtype"]
        self.rope = cfg["rope"]
        self.theta = f32_from_bits(cfg["rope_theta_bits"])  # exact float32 values, as the ABI passes them
        self.scale = f32_from_bits(cfg["scale_bits"])
        self.max_tokens = cfg["max_tokens"]
        self.skip_self = skip_self
        self.unrounded_new_rows = unrounded_new_rows
        self.k, self.v, self.length = {}, {}, {}  # (seq, layer) -> [max_tokens, hkv, d] storage, rows used

    def _stream(self, seq, layer):
        key = (seq, layer)
        if key not in self.k:
            shape = (self.max_tokens, self.hkv, self.d)
            self.k[key] = np.zeros(shape, STORAGE[self.dtype])
            self.v[key] = np.zeros(shape, STORAGE[self.dtype])
            self.length[key] = 0
        return key

    def append_attend(self, seq, layer, q, k, v):
        """q: [n, hq, d], k, v: [n, hkv, d] float32. Returns out [n, hq, d] float32."""
        key = self._stream(seq, layer)
        n, before = q.shape[0], self.length[key]
        if n == 0:  # an empty append is a no-op
            return np.zeros((0, self.hq, self.d), np.float32)
        positions = np.arange(before, before + n)
        q = q.astype(np.float64)
        if self.rope != "none":
            q = rope(q, positions, self.rope, self.theta)
            k = rope(k.astype(np.float64), positions, self.rope, self.theta).astype(np.float32)
        # store the new rows in the cache dtype
        self.k[key][before : before + n] = to_cache(k, self.dtype)
        self.v[key][before : before + n] = to_cache(v, self.dtype)
        self.length[key] = total = before + n
        # attend: query head h reads KV head h // (hq / hkv)
        group = self.hq // self.hkv
        K, V = widen(self.k[key][:total], self.dtype), widen(self.v[key][:total], self.dtype)
        if self.unrounded_new_rows:  # the new rows as given, not as stored: outputs then depend on chunking
            K[before:], V[before:] = k.astype(np.float64), v.astype(np.float64)
        K, V = np.repeat(K, group, axis=1), np.repeat(V, group, axis=1)  # [T, hq, d]
        scores = np.einsum("ihd,thd->hit", q, K) * np.float64(self.scale)  # [hq, n, T]
        # query i (position before + i) sees rows 0 .. before + i
        t = np.arange(total)[None, :]
        last = (before + np.arange(n))[:, None]
        visible = t < last if self.skip_self else t <= last  # [n, T]
        scores = np.where(visible[None, :, :], scores, -np.inf)
        m = scores.max(axis=2, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(scores - m)
        denom = p.sum(axis=2, keepdims=True)
        p = p / np.where(denom > 0, denom, 1.0)  # a query that sees nothing outputs zeros
        return np.einsum("hit,thd->ihd", p, V).astype(np.float32)

    def dump(self, seq, layer):
        """Every row of (seq, layer), as stored: [length, hkv, d] in the cache dtype."""
        key = self._stream(seq, layer)
        n = self.length[key]
        return self.k[key][:n].copy(), self.v[key][:n].copy()

    def fork(self, parent, child):
        for layer in range(self.layers):
            src, dst = self._stream(parent, layer), self._stream(child, layer)
            self.k[dst], self.v[dst] = self.k[src].copy(), self.v[src].copy()
            self.length[dst] = self.length[src]

    def release(self, seq):
        for layer in range(self.layers):
            self.length[self._stream(seq, layer)] = 0

    def live_bytes(self):
        row = self.hkv * self.d * np.dtype(STORAGE[self.dtype]).itemsize
        return sum(2 * n * row for n in self.length.values())


def main():
    ap = vectors_io.arguments(__doc__.split("\n")[0])
    ap.add_argument("--bug", choices=["skip-self", "unrounded-new-rows"],
                    help="break the cache on purpose: a query misses its own key; or a 16-bit cache attends the new "
                         "rows as given instead of as stored")
    args = ap.parse_args()
    return vectors_io.drive(args, lambda cfg: KVCache(cfg, args.bug == "skip-self", args.bug == "unrounded-new-rows"),
                            "numpy-example" + ("-" + args.bug if args.bug else ""), "1.0",
                            {"capabilities": CAPABILITIES, "pipeline": "f32"})


if __name__ == "__main__":
    sys.exit(main())
