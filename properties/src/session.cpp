// The plugin harness's session: a case's ops applied one by one to an implementation (through the call driver),
// the cache model kept beside it, and after every call and op the checks the property asks for. The rules
// themselves live in their own units: what the cache must hold in cache_model.cpp, EQUIV's grading of a call in
// output_grade.cpp, the memory rules (NO-Q's watch, MEMORY's report checks) in memory_watch.cpp.
#include "kvcheck/properties/session.hpp"

#include "call_driver.hpp"
#include "kvcheck/abi.hpp"
#include "kvcheck/properties/cache_model.hpp"
#include "kvcheck/properties/oracle.hpp"
#include "kvcheck/properties/output_grade.hpp"
#include "kvcheck/properties/tolerance.hpp"
#include "memory_watch.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

namespace kvc::prop {

class Session::Impl {
public:
    Impl(const Target& target, const CaseConfig& cfg, uint64_t data_seed, const Checks& checks, QueryVariant qv)
        : data_seed_(data_seed), checks_(checks), query_variant_(qv), cfg_(cfg),
          pipeline_(declared_pipeline(target.caps)), scope_{checks.property, -1},
          watch_(target, cfg_, checks_, scope_, result_), driver_(target.api, scope_, watch_), model_(cfg_) {
        driver_.create(cfg_.to_abi());
    }

    void apply(const Op& op) {
        ++scope_.op;
        std::vector<bool> touched(cfg_.max_seqs, false);
        switch (op.kind) {
        case OpKind::Append:
        case OpKind::AppendBatch: append(op, touched); break;
        case OpKind::Fork: fork(op, touched); break;
        case OpKind::Release: release(op, touched); break;
        }
        check_after_op(touched);
    }

    const RunResult& result() const { return result_; }

private:
    // ---- appends ----
    // One sequence's part of an append call: its inputs, and the rows (seq, layer) held before it.
    struct Pending {
        uint32_t seq, n_new, before;
        AppendInputs in;
        bool extreme = false; // a stale-slot trap (SeqAppend::extreme): not graded
    };

    Pending inputs(const SeqAppend& a, uint32_t layer) const {
        // NO-Q's second run varies the queries of the ops whose parity differs from keep_parity
        const bool varied = query_variant_.enabled && static_cast<uint32_t>(scope_.op % 2) != query_variant_.keep_parity;
        return {a.seq, a.n_new, model_.length(a.seq, layer),
                append_inputs(cfg_, data_seed_, static_cast<uint32_t>(scope_.op), a.seq, layer, a.n_new,
                              varied ? 1u : 0u, a.extreme),
                a.extreme};
    }

    void append(const Op& op, std::vector<bool>& touched) {
        for (const SeqAppend& a : op.appends) touched[a.seq] = true;
        for (uint32_t layer : layers_of(cfg_, op)) {
            std::vector<Pending> ps;
            for (const SeqAppend& a : op.appends) ps.push_back(inputs(a, layer));
            std::vector<std::vector<float>> outs;
            if (op.kind == OpKind::Append) { // one call per sequence (BATCH runs its batches this way to compare)
                for (const Pending& p : ps)
                    outs.push_back(driver_.append_attend(p.seq, layer, p.n_new, p.in.q, p.in.k, p.in.v));
            } else {
                std::vector<CallDriver::BatchPart> parts;
                for (const Pending& p : ps) parts.push_back({p.seq, p.n_new, &p.in.q, &p.in.k, &p.in.v});
                outs = driver_.append_attend_batch(layer, parts);
            }
            for (size_t i = 0; i < ps.size(); ++i) record(ps[i], layer, outs[i]);
        }
    }

    // Reads the new rows back into the model (CACHE-CONTENT), then grades the outputs (EQUIV).
    void record(const Pending& p, uint32_t layer, const std::vector<float>& out) {
        result_.outputs[{scope_.op, layer, p.seq}] = out;
        if (p.n_new == 0) return;
        std::vector<uint8_t> k(model_.kv_bytes(p.n_new)), v(model_.kv_bytes(p.n_new));
        std::vector<uint8_t> ks(model_.scale_bytes(p.n_new)), vs(model_.scale_bytes(p.n_new));
        driver_.read_kv(p.seq, layer, p.before, p.n_new, k, v);
        if (model_.quantized()) driver_.read_kv_scales(p.seq, layer, p.before, p.n_new, ks, vs);
        std::string why;
        const std::optional<Mismatch> wrong = model_.store(p.seq, layer, p.n_new, p.in.k.data(), p.in.v.data(),
                                                           k.data(), v.data(), pipeline_.rope, ks.data(), vs.data(),
                                                           &why);
        if (wrong) {
            if (checks_.content) scope_.fail(why, *wrong);
            if (!storage_mismatch_) storage_mismatch_ = wrong; // EQUIV's diagnosis names the first
        }
        if (checks_.equiv && !p.extreme) grade_call(p, layer, out);
    }

    // Grades a call's outputs: every row when the oracle's cost (n_new * T * Hq * d, in long double) is small, and
    // otherwise a sample of rows, each graded as a one-row call over the history truncated after it (its own
    // expectation exactly): the first and last rows, rows at 63/64/65 and around 2^k and 512 cached tokens, and a
    // few more drawn from the case's seed.
    void grade_call(const Pending& p, uint32_t layer, const std::vector<float>& out) {
        const uint32_t history = model_.length(p.seq, layer);
        GradedRows all;
        all.q = p.in.q.data();
        all.out = out.data();
        all.n_rows = p.n_new;
        all.history = history;
        all.call_begin = p.before;
        all.call_k = p.in.k.data();
        all.call_v = p.in.v.data();
        const uint64_t cost = static_cast<uint64_t>(p.n_new) * history * cfg_.n_q_heads * cfg_.head_dim;
        if (cost <= kFullGradeCost) return grade(p.seq, layer, all);
        const size_t qrow = static_cast<size_t>(cfg_.n_q_heads) * cfg_.head_dim;
        for (uint32_t i : sampled_rows(p, layer)) {
            GradedRows one = all;
            one.q = all.q + i * qrow;
            one.out = all.out + i * qrow;
            one.n_rows = 1;
            one.history = p.before + i + 1;
            grade(p.seq, layer, one);
        }
    }

    std::vector<uint32_t> sampled_rows(const Pending& p, uint32_t layer) const {
        std::vector<uint32_t> rows = {0, 1, 62, 63, 64, 65, p.n_new - 2, p.n_new - 1};
        for (uint32_t k = 8; k <= 16; ++k)
            for (int64_t off : {-1, 0, 1}) {
                const int64_t r = (int64_t{1} << k) + off - 1 - p.before; // position 2^k + off is row r
                if (r >= 0 && r < p.n_new) rows.push_back(static_cast<uint32_t>(r));
            }
        uint64_t h = data_seed_ ^ (static_cast<uint64_t>(scope_.op) << 40) ^ (static_cast<uint64_t>(layer) << 20) ^
                     p.seq;
        for (uint32_t k = 0; k < kSampledRows; ++k) { // a 64-bit LCG: the same rows every replay
            h = h * 6364136223846793005ull + 1442695040888963407ull;
            rows.push_back(static_cast<uint32_t>((h >> 33) % p.n_new));
        }
        std::sort(rows.begin(), rows.end());
        rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
        rows.erase(std::remove_if(rows.begin(), rows.end(), [&](uint32_t r) { return r >= p.n_new; }), rows.end());
        return rows;
    }

    // The informative quantization loss (RunResult::quant_loss): the same queries over the rows before quantization.
    void measure_quant_loss(uint32_t seq, uint32_t layer, const GradedRows& rows) {
        const CacheModel::Stream& s = model_.stream(seq, layer);
        const std::vector<float> q = queries_as_rounded(
            pipeline_, rows.q, static_cast<size_t>(rows.n_rows) * cfg_.n_q_heads * cfg_.head_dim);
        const Expected e = expect_outputs(cfg_, q.data(), rows.n_rows, s.k_raw, s.v_raw, rows.history);
        const uint32_t d = cfg_.head_dim;
        for (size_t o = 0; o < e.oracle.size(); ++o) {
            const double err = std::fabs(static_cast<double>(rows.out[o]) - static_cast<double>(e.oracle[o])) /
                               e.v_scale[o / d];
            if (std::isfinite(err)) result_.quant_loss = std::max(result_.quant_loss, err);
        }
    }

    void grade(uint32_t seq, uint32_t layer, const GradedRows& rows) {
        // EQUIV's cases carry it; the other properties that grade outputs (LONG's long prompts above all) would only
        // pay a second oracle for it
        if (model_.quantized() && checks_.property == "EQUIV") measure_quant_loss(seq, layer, rows);
        const OutputVerdict v = grade_call_outputs(model_, seq, layer, pipeline_, rows, storage_mismatch_);
        result_.headroom = std::max(result_.headroom, v.grade.headroom);
        result_.fails_f32_class = result_.fails_f32_class || v.grade.fails_f32_class;
        if (v.grade.pass) return;
        scope_.fail(v.reason + diagnosis(seq, layer, rows), v.where);
    }

    // What a failed call's outputs match instead, when the property asks: the classic head-mapping bug, or another
    // layer's history.
    std::string diagnosis(uint32_t seq, uint32_t layer, const GradedRows& rows) const {
        std::string why;
        if (checks_.diagnose_heads && cfg_.n_kv_heads < cfg_.n_q_heads && cfg_.n_kv_heads > 1) {
            const Expected tile = expected_outputs(model_, seq, layer, rows, HeadMap::Tile);
            if (grade_outputs(cfg_, pipeline_, rows.out, tile).pass)
                why += "; the outputs match query head h reading KV head h % n_kv_heads ('tile') instead of "
                       "h / (n_q_heads / n_kv_heads) ('repeat')";
        }
        if (checks_.diagnose_layers)
            for (uint32_t other = 0; other < cfg_.n_layers; ++other) {
                // another layer as long as the graded rows' history (a sampled row's history is truncated)
                if (other == layer || model_.length(seq, other) != rows.history) continue;
                if (grade_outputs(cfg_, pipeline_, rows.out, expected_outputs(model_, seq, other, rows)).pass) {
                    why += "; layer " + std::to_string(layer) + "'s outputs match layer " + std::to_string(other) +
                           "'s history: one layer's cache is used for another";
                    break;
                }
            }
        return why;
    }

    // ---- fork and release ----
    void fork(const Op& op, std::vector<bool>& touched) {
        touched[op.child] = true;
        forked_ = true;
        driver_.fork(op.seq, op.child);
        model_.fork(op.seq, op.child);
        if (checks_.fork_shares)
            for (uint32_t l = 0; l < cfg_.n_layers; ++l)
                compare_rows(op.child, l, "a forked child's rows differ from its parent's");
    }

    void release(const Op& op, std::vector<bool>& touched) {
        touched[op.seq] = true;
        driver_.release(op.seq);
        model_.release(op.seq);
    }

    // ---- checks after every op ----
    // Every row the model holds for (seq, layer), read back whole, must be bitwise what was read when it was new.
    void compare_rows(uint32_t seq, uint32_t layer, const std::string& reason) {
        const uint32_t len = model_.length(seq, layer);
        if (len == 0) return;
        std::vector<uint8_t> k(model_.kv_bytes(len)), v(model_.kv_bytes(len));
        std::vector<uint8_t> ks(model_.scale_bytes(len)), vs(model_.scale_bytes(len));
        driver_.read_kv(seq, layer, 0, len, k, v);
        if (model_.quantized()) driver_.read_kv_scales(seq, layer, 0, len, ks, vs);
        if (const std::optional<Mismatch> m = model_.first_changed(seq, layer, k.data(), v.data(), ks.data(), vs.data()))
            scope_.fail(reason + (m->what.find("scale") != std::string::npos ? " (a stored scale changed)" : ""), *m);
    }

    void check_after_op(const std::vector<bool>& touched) {
        for (uint32_t seq = 0; seq < cfg_.max_seqs; ++seq)
            for (uint32_t l = 0; l < cfg_.n_layers; ++l) {
                if (checks_.all_unchanged || (checks_.others_unchanged && !touched[seq]))
                    compare_rows(seq, l, std::string("a row read back earlier changed: ") + kRewrittenRule);
                if (checks_.lengths) check_length(seq, l);
            }
        if (checks_.memory) check_memory_report(scope_, driver_.memory(), model_, forked_);
    }

    void check_length(uint32_t seq, uint32_t layer) {
        const uint32_t len = driver_.seq_length(seq, layer);
        if (len == model_.length(seq, layer)) return;
        Mismatch m;
        m.what = "seq_length";
        m.seq = static_cast<int>(seq);
        m.layer = static_cast<int>(layer);
        m.expected = model_.length(seq, layer);
        m.actual = len;
        scope_.fail("the sequence's length differs from the number of rows appended since it was started", m);
    }

    const uint64_t data_seed_;
    const Checks checks_;
    const QueryVariant query_variant_;
    const CaseConfig cfg_;
    const Pipeline pipeline_; // what the implementation declares: the bounds it is graded by
    CheckScope scope_;        // the property and the op being applied
    RunResult result_;
    MemoryWatch watch_;  // before the driver: the driver's calls report to it
    CallDriver driver_;  // owns the cache instance
    CacheModel model_;   // what the cache must hold
    std::optional<Mismatch> storage_mismatch_; // the first element read back unlike the appended one, when
                                               // CACHE-CONTENT is off (EQUIV's diagnosis names it)
    bool forked_ = false; // storage may be shared from the first fork on
};

Session::Session(const Target& target, const CaseConfig& cfg, uint64_t data_seed, const Checks& checks,
                 QueryVariant variant)
    : impl_(std::make_unique<Impl>(target, cfg, data_seed, checks, variant)) {}
Session::~Session() = default;
void Session::apply(const Op& op) { impl_->apply(op); }
const RunResult& Session::result() const { return impl_->result(); }

RunResult run_script(const Target& target, const Case& c, const Checks& checks, QueryVariant variant) {
    Session s(target, c.cfg, c.data_seed, checks, variant);
    for (const Op& op : c.ops) s.apply(op);
    return s.result();
}

} // namespace kvc::prop
