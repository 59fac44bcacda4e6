#include "q_store_probe.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/mismatch.hpp"

#include <algorithm>
#include <optional>

namespace kvc::prop {

namespace {

// What an instance holds besides K/V from create on: its declared workspace and what create() allocated unreported.
uint64_t besides_kv(const RunResult& r) {
    return r.workspace_bytes + static_cast<uint64_t>(std::max<int64_t>(r.create_unreported_bytes, 0));
}

std::string describe(const CaseConfig& cfg) {
    return std::to_string(cfg.n_layers) + " layer(s), " + std::to_string(cfg.max_seqs) + " sequence(s)";
}

struct Created {
    std::optional<uint64_t> bytes; // empty: create refused
    std::string refused;
};

// Creates (and destroys) the implementation with `cfg` under the NO-Q watch, appending nothing.
Created create_only(const Target& t, const CaseConfig& cfg, uint64_t data_seed) {
    Case bare;
    bare.cfg = cfg;
    bare.data_seed = data_seed;
    Checks ch;
    ch.property = "NO-Q";
    ch.heap = true;
    try {
        return {besides_kv(run_script(t, bare, ch)), ""};
    } catch (const Violation& v) {
        throw Violation(v.property(), "with " + describe(cfg) + " (the Q-store probe's configuration): " + v.what(),
                        v.mismatch());
    } catch (const AbiError& e) {
        return {std::nullopt, e.what()};
    }
}

} // namespace

uint64_t min_query_row_bytes(const CaseConfig& cfg) {
    const uint64_t element = dtype_size(cfg.cache_dtype) == 1 ? 1 : 2;
    return uint64_t{cfg.n_q_heads} * cfg.head_dim * element;
}

CaseConfig with_layers(const CaseConfig& cfg, uint32_t n_layers) {
    CaseConfig out = cfg;
    out.n_layers = n_layers;
    auto repeat_layers = [&](std::vector<float>& per_layer) {
        if (per_layer.empty()) return;
        const size_t each = per_layer.size() / cfg.n_layers; // 1 (TENSOR) or n_kv_heads (KV_HEAD)
        std::vector<float> grown;
        for (uint32_t l = 0; l < n_layers; ++l)
            grown.insert(grown.end(), per_layer.begin() + static_cast<std::ptrdiff_t>(l % cfg.n_layers * each),
                         per_layer.begin() + static_cast<std::ptrdiff_t>((l % cfg.n_layers + 1) * each));
        per_layer = std::move(grown);
    };
    repeat_layers(out.k_scales);
    repeat_layers(out.v_scales);
    if (!cfg.windows.empty()) {
        out.windows.clear();
        for (uint32_t l = 0; l < n_layers; ++l) out.windows.push_back(cfg.windows[l % cfg.n_layers]);
    }
    return out;
}

std::string probe_q_store(const Target& t, const Case& c, const RunResult& case_run) {
    const CaseConfig& cfg = c.cfg;
    const uint32_t max_layers = t.caps.max_layers ? t.caps.max_layers : 2 * cfg.n_layers;
    const uint32_t max_seqs = t.caps.max_seqs ? t.caps.max_seqs : 2 * cfg.max_seqs;
    const uint32_t layers = std::min(2 * cfg.n_layers, max_layers), seqs = std::min(2 * cfg.max_seqs, max_seqs);
    if (layers <= cfg.n_layers || seqs <= cfg.max_seqs)
        return "Q-store probe NOT RUN: the declared limits leave no room for more " +
               std::string(layers <= cfg.n_layers ? "layers" : "sequences") + " than the case's " + describe(cfg);

    CaseConfig more_seqs = cfg;
    more_seqs.max_seqs = seqs;
    const CaseConfig more_layers = with_layers(cfg, layers);
    const Created by_layers = create_only(t, more_layers, c.data_seed);
    const Created by_seqs = create_only(t, more_seqs, c.data_seed);
    if (!by_layers.bytes || !by_seqs.bytes)
        return "Q-store probe NOT RUN: create refused " + describe(by_layers.bytes ? more_seqs : more_layers) + ": " +
               (by_layers.bytes ? by_seqs.refused : by_layers.refused);

    const uint64_t base = besides_kv(case_run), row = min_query_row_bytes(cfg);
    auto grown = [&](uint64_t bytes) { return bytes > base ? bytes - base : 0; };
    // a query row for every (layer, sequence, token) the bigger configuration adds
    const uint64_t store_by_layers = uint64_t{layers - cfg.n_layers} * cfg.max_seqs * cfg.max_tokens * row;
    const uint64_t store_by_seqs = uint64_t{cfg.n_layers} * (seqs - cfg.max_seqs) * cfg.max_tokens * row;
    const std::string sizes = "besides K/V: " + std::to_string(base) + " bytes with " + describe(cfg) + ", " +
                              std::to_string(*by_layers.bytes) + " with " + describe(more_layers) + ", " +
                              std::to_string(*by_seqs.bytes) + " with " + describe(more_seqs);
    if (grown(*by_layers.bytes) >= store_by_layers && grown(*by_seqs.bytes) >= store_by_seqs) {
        Mismatch m;
        m.what = "workspace_bytes";
        m.expected = static_cast<double>(base);
        m.actual = static_cast<double>(*by_layers.bytes);
        throw Violation("NO-Q",
                        "the declared workspace grows with the layers and with the sequences by at least a query row (" +
                            std::to_string(row) + " bytes) per (layer, sequence, token) of max_tokens " +
                            std::to_string(cfg.max_tokens) + " (" + sizes +
                            "): a store of every query, not one call's scratch",
                        m);
    }
    // the measured sizes only in a failure: read from the allocator they can differ by a few bytes between runs,
    // and a passing case's report is the same for the same command line
    return "Q-store probe: besides K/V, " + describe(more_layers) + " and " + describe(more_seqs) +
           " grew by less than a store of every query row would add (at least " + std::to_string(store_by_layers) +
           " and " + std::to_string(store_by_seqs) + " bytes)";
}

} // namespace kvc::prop
