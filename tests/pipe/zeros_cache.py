#!/usr/bin/env python3
"""A cache that stores nothing and attends to nothing (outputs zeros): what the Python client itself costs per call,
for pipe_call_bench. Not conformant, not meant to be."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "python_client"))
import kvcheck_client as kvc  # noqa: E402


class Zeros:
    def __init__(self, cfg):
        self.cfg = cfg

    def append_attend(self, seq, layer, q, k, v):
        return np.zeros(q.shape, np.float32)

    def append_attend_batch(self, layer, seq_ids, offsets, q, k, v):
        return np.zeros(q.shape, np.float32)

    def memory(self):
        return kvc.Memory(1, 0, 0, 0)


if __name__ == "__main__":
    watch = "--no-memory-watch" not in sys.argv
    sys.exit(kvc.serve(Zeros, kvc.Caps(features=["gqa", "chunked", "batch"]), name="zeros", watch_memory=watch))
