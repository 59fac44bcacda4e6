#!/usr/bin/env python3
"""End-to-end cases of `kvcheck export | grade` on quantized caches (fp8, int8_token, q8_0), with quant_driver.py
as the implementation: a numpy cache whose quantizer (quant_np.py) shares no code with kvcheck's.

    quant_e2e.py --kvcheck build/bin/kvcheck --example tools/python_example --work DIR CASE

A correct driver must grade CONFORMANT; each broken one (or results broken after the fact) must grade NOT
CONFORMANT naming the property and the problem. Exit 0 when the case holds.
"""

import json
import os
import sys

import numpy as np

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from vectors_e2e import Case, expect, expect_in, run_named_case, sh, summary_line, verdict_line  # noqa: E402

QUANT = "fp8_e4m3,fp8_e5m2,int8_token,q8_0"


class QuantCase(Case):
    def run_driver(self, *extra, results=None):
        rc, _ = sh([sys.executable, "-B", os.path.join(HERE, "quant_driver.py"), "--example", self.example,
                    "--vectors", self.vectors, "--results", results or self.results, *extra])
        expect(rc == 0, f"the driver exited {rc}")

    def caps(self, words, pipeline=None):
        path = os.path.join(self.work, "caps.json")
        with open(path, "w") as f:
            json.dump({"capabilities": words, **({"pipeline": pipeline} if pipeline else {})}, f)
        return path

    def appends(self, c):
        return [s for s in c["steps"] if s["op"] in ("append", "append_batch") and s["n_new"] > 0]


def counts(out, verdict):
    """How many cases the summary line ("summary: 3 FAIL 25 PASS  => ...") gives the verdict."""
    words = summary_line(out).split("=>")[0].split()
    return sum(int(words[i - 1]) for i, w in enumerate(words) if w == verdict)


# ---- a correct cache ---------------------------------------------------------------------------------------------


def roundtrip(t):
    """Every quantized dtype and property the offline route grades: a correct cache is CONFORMANT, its stored codes
    and scales are the export's expected ones, and the files carry what a driver needs to make them."""
    t.export("--dtypes", QUANT, "--properties", "EQUIV,CACHE-CONTENT,APPEND-ONLY,MEMORY,FORK,RELEASE,BATCH",
             "--cases", "4")
    cases = t.manifest["cases"]
    expect(len(cases) == 28, f"{len(cases)} cases exported, not 28")
    expect({c["config"]["dtype"] for c in cases} == set(QUANT.split(",")), "every quantized dtype is drawn")
    t.run_driver()
    out = t.grade(0)
    expect(counts(out, "PASS") + counts(out, "QUALITY_WARNING") == 28, "every case passes: " + summary_line(out))
    checked = 0
    for c in cases:
        cfg = c["config"]
        expect(cfg["codes_dtype"] == {"fp8_e4m3": "F8_E4M3", "fp8_e5m2": "F8_E5M2"}.get(cfg["dtype"], "I8"), "codes")
        if cfg["dtype"].startswith("fp8"):
            n = {"none": 0, "tensor": cfg["n_layers"], "kv_head": cfg["n_layers"] * cfg["n_kv_heads"]}
            expect(len(cfg["k_scales_bits"]) == len(cfg["v_scales"]) == n[cfg["kv_scale_mode"]], "fp8 scales")
            expect(c["case"]["config"].get("k_scales", []) == cfg["k_scales"], "the case carries the same scales")
        with open(os.path.join(t.vectors, c["expected_json"])) as f:
            expect(json.load(f)["quantization"]["codes_dtype"] == cfg["codes_dtype"], "expected json")
        if cfg["rope"] != "none":  # the driver rotates in float64, the export in long double: codes may differ
            continue
        expected, dtypes, _ = t.st.read(os.path.join(t.vectors, c["expected"]))
        got, _, _ = t.st.read(t.result_path(c))
        for s in t.appends(c):
            if s["op"] != "append":
                continue
            i, b, e = s["step"], s["pos_begin"], s["pos_end"]
            for name in (f"step{i}.k", f"step{i}.v", f"step{i}.k.scales", f"step{i}.v.scales"):
                want = expected[name]
                expect(dtypes[name] == (cfg["codes_dtype"] if not name.endswith("scales") else cfg["scales_dtype"]),
                       f"{name}: {dtypes[name]}")
                have = got[name][b:e]
                expect(np.array_equal(want.view(np.uint8), np.ascontiguousarray(have).view(np.uint8)),
                       f"{c['id']} {name}: the export's expected bytes and the numpy quantizer's differ")
                checked += 1
    expect(checked > 0, "no append step was compared")


def caps_q_rounding(t):
    """A declaration with quantized dtypes, scale forms and a q rounded to q8_0 blocks: cases are drawn inside it
    (head_dim a multiple of 32), graded with q rounded exactly; the same outputs declared f32 fail EQUIV."""
    caps = t.caps(["dtype fp8_e4m3", "fp8 scale per kv head", "dtype q8_0", "rope neox", "gqa", "chunked"],
                  {"q": "q8_0"})
    t.export("--caps", caps, "--dtypes", "fp8_e4m3,q8_0", "--properties", "EQUIV,CACHE-CONTENT", "--cases", "4")
    m = t.manifest
    expect("fp8 scale per kv head" in m["declared"]["capabilities"], "the manifest echoes the declaration")
    for c in m["cases"]:
        cfg = c["config"]
        expect(cfg["head_dim"] % 32 == 0, f"{c['id']}: head_dim {cfg['head_dim']} with a q8_0 query")
        expect(cfg.get("kv_scale_mode", "none") in ("none", "kv_head"), f"{c['id']}: an undeclared scale form")
    t.run_driver("--q-rounding", "q8_0")
    out = t.grade(0)
    expect_in(out, "pipeline q=q8_0")
    undeclared = os.path.join(t.work, "undeclared")
    t.run_driver("--q-rounding", "q8_0", "--pipeline", "f32", results=undeclared)
    out = t.grade(1, results=undeclared)
    # a query that sees one row outputs that row whatever q is: only cases with longer histories can fail
    failed = [c for c in m["cases"] if "FAIL" in verdict_line(out, c["id"]).split()]
    expect(failed and all(c["property"] == "EQUIV" for c in failed), "EQUIV, and only EQUIV, fails")
    for c in failed:
        expect_in(verdict_line(out, c["id"]), "EQUIV: ", "of pipeline f32")


# ---- broken caches -----------------------------------------------------------------------------------------------


def code_off_by_one(t):
    t.export("--dtypes", QUANT, "--properties", "CACHE-CONTENT", "--cases", "6")
    t.run_driver("--bug", "code-off-by-one")
    out = t.grade(1)
    for c in t.manifest["cases"]:
        if t.appends(c):
            expect_in(verdict_line(out, c["id"]), "FAIL", "CACHE-CONTENT: dumped v",
                      "differs from the reference quantizer's", "position 0")


def k_scale_for_v(t):
    caps = t.caps(["dtype fp8_e4m3", "dtype fp8_e5m2", "fp8 scale per tensor", "fp8 scale per kv head", "rope neox",
                   "rope gptj", "gqa", "chunked"])
    t.export("--caps", caps, "--dtypes", "fp8_e4m3,fp8_e5m2", "--properties", "CACHE-CONTENT", "--cases", "8")
    t.run_driver("--bug", "k-scale-for-v")
    out = t.grade(1)
    scaled = [c for c in t.manifest["cases"] if c["config"]["kv_scale_mode"] != "none" and t.appends(c)]
    expect(scaled, "no case with fp8 scales; export more cases")
    for c in t.manifest["cases"]:
        line = verdict_line(out, c["id"])
        if c in scaled:
            expect_in(line, "FAIL", "CACHE-CONTENT: dumped v scale")
        else:  # every scale is 1: K's is V's
            expect_in(line, "PASS")


def scale_rewritten(t):
    """A scale of a row dumped earlier, changed in a later dump: APPEND-ONLY names the scale."""
    t.export("--dtypes", "int8_token,q8_0", "--properties", "APPEND-ONLY", "--cases", "6")
    t.run_driver()
    c = next(c for c in t.manifest["cases"] if any(s["op"] == "append" and s["pos_begin"] > 0 for s in c["steps"]))
    s = next(s for s in c["steps"] if s["op"] == "append" and s["pos_begin"] > 0)
    tensors, dtypes, meta = t.st.read(t.result_path(c))
    name = s["dump"]["k_scales"]
    rewritten = []
    for n, a in tensors.items():
        if n == name:
            a = a.copy()
            a.reshape(a.shape[0], -1)[0, 0] *= 2  # row 0 was dumped by an earlier step
        rewritten.append((n, dtypes[n], a))
    t.st.write(t.result_path(c), rewritten, meta)
    out = t.grade(1)
    expect_in(verdict_line(out, c["id"]), "FAIL", "APPEND-ONLY: a row dumped earlier changed",
              "(a stored scale changed)", f"[step {s['step']}]")


def memory_scales(t):
    t.export("--dtypes", "int8_token,q8_0", "--properties", "MEMORY", "--cases", "4")
    t.run_driver("--bug", "scales-uncounted")
    out = t.grade(1)
    for c in t.manifest["cases"]:
        if t.appends(c):
            expect_in(verdict_line(out, c["id"]), "FAIL", "MEMORY: reported live bytes differ")


def attend_unquantized(t):
    """Codes stored right, but the rows attended are the ones before quantization: EQUIV grades over the
    dequantized rows and fails it."""
    t.export("--dtypes", QUANT, "--properties", "EQUIV", "--cases", "6")
    t.run_driver("--bug", "attend-unquantized")
    out = t.grade(1)
    expect(counts(out, "FAIL") >= 4, "most cases fail: " + summary_line(out))
    c = next(c for c in t.manifest["cases"] if t.appends(c))
    expect_in(verdict_line(out, c["id"]), "FAIL", "EQUIV: ")


# ---- malformed results: ERROR with the tensor named --------------------------------------------------------------


def bad_tensors(t):
    t.export("--dtypes", "int8_token,fp8_e4m3", "--properties", "CACHE-CONTENT", "--cases", "12")
    t.run_driver()
    fp8 = next(c for c in t.manifest["cases"] if c["config"]["dtype"] == "fp8_e4m3" and t.appends(c))
    int8 = next(c for c in t.manifest["cases"] if c["config"]["dtype"] == "int8_token" and t.appends(c))
    s8, si = t.appends(fp8)[0], t.appends(int8)[0]
    k8 = s8["dump"]["k"] if "dump" in s8 else s8["slices"][0]["dump"]["k"]
    ki = si["dump"]["k"] if "dump" in si else si["slices"][0]["dump"]["k"]

    def edit(c, fn):
        tensors, dtypes, meta = t.st.read(t.result_path(c))
        t.st.write(t.result_path(c), [x for n, a in tensors.items() for x in fn(n, dtypes[n], a)], meta)

    edit(fp8, lambda n, d, a: [(n, "U8" if n == k8 else d, a)])  # fp8 codes without their dtype
    edit(int8, lambda n, d, a: [] if n == ki + ".scales" else [(n, d, a)])
    out = t.grade(1)
    expect_in(verdict_line(out, fp8["id"]), "ERROR", f'tensor "{k8}" is U8, expected F8_E4M3')
    expect_in(verdict_line(out, int8["id"]), "ERROR", f'tensor "{ki}.scales" is missing')
    rc, text = sh([t.kvcheck, "export", "--out", os.path.join(t.work, "x"), "--dtypes", "fp9"])
    expect(rc == 2 and "unknown dtype" in text, "an unknown dtype is exit 2")


CASES = {f.__name__: f for f in [roundtrip, caps_q_rounding, code_off_by_one, k_scale_for_v, scale_rewritten,
                                 memory_scales, attend_unquantized, bad_tensors]}


def main():
    return run_named_case(CASES, QuantCase)


if __name__ == "__main__":
    sys.exit(main())
