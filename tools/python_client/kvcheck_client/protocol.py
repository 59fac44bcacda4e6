"""The client side of kvcheck's pipe protocol: frames in on stdin, frames out on stdout, one reply per request.

Every name and number here is docs/protocol.md's; the meanings are include/kvcheck/abi.h's.
"""

import gc
import os
import struct
import sys
import traceback
import tracemalloc
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

MAGIC = 0x5043564B
REPLY = 0x8000
# 1.3 carries every field of ABI 1.2, 1.5 ABI 1.3's pipeline rules (1.4's lent-buffer flag this client never sets);
# a kvcheck that asks for less gets its minor's frames
PROTOCOL = (1, 5)
WHOLE_ABI_MINOR = 3
RULES_MINOR = 5
MAX_PIPELINE_RULES = 8
MAX_PAYLOAD = 1 << 30
MAX_MESSAGE = 4096
NO_READING = 0xFFFFFFFFFFFFFFFF

OK, INVALID_ARGUMENT, UNSUPPORTED, OUT_OF_MEMORY, INTERNAL, EVICTED = range(6)
HELLO, GET_CAPS, CREATE, DESTROY, APPEND, BATCH, READ_KV, READ_SCALES, SEQ_LENGTH, MEMORY, FORK, RELEASE = range(1, 13)
# the model level's opcodes (protocol 1.5): this client serves no model table, and says so to each
MODEL_OPCODES = range(13, 22)

DTYPES = ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8_token", "q8_0"]
ROPES = ["none", "neox", "gptj"]
FEATURES = {"gqa": 1, "paged": 2, "fork": 4, "release": 8, "batch": 16, "chunked": 32, "window": 64, "sinks": 128,
            "evict": 256, "head_dim_v": 512, "rope_range": 1024, "fork_shares": 2048}
FIXED_SCALE = {None: 0, "inv_sqrt_head_dim": 1}
QUANT = {"fp8_scale_tensor": 1, "fp8_scale_kv_head": 2, "int8_scale_f16": 4}
ROUNDS = {"f32": 0, "f16": 1, "bf16": 2, "cache": 3, "fp8_e4m3": 4, "fp8_e5m2": 5}
PIPELINE_STAGES = ["q", "rope", "scores", "probs", "accum", "output"]


class KvcError(Exception):
    """Raise from a cache method to return a kvc_status with a message. ValueError, IndexError and KeyError become
    INVALID_ARGUMENT, NotImplementedError UNSUPPORTED, MemoryError OUT_OF_MEMORY, anything else INTERNAL."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Caps:
    """kvc_caps in words. Limits of 0 mean no limit. pipeline: stage -> round name, e.g. {"accum": "f16"}."""
    dtypes: List[str] = field(default_factory=lambda: ["f32"])
    rope: List[str] = field(default_factory=list)          # variants applied by the cache itself
    features: List[str] = field(default_factory=list)      # FEATURES' names: gqa, paged, fork, release, ...
    precision: str = "f32"                                  # or "q_and_v_accum_in_cache_dtype"
    max_layers: int = 0
    max_q_heads: int = 0
    max_kv_heads: int = 0
    max_head_dim: int = 0
    max_seqs: int = 0
    max_tokens: int = 0
    head_dim_multiple: int = 0
    head_dim_multiple_rope: int = 0
    pipeline: Optional[Dict[str, str]] = None
    new_rows_unrounded: bool = False
    quant: List[str] = field(default_factory=list)
    max_window: int = 0
    max_sinks: int = 0
    max_head_dim_v: int = 0
    fixed_rope_theta: float = 0.0            # the one RoPE base the cache rotates with; 0 = the config's
    fixed_scale: Optional[str] = None        # "inv_sqrt_head_dim": 1/sqrt(head_dim) whatever config.scale says
    # ABI 1.3: a pipeline per cache dtype and call shape, tried in order (docs/tolerance.md), e.g.
    # [{"dtypes": ["f16"], "min_new": 64, "pipeline": {}}, {"dtypes": ["f16"], "pipeline": {"q": "cache", ...}}];
    # "dtypes" absent = every dtype, "min_new" absent = any call. Sent to a kvcheck speaking 1.5 or later.
    pipeline_rules: List[Dict] = field(default_factory=list)

    def encode(self, minor: int = PROTOCOL[1]) -> bytes:
        dtypes = sum(1 << DTYPES.index(d) for d in self.dtypes)
        ropes = sum(1 << ROPES.index(r) for r in self.rope)
        features = sum(FEATURES[f] for f in self.features)
        precision = {"f32": 0, "q_and_v_accum_in_cache_dtype": 1}[self.precision]
        stages = [0] * 6
        flags = 0
        if self.pipeline is not None:
            flags |= 1
            for stage, rounding in self.pipeline.items():
                stages[PIPELINE_STAGES.index(stage)] = ROUNDS[rounding]
        if self.new_rows_unrounded:
            flags |= 2
        quant = sum(QUANT[q] for q in self.quant)
        words = struct.pack("<21I", dtypes, ropes, features, precision, 0, self.max_layers, self.max_q_heads,
                            self.max_kv_heads, self.max_head_dim, self.max_seqs, self.max_tokens,
                            self.head_dim_multiple, self.head_dim_multiple_rope, *stages, flags, quant)
        if minor < WHOLE_ABI_MINOR:
            return words
        words += struct.pack("<3IfI", self.max_window, self.max_sinks, self.max_head_dim_v,
                             self.fixed_rope_theta, FIXED_SCALE[self.fixed_scale])
        if minor < RULES_MINOR:
            return words
        if len(self.pipeline_rules) > MAX_PIPELINE_RULES:
            raise ValueError(f"at most {MAX_PIPELINE_RULES} pipeline rules")
        words += struct.pack("<I", len(self.pipeline_rules))
        for i in range(MAX_PIPELINE_RULES):
            rule = self.pipeline_rules[i] if i < len(self.pipeline_rules) else None
            if rule is None:
                words += bytes(9 * 4)
                continue
            rule_stages = [0] * 6
            for stage, rounding in rule["pipeline"].items():
                rule_stages[PIPELINE_STAGES.index(stage)] = ROUNDS[rounding]
            words += struct.pack("<9I", sum(1 << DTYPES.index(d) for d in rule.get("dtypes", [])),
                                 rule.get("min_new", 0), *rule_stages, 1 | (2 if rule.get("new_rows_unrounded") else 0))
        return words


@dataclass
class Config:
    """kvc_config. dtype and rope_name are the names of cache_dtype and rope; k_scales, v_scales are float32 arrays
    ([n_layers] or [n_layers, n_kv_heads]) for a scaled fp8 cache, else None."""
    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    cache_dtype: int
    max_seqs: int
    max_tokens: int
    scale: np.float32
    rope: int
    rope_theta: np.float32
    block_size_hint: int
    kv_scale_mode: int
    int8_scale_dtype: int
    k_scales: Optional[np.ndarray] = None
    v_scales: Optional[np.ndarray] = None
    n_sinks: int = 0
    evict: int = 0
    head_dim_v: int = 0                 # 0: V rows and outputs have head_dim dims
    rope_dim_begin: int = 0
    rope_dims: int = 0                  # 0: RoPE over the whole head
    windows: Optional[np.ndarray] = None  # uint32 [n_layers], 0 = full attention in that layer; None = no window

    @property
    def dv(self) -> int:
        """Dims of a V row and of an output row."""
        return self.head_dim_v or self.head_dim

    @property
    def dtype(self) -> str:
        return DTYPES[self.cache_dtype] if self.cache_dtype < len(DTYPES) else "unknown"

    @property
    def rope_name(self) -> str:
        return ROPES[self.rope] if self.rope < len(ROPES) else "unknown"


@dataclass
class Memory:
    """kvc_memory (docs/plugin-abi.md, Memory)."""
    block_size: int
    live_bytes: int
    capacity_bytes: int
    pool_bytes: int
    workspace_bytes: int = 0


_DTYPE_BYTES = {0: 4, 1: 2, 2: 2}  # f32, f16, bf16; every quantized dtype stores one byte per element


def _scale_bytes(cfg, dims: int) -> int:
    """Bytes of the scales of one head row of `dims` dims as read_kv_scales returns them (kvc::scales_per_head_row
    x scale_size)."""
    if cfg.cache_dtype in (3, 4):  # fp8: one f32
        return 4
    if cfg.cache_dtype == 5:  # int8_token: one scale in int8_scale_dtype
        return 2 if cfg.int8_scale_dtype == 1 else 4
    if cfg.cache_dtype == 6:  # q8_0: one f16 per 32 values
        return 2 * (dims // 32)
    return 0


def _as_array(x, dtype=None) -> np.ndarray:
    """numpy arrays as they are; torch tensors (anything with .detach()) through the CPU."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    a = np.ascontiguousarray(x)
    return a if dtype is None else a.astype(dtype, copy=False)


def _status_of(e: BaseException) -> int:
    if isinstance(e, KvcError):
        return e.status
    if isinstance(e, (ValueError, IndexError, KeyError)):
        return INVALID_ARGUMENT
    if isinstance(e, NotImplementedError):
        return UNSUPPORTED
    if isinstance(e, MemoryError):
        return OUT_OF_MEMORY
    return INTERNAL


def _traced_bytes() -> int:
    """Bytes the process holds through Python's allocators now, numpy's array data included (numpy reports it to
    tracemalloc), after collecting the young generations (a call's garbage cycles are there; a full collection costs
    milliseconds per call): the reading kvcheck's NO-Q watch follows (docs/protocol.md)."""
    gc.collect(1)
    return tracemalloc.get_traced_memory()[0]


class _Server:
    def __init__(self, factory, caps: Caps, name: str, version: str, watch_memory: bool):
        self.factory, self.caps, self.name, self.version = factory, caps, name, version
        self.watch_memory = watch_memory
        if watch_memory:
            tracemalloc.start()
        self.caches: Dict[int, tuple] = {}  # handle -> (cache object, config)
        self.next_handle = 1
        self.minor = PROTOCOL[1]  # until hello says which minor kvcheck speaks
        # The protocol owns fds 0 and 1: Python's own stdout goes to stderr, so a print() cannot corrupt a frame.
        self.inp = os.dup(0)
        self.out = os.dup(1)
        os.dup2(2, 1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdout = sys.stderr

    def read_exact(self, n: int) -> Optional[bytes]:
        chunks, got = [], 0
        while got < n:
            b = os.read(self.inp, min(n - got, 1 << 24))
            if not b:
                return None
            chunks.append(b)
            got += len(b)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def reply(self, op: int, seq: int, status: int, body=(), message: str = "") -> bytearray:
        """The reply frame, its reading left to fill in (offset 24) once the request's own arrays are gone."""
        if status != OK:
            text = message.encode("utf-8", "replace")[:MAX_MESSAGE]
            payload = [struct.pack("<IIQI", status, 0, NO_READING, len(text)), text]
        else:
            payload = [struct.pack("<IIQ", OK, 0, NO_READING)] + list(body)
        length = sum(memoryview(p).nbytes for p in payload)
        frame = bytearray(16 + length)
        struct.pack_into("<IHHII", frame, 0, MAGIC, op | REPLY, 0, seq, length)
        at = 16
        for p in payload:
            n = memoryview(p).nbytes
            if n == 0:  # (an empty array's view cannot be cast to bytes)
                continue
            frame[at:at + n] = memoryview(np.ascontiguousarray(p)).cast("B")
            at += n
        return frame

    def send(self, frame: bytearray) -> None:
        if self.watch_memory:  # the frame itself is the one array still held that the cache does not own
            struct.pack_into("<Q", frame, 24, max(0, _traced_bytes() - len(frame)))
        view = memoryview(frame)
        while view:
            view = view[os.write(self.out, view):]

    def run(self) -> int:
        while True:
            head = self.read_exact(16)
            if head is None:
                return 0
            magic, op, reserved, seq, length = struct.unpack("<IHHII", head)
            if magic != MAGIC or reserved or length > MAX_PAYLOAD:
                print(f"kvcheck_client: a request that is not the protocol (magic {magic:#x})", file=sys.stderr)
                return 2
            payload = self.read_exact(length) if length else b""
            if payload is None:
                return 0
            try:
                frame = self.reply(op, seq, OK, self.dispatch(op, payload))
            except Exception as e:  # every failure of the cache is a status with its words
                detail = "".join(traceback.format_exception_only(type(e), e)).strip()
                if _status_of(e) == INTERNAL:
                    detail += "\n" + "".join(traceback.format_tb(e.__traceback__)[-3:])
                frame = self.reply(op, seq, _status_of(e), message=detail)
                del e
            del payload
            self.send(frame)

    def cache(self, payload: bytes):
        handle = struct.unpack_from("<Q", payload)[0]
        if handle not in self.caches:
            raise KvcError(INVALID_ARGUMENT, f"unknown cache handle {handle}")
        return self.caches[handle]

    def dispatch(self, op: int, p: bytes):
        if op == HELLO:
            name = self.name.encode()[:64].ljust(64, b"\0")
            version = self.version.encode()[:64].ljust(64, b"\0")
            self.minor = min(struct.unpack_from("<I", p, 4)[0], PROTOCOL[1])
            return [struct.pack("<II", PROTOCOL[0], self.minor), name, version]
        if op == GET_CAPS:
            return [self.caps.encode(self.minor)]
        if op == CREATE:
            return self.create(p)
        if op == DESTROY:
            handle = struct.unpack_from("<Q", p)[0]
            entry = self.caches.pop(handle, None)
            if entry is not None and hasattr(entry[0], "close"):
                entry[0].close()
            return []
        if op in MODEL_OPCODES:
            raise KvcError(UNSUPPORTED, f"opcode {op} (the model level): this client serves the operation level only")
        if not HELLO <= op <= RELEASE:
            raise KvcError(UNSUPPORTED, f"unknown opcode {op}")
        obj, cfg = self.cache(p)
        hq, hkv, d, dv = cfg.n_q_heads, cfg.n_kv_heads, cfg.head_dim, cfg.dv
        if op == APPEND:
            seq, layer, n = struct.unpack_from("<III", p, 8)
            q, k, v = self.arrays(p, 24, [(n, hq, d), (n, hkv, d), (n, hkv, dv)])
            out = _as_array(obj.append_attend(seq, layer, q, k, v), np.float32)
            return [self.shaped(out, (n, hq, dv), "append_attend's output")]
        if op == BATCH:
            layer, n_seqs = struct.unpack_from("<II", p, 8)
            ids = np.frombuffer(p, np.uint32, n_seqs, 16)
            offsets = np.frombuffer(p, np.uint32, n_seqs + 1, 16 + 4 * n_seqs)
            total = int(offsets[-1])
            q, k, v = self.arrays(p, 16 + 8 * n_seqs + 4, [(total, hq, d), (total, hkv, d), (total, hkv, dv)])
            out = _as_array(obj.append_attend_batch(layer, ids, offsets, q, k, v), np.float32)
            return [self.shaped(out, (total, hq, dv), "append_attend_batch's output")]
        if op in (READ_KV, READ_SCALES):
            seq, layer, pos, n = struct.unpack_from("<IIII", p, 8)
            method = obj.read_kv if op == READ_KV else obj.read_kv_scales
            k, v = method(seq, layer, pos, n)
            k, v = _as_array(k), _as_array(v)
            what = "read_kv" if op == READ_KV else "read_kv_scales"
            for side, a, dims in (("k", k, d), ("v", v, dv)):
                want = n * hkv * (dims * _DTYPE_BYTES.get(cfg.cache_dtype, 1) if op == READ_KV
                                  else _scale_bytes(cfg, dims))
                if a.nbytes != want:  # a reply of the wrong length would break the connection: say what is wrong
                    raise KvcError(INTERNAL, f"{what} returned {a.nbytes} bytes for {side}, expected {want} "
                                             f"({n} rows x {hkv} KV heads, as stored)")
            return [k, v]
        if op == SEQ_LENGTH:
            seq, layer = struct.unpack_from("<II", p, 8)
            return [struct.pack("<II", int(obj.seq_length(seq, layer)), 0)]
        if op == MEMORY:
            m = obj.memory()
            return [struct.pack("<IIQQQQ", m.block_size, 0, m.live_bytes, m.capacity_bytes, m.pool_bytes,
                                m.workspace_bytes)]
        if op == FORK:
            parent, child = struct.unpack_from("<II", p, 8)
            obj.fork(parent, child)
            return []
        if op == RELEASE:
            obj.release(struct.unpack_from("<I", p, 8)[0])
            return []
        raise KvcError(UNSUPPORTED, f"unknown opcode {op}")

    @staticmethod
    def arrays(p: bytes, offset: int, shapes):
        out = []
        for shape in shapes:
            count = int(np.prod(shape))
            out.append(np.frombuffer(p, np.float32, count, offset).reshape(shape))
            offset += 4 * count
        return out

    @staticmethod
    def shaped(a: np.ndarray, shape, what: str) -> np.ndarray:
        if a.shape != tuple(shape):
            raise KvcError(INTERNAL, f"{what} has shape {a.shape}, expected {tuple(shape)}")
        return a

    def create(self, p: bytes):
        f = struct.unpack_from("<7IfIf4I", p)
        n_scales = f[-1]
        cfg = Config(*f[:13])
        cfg.scale, cfg.rope_theta = np.float32(cfg.scale), np.float32(cfg.rope_theta)
        at, n_windows = 56, 0
        if self.minor >= WHOLE_ABI_MINOR:
            cfg.n_sinks, cfg.evict, cfg.head_dim_v, cfg.rope_dim_begin, cfg.rope_dims, n_windows = \
                struct.unpack_from("<6I", p, 56)
            at = 80
        if n_scales:
            shape = (cfg.n_layers,) if n_scales == cfg.n_layers else (cfg.n_layers, cfg.n_kv_heads)
            cfg.k_scales = np.frombuffer(p, np.float32, n_scales, at).reshape(shape).copy()
            cfg.v_scales = np.frombuffer(p, np.float32, n_scales, at + 4 * n_scales).reshape(shape).copy()
        if n_windows:
            cfg.windows = np.frombuffer(p, np.uint32, n_windows, at + 8 * n_scales).copy()
        obj = self.factory(cfg)
        handle = self.next_handle
        self.next_handle += 1
        self.caches[handle] = (obj, cfg)
        return [struct.pack("<Q", handle)]


def serve(factory: Callable[[Config], object], caps: Caps, name: str = "python-cache", version: str = "0",
          watch_memory: bool = True) -> int:
    """Serves caches made by factory(config) on stdin/stdout until kvcheck closes stdin. Returns the exit status.

    watch_memory: report what Python's allocators hold (tracemalloc, numpy's arrays included) in every reply, so
    that kvcheck's NO-Q watch follows it (docs/protocol.md says what that sees); False reports nothing and leaves that
    half of NO-Q blind, for speed."""
    return _Server(factory, caps, name, version, watch_memory).run()
