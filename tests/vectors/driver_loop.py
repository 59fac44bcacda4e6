#!/usr/bin/env python3
"""The driver loop of tools/python_example/vectors_io.py, tested against `kvcheck grade`: the loop leaves out exactly
the cases grade counts as outside the declaration, turns a library's exception into that case's ERROR, a call the
cache cannot make into a case skipped (an ERROR, never a pass), and a correct cache through it grades PASS.

    driver_loop.py --kvcheck build/bin/kvcheck --example tools/python_example --work DIR CASE

The caches are the numpy example's, changed in one way each. Exit 0 when the case holds.
"""

import io
import json
import os
import sys

import numpy as np

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from vectors_e2e import Case, expect, expect_in, run_named_case, sh, verdict_line  # noqa: E402

EVERY_PROPERTY = "EQUIV,CACHE-CONTENT,APPEND-ONLY,MEMORY,LAYERS,GQA,BATCH,FORK,RELEASE"
ALL_WORDS = ["dtype f32", "dtype f16", "dtype bf16", "rope neox", "rope gptj", "gqa", "chunked", "fork", "release",
             "batch"]


class LoopCase(Case):
    def __init__(self, args):
        super().__init__(args)  # puts the example's directory on sys.path
        import kvcache_example
        import vectors_io

        self.ex, self.io = kvcache_example, vectors_io

    def drive(self, make_cache, declaration, results=None):
        """The loop, in this process; returns (summary, what it said on stderr)."""
        log = io.StringIO()
        results = results or self.results
        try:
            summary = self.io.run(self.vectors, results, make_cache, "loop-test", "1", declaration, log)
        finally:
            print(log.getvalue(), end="")
        return summary, log.getvalue()

    def report(self, want_rc, results=None):
        """grade's JSON report: {case id: case}, [outside_declaration entries], the report."""
        path = os.path.join(self.work, "report.json")
        out = self.grade(want_rc, "--report", path, results=results)
        with open(path) as f:
            r = json.load(f)
        impl = r["implementations"][0]
        return {c["id"]: c for c in impl["cases"]}, impl["outside_declaration"], r, out

    def files(self, case, results=None):
        """Which of the case's two results files exist."""
        base = os.path.join(results or self.results, case["file"])
        return {ext for ext in ("safetensors", "json") if os.path.exists(f"{base}.{ext}")}

    def ids_with(self, pred):
        return [c["id"] for c in self.manifest["cases"] if pred(c)]

    def by_id(self, case_id):
        return next(c for c in self.manifest["cases"] if c["id"] == case_id)


def appends(case):
    return [s for s in case["steps"] if s["op"] in ("append", "append_batch") and s["n_new"] > 0]


# ---- which cases the loop runs -----------------------------------------------------------------------------------


def filter_is_grades(t):
    """A declaration narrower than the export (no bf16, size limits, head_dim multiples; then a q8_0 query): the loop
    runs exactly the cases grade grades and leaves out exactly those grade counts as outside; the cases it runs
    pass, and results an earlier run left for a case now outside are removed, not graded."""
    t.export("--properties", EVERY_PROPERTY, "--cases", "2")
    declaration = {"capabilities": [w for w in ALL_WORDS if w != "dtype bf16"], "pipeline": "f32",
                   "limits": {"max_head_dim": 128, "max_tokens": 140, "max_seqs": 20, "head_dim_multiple": 4,
                              "head_dim_multiple_rope": 16}}
    os.makedirs(t.results)
    for c in t.manifest["cases"]:  # an earlier run's results: none may survive for a case now outside
        for ext in ("safetensors", "json"):
            with open(t.result_path(c, ext), "w") as f:
                f.write("left by an earlier run")
    summary, _ = t.drive(t.ex.KVCache, declaration)
    expect(not summary.skipped and not summary.errors, f"skipped {summary.skipped}, errors {summary.errors}")
    needs = " | ".join(w for ws in summary.outside.values() for w in ws)
    for why in ("dtype bf16", "not a multiple of 4", "not a multiple of 16", "head_dim 256 > 128", "tokens",
                "seqs"):
        expect(why in needs, f"no case was left out for {why!r}: {needs}; export more cases")
    expect(summary.ran, "no case inside the declaration; export more cases")
    for c in t.manifest["cases"]:
        want = set() if c["id"] in summary.outside else {"safetensors", "json"}
        expect(t.files(c) == want, f"{c['id']}: results files {sorted(t.files(c))}, expected {sorted(want)}")
    verdicts, outside, r, _ = t.report(0)
    expect({o["id"] for o in outside} == set(summary.outside), "the loop and grade disagree on what lies outside: "
           f"loop {sorted(summary.outside)}, grade {sorted(o['id'] for o in outside)}")
    expect(all(o["exported"] for o in outside), "an exported case reported as not exported")
    expect(set(verdicts) == set(summary.ran), "grade graded other cases than the loop ran")
    expect(all(v["verdict"] == "PASS" for v in verdicts.values()), "a case the loop ran does not pass")
    expect(not any(v.get("skipped_by_driver") for v in verdicts.values()), "a case inside was skipped")
    with open(os.path.join(t.results, "manifest.json")) as f:
        m = json.load(f)
    expect(m["capabilities"] == declaration["capabilities"] and m["limits"] == declaration["limits"] and
           m["pipeline"] == "f32", f"the results manifest does not declare what the driver declared: {m}")

    q8 = {**declaration, "pipeline": {"q": "q8_0"}}  # head_dim in whole blocks of 32 besides
    results = os.path.join(t.work, "q8_0")
    summary, _ = t.drive(t.ex.KVCache, q8, results=results)
    expect(any("multiple of 32" in " ".join(w) for w in summary.outside.values()), "no case left out for q8_0")
    expect(summary.ran, "no case with head_dim a multiple of 32; export more cases")
    # the example does not round q to q8_0 blocks, so cases may fail: only what lies outside is compared
    rc, _ = sh([t.kvcheck, "grade", "--vectors", t.vectors, "--results", results, "--report", t.work + "/q8.json"])
    expect(rc in (0, 1), f"grade exited {rc}")
    with open(t.work + "/q8.json") as f:
        graded_outside = {o["id"] for o in json.load(f)["implementations"][0]["outside_declaration"]}
    expect(graded_outside == set(summary.outside), f"q8_0: loop {sorted(summary.outside)}, grade "
                                                   f"{sorted(graded_outside)}")


def declaration_refused(t):
    """Before any case runs: a declaration narrower than the export's --caps, an unknown capability word or limit,
    or no pipeline is refused, naming the problem, and nothing is written. The words the loop knows are kvcheck's."""
    caps = os.path.join(t.work, "caps.json")
    with open(caps, "w") as f:
        json.dump({"capabilities": ["dtype f32", "rope neox", "gqa", "chunked", "batch"],
                   "limits": {"max_head_dim": 64, "head_dim_multiple": 8}}, f)
    t.export("--caps", caps, "--properties", "EQUIV,BATCH", "--cases", "2")
    bad = [({"capabilities": ["dtype f32", "rope neox", "gqa", "chunked"], "pipeline": "f32"},
            '"batch": declared by the export, not by the driver'),
           ({"capabilities": ALL_WORDS, "limits": {"max_head_dim": 32}, "pipeline": "f32"},
            "max_head_dim: 64 in the export, 32 in the driver's declaration"),
           ({"capabilities": ALL_WORDS, "limits": {"head_dim_multiple": 16}, "pipeline": "f32"},
            "head_dim_multiple: 8 in the export, 16"),
           ({"capabilities": ALL_WORDS + ["rope neox "], "pipeline": "f32"}, 'unknown word "rope neox "'),
           ({"capabilities": ALL_WORDS, "limits": {"max_head_dims": 64}, "pipeline": "f32"},
            'unknown limit "max_head_dims"'),
           ({"capabilities": ALL_WORDS}, '"pipeline"'),
           ({"capabilities": ALL_WORDS, "pipeline": {"q": "f32", "output ": "f16"}}, 'unknown stage "output "'),
           ({"capabilities": ALL_WORDS, "pipelines": "f32"}, 'unknown field "pipelines"'),
           ({"capabilities": ALL_WORDS, "fixed": {"rope_theta": 10000}, "pipeline": "f32"},
            "fixed rope_theta: none in the export, 10000 in the driver's declaration"),
           ({"capabilities": ALL_WORDS, "fixed": {"rms_eps": 1e-5}, "pipeline": "f32"},
            '"fixed": unknown parameter "rms_eps"'),
           ({"capabilities": ALL_WORDS, "fixed": {"rope_theta": -1}, "pipeline": "f32"},
            '"rope_theta" must be a finite number > 0')]
    for declaration, message in bad:
        try:
            t.drive(t.ex.KVCache, declaration)
            raise AssertionError(f"accepted {declaration}")
        except t.io.BadInput as e:
            expect(message in str(e), f"{declaration}: the message does not say {message!r}: {e}")
        expect(not os.path.exists(t.results) or not os.listdir(t.results), f"{declaration}: files were written")
    summary, _ = t.drive(t.ex.KVCache, {"capabilities": ALL_WORDS, "pipeline": "f32"})  # more than the export
    expect(len(summary.ran) == len(t.manifest["cases"]), "a declaration wider than the export's runs every case")
    t.grade(0)
    # kvcheck names the words it knows when it refuses one: the same list as the loop's
    with open(caps, "w") as f:
        json.dump({"capabilities": ["no such word"]}, f)
    rc, out = sh([t.kvcheck, "export", "--caps", caps, "--out", os.path.join(t.work, "x")])
    expect(rc == 2 and "(known: " in out, f"export exited {rc}")
    known = out.split("(known: ")[1].split(")")[0].split(", ")
    expect(known == t.io.CAPABILITY_WORDS, f"kvcheck knows {known}, the loop {t.io.CAPABILITY_WORDS}")


def fixed_parameters(t):
    """A library that hard-codes its RoPE base and softmax scale declares them ("fixed"): export draws every case with
    them, the loop accepts the declaration and carries it into the results, and grade grades every case."""
    caps = os.path.join(t.work, "caps.json")
    fixed = {"rope_theta": 500000, "softmax_scale": "1/sqrt(head_dim)"}
    with open(caps, "w") as f:
        json.dump({"capabilities": ["dtype f32", "rope neox", "rope gptj", "gqa", "chunked"], "fixed": fixed}, f)
    t.export("--caps", caps, "--properties", "EQUIV,CACHE-CONTENT", "--cases", "4")
    roped = [c for c in t.manifest["cases"] if c["config"]["rope"] != "none"]
    expect(roped and all(c["config"]["rope_theta"] == 500000 for c in roped), "a case drawn with another RoPE base")
    summary, _ = t.drive(t.ex.KVCache, {"capabilities": ALL_WORDS, "fixed": fixed, "pipeline": "f32"})
    expect(len(summary.ran) == len(t.manifest["cases"]), "the loop left out a case drawn with the fixed values")
    with open(os.path.join(t.results, "manifest.json")) as f:
        expect(json.load(f).get("fixed") == fixed, "the results manifest does not carry the fixed values")
    t.grade(0)


# ---- what a library's failure becomes ----------------------------------------------------------------------------


def error_record(t):
    """A call that raises, a constructor that raises, a dump of the wrong dtype: each is that case's error record
    (<file>.json with "error", no safetensors), the loop goes on, and grade makes it an ERROR; the rest pass."""
    t.export("--properties", "EQUIV,CACHE-CONTENT", "--dtypes", "f16", "--cases", "4")
    raising = t.case(lambda c: len(appends(c)) >= 2)["id"]
    constructor = t.case(lambda c: c["id"] != raising)["id"]
    wrong_dtype = t.case(lambda c: c["id"] not in (raising, constructor) and appends(c))["id"]

    class Broken(t.ex.KVCache):
        def __init__(self, cfg, case_id):
            if case_id == constructor:
                raise MemoryError("cannot allocate the cache")
            super().__init__(cfg)
            self.case_id, self.calls = case_id, 0

        def append_attend(self, seq, layer, q, k, v):
            self.calls += 1
            if self.case_id == raising and self.calls == 2:
                raise RuntimeError("the library refused this call")
            return super().append_attend(seq, layer, q, k, v)

        def dump(self, seq, layer):
            k, v = super().dump(seq, layer)
            return (k.astype(np.float32), v) if self.case_id == wrong_dtype else (k, v)

    ids = iter([c["id"] for c in t.manifest["cases"]])  # make_cache is called once per case, in the manifest's order
    summary, said = t.drive(lambda cfg: Broken(cfg, next(ids)), {"capabilities": ALL_WORDS, "pipeline": "f32"})
    broken = {raising, constructor, wrong_dtype}
    expect(set(summary.errors) == broken, f"errors {sorted(summary.errors)}, expected {sorted(broken)}")
    expect(not summary.skipped and len(summary.ran) == len(t.manifest["cases"]) - 3, "the loop did not go on")
    expect_in(said, f"{raising}: ERROR: step", "RuntimeError: the library refused this call",
              f"{constructor}: ERROR: the cache's constructor: MemoryError", f"{wrong_dtype}: ERROR: step",
              "TypeError: k is float32; the F16 tensor takes float16")
    for case_id in broken:
        c = t.by_id(case_id)
        expect(t.files(c) == {"json"}, f"{case_id}: files {t.files(c)}")
        with open(t.result_path(c, "json")) as f:
            record = json.load(f)
        expect(record["case"] == case_id and set(record["error"]) == {"step", "call", "message"}, f"{record}")
    with open(t.result_path(t.by_id(raising), "json")) as f:
        err = json.load(f)["error"]
    second = appends(t.by_id(raising))[1]
    expect(err["step"] == second["step"] and err["call"].startswith("append_attend(seq"), f"{err}")
    verdicts, _, _, out = t.report(1)
    for case_id, v in verdicts.items():
        want = "ERROR" if case_id in broken else "PASS"
        expect(v["verdict"] == want, f"{case_id} is {v['verdict']}, expected {want}")
        expect(not v.get("skipped_by_driver"), f"{case_id}: an error reported as a skip")
    # grade's reason is what the library said, where: not only that the outputs are missing
    expect_in(verdicts[raising]["reason"], "the driver recorded an error at step",
              "RuntimeError: the library refused this call")
    expect_in(verdicts[constructor]["reason"], "MemoryError: cannot allocate the cache")


def unsupported_calls(t):
    """A cache without fork() on vectors with fork steps, a cache that raises Unsupported, and a step this loop does
    not know: each case is skipped, said on stderr, with no files; grade makes each an ERROR the driver skipped
    (never a pass), while the other cases pass."""
    t.export("--properties", "EQUIV,FORK", "--cases", "3")

    class NoFork(t.ex.KVCache):
        fork = None  # the library has no fork

        def __init__(self, cfg):
            if cfg["head_dim"] > 128:
                raise t.io.Unsupported(f"head_dim {cfg['head_dim']}: this library stops at 128")
            super().__init__(cfg)

    summary, said = t.drive(NoFork, {"capabilities": ALL_WORDS, "pipeline": "f32"})
    forks = set(t.ids_with(lambda c: any(s["op"] == "fork" for s in c["steps"])))
    wide = set(t.ids_with(lambda c: c["config"]["head_dim"] > 128))
    expect(forks and wide, "no fork step or no head_dim over 128; export more cases")
    expect(set(summary.skipped) == forks | wide, f"skipped {sorted(summary.skipped)}, expected {sorted(forks | wide)}")
    expect(not summary.errors and not summary.outside, f"errors {summary.errors}, outside {summary.outside}")
    for case_id in forks - wide:
        expect_in(said, f"{case_id}: SKIPPED by the driver (grade: ERROR): the cache has no fork()")
    for case_id in wide:
        expect_in(said, f"{case_id}: SKIPPED by the driver (grade: ERROR): head_dim")
    for case_id in forks | wide:
        expect(not t.files(t.by_id(case_id)), f"{case_id} has results files")
    verdicts, _, _, out = t.report(1)
    for case_id, v in verdicts.items():
        skipped = case_id in forks | wide
        expect(v["verdict"] == ("ERROR" if skipped else "PASS"), f"{case_id} is {v['verdict']}")
        expect(bool(v.get("skipped_by_driver")) == skipped, f"{case_id}: skipped_by_driver")
        if skipped:
            expect_in(verdict_line(out, case_id), "the driver skipped it")
    expect_in(out, f"the driver wrote no results for {len(forks | wide)} cases inside its declaration")

    c = json.loads(json.dumps(t.case(lambda c: c["id"] not in forks | wide)))  # a step of a later format
    c["steps"].insert(0, {"op": "evict", "step": 0, "seq": 0})
    what, why = t.io.run_case(t.vectors, t.results, c, t.ex.KVCache)
    expect(what == "skipped" and 'op "evict" is not one this loop knows' in why, f"{what}: {why}")
    expect(not t.files(c), "a case with an unknown step left results files")


# ---- a correct cache through the loop ----------------------------------------------------------------------------


def correct_batched(t):
    """A correct cache with a batched kernel, whose dumps are views of its storage (released rows are written
    over): through the loop every case of the properties that batch, fork and release, or count bytes, passes,
    and the batched kernel served every batch step."""
    t.export("--properties", "BATCH,FORK,MEMORY", "--cases", "2")

    class Batched(t.ex.KVCache):
        batches = 0

        def append_attend_batch(self, layer, seqs, offsets, q, k, v):
            Batched.batches += 1
            out = np.empty(q.shape, np.float32)
            for j, seq in enumerate(seqs):
                b, e = offsets[j], offsets[j + 1]
                out[b:e] = self.append_attend(seq, layer, q[b:e], k[b:e], v[b:e])
            return out

        def dump(self, seq, layer):
            key = self._stream(seq, layer)
            n = self.length[key]
            return self.k[key][:n], self.v[key][:n]  # views: the loop must copy them

    summary, _ = t.drive(Batched, {"capabilities": ALL_WORDS, "pipeline": "f32"})
    n_batch = sum(s["op"] == "append_batch" for c in t.manifest["cases"] for s in c["steps"])
    expect(n_batch > 0 and Batched.batches == n_batch, f"{Batched.batches} batched calls for {n_batch} batch steps")
    expect(len(summary.ran) == len(t.manifest["cases"]), f"not every case ran: {summary.line('loop', t.results)}")
    verdicts, outside, r, _ = t.report(0)
    expect(not outside and len(verdicts) == len(t.manifest["cases"]), "a case was not graded")
    expect(all(v["verdict"] == "PASS" for v in verdicts.values()), "a case did not pass")


CASES = {f.__name__: f for f in [filter_is_grades, declaration_refused, fixed_parameters, error_record,
                                 unsupported_calls, correct_batched]}


def main():
    return run_named_case(CASES, LoopCase)


if __name__ == "__main__":
    sys.exit(main())
