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
          caps_(target.caps), has_rules_(!pipeline_rules(target.caps).empty()), scope_{checks.property, -1},
          watch_(target, cfg_, checks_, scope_, result_), driver_(target.api, scope_, watch_), model_(cfg_),
          fork_shares_((target.caps.features & KVC_FEATURE_FORK_SHARES) != 0 && !cfg_.evict) {
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
        std::vector<uint8_t> k(model_.kv_bytes(p.n_new)), v(model_.v_bytes(p.n_new));
        std::vector<uint8_t> ks(model_.scale_bytes(p.n_new)), vs(model_.scale_bytes(p.n_new));
        // an evicting cache may already have dropped some of the new rows (a chunk longer than its window): those
        // are judged by the outputs that used them, and stand in here as the rows they had to be
        const Dropped gone = dropped_rows(p.seq, layer, p.before + p.n_new);
        const StoredRows want = cfg_.evict ? expected_new_rows(cfg_, p.before, p.n_new, p.in.k.data(),
                                                               p.in.v.data(), layer)
                                           : StoredRows{};
        read_kept(p.seq, layer, p.before, p.n_new, gone, {&want.k_bits, &want.v_bits, &want.k_scale_bits,
                                                          &want.v_scale_bits}, k, v, ks, vs);
        std::string why;
        // the pipeline of the path this call takes for this sequence (ABI 1.3 rules), its RoPE stage included
        const ChosenPipeline chosen = pipeline_for(caps_, cfg_.cache_dtype, p.n_new);
        const std::optional<Mismatch> wrong = model_.store(p.seq, layer, p.n_new, p.in.k.data(), p.in.v.data(),
                                                           k.data(), v.data(), chosen.pipeline.rope, ks.data(),
                                                           vs.data(), &why);
        if (wrong) {
            if (checks_.content) scope_.fail(why, *wrong);
            if (!storage_mismatch_) storage_mismatch_ = wrong; // EQUIV's diagnosis names the first
        }
        if (checks_.equiv && !p.extreme) grade_call(p, layer, out, chosen);
    }

    // ---- evicting caches (docs/windowed-caches.md) ----
    struct Dropped { // rows [begin, end) an evicting cache no longer returns (dropped_rows)
        uint32_t begin = 0, end = 0;
    };
    // Rows pos .. pos+n-1 of (seq, layer) into k, v (and ks, vs for a quantized dtype). Rows the cache dropped
    // (dropped_rows) are not read: they are copied from `fill` (byte arrays that start at row pos).
    struct Fill {
        const std::vector<uint8_t>*k, *v, *ks, *vs;
    };
    void read_kept(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, Dropped gone, const Fill& fill,
                   std::vector<uint8_t>& k, std::vector<uint8_t>& v, std::vector<uint8_t>& ks,
                   std::vector<uint8_t>& vs) {
        const uint32_t end = pos + n;
        const uint32_t a = std::clamp(gone.begin, pos, end), b = std::clamp(gone.end, a, end);
        read_into(seq, layer, pos, a - pos, k, v, ks, vs, 0);
        const auto kv = [&](uint32_t r) { return static_cast<std::ptrdiff_t>(model_.kv_bytes(r)); };
        const auto vb = [&](uint32_t r) { return static_cast<std::ptrdiff_t>(model_.v_bytes(r)); };
        const auto sc = [&](uint32_t r) { return static_cast<std::ptrdiff_t>(model_.scale_bytes(r)); };
        if (b > a) {
            std::copy(fill.k->begin() + kv(a - pos), fill.k->begin() + kv(b - pos), k.begin() + kv(a - pos));
            std::copy(fill.v->begin() + vb(a - pos), fill.v->begin() + vb(b - pos), v.begin() + vb(a - pos));
            if (model_.quantized()) {
                std::copy(fill.ks->begin() + sc(a - pos), fill.ks->begin() + sc(b - pos), ks.begin() + sc(a - pos));
                std::copy(fill.vs->begin() + sc(a - pos), fill.vs->begin() + sc(b - pos), vs.begin() + sc(a - pos));
            }
        }
        read_into(seq, layer, b, end - b, k, v, ks, vs, b - pos);
    }

    // Rows pos .. pos+n-1 into k, v (and ks, vs) from their row at_row on.
    void read_into(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, std::vector<uint8_t>& k,
                   std::vector<uint8_t>& v, std::vector<uint8_t>& ks, std::vector<uint8_t>& vs, uint32_t at_row) {
        if (n == 0) return;
        std::vector<uint8_t> rk(model_.kv_bytes(n)), rv(model_.v_bytes(n));
        driver_.read_kv(seq, layer, pos, n, rk, rv);
        std::copy(rk.begin(), rk.end(), k.begin() + static_cast<std::ptrdiff_t>(model_.kv_bytes(at_row)));
        std::copy(rv.begin(), rv.end(), v.begin() + static_cast<std::ptrdiff_t>(model_.v_bytes(at_row)));
        const size_t at_scales = model_.scale_bytes(at_row);
        if (!model_.quantized()) return;
        std::vector<uint8_t> rks(model_.scale_bytes(n)), rvs(model_.scale_bytes(n));
        driver_.read_kv_scales(seq, layer, pos, n, rks, rvs);
        std::copy(rks.begin(), rks.end(), ks.begin() + static_cast<std::ptrdiff_t>(at_scales));
        std::copy(rvs.begin(), rvs.end(), vs.begin() + static_cast<std::ptrdiff_t>(at_scales));
    }

    // Whether read_kv of rows pos .. end-1 of (seq, layer), holding len rows, succeeds, or says the cache dropped one
    // of them. Empty ranges are readable.
    bool readable(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t end, uint32_t len) {
        if (pos >= end || end > len) return pos >= end;
        std::vector<uint8_t> k(model_.kv_bytes(end - pos)), v(model_.v_bytes(end - pos));
        try {
            driver_.read_kv(seq, layer, pos, end - pos, k, v);
            return true;
        } catch (const AbiError& e) {
            if (e.status() != KVC_ERR_EVICTED) throw;
            return false;
        }
    }

    // The rows (seq, layer), holding len rows, no longer returns: an evicting cache drops one run of rows between
    // the sinks and the window, [begin, end) with S <= begin <= end <= the first row a later query sees; it may keep
    // dead rows on either side (a block it shares with the sinks, the rest of the window's first block). Found by
    // bisection from both sides and recorded in the model (its live bytes). A dropped row that a later query can
    // still see is a failure of the property running; the run is then taken as no longer than the dead rows.
    Dropped dropped_rows(uint32_t seq, uint32_t layer, uint32_t len) {
        const uint32_t S = std::min(cfg_.n_sinks, len);
        if (!cfg_.evict || cfg_.window(layer) == 0 || len == 0) return {S, S};
        if (S > 0 && !readable(seq, layer, 0, S, len)) {
            fail_dropped(seq, layer, len, 0, "a sink");
            return {S, S};
        }
        const uint32_t dead_end = std::max(cfg_.dead_end(layer, len), S); // rows S .. dead_end-1 may be gone
        if (!readable(seq, layer, dead_end, len, len)) {
            uint32_t p = dead_end; // the first row that is gone though a later query sees it
            while (p + 1 < len && readable(seq, layer, p + 1, len, len)) ++p;
            fail_dropped(seq, layer, len, p, "a row inside the window");
            return {S, S};
        }
        uint32_t lo = S, hi = dead_end; // the smallest readable start of the suffix
        while (lo < hi) {
            const uint32_t mid = lo + (hi - lo) / 2;
            if (readable(seq, layer, mid, len, len)) hi = mid;
            else lo = mid + 1;
        }
        const uint32_t end = lo;
        uint32_t a = S, b = end; // the largest readable end of the prefix
        while (a < b) {
            const uint32_t mid = a + (b - a + 1) / 2;
            if (readable(seq, layer, 0, mid, len)) a = mid;
            else b = mid - 1;
        }
        model_.set_dropped(seq, layer, a, end);
        return {a, end};
    }

    void fail_dropped(uint32_t seq, uint32_t layer, uint32_t len, uint32_t pos, const char* what) {
        Mismatch m;
        m.what = "evicted row";
        m.seq = static_cast<int>(seq);
        m.layer = static_cast<int>(layer);
        m.pos = static_cast<int>(pos);
        scope_.fail(std::string("the cache dropped ") + what + " (position " + std::to_string(pos) +
                        ") that the next query still sees: window " + std::to_string(cfg_.window(layer)) +
                        ", sinks " + std::to_string(cfg_.n_sinks) + ", length " + std::to_string(len),
                    m);
    }

    // Grades a call's outputs: every row when the oracle's cost (n_new * T * Hq * d, in long double) is small, and
    // otherwise a sample of rows, each graded as a one-row call over the history truncated after it (its own
    // expectation exactly): the first and last rows, rows at 63/64/65 and around 2^k and 512 cached tokens, and a
    // few more drawn from the case's seed.
    void grade_call(const Pending& p, uint32_t layer, const std::vector<float>& out, const ChosenPipeline& chosen) {
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
        if (cost <= kFullGradeCost) return grade(p.seq, layer, all, chosen);
        const size_t qrow = static_cast<size_t>(cfg_.n_q_heads) * cfg_.head_dim;
        const size_t orow = static_cast<size_t>(cfg_.n_q_heads) * cfg_.dv();
        for (uint32_t i : sampled_rows(p, layer)) {
            GradedRows one = all;
            one.q = all.q + i * qrow;
            one.out = all.out + i * orow;
            one.n_rows = 1;
            one.history = p.before + i + 1;
            grade(p.seq, layer, one, chosen);
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
    void measure_quant_loss(uint32_t seq, uint32_t layer, const GradedRows& rows, const Pipeline& pipeline) {
        const CacheModel::Stream& s = model_.stream(seq, layer);
        const std::vector<float> q = queries_as_rounded(
            pipeline, rows.q, static_cast<size_t>(rows.n_rows) * cfg_.n_q_heads * cfg_.head_dim);
        const Expected e =
            expect_outputs(cfg_, q.data(), rows.n_rows, s.k_raw, s.v_raw, rows.history, HeadMap::Repeat, 0, layer);
        const uint32_t d = cfg_.dv();
        for (size_t o = 0; o < e.oracle.size(); ++o) {
            const double err = std::fabs(static_cast<double>(rows.out[o]) - static_cast<double>(e.oracle[o])) /
                               e.v_scale[o / d];
            if (std::isfinite(err)) result_.quant_loss = std::max(result_.quant_loss, err);
        }
    }

    void grade(uint32_t seq, uint32_t layer, const GradedRows& rows, const ChosenPipeline& chosen) {
        // EQUIV's cases carry it; the other properties that grade outputs (LONG's long prompts above all) would only
        // pay a second oracle for it
        if (model_.quantized() && checks_.property == "EQUIV") measure_quant_loss(seq, layer, rows, chosen.pipeline);
        const std::string by = has_rules_ ? graded_by_name(caps_, chosen.rule) : std::string();
        if (has_rules_ && std::find(result_.graded_by.begin(), result_.graded_by.end(), by) == result_.graded_by.end())
            result_.graded_by.push_back(by);
        const OutputVerdict v = grade_call_outputs(model_, seq, layer, chosen.pipeline, rows, storage_mismatch_);
        result_.headroom = std::max(result_.headroom, v.grade.headroom);
        result_.fails_f32_class = result_.fails_f32_class || v.grade.fails_f32_class;
        if (v.grade.pass) return;
        // with rules declared, the failure names the declaration that graded it (a call of another length or dtype
        // would have been graded by another)
        const std::string named = has_rules_ ? " [graded by " + by + ": " + pipeline_name(chosen.pipeline) + "]" : "";
        Mismatch where = v.where;
        where.graded_by = by;
        scope_.fail(v.reason + diagnosis(seq, layer, rows, chosen.pipeline) + named, where);
    }

    // What a failed call's outputs match instead, when the property asks: the classic head-mapping bug, or another
    // layer's history.
    std::string diagnosis(uint32_t seq, uint32_t layer, const GradedRows& rows, const Pipeline& pipeline) const {
        std::string why;
        if (checks_.diagnose_heads && cfg_.n_kv_heads < cfg_.n_q_heads && cfg_.n_kv_heads > 1) {
            const Expected tile = expected_outputs(model_, seq, layer, rows, HeadMap::Tile);
            if (grade_outputs(cfg_, pipeline, rows.out, tile).pass)
                why += "; the outputs match query head h reading KV head h % n_kv_heads ('tile') instead of "
                       "h / (n_q_heads / n_kv_heads) ('repeat')";
        }
        if (cfg_.window(layer) > 0) why += window_diagnosis(model_, seq, layer, pipeline, rows);
        if (checks_.diagnose_layers)
            for (uint32_t other = 0; other < cfg_.n_layers; ++other) {
                // another layer as long as the graded rows' history (a sampled row's history is truncated)
                if (other == layer || model_.length(seq, other) != rows.history) continue;
                if (grade_outputs(cfg_, pipeline, rows.out, expected_outputs(model_, seq, other, rows)).pass) {
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
        const bool sharing = checks_.fork_shares && fork_shares_;
        const uint64_t before = sharing ? memory_report().capacity_bytes : 0;
        driver_.fork(op.seq, op.child);
        model_.fork(op.seq, op.child);
        if (sharing) check_fork_growth(op, before, memory_report());
        if (checks_.fork_shares)
            for (uint32_t l = 0; l < cfg_.n_layers; ++l)
                compare_rows(op.child, l, "a forked child's rows differ from its parent's");
    }

    // The cache's memory report; its block size is what the sharing of a failed row is named in.
    kvc_memory memory_report() {
        const kvc_memory m = driver_.memory();
        block_size_ = m.block_size;
        return m;
    }

    // KVC_FEATURE_FORK_SHARES: a fork copies at most the partly filled last block of each layer of the child.
    void check_fork_growth(const Op& op, uint64_t before, const kvc_memory& after) {
        const uint64_t b = std::max<uint32_t>(after.block_size, 1u);
        uint64_t partial = 0;
        for (uint32_t l = 0; l < cfg_.n_layers; ++l) partial += model_.length(op.child, l) % b != 0;
        const uint64_t allowed = partial * b * model_.row_bytes();
        if (after.capacity_bytes <= before || after.capacity_bytes - before <= allowed) return;
        Mismatch m;
        m.what = "capacity_bytes growth across fork";
        m.seq = static_cast<int>(op.child);
        m.expected = static_cast<double>(allowed);
        m.actual = static_cast<double>(after.capacity_bytes - before);
        scope_.fail("fork of sequence " + std::to_string(op.seq) + " into " + std::to_string(op.child) +
                        " grew the reported capacity by " + std::to_string(after.capacity_bytes - before) +
                        " bytes, more than the " + std::to_string(partial) + " partly filled last block(s) of " +
                        std::to_string(b) + " tokens it may copy (" + std::to_string(allowed) +
                        " bytes): the cache declares KVC_FEATURE_FORK_SHARES, so every full block must be shared "
                        "and counted once, not copied or counted per sequence",
                    m);
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
        std::vector<uint8_t> k(model_.kv_bytes(len)), v(model_.v_bytes(len));
        std::vector<uint8_t> ks(model_.scale_bytes(len)), vs(model_.scale_bytes(len));
        // an evicting cache's dropped rows stand in as recorded; only the rows it still holds are compared
        const Dropped gone = dropped_rows(seq, layer, len);
        const CacheModel::Stream& st = model_.stream(seq, layer);
        read_kept(seq, layer, 0, len, gone, {&st.k_bits, &st.v_bits, &st.k_scale_bits, &st.v_scale_bits}, k, v, ks,
                  vs);
        if (const std::optional<Mismatch> m = model_.first_changed(seq, layer, k.data(), v.data(), ks.data(), vs.data()))
            scope_.fail(reason + (m->what.find("scale") != std::string::npos ? " (a stored scale changed)" : "") +
                            shared_block_clause(seq, layer, static_cast<uint32_t>(std::max(m->pos, 0))),
                        *m);
    }

    // Names the block of a changed row that another sequence shares, or shared until it was released: the fork
    // history is the model's, the block size the cache's own report.
    std::string shared_block_clause(uint32_t seq, uint32_t layer, uint32_t pos) {
        if (block_size_ == 0) try {
                memory_report();
            } catch (const std::exception&) { // the row is still named, without its block
            }
        const std::string sharing = model_.sharing_of(seq, layer, pos);
        if (sharing.empty()) return "";
        const uint32_t b = block_size_, first = b ? pos / b * b : pos;
        const uint32_t last = std::min(b ? first + b : pos + 1, model_.length(seq, layer)) - 1;
        const std::string changed = "; rows " + std::to_string(first) + ".." + std::to_string(last) +
                                    " of sequence " + std::to_string(seq) + " layer " + std::to_string(layer) + " (" +
                                    (b ? "block " + std::to_string(pos / b) + " of " + std::to_string(b) +
                                             " tokens, "
                                       : std::string()) +
                                    sharing + ") changed (first: row " + std::to_string(pos) + ")";
        if (sharing.find("until its release") == std::string::npos) return changed;
        return changed + " after that release: the release freed a block the surviving sequence still shares, and "
                         "its storage was reused";
    }

    void check_after_op(const std::vector<bool>& touched) {
        for (uint32_t seq = 0; seq < cfg_.max_seqs; ++seq)
            for (uint32_t l = 0; l < cfg_.n_layers; ++l) {
                if (checks_.all_unchanged || (checks_.others_unchanged && !touched[seq]))
                    compare_rows(seq, l, std::string("a row read back earlier changed: ") + kRewrittenRule);
                if (checks_.lengths) check_length(seq, l);
            }
        if (checks_.memory) {
            if (cfg_.evict) // the live bytes count what the cache still holds
                for (uint32_t seq = 0; seq < cfg_.max_seqs; ++seq)
                    for (uint32_t l = 0; l < cfg_.n_layers; ++l) dropped_rows(seq, l, model_.length(seq, l));
            const kvc_memory m = memory_report();
            check_memory_report(scope_, m, model_, forked_);
            if (fork_shares_) check_shared_capacity(scope_, m, model_);
        } else if (checks_.fork_shares && fork_shares_ && forked_) {
            check_shared_capacity(scope_, memory_report(), model_);
        }
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
    const kvc_caps caps_;   // what the implementation declares: the pipelines its calls are graded by
    const bool has_rules_;  // ABI 1.3 pipeline rules: each grade is chosen per call and the report names it
    CheckScope scope_;        // the property and the op being applied
    RunResult result_;
    MemoryWatch watch_;  // before the driver: the driver's calls report to it
    CallDriver driver_;  // owns the cache instance
    CacheModel model_;   // what the cache must hold
    std::optional<Mismatch> storage_mismatch_; // the first element read back unlike the appended one, when
                                               // CACHE-CONTENT is off (EQUIV's diagnosis names it)
    bool forked_ = false; // storage may be shared from the first fork on
    const bool fork_shares_; // the cache declares KVC_FEATURE_FORK_SHARES (not judged for evicting caches)
    uint32_t block_size_ = 0; // from the cache's last memory report (0: none yet)
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
