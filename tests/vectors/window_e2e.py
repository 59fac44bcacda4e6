#!/usr/bin/env python3
"""End-to-end cases of `kvcheck export | grade` on windowed, sink and latent (MLA, partial-rotary) caches, with
window_driver.py as the implementation: a numpy cache that reads the windows, sinks, head_dim_v and RoPE range from
each case's config (docs/windowed-caches.md).

    window_e2e.py --kvcheck build/bin/kvcheck --example tools/python_example --work DIR CASE

A correct driver must grade CONFORMANT; each broken one must grade NOT CONFORMANT naming what it does wrong; files
that declare or describe what the vectors route cannot judge are exit 2. Every export uses the fixed seed SEED.
Exit 0 when the case holds.
"""

import json
import os
import sys

import numpy as np

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from vectors_e2e import Case, expect, expect_in, run_named_case, sh, summary_line, verdict_line  # noqa: E402

SEED = "20261207"
WORDS = ["dtype f32", "dtype f16", "dtype bf16", "rope neox", "rope gptj", "gqa", "chunked", "fork", "release",
         "batch", "window", "sinks", "head_dim_v", "rope_range"]
EVERY_PROPERTY = "EQUIV,CACHE-CONTENT,APPEND-ONLY,MEMORY,LAYERS,GQA,BATCH,FORK,RELEASE"


class WindowCase(Case):
    def export_caps(self, properties, cases, words=WORDS, limits=None):
        path = os.path.join(self.work, "caps.json")
        with open(path, "w") as f:
            json.dump({"capabilities": words, "limits": limits or {}, "pipeline": "f32"}, f)
        print(f"seed {SEED}")
        self.export("--caps", path, "--seed", SEED, "--properties", properties, "--cases", str(cases))

    def run_driver(self, *extra, want_rc=0):
        rc, out = sh([sys.executable, "-B", os.path.join(HERE, "window_driver.py"), "--example", self.example,
                      "--vectors", self.vectors, "--results", self.results, *extra])
        expect(rc == want_rc, f"the driver exited {rc}, expected {want_rc}")
        return out

    def ids(self, pred):
        return [c["id"] for c in self.manifest["cases"] if pred(c["config"])]

    def edit_manifest(self, edit):
        path = os.path.join(self.vectors, "manifest.json")
        with open(path) as f:
            m = json.load(f)
        edit(m)
        with open(path, "w") as f:
            json.dump(m, f)


def windowed(cfg):
    return any(cfg.get("windows") or [])


def latent(cfg):
    return "head_dim_v" in cfg


def ranged(cfg):
    return "rope_dims" in cfg


def slices(case):
    """Every (append step or batch slice) of the case that appends rows, with its n_new and pos_end."""
    return [a for s in case["steps"] if s["op"] in ("append", "append_batch") for a in s.get("slices", [s])
            if a["n_new"] > 0]


def case_ids(t, pred):
    return {c["id"] for c in t.manifest["cases"] if pred(c)}


def failing(out):
    return [l.split()[0] for l in out.splitlines() if l.startswith("  ") and len(l.split()) > 1
            and l.split()[1] == "FAIL"]


# ---- a correct cache ---------------------------------------------------------------------------------------------


def roundtrip(t):
    """Every offline property with windows, sinks, head_dim_v and RoPE ranges declared: they are drawn, the files
    carry them (V and outputs sized by head_dim_v), and a correct cache is CONFORMANT."""
    t.export_caps(EVERY_PROPERTY, 6)
    cases = t.manifest["cases"]
    for what, pred in (("a window", windowed), ("sinks", lambda c: windowed(c) and c["sinks"] > 0),
                       ("head_dim_v", latent), ("a RoPE range", ranged)):
        expect(t.ids(pred), f"no exported case has {what}")
    expect(not any(c["config"].get("evict") for c in cases), "an exported case evicts")
    for c in cases:
        cfg = c["config"]
        words = set(c["requires"])
        expect(windowed(cfg) == ("window" in words) and latent(cfg) == ("head_dim_v" in words)
               and ranged(cfg) == ("rope_range" in words), f"{c['id']}: requires {sorted(words)} vs its config")
    c = next(c for c in cases if latent(c["config"]))
    cfg = c["config"]
    tensors, _, _ = t.st.read(os.path.join(t.vectors, c["inputs"]))
    expected, _, _ = t.st.read(os.path.join(t.vectors, c["expected"]))
    s = next(s for s in c["steps"] if s["op"] == "append" and s["n_new"] > 0)
    n = s["n_new"]
    expect(tensors[f"step{s['step']}.k"].shape == (n, cfg["n_kv_heads"], cfg["head_dim"]), "K inputs of head_dim")
    expect(tensors[f"step{s['step']}.v"].shape == (n, cfg["n_kv_heads"], cfg["head_dim_v"]), "V inputs of head_dim_v")
    expect(expected[f"step{s['step']}.out"].shape == (n, cfg["n_q_heads"], cfg["head_dim_v"]),
           "expected outputs of head_dim_v")
    t.run_driver()
    out = t.grade(0)
    words = summary_line(out).split("=>")[0].split()
    passed = sum(int(words[i - 1]) for i, w in enumerate(words) if w in ("PASS", "QUALITY_WARNING"))
    expect(passed == len(cases), "every exported case passes: " + summary_line(out))


# ---- broken caches -----------------------------------------------------------------------------------------------


def window_plus_one(t):
    """A query that sees W + 1 keys fails EQUIV in every windowed case, and the reason names the window."""
    t.export_caps("EQUIV", 12)
    t.run_driver("--bug", "window-plus-one")
    out = t.grade(1)
    fails = failing(out)
    expect(fails, "no case fails")
    expect(set(fails) <= set(t.ids(windowed)), f"a case without a window fails: {fails}")
    for case_id in fails:
        expect_in(verdict_line(out, case_id), "EQUIV: ", "the outputs match a window of")
    expect(any("outside its window of" in verdict_line(out, i) for i in fails), "no reason names the key outside")


def v_from_k(t):
    """V rows read from the call's v with K's row stride fail CACHE-CONTENT in every latent case, named."""
    t.export_caps("CACHE-CONTENT", 12)
    t.run_driver("--bug", "v-from-k")
    out = t.grade(1)
    fails = failing(out)
    # a call of one head row reads the same values with either stride: every latent case with a longer call fails
    want = case_ids(t, lambda c: latent(c["config"]) and any(
        a["n_new"] * c["config"]["n_kv_heads"] > 1 for a in slices(c)))
    expect(set(fails) == want and fails, f"failing {fails}, latent with a call of several head rows {sorted(want)}")
    for case_id in fails:
        expect_in(verdict_line(out, case_id), "CACHE-CONTENT: dumped v differs", "the V head dim taken from K's")


def rope_all(t):
    """RoPE over every dim of the head when a range is declared fails CACHE-CONTENT, named."""
    t.export_caps("CACHE-CONTENT", 12)
    t.run_driver("--bug", "rope-all")
    out = t.grade(1)
    fails = failing(out)
    # RoPE at position 0 turns nothing: every ranged case with a row at a later position fails
    want = case_ids(t, lambda c: ranged(c["config"]) and any(a["pos_end"] > 1 for a in slices(c)))
    expect(set(fails) == want and fails, f"failing {fails}, ranged with a row past position 0 {sorted(want)}")
    for case_id in fails:
        expect_in(verdict_line(out, case_id), "CACHE-CONTENT: dumped k differs",
                  "RoPE over all dims when a range is declared")


# ---- limits, and what the vectors route refuses ------------------------------------------------------------------


def limits_filter(t):
    """Declared limits on windows, sinks and head_dim_v: export draws inside them; a driver declaring smaller ones
    (its vectors exported without a declaration) leaves out exactly the cases grade counts as outside."""
    t.export_caps("EQUIV,MEMORY", 10, limits={"max_window": 24, "max_sinks": 4, "max_head_dim_v": 64,
                                              "max_head_dim": 128})
    cases = t.manifest["cases"]
    expect(all(max(c["config"].get("windows") or [0]) <= 24 and c["config"].get("sinks", 0) <= 4
               and c["config"].get("head_dim_v", 0) <= 64 for c in cases), "a case outside the declared limits")
    expect(t.ids(windowed) and t.ids(latent), "windows and head_dim_v are still drawn")
    t.edit_manifest(lambda m: m.pop("declared"))
    small = {"max_window": 8, "max_head_dim_v": 16}
    out = t.run_driver("--declare", json.dumps({"limits": small}))
    report = os.path.join(t.work, "report.json")
    graded = t.grade(0, "--report", report)
    with open(report) as f:
        r = json.load(f)
    outside = {o["id"] for o in r["implementations"][0]["outside_declaration"]}
    want = {c["id"] for c in cases if max(c["config"].get("windows") or [0]) > 8
            or c["config"].get("head_dim_v", 0) > 16}
    expect(outside == want and want, f"grade's outside {sorted(outside)}, by the limits {sorted(want)}")
    expect_in(graded, "window ", " > 8")
    expect(f"{len(want)} outside the declaration" in out, "the driver leaves out the same cases")


def evict_refused(t):
    """"evict" is refused by the export, by grade in a results manifest and by the driver loop, each saying why."""
    path = os.path.join(t.work, "caps.json")
    with open(path, "w") as f:
        json.dump({"capabilities": WORDS + ["evict"], "pipeline": "f32"}, f)
    rc, out = sh([t.kvcheck, "export", "--out", t.vectors, "--caps", path])
    expect(rc == 2, f"export exited {rc}")
    expect_in(out, '"evict" is not supported on the vectors route', "--plugin")
    t.export_caps("EQUIV", 2)
    out = t.run_driver("--declare", json.dumps({"capabilities": WORDS + ["evict"]}), want_rc=2)
    expect_in(out, '"evict" is not supported on the vectors route')
    t.run_driver()
    m = os.path.join(t.results, "manifest.json")
    with open(m) as f:
        j = json.load(f)
    j["capabilities"].append("evict")
    with open(m, "w") as f:
        json.dump(j, f)
    expect_in(t.grade(2), "results/manifest.json", '"evict" is not supported on the vectors route')


def edit_case(t, pred, edit):
    """Edits the first case whose config fits pred: its "case" JSON, and its "config" alike."""

    def change(m):
        c = next(c for c in m["cases"] if pred(c["config"]))
        edit(c["case"]["config"])
        edit(c["config"])

    t.edit_manifest(change)


def window_over_max(t):
    """A vectors manifest whose case lies outside its own declaration (a window over max_window) is exit 2."""
    t.export_caps("EQUIV", 6, limits={"max_window": 32})
    t.run_driver()
    t.edit_manifest(lambda m: m["declared"]["limits"].update({"max_window": 1}))
    c = next(c for c in t.manifest["cases"] if windowed(c["config"]) and max(c["config"]["windows"]) > 1)
    expect_in(t.grade(2), f"case {c['id']}: lies outside the manifest's own \"declared\" (needs window",
              "> 1")


def evict_case(t):
    """A case that lets the cache evict, written into a manifest by hand, is exit 2: grade cannot judge it."""
    t.export_caps("EQUIV", 6)
    t.run_driver()
    edit_case(t, windowed, lambda cfg: cfg.update({"evict": True}))
    expect_in(t.grade(2), '"evict": true', "does not judge")


def head_dim_v_absurd(t):
    """A case with an absurd head_dim_v is exit 2, naming the field."""
    t.export_caps("EQUIV", 6)
    t.run_driver()
    edit_case(t, latent, lambda cfg: cfg.update({"head_dim_v": 100000}))
    expect_in(t.grade(2), 'field "case": case: head_dim_v must be 1 .. 8192')


CASES = {f.__name__: f for f in [roundtrip, window_plus_one, v_from_k, rope_all, limits_filter, evict_refused,
                                 window_over_max, evict_case, head_dim_v_absurd]}


def main():
    return run_named_case(CASES, WindowCase)


if __name__ == "__main__":
    sys.exit(main())
