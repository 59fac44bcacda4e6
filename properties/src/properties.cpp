// The property table. Each entry: a generator (generators.hpp) and a check built from the session's checks
// (session.hpp). Keep IDs stable: reports, replay files and users' CI refer to them.
#include "kvcheck/properties/properties.hpp"

#include "generators.hpp"
#include "kvcheck/abi.hpp"
#include "kvcheck/properties/device_watch.hpp"
#include "kvcheck/properties/heap.hpp"
#include "kvcheck/properties/session.hpp"
#include "q_store_probe.hpp"

#include <cmath>
#include <cstring>
#include <sstream>

namespace kvc::prop {

namespace {

using gens::ConfigSpace;
using gens::ScriptSpace;

bool allows(const kvc_caps& c, uint32_t bit) { return (c.features & bit) != 0; }

Outcome outcome_of(const RunResult& r) {
    Outcome o;
    o.headroom = r.headroom;
    o.fails_f32_class = r.fails_f32_class;
    o.quant_loss = r.quant_loss;
    o.graded_by = r.graded_by;
    if (r.quant_loss >= 0) {
        std::ostringstream m;
        m.precision(3);
        m << "quantization loss (informative, not graded): the outputs differ from attention over the unquantized "
             "rows by up to "
          << r.quant_loss << " relative to max|v|";
        o.notes.push_back(m.str());
    }
    if (!r.watch_not_run.empty()) {
        o.not_run = "the device-memory watch could not run, so this DEVICE cache's allocations were not held against "
                    "its reports: " + r.watch_not_run;
        o.notes.push_back("NOT RUN: " + o.not_run);
    }
    return o;
}

// A property that is one run of the session with a set of checks.
std::function<Outcome(const Target&, const Case&)> single_run(Checks checks) {
    return [checks](const Target& t, const Case& c) { return outcome_of(run_script(t, c, checks)); };
}

Checks named(const char* id) {
    Checks c;
    c.property = id;
    return c;
}

// NO-Q: (1) the allocator never grows beyond the storage the implementation reports; (2) outputs at a step are
// bitwise independent of the queries of earlier steps: a second run with different queries at every even op (same
// K and V) must give bitwise the same outputs at every odd op; (3) the harness poisons every buffer it lent after
// each call (both runs), so reading a kept pointer shows as a difference or a NaN; (4) the declared workspace is no
// store of every query (q_store_probe.hpp).
Outcome no_q(const Target& t, const Case& c) {
    Checks a = named("NO-Q");
    a.heap = true; // under ASan only the heap-growth half of (1) is skipped (session.cpp): see the note below
    const char* blind = heap_watch_blind_reason();
    const RunResult first = run_script(t, c, a);
    const bool device = t.caps.memory_space == KVC_MEMORY_DEVICE;
    if (device) blind = nullptr; // ASan blinds the heap watch, not the device one
    Checks b = named("NO-Q");
    QueryVariant qv;
    qv.enabled = true;
    qv.keep_parity = 1;
    const RunResult second = run_script(t, c, b, qv);
    for (const auto& [key, out] : first.outputs) {
        if (std::get<0>(key) % 2 != 1) continue;
        const auto it = second.outputs.find(key);
        const std::vector<float>& other = it->second;
        for (size_t i = 0; i < out.size(); ++i) {
            const bool same = std::memcmp(&out[i], &other[i], sizeof(float)) == 0;
            if (same && !std::isnan(out[i])) continue;
            Mismatch m;
            m.what = "output";
            m.op = std::get<0>(key);
            m.layer = static_cast<int>(std::get<1>(key));
            m.seq = static_cast<int>(std::get<2>(key));
            const size_t orow = static_cast<size_t>(c.cfg.n_q_heads) * c.cfg.dv();
            m.head = static_cast<int>(i % orow / c.cfg.dv());
            m.dim = static_cast<int>(i % c.cfg.dv());
            m.expected = out[i];
            m.actual = other[i];
            throw Violation("NO-Q",
                            std::isnan(out[i]) ? "NaN in an output after the harness poisoned the buffers of earlier "
                                                 "calls: the implementation reads caller memory after a call returned"
                                               : "the output changed when only the queries of earlier steps changed "
                                                 "(same K and V, same current query): past Q is kept and used",
                            m);
        }
    }
    const std::string probe = probe_q_store(t, c, first);
    Outcome o = outcome_of(first); // carries not_run when a DEVICE cache's memory could not be watched
    o.notes.push_back(probe);
    o.headroom = 0;
    o.fails_f32_class = false;
    if (!o.not_run.empty())
        o.notes.push_back("the past-query (2) and poison (3) halves ran and passed");
    else if (blind)
        o.notes.push_back(std::string("allocator growth watch SKIPPED: ") + blind +
                          "; the workspace and K/V-bound checks of (1), (2) and (3) ran");
    else {
        // in powers of two KiB: the exact count differs by a few bytes between runs (the allocator's own
        // bookkeeping), and a passing case's report is the same for the same command line
        int64_t kib = 1;
        while (kib * 1024 < first.hidden_heap_bytes) kib *= 2;
        o.notes.push_back("largest rise of " + std::string(device ? "device memory" : "allocator") +
                          " growth beyond reported growth after create: at most " + std::to_string(kib) +
                          " KiB (slack " + std::to_string(device ? kDeviceSlackBytes : kHeapSlackBytes) +
                          " bytes; watched: " + first.watched + ")");
    }
    if (first.workspace_bytes > 0)
        o.notes.push_back("declared workspace: " + std::to_string(first.workspace_bytes) + " bytes");
    if (first.create_unreported_bytes > (device ? kDeviceSlackBytes : kHeapSlackBytes))
        o.notes.push_back("create() allocated " + std::to_string(first.create_unreported_bytes) +
                          " bytes it does not report (judged as a constant workspace; ABI 1.1 declares it as "
                          "workspace_bytes)");
    return o;
}

// BATCH: outputs of batched calls equal the oracle (property), and the grade says whether they are also bitwise
// equal to the same sequences appended one at a time.
Outcome batch(const Target& t, const Case& c) {
    Checks ch = named("BATCH");
    ch.equiv = true;
    const RunResult batched = run_script(t, c, ch);
    Case solo = c;
    for (Op& op : solo.ops)
        if (op.kind == OpKind::AppendBatch) op.kind = OpKind::Append;
    Outcome o = outcome_of(batched);
    // Append ops with several entries run through the single-sequence call once per entry: see session.cpp.
    Checks quiet = named("BATCH");
    const RunResult singles = run_script(t, solo, quiet);
    bool bitwise = true;
    for (const auto& [key, out] : batched.outputs) {
        const auto it = singles.outputs.find(key);
        if (it == singles.outputs.end() || it->second.size() != out.size() ||
            (!out.empty() && // an empty output has no data pointer: memcmp must not see it (UBSan)
             std::memcmp(it->second.data(), out.data(), out.size() * sizeof(float)) != 0))
            bitwise = false;
    }
    o.notes.push_back(bitwise ? "bitwise batch-invariant: yes"
                              : "bitwise batch-invariant: no (outputs agree within tolerance only)");
    return o;
}

ConfigSpace space(const kvc_caps& allow) {
    ConfigSpace s;
    s.allow = allow;
    return s;
}

ScriptSpace script(const kvc_caps& allow) {
    ScriptSpace s;
    s.chunked = allows(allow, KVC_FEATURE_CHUNKED);
    return s;
}

std::vector<Property> make_properties() {
    std::vector<Property> ps;

    {
        Checks ch = named("EQUIV");
        ch.equiv = true;
        ps.push_back({"EQUIV",
                      "prefill, decode and chunked-prefill outputs equal the full-recompute reference (tolerance "
                      "policy) at every step, layer and head",
                      true, 0,
                      [](const kvc_caps& a) {
                          ScriptSpace s = script(a);
                          s.n_seqs = 2;
                          ConfigSpace cs = space(a);
                          cs.large_scores = true;
                          return gens::case_for(cs, s);
                      },
                      single_run(ch)});
    }
    {
        Checks ch = named("CACHE-CONTENT");
        ch.content = true;
        ch.lengths = true;
        ps.push_back({"CACHE-CONTENT",
                      "rows read back equal what was appended, rounded to the cache dtype, bitwise (within one ulp "
                      "after rotation when the implementation applies RoPE); a quantized cache's codes and scales "
                      "equal the reference quantizer's; lengths agree",
                      true, 0, [](const kvc_caps& a) { return gens::case_for(space(a), script(a)); }, single_run(ch)});
    }
    {
        Checks ch = named("APPEND-ONLY");
        ch.all_unchanged = true;
        ps.push_back({"APPEND-ONLY", "after every operation every row read back before it is bitwise unchanged", true, 0,
                      [](const kvc_caps& a) {
                          ScriptSpace s = script(a);
                          s.fork = allows(a, KVC_FEATURE_FORK);
                          s.release = allows(a, KVC_FEATURE_RELEASE);
                          s.max_ops = 14;
                          return gens::case_for(space(a), s);
                      },
                      single_run(ch)});
    }
    ps.push_back({"NO-Q",
                  "no storage beyond the reported K/V (allocator growth), outputs bitwise independent of past "
                  "queries, no use of caller buffers after a call",
                  true, 0,
                  [](const kvc_caps& a) {
                      ConfigSpace cs = space(a);
                      cs.large_queries = true;
                      cs.max_layers = 2;
                      cs.max_tokens = 200; // two runs per case of wide queries: the allocator, not the length, is judged
                      ScriptSpace s = script(a);
                      s.min_ops = 3;
                      s.max_ops = 8;
                      s.min_total_tokens = 128;
                      s.n_seqs = 1;
                      return gens::case_for(cs, s);
                  },
                  no_q});
    {
        Checks ch = named("MEMORY");
        ch.memory = true;
        ch.device_memory = true; // a DEVICE cache's reports are also held against device memory (cudaMemGetInfo)
        ps.push_back({"MEMORY",
                      "reported live bytes equal 2*T*H_kv*d_h*s per layer (plus the per-row scales of int8 and q8_0 "
                      "caches); reported capacity at most that rounded up to whole blocks per sequence and layer",
                      true, 0,
                      [](const kvc_caps& a) {
                          ScriptSpace s = script(a);
                          s.fork = allows(a, KVC_FEATURE_FORK);
                          s.release = allows(a, KVC_FEATURE_RELEASE);
                          s.max_ops = 12;
                          return gens::case_for(space(a), s);
                      },
                      single_run(ch)});
    }
    {
        Checks ch = named("LAYERS");
        ch.equiv = true;
        ch.diagnose_layers = true;
        ps.push_back({"LAYERS",
                      "each layer keeps its own history, whatever order layers are appended in; one layer's history "
                      "used for another is caught",
                      false, 0,
                      [](const kvc_caps& a) {
                          ConfigSpace cs = space(a);
                          cs.min_layers = 2;
                          cs.max_layers = 4;
                          ScriptSpace s = script(a);
                          s.shuffle_layers = true;
                          return gens::case_for(cs, s);
                      },
                      single_run(ch)});
    }
    {
        Checks ch = named("GQA");
        ch.equiv = true;
        ch.diagnose_heads = true;
        ps.push_back({"GQA",
                      "query head h reads KV head h / (n_q_heads / n_kv_heads), for group sizes 2..8 including "
                      "non-powers of two and MQA",
                      false, KVC_FEATURE_GQA,
                      [](const kvc_caps& a) {
                          ConfigSpace cs = space(a);
                          cs.force_gqa = true;
                          return gens::case_for(cs, script(a));
                      },
                      single_run(ch)});
    }
    ps.push_back({"BATCH",
                  "a sequence's outputs in a batch of sequences of different lengths equal the reference (graded: "
                  "bitwise equal to running it alone)",
                  false, KVC_FEATURE_BATCH,
                  [](const kvc_caps& a) {
                      ScriptSpace s = script(a);
                      s.batch = true;
                      s.n_seqs = 4;
                      s.min_ops = 2;
                      s.max_ops = 6;
                      return gens::case_for(space(a), s);
                  },
                  batch});
    {
        Checks ch = named("FORK");
        ch.equiv = true;
        ch.others_unchanged = true;
        ch.fork_shares = true;
        ps.push_back({"FORK",
                      "after a fork the child reads back the parent's rows; appends to either side never change the "
                      "other's rows; each side's outputs equal a recomputation of its own history",
                      false, KVC_FEATURE_FORK,
                      [](const kvc_caps& a) {
                          ScriptSpace s = script(a);
                          s.fork = true;
                          s.min_forks = 2; // each at a length around a block boundary, then appends to both sides
                          s.release_shared = allows(a, KVC_FEATURE_RELEASE); // a release while a sibling shares
                          s.n_seqs = 1;
                          s.min_ops = 4;
                          s.max_ops = 12;
                          return gens::case_for(space(a), s);
                      },
                      single_run(ch)});
    }
    {
        Checks ch = named("RELEASE");
        ch.equiv = true;
        ch.content = true;
        ch.lengths = true;
        ch.others_unchanged = true;
        ps.push_back({"RELEASE",
                      "a released sequence is empty; its storage is reused with no stale token visible to it or to "
                      "others",
                      false, KVC_FEATURE_RELEASE,
                      [](const kvc_caps& a) {
                          ScriptSpace s = script(a);
                          s.release = true;
                          s.min_releases = 2; // each followed by an append that reuses the sequence
                          s.release_shared = allows(a, KVC_FEATURE_FORK); // and one while a fork sibling shares
                          s.stale_fill = true;
                          s.n_seqs = 3;
                          s.min_ops = 4;
                          s.max_ops = 12;
                          return gens::case_for(space(a), s);
                      },
                      single_run(ch)});
    }
    {
        Checks ch = named("LONG");
        ch.equiv = true;
        ch.content = true;
        ch.lengths = true;
        ps.push_back({"LONG",
                      "long sequences (prompts of 2^k and 2^k+-1 up to 8k tokens, chunks of 63/64/65 new tokens over "
                      "511/512/513 cached) keep EQUIV and CACHE-CONTENT; big calls are graded on sampled rows",
                      false, 0,
                      [](const kvc_caps& a) {
                          ConfigSpace cs = space(a);
                          cs.long_cases = true;
                          cs.large_scores = true;
                          ScriptSpace s = script(a);
                          s.long_script = true;
                          s.n_seqs = 1;
                          return gens::case_for(cs, s);
                      },
                      single_run(ch)});
    }
    return ps;
}

} // namespace

const std::vector<Property>& properties() {
    static const std::vector<Property> ps = make_properties();
    return ps;
}

const Property* find_property(const std::string& id) {
    for (const Property& p : properties())
        if (p.id == id) return &p;
    return nullptr;
}

kvc_caps full_caps() {
    kvc_caps c{};
    c.struct_size = sizeof c;
    c.dtypes = 0x7;
    c.rope_variants = (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    c.features = KVC_FEATURE_GQA | KVC_FEATURE_PAGED | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE | KVC_FEATURE_BATCH |
                 KVC_FEATURE_CHUNKED;
    c.precision = KVC_PRECISION_F32;
    return c;
}

} // namespace kvc::prop
