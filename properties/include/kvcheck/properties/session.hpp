// Runs a case's script against one implementation while keeping the harness's own model of what the cache must
// hold, and checks after every call whatever the property asks for. This is the one place where the harness
// touches an implementation; every property is a choice of checks plus a generator (properties.hpp).
#pragma once

#include "kvcheck/properties/cache_model.hpp"
#include "kvcheck/properties/case.hpp"
#include "kvcheck/properties/mismatch.hpp"
#include "kvcheck/properties/target.hpp"

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace kvc::prop {

struct Checks {
    std::string property;          // the ID a violation is reported under
    bool equiv = false;            // outputs vs the oracle, under the tolerance policy
    bool content = false;          // new rows read back as appended (bitwise; RoPE: the rounding of an f32 rotation)
    bool lengths = false;          // seq_length agrees with the model for every sequence and layer
    bool all_unchanged = false;    // every row read before an op is bitwise unchanged after it (APPEND-ONLY)
    bool others_unchanged = false; // rows of sequences an op did not append to are unchanged (FORK, RELEASE)
    bool fork_shares = false;      // a forked child reads back exactly its parent's rows
    bool memory = false;           // reported live bytes equal the formula; capacity within whole blocks
    bool heap = false;             // allocator growth is explained by reported K/V and workspace (NO-Q): the host
                                   // heap for HOST caches, device memory for DEVICE caches
    bool device_memory = false;    // the same watch for DEVICE caches only (MEMORY: their reports are checked
                                   // against device memory, which costs one cudaMemGetInfo per call)
    bool diagnose_heads = false;   // on an equiv failure, test the "tile" head mapping
    bool diagnose_layers = false;  // on an equiv failure, test the other layers' histories
};

// Alternative query stream for NO-Q: ops whose index has `keep_parity` keep the case's queries, the others get
// different ones; K and V are always the case's.
struct QueryVariant {
    bool enabled = false;
    uint32_t keep_parity = 1;
};

// Outputs by (op, layer, seq), kept for comparisons between runs.
using OutputLog = std::map<std::tuple<int, uint32_t, uint32_t>, std::vector<float>>;

struct RunResult {
    OutputLog outputs;
    double headroom = 0;          // worst error / allowed over every graded output
    bool fails_f32_class = false; // passed its declared 16-bit class, would fail f32
    int64_t hidden_heap_bytes = 0; // largest rise of allocator growth not explained by reported growth since create
    int64_t create_unreported_bytes = 0; // what create() allocated beyond capacity + pool + workspace
    uint64_t workspace_bytes = 0;        // reported after create
    std::string watched;                 // what the allocator watch read: "heap", "device memory (libcudart.so.13)"
    std::string watch_not_run;           // why the allocator watch asked for could not run (no CUDA runtime, no device)
    // A quantized cache (EQUIV's cases): the largest error of the graded outputs against attention over the UNQUANTIZED
    // rows, relative to max |v| of the row: what the user loses by quantizing. Informative, never graded; -1 when
    // not measured.
    double quant_loss = -1;
    // ABI 1.3, only where the implementation declares pipeline rules: the declarations that graded the outputs, in
    // the order first used ("pipeline rule 2 (f16, n >= 64)", "the default pipeline"; graded_by_name)
    std::vector<std::string> graded_by;
};

// One cache instance driven op by op, with the harness's model beside it. The constructor creates the cache;
// apply() runs one op and the checks after it. Throws Violation on a failed check, kvc::AbiError on a failed call.
class Session {
public:
    Session(const Target& target, const CaseConfig& cfg, uint64_t data_seed, const Checks& checks,
            QueryVariant variant = {});
    ~Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    void apply(const Op& op); // ops are numbered 0, 1, ... in the order applied (the inputs depend on it)
    const RunResult& result() const;

private:
    class Impl;
    std::unique_ptr<Impl> impl_;
};

// Executes c against target, checking `checks` after every call. Throws Violation on a failed check and
// kvc::AbiError when a call returns an error.
RunResult run_script(const Target& target, const Case& c, const Checks& checks, QueryVariant variant = {});

// Slack for bookkeeping the allocator may show beyond reported storage (handles, small tables), after create.
constexpr int64_t kHeapSlackBytes = 32 * 1024;
// The most a cache may hold besides K/V storage, constant from create on: kvc_memory.workspace_bytes plus what an
// ABI 1.0 plugin allocates in create() without reporting it.
constexpr uint64_t kMaxWorkspaceBytes = 256ull << 20;
// A call whose oracle cost n_new * T * n_q_heads * head_dim exceeds this is graded on a sample of rows.
constexpr uint64_t kFullGradeCost = 1ull << 21;
constexpr uint32_t kSampledRows = 8; // rows drawn from the seed besides the fixed ones

} // namespace kvc::prop
