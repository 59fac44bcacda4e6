#!/usr/bin/env python3
"""The numpy KV cache of tools/python_example, served live to kvcheck over the pipe protocol.

    kvcheck validate --connect 'python3 tools/python_client/examples/numpy_cache.py'

Per (sequence, layer) the cache keeps the K and V rows of every past token in one array in the cache dtype (f32, f16,
or bf16 kept as bit patterns), keys already rotated under RoPE; the array doubles when full, and what it holds beyond
the live rows is reported as pool. Q is used once and never kept. Attention runs in float64 on the rows as stored,
so the cache declares the f32 pipeline. --bug keep-q keeps every query (a NO-Q failure); --bug skip-self makes a
query miss its own key (an EQUIV failure).
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvcheck_client as kvc  # noqa: E402  (the in-repo package, also when it is not pip-installed)

STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


def to_cache(x32, dtype):
    if dtype == "f32":
        return x32.astype(np.float32)
    if dtype == "f16":
        return x32.astype(np.float32).astype(np.float16)  # numpy rounds to nearest even
    bits = x32.astype(np.float32).view(np.uint32).astype(np.uint64)  # bf16, rounded to nearest even
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def widen(stored, dtype):
    if dtype == "bf16":
        return (stored.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return stored.astype(np.float64)


def rope(x, positions, variant, theta):
    """Rotates x [n, heads, d] (float64) by positions [n]: pair j turns by pos * theta^(-2j/d)."""
    d = x.shape[-1]
    half = d // 2
    inv_freq = np.float64(theta) ** (-2.0 * np.arange(half, dtype=np.float64) / d)
    angle = positions.astype(np.float64)[:, None] * inv_freq
    c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    out = x.copy()
    if variant == "neox":
        a, b = x[..., :half], x[..., half:]
        out[..., :half], out[..., half:] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    return out


class NumpyCache:
    def __init__(self, cfg: kvc.Config, bug=None):
        self.cfg = cfg
        self.hq, self.hkv, self.d = cfg.n_q_heads, cfg.n_kv_heads, cfg.head_dim
        self.dtype = cfg.dtype
        self.store = STORAGE[self.dtype]
        self.row = self.hkv * self.d * np.dtype(self.store).itemsize
        self.bug = bug
        self.kept_q = []
        self.k, self.v, self.length = {}, {}, {}  # (seq, layer) -> [capacity, hkv, d] arrays, rows used

    def _check(self, seq, layer):
        if seq >= self.cfg.max_seqs or layer >= self.cfg.n_layers:
            raise IndexError(f"sequence {seq} or layer {layer} out of range")

    def _room(self, key, rows):
        held = self.k[key].shape[0] if key in self.k else 0
        if rows <= held:
            return
        cap = max(rows, 2 * held, 16)
        for side in (self.k, self.v):
            # zeros then fill: the pages are touched now, when they are reported, not later (docs/protocol.md)
            grown = np.zeros((cap, self.hkv, self.d), self.store)
            grown.fill(0)
            if held:
                grown[:held] = side[key]
            side[key] = grown

    def append_attend(self, seq, layer, q, k, v):
        self._check(seq, layer)
        key = (seq, layer)
        n, before = q.shape[0], self.length.get(key, 0)
        if n == 0:
            return np.zeros((0, self.hq, self.d), np.float32)
        if before + n > self.cfg.max_tokens:
            raise MemoryError("max_tokens reached")
        if self.bug == "keep-q":
            self.kept_q.append(q.copy())
        self._room(key, before + n)
        positions = np.arange(before, before + n)
        q = q.astype(np.float64)
        rope_name = self.cfg.rope_name
        if rope_name != "none":
            q = rope(q, positions, rope_name, self.cfg.rope_theta)
            k = rope(k.astype(np.float64), positions, rope_name, self.cfg.rope_theta).astype(np.float32)
        self.k[key][before:before + n] = to_cache(k, self.dtype)
        self.v[key][before:before + n] = to_cache(v, self.dtype)
        self.length[key] = total = before + n
        group = self.hq // self.hkv
        K, V = widen(self.k[key][:total], self.dtype), widen(self.v[key][:total], self.dtype)
        K, V = np.repeat(K, group, axis=1), np.repeat(V, group, axis=1)
        scores = np.einsum("ihd,thd->hit", q, K) * np.float64(self.cfg.scale)
        t = np.arange(total)[None, :]
        last = (before + np.arange(n))[:, None]
        visible = t < last if self.bug == "skip-self" else t <= last
        scores = np.where(visible[None, :, :], scores, -np.inf)
        m = scores.max(axis=2, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(scores - m)
        denom = p.sum(axis=2, keepdims=True)
        p = p / np.where(denom > 0, denom, 1.0)
        return np.einsum("hit,thd->ihd", p, V).astype(np.float32)

    def append_attend_batch(self, layer, seq_ids, offsets, q, k, v):
        out = np.empty(q.shape, np.float32)
        for i, seq in enumerate(seq_ids):
            a, b = int(offsets[i]), int(offsets[i + 1])
            out[a:b] = self.append_attend(int(seq), layer, q[a:b], k[a:b], v[a:b])
        return out

    def seq_length(self, seq, layer):
        self._check(seq, layer)
        return self.length.get((seq, layer), 0)

    def read_kv(self, seq, layer, pos, n):
        self._check(seq, layer)
        if pos + n > self.seq_length(seq, layer):
            raise IndexError("rows past the sequence's length")
        key = (seq, layer)
        if n == 0:
            return np.zeros(0, np.uint8), np.zeros(0, np.uint8)
        return self.k[key][pos:pos + n], self.v[key][pos:pos + n]

    def started(self, seq):
        return any(self.length.get((seq, layer), 0) for layer in range(self.cfg.n_layers))

    def fork(self, parent, child):
        if not self.started(parent) or self.started(child) or child >= self.cfg.max_seqs:
            raise ValueError("fork needs a started parent and an empty child")
        for layer in range(self.cfg.n_layers):
            src, dst = (parent, layer), (child, layer)
            if src in self.k:
                self.k[dst], self.v[dst] = self.k[src].copy(), self.v[src].copy()
                self.length[dst] = self.length.get(src, 0)

    def release(self, seq):
        if not self.started(seq):
            raise ValueError("release needs a started sequence")
        for layer in range(self.cfg.n_layers):
            for side in (self.k, self.v, self.length):
                side.pop((seq, layer), None)

    def memory(self):
        live = sum(2 * n * self.row for n in self.length.values())
        held = sum(2 * a.shape[0] * self.row for a in self.k.values())
        return kvc.Memory(block_size=1, live_bytes=live, capacity_bytes=live, pool_bytes=held - live)


CAPS = kvc.Caps(dtypes=["f32", "f16", "bf16"], rope=["neox", "gptj"],
                features=["gqa", "chunked", "fork", "release", "batch"], pipeline={})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bug", choices=["keep-q", "skip-self"], help="break the cache on purpose")
    ap.add_argument("--no-memory-watch", action="store_true", help="report no memory reading")
    args = ap.parse_args()
    name = "numpy-example" + ("-" + args.bug if args.bug else "")
    return kvc.serve(lambda cfg: NumpyCache(cfg, args.bug), CAPS, name=name, version="1.0",
                     watch_memory=not args.no_memory_watch)


if __name__ == "__main__":
    sys.exit(main())
