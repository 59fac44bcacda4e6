"""Serve a KV cache written in Python to kvcheck over its pipe protocol (docs/protocol.md, docs/python.md).

    import kvcheck_client as kvc

    def make(config):                 # config: kvc.Config, the ABI's kvc_config
        return MyCache(config)        # append_attend, read_kv, seq_length, memory, [fork, release, ...]

    if __name__ == "__main__":
        kvc.serve(make, kvc.Caps(dtypes=["f32"], features=["gqa", "chunked"]), name="my-cache")

and then: kvcheck validate --connect 'python3 my_cache.py'
"""

from .protocol import (EVICTED, INTERNAL, INVALID_ARGUMENT, OUT_OF_MEMORY, UNSUPPORTED, Caps, Config, KvcError, Memory,
                       serve)

__all__ = ["Caps", "Config", "KvcError", "Memory", "serve", "INVALID_ARGUMENT", "UNSUPPORTED", "OUT_OF_MEMORY",
           "INTERNAL", "EVICTED"]
