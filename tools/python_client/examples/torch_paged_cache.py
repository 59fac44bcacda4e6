#!/usr/bin/env python3
"""A paged KV cache in torch, built the way vLLM's is, served live to kvcheck over the pipe protocol.

    bash tools/setup-torch.sh        # build/venv-torch: CPU torch, pinned
    kvcheck validate --connect 'build/venv-torch/bin/python tools/python_client/examples/torch_paged_cache.py'

Storage is one pool of fixed-size blocks (BLOCK_SIZE tokens each; the config's block_size_hint when it gives one),
K and V as torch tensors [blocks, block_size, n_kv_heads, head_dim] in the cache dtype (torch.float32, float16,
bfloat16: torch rounds to nearest even). The pool grows in whole blocks (doubling, up to what max_seqs x n_layers
sequences of max_tokens can need). A block allocator hands blocks out from a free stack and keeps a reference count
per block; every (sequence, layer) stream has a block table (logical block -> physical block).

* fork(parent, child): the child's tables are copies of the parent's, every block's reference count goes up by one:
  nothing is copied.
* append: when the stream's last block is partially filled and shared (reference count > 1), it is copied to a block
  of the stream's own first (copy-on-write), then the new rows are written; full shared blocks stay shared.
* release(seq): every block of its tables loses one reference, tail first; blocks at zero go back to the free
  stack, so the next block handed out is the released stream's first (when no fork still holds it).

Attention gathers the stream's rows through its block table and computes in float32 over the rows as stored
(softmax in float32), so the cache declares the f32 pipeline; keys are stored rotated under RoPE (rotation in
float64). memory(): live bytes by the ABI formula, capacity = the blocks holding live tokens (each once), pool = the
free blocks.

Broken on purpose (each fails with a shrunk counterexample):
  --bug fork-no-cow           a shared, partially filled last block is appended into without copying it, so one
                              side of a fork writes its new rows over the other's
  --bug release-frees-shared  release frees every block of the sequence, also those a fork still references
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvcheck_client as kvc  # noqa: E402  (the in-repo package, also when it is not pip-installed)

BLOCK_SIZE = 16
TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
NUMPY_STORAGE = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.uint16}  # same bytes


def rope(x, positions, variant, theta):
    """Rotates x [n, heads, d] (float64) by positions [n] (int64): pair j turns by pos * theta^(-2j/d)."""
    d = x.shape[-1]
    half = d // 2
    inv_freq = torch.tensor(float(theta), dtype=torch.float64) ** (
        -2.0 * torch.arange(half, dtype=torch.float64) / d)
    angle = positions.to(torch.float64)[:, None] * inv_freq
    c, s = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]
    out = x.clone()
    if variant == "neox":
        a, b = x[..., :half], x[..., half:]
        out[..., :half], out[..., half:] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    return out


class BlockAllocator:
    """Physical blocks of K and V, a free stack and a reference count per block (vLLM's BlockAllocator)."""

    def __init__(self, block_size, n_kv_heads, head_dim, dtype, max_blocks):
        self.block_size, self.dtype, self.max_blocks = block_size, dtype, max_blocks
        self.shape = (block_size, n_kv_heads, head_dim)
        self.k = torch.zeros((0, *self.shape), dtype=dtype)
        self.v = torch.zeros((0, *self.shape), dtype=dtype)
        self.refcount = []   # per physical block
        self.free = []       # free stack: the most recently freed block is handed out first
        self.block_bytes = 2 * block_size * n_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    @property
    def n_blocks(self):
        return self.k.shape[0]

    def _grow(self):
        held = self.n_blocks
        want = max(2 * held, 4)
        if self.max_blocks:
            want = min(want, self.max_blocks)
        if want <= held:
            raise MemoryError(f"the pool holds its maximum of {held} blocks")
        # Whole blocks, zero-filled now (touched when reported, not later). The storage is a numpy array seen through
        # torch.from_numpy: numpy reports its arrays to tracemalloc, so kvcheck's NO-Q watch sees the pool and holds
        # its growth against the capacity and pool reported (torch's own allocator is invisible to it).
        for side in ("k", "v"):
            grown = torch.from_numpy(np.zeros((want, *self.shape), NUMPY_STORAGE[self.dtype])).view(self.dtype)
            grown[:held] = getattr(self, side)
            setattr(self, side, grown)
        self.refcount.extend([0] * (want - held))
        self.free.extend(range(want - 1, held - 1, -1))

    def allocate(self):
        if not self.free:
            self._grow()
        block = self.free.pop()
        self.refcount[block] = 1
        return block

    def share(self, block):
        self.refcount[block] += 1

    def release(self, block, force=False):
        if force:  # --bug release-frees-shared
            if self.refcount[block] > 0:
                self.refcount[block] = 0
                self.free.append(block)
            return
        self.refcount[block] -= 1
        if self.refcount[block] == 0:
            self.free.append(block)

    def copy(self, src):
        """Copy-on-write: a block of the caller's own holding src's rows; src loses the caller's reference."""
        dst = self.allocate()
        self.k[dst] = self.k[src]
        self.v[dst] = self.v[src]
        self.release(src)
        return dst

    def used_blocks(self):
        return sum(1 for r in self.refcount if r > 0)


class TorchPagedCache:
    def __init__(self, cfg: kvc.Config, bug=None):
        self.cfg = cfg
        self.hq, self.hkv, self.d = cfg.n_q_heads, cfg.n_kv_heads, cfg.head_dim
        if cfg.dtype not in TORCH_DTYPE:
            raise NotImplementedError(f"cache dtype {cfg.dtype}")
        self.dtype = TORCH_DTYPE[cfg.dtype]
        self.bs = cfg.block_size_hint or BLOCK_SIZE
        self.bug = bug
        per_stream = -(-cfg.max_tokens // self.bs) if cfg.max_tokens else 0
        self.alloc = BlockAllocator(self.bs, self.hkv, self.d, self.dtype, cfg.max_seqs * cfg.n_layers * per_stream)
        self.row = self.hkv * self.d * torch.finfo(self.dtype).bits // 8  # bytes of one token's K (or V) per layer
        self.tables = {}   # (seq, layer) -> [physical block per logical block]
        self.length = {}   # (seq, layer) -> tokens

    def _check(self, seq, layer):
        if seq >= self.cfg.max_seqs or layer >= self.cfg.n_layers:
            raise IndexError(f"sequence {seq} or layer {layer} out of range")

    def _slots(self, table, start, stop):
        """Flat slot indices (physical block * block_size + offset) of positions [start, stop) of a stream."""
        pos = torch.arange(start, stop)
        blocks = torch.tensor(table, dtype=torch.int64)[pos // self.bs]
        return blocks * self.bs + pos % self.bs

    def _make_room(self, key, before, n):
        """Blocks for positions [before, before + n): copy-on-write of a shared partial last block, then new ones."""
        table = self.tables.setdefault(key, [])
        if before % self.bs and self.alloc.refcount[table[-1]] > 1 and self.bug != "fork-no-cow":
            table[-1] = self.alloc.copy(table[-1])
        while len(table) * self.bs < before + n:
            table.append(self.alloc.allocate())
        return table

    def append_attend(self, seq, layer, q, k, v):
        self._check(seq, layer)
        key = (seq, layer)
        n, before = q.shape[0], self.length.get(key, 0)
        if n == 0:
            return torch.zeros((0, self.hq, self.d), dtype=torch.float32)
        if self.cfg.max_tokens and before + n > self.cfg.max_tokens:
            raise MemoryError("max_tokens reached")
        q = torch.from_numpy(np.array(q, dtype=np.float32))
        k = torch.from_numpy(np.array(k, dtype=np.float32))
        v = torch.from_numpy(np.array(v, dtype=np.float32))
        total = before + n
        if self.cfg.rope_name != "none":
            positions = torch.arange(before, total)
            theta = self.cfg.rope_theta
            q = rope(q.to(torch.float64), positions, self.cfg.rope_name, theta).to(torch.float32)
            k = rope(k.to(torch.float64), positions, self.cfg.rope_name, theta).to(torch.float32)
        table = self._make_room(key, before, n)
        k_flat = self.alloc.k.view(-1, self.hkv, self.d)
        v_flat = self.alloc.v.view(-1, self.hkv, self.d)
        new = self._slots(table, before, total)
        k_flat[new] = k.to(self.dtype)   # round to nearest even, as the ABI asks
        v_flat[new] = v.to(self.dtype)
        self.length[key] = total
        slots = self._slots(table, 0, total)
        group = self.hq // self.hkv
        K = k_flat[slots].to(torch.float32).repeat_interleave(group, dim=1)  # [total, hq, d]: head h reads h // group
        V = v_flat[slots].to(torch.float32).repeat_interleave(group, dim=1)
        scores = torch.matmul(q.transpose(0, 1), K.permute(1, 2, 0)) * float(self.cfg.scale)  # [hq, n, total]
        visible = torch.arange(total)[None, :] <= torch.arange(before, total)[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, V.transpose(0, 1)).transpose(0, 1).contiguous()  # [n, hq, d] float32

    def append_attend_batch(self, layer, seq_ids, offsets, q, k, v):
        out = np.empty(q.shape, np.float32)
        for i, seq in enumerate(seq_ids):
            a, b = int(offsets[i]), int(offsets[i + 1])
            out[a:b] = self.append_attend(int(seq), layer, q[a:b], k[a:b], v[a:b]).numpy()
        return out

    def seq_length(self, seq, layer):
        self._check(seq, layer)
        return self.length.get((seq, layer), 0)

    def read_kv(self, seq, layer, pos, n):
        self._check(seq, layer)
        key = (seq, layer)
        if pos + n > self.length.get(key, 0):
            raise IndexError("rows past the sequence's length")
        if n == 0:
            return np.zeros(0, np.uint8), np.zeros(0, np.uint8)
        slots = self._slots(self.tables[key], pos, pos + n)
        out = []
        for pool in (self.alloc.k, self.alloc.v):
            rows = pool.view(-1, self.hkv, self.d)[slots]
            if self.dtype == torch.bfloat16:  # bf16 travels as its bit patterns
                rows = rows.view(torch.int16).numpy().view(np.uint16)
            out.append(rows)
        return out[0], out[1]

    def started(self, seq):
        return any(self.length.get((seq, layer), 0) for layer in range(self.cfg.n_layers))

    def fork(self, parent, child):
        if parent >= self.cfg.max_seqs or child >= self.cfg.max_seqs or parent == child:
            raise ValueError("fork needs two distinct sequences in range")
        if not self.started(parent) or self.started(child):
            raise ValueError("fork needs a started parent and an empty child")
        for layer in range(self.cfg.n_layers):
            src = (parent, layer)
            if self.length.get(src, 0):
                table = list(self.tables[src])
                for block in table:
                    self.alloc.share(block)
                self.tables[(child, layer)] = table
                self.length[(child, layer)] = self.length[src]

    def release(self, seq):
        if seq >= self.cfg.max_seqs or not self.started(seq):
            raise ValueError("release needs a started sequence")
        for layer in range(self.cfg.n_layers):
            # tail first, as vLLM frees a table: the stream's first block ends on top of the free stack, the
            # first to be handed out again
            for block in reversed(self.tables.pop((seq, layer), [])):
                self.alloc.release(block, force=self.bug == "release-frees-shared")
            self.length.pop((seq, layer), None)

    def memory(self):
        live = sum(2 * n * self.row for n in self.length.values())
        used = self.alloc.used_blocks()
        free = self.alloc.n_blocks - used
        return kvc.Memory(block_size=self.bs, live_bytes=live, capacity_bytes=used * self.alloc.block_bytes,
                          pool_bytes=free * self.alloc.block_bytes)


CAPS = kvc.Caps(dtypes=["f32", "f16", "bf16"], rope=["neox", "gptj"],
                features=["gqa", "paged", "chunked", "fork", "release", "batch"], pipeline={})


def warm_up():
    """Runs every path once before serving, so that torch's lazy imports and first-call allocations happen before
    kvcheck's first memory reading rather than inside a case (they would look like hidden storage to NO-Q)."""
    for dtype in (0, 1, 2):
        for rope_kind in (0, 1, 2):
            cfg = kvc.Config(n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=8, cache_dtype=dtype, max_seqs=3,
                             max_tokens=40, scale=np.float32(0.35), rope=rope_kind, rope_theta=np.float32(10000.0),
                             block_size_hint=0, kv_scale_mode=0, int8_scale_dtype=0)
            c = TorchPagedCache(cfg)
            x = np.linspace(-1, 1, 20 * 4 * 8, dtype=np.float32).reshape(20, 4, 8)
            c.append_attend(0, 0, x, x[:, :2], x[:, 2:])
            c.append_attend(0, 1, x[:3], x[:3, :2], x[:3, 2:])
            c.fork(0, 1)
            c.append_attend_batch(0, np.array([0, 1], np.uint32), np.array([0, 1, 2], np.uint32), x[:2], x[:2, :2],
                                  x[:2, 2:])
            c.read_kv(1, 0, 0, 21)
            c.seq_length(1, 0)
            c.memory()
            c.release(0)
            c.release(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bug", choices=["fork-no-cow", "release-frees-shared"], help="break the cache on purpose")
    ap.add_argument("--no-memory-watch", action="store_true", help="report no memory reading")
    args = ap.parse_args()
    torch.set_num_threads(1)  # deterministic, and kvcheck runs cases side by side
    warm_up()
    name = "torch-paged-example" + ("-" + args.bug if args.bug else "")
    return kvc.serve(lambda cfg: TorchPagedCache(cfg, args.bug), CAPS, name=name, version="1.0",
                     watch_memory=not args.no_memory_watch)


if __name__ == "__main__":
    sys.exit(main())
