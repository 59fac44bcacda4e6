// kvcheck grade: what an implementation wrote back for exported vectors, graded with the checks that make sense
// offline (EQUIV, CACHE-CONTENT, APPEND-ONLY, MEMORY and the properties built from them). The harness's model is
// rebuilt from the case's script and data seed, exactly as the plugin session keeps it, and each step of the
// results is checked against it. docs/vectors.md specifies the results. What grading finds is printed and written
// by grade_report.cpp.
#include "kvcheck/vectors/vectors.hpp"

#include "grade_inputs.hpp"
#include "grade_report.hpp"

#include "kvcheck/harness/errors.hpp"
#include "kvcheck/harness/input_file.hpp"
#include "kvcheck/harness/report.hpp"
#include "kvcheck/vectors/safetensors.hpp"
#include "kvcheck/vectors/caps.hpp"
#include "kvcheck/vectors/model.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/cache_model.hpp"
#include "kvcheck/properties/output_grade.hpp"
#include "kvcheck/properties/properties.hpp"
#include "kvcheck/properties/runner.hpp"
#include "kvcheck/properties/tolerance.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

namespace kvc::vec {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The implementation's results for a case are readable but incomplete or of the wrong shape: ERROR.
struct CaseError {
    std::string reason;
    int step = -1;
};

// A check failed: FAIL of the case's property.
struct CaseFail {
    std::string reason;
    prop::Mismatch m;
    int step = -1;
};

// ---- grading one case ----

class CaseGrader {
public:
    CaseGrader(const VCase& vc, const Results& res, const st::File& f, const json& js, std::string file)
        : vc_(vc), res_(res), results_(f), results_json_(js), file_(std::move(file)), cfg_(vc.c.cfg),
          head_dim_(cfg_.head_dim), head_dim_v_(cfg_.dv()),
          row_elems_(static_cast<size_t>(cfg_.n_kv_heads) * head_dim_),
          v_row_elems_(static_cast<size_t>(cfg_.n_kv_heads) * head_dim_v_), model_(cfg_),
          quantized_(model_.quantized()) {}

    // Throws CaseFail / CaseError.
    void run() {
        if (results_json_.contains("case") && results_json_["case"] != vc_.id)
            error(-1, file_ + ".json says it holds case " + results_json_["case"].dump() + ", not " + vc_.id);
        if (vc_.checks.memory) {
            const json& live = results_json_.contains("live_bytes") ? results_json_["live_bytes"] : json();
            if (!live.is_array() || live.size() != vc_.steps.size())
                error(-1, file_ + ".json: \"live_bytes\" must be an array of one integer per step (" +
                              std::to_string(vc_.steps.size()) + " steps)");
            for (const json& x : live)
                if (!x.is_number_unsigned())
                    error(-1, file_ + ".json: \"live_bytes\" holds " + x.dump() + ", not a non-negative integer");
        }
        for (size_t i = 0; i < vc_.steps.size(); ++i) {
            step_ = static_cast<int>(i);
            const Step& s = vc_.steps[i];
            switch (s.kind) {
            case StepKind::Append:
            case StepKind::AppendBatch: append(s); break;
            case StepKind::Fork: model_.fork(s.seq, s.child); break;
            case StepKind::Release: model_.release(s.seq); break;
            }
            if (vc_.checks.memory) check_memory(s);
        }
        step_ = -1;
        finals();
    }

    double headroom = 0;
    bool fails_f32_class = false;
    std::vector<std::string> graded_by; // with pipeline rules: the declarations that graded the outputs

private:
    [[noreturn]] void error(int step, const std::string& reason) { throw CaseError{reason, step}; }

    [[noreturn]] void fail(const std::string& reason, prop::Mismatch m) {
        if (m.op < 0 && step_ >= 0) m.op = static_cast<int>(vc_.steps[static_cast<size_t>(step_)].op);
        throw CaseFail{reason, std::move(m), step_};
    }

    const st::Tensor& tensor(const std::string& name, st::DType dt) {
        const st::Tensor* t = results_.find(name);
        if (!t) error(step_, file_ + ".safetensors: tensor \"" + name + "\" is missing");
        if (t->dtype != dt)
            error(step_, file_ + ".safetensors: tensor \"" + name + "\" is " + st::dtype_name(t->dtype) +
                             ", expected " + st::dtype_name(dt));
        return *t;
    }

    // A dump of every row of one (sequence, layer) in the cache dtype, rows as the model says: [rows][Hkv][d] values
    // or codes (a V dump [rows][Hkv][head_dim_v]), and for a quantized cache their scales (scales_shape) in the
    // tensor scales_name(name).
    struct Dump {
        const st::Tensor* rows = nullptr;
        const st::Tensor* scales = nullptr;
        const uint8_t* row_bytes(uint32_t first) const { return rows->data.data() + first * bytes_per_row; }
        const uint8_t* scale_bytes(uint32_t first) const {
            // an empty tensor's data() may be null, which the model reads as "no scales at all"
            static const uint8_t kNone = 0;
            if (!scales) return nullptr;
            return scales->data.empty() ? &kNone : scales->data.data() + first * scale_bytes_per_row;
        }
        size_t bytes_per_row = 0, scale_bytes_per_row = 0;
    };

    void expect_shape(const std::string& name, const st::Tensor& t, const std::vector<uint64_t>& want) {
        if (t.shape != want)
            error(step_, file_ + ".safetensors: tensor \"" + name + "\" has shape " + st::shape_text(t.shape) +
                             ", expected " + st::shape_text(want));
    }

    Dump dump(const std::string& name, uint32_t seq, uint32_t layer, uint32_t rows, bool v) {
        const st::Tensor& t = tensor(name, cache_st_dtype(cfg_.cache_dtype));
        const uint32_t dims = v ? head_dim_v_ : head_dim_;
        if (t.shape.size() != 3 || t.shape[1] != cfg_.n_kv_heads || t.shape[2] != dims)
            error(step_, file_ + ".safetensors: tensor \"" + name + "\" has shape " + st::shape_text(t.shape) +
                             ", expected [rows, " + std::to_string(cfg_.n_kv_heads) + ", " + std::to_string(dims) +
                             "]" + (v && dims != head_dim_ ? " (V rows have head_dim_v dims)" : ""));
        if (t.shape[0] != rows) {
            prop::Mismatch m;
            m.what = "seq_length";
            m.seq = static_cast<int>(seq);
            m.layer = static_cast<int>(layer);
            m.expected = rows;
            m.actual = static_cast<double>(t.shape[0]);
            fail("the cache dump \"" + name + "\" holds " + std::to_string(t.shape[0]) + " rows; the sequence holds " +
                     std::to_string(rows) + " in this layer",
                 m);
        }
        Dump d;
        d.rows = &t;
        d.bytes_per_row = v ? model_.v_bytes(1) : model_.kv_bytes(1);
        if (!quantized_) return d;
        // the scales of exactly these rows: a quantized dump without them cannot be judged (ERROR, not FAIL)
        const std::string sname = scales_name(name);
        d.scales = &tensor(sname, scales_st_dtype(cfg_));
        expect_shape(sname, *d.scales, scales_shape(cfg_, rows));
        d.scale_bytes_per_row = model_.scale_bytes(1);
        return d;
    }

    // Rows dumped earlier are bitwise what they were when first dumped (the model holds them as first dumped),
    // a quantized cache's scales included.
    std::optional<prop::Mismatch> changed(uint32_t seq, uint32_t layer, const Dump& k, const Dump& v) {
        if (!vc_.checks.unchanged) return std::nullopt;
        return model_.first_changed(seq, layer, k.row_bytes(0), v.row_bytes(0), k.scale_bytes(0), v.scale_bytes(0));
    }

    static std::string rewritten_reason(const prop::Mismatch& m) {
        return std::string("a row dumped earlier changed: ") + prop::kRewrittenRule +
               (m.what.find("scale") != std::string::npos ? " (a stored scale changed)" : "");
    }

    void append(const Step& s) {
        const std::string base = "step" + std::to_string(step_) + ".";
        const AppendInputs in = step_inputs(vc_.c, s);
        const st::Tensor& out = tensor(base + "out", st::DType::F32);
        const std::vector<uint64_t> out_shape{s.n_new, cfg_.n_q_heads, head_dim_v_}; // outputs have V's dims
        if (out.shape != out_shape)
            error(step_, file_ + ".safetensors: tensor \"" + base + "out\" has shape " + st::shape_text(out.shape) +
                             ", expected " + st::shape_text(out_shape));
        const std::vector<float> actual = st::to_f32(out);
        const size_t qrow = static_cast<size_t>(cfg_.n_q_heads) * head_dim_;
        const size_t orow = static_cast<size_t>(cfg_.n_q_heads) * head_dim_v_;
        for (const Slice& sl : s.slices)
            append_slice(s, sl, in.q.data() + sl.token_begin * qrow, in.k.data() + sl.token_begin * row_elems_,
                         in.v.data() + sl.token_begin * v_row_elems_, actual.data() + sl.token_begin * orow);
    }

    // One sequence's part of an append step: q [n][Hq*d], k [n][Hkv*d], v [n][Hkv*dv] its inputs, out [n][Hq*dv]
    // its outputs.
    void append_slice(const Step& s, const Slice& sl, const float* q, const float* k, const float* v,
                      const float* out) {
        const uint32_t before = model_.length(sl.seq, s.layer), after = before + sl.n_new;
        const size_t i_step = static_cast<size_t>(step_);
        const Dump kd = dump(dump_name(s, i_step, sl, "k"), sl.seq, s.layer, after, false);
        const Dump vd = dump(dump_name(s, i_step, sl, "v"), sl.seq, s.layer, after, true);
        const std::optional<prop::Mismatch> rewritten = changed(sl.seq, s.layer, kd, vd); // before the new rows
        std::string why;
        // the pipeline of the path this call took for this sequence (ABI 1.3 rules), as the plugin route chooses it
        prop::ChosenPipeline chosen = prop::pipeline_for(res_.declared.caps, cfg_.cache_dtype, sl.n_new);
        if (chosen.rule < 0) chosen.pipeline = res_.declared.pipeline; // "pipeline" or the older "precision" preset
        const std::optional<prop::Mismatch> wrong =
            model_.store(sl.seq, s.layer, sl.n_new, k, v, kd.row_bytes(before), vd.row_bytes(before),
                         chosen.pipeline.rope, kd.scale_bytes(before), vd.scale_bytes(before), &why);
        if (wrong && vc_.checks.content) fail(stored_reason(*wrong, why), *wrong);
        if (wrong && !storage_mismatch_) storage_mismatch_ = wrong; // EQUIV's diagnosis names the first
        if (rewritten) fail(rewritten_reason(*rewritten), *rewritten);

        if (!vc_.checks.equiv || sl.n_new == 0) return;
        prop::GradedRows rows;
        rows.q = q;
        rows.out = out;
        rows.n_rows = sl.n_new;
        rows.history = after;
        rows.call_begin = before;
        rows.call_k = k;
        rows.call_v = v;
        const prop::OutputVerdict o =
            prop::grade_call_outputs(model_, sl.seq, s.layer, chosen.pipeline, rows, storage_mismatch_);
        headroom = std::max(headroom, o.grade.headroom);
        fails_f32_class = fails_f32_class || o.grade.fails_f32_class;
        const bool rules = !prop::pipeline_rules(res_.declared.caps).empty();
        const std::string by = rules ? prop::graded_by_name(res_.declared.caps, chosen.rule) : std::string();
        if (rules && std::find(graded_by.begin(), graded_by.end(), by) == graded_by.end()) graded_by.push_back(by);
        // a windowed layer's failure says what window the outputs match instead, as the plugin route says it; with
        // rules, the declaration that graded the call
        if (!o.grade.pass)
            fail(o.reason + prop::window_diagnosis(model_, sl.seq, s.layer, chosen.pipeline, rows) +
                     (rules ? " [graded by " + by + ": " + prop::pipeline_name(chosen.pipeline) + "]" : ""),
                 o.where);
    }

    // CACHE-CONTENT's reason: the model's account of the first element unlike the expected one, said of the dump:
    // the stored-row rule and what every wrong row of the call is consistent with (V read with K's row stride, RoPE
    // over all dims), or for a quantized cache the code or scale unlike the reference quantizer's and its mechanism.
    std::string stored_reason(const prop::Mismatch& m, const std::string& why) const {
        if (why.empty()) return prop::stored_row_reason(cfg_, "dumped", m);
        const std::string model_source = "read-back ";
        return why.rfind(model_source, 0) == 0 ? "dumped " + why.substr(model_source.size()) : why;
    }

    void check_memory(const Step& s) {
        const uint64_t want = model_.live_bytes();
        const uint64_t got = results_json_["live_bytes"][static_cast<size_t>(step_)].get<uint64_t>();
        if (got == want) return;
        prop::Mismatch m;
        m.what = "live_bytes";
        m.op = static_cast<int>(s.op);
        m.expected = static_cast<double>(want);
        m.actual = static_cast<double>(got);
        fail(prop::kLiveBytesRule, m);
    }

    // After the last step: every started (sequence, layer) dumped whole, lengths as the model says, and no row
    // changed since it was first dumped (forks share their parent's rows, releases forget).
    void finals() {
        for (uint32_t q = 0; q < cfg_.max_seqs; ++q)
            for (uint32_t l = 0; l < cfg_.n_layers; ++l) {
                const uint32_t len = model_.length(q, l);
                if (len == 0) continue;
                const std::string base = "final.s" + std::to_string(q) + ".l" + std::to_string(l) + ".";
                const Dump k = dump(base + "k", q, l, len, false);
                const Dump v = dump(base + "v", q, l, len, true);
                if (const auto m = changed(q, l, k, v)) fail(rewritten_reason(*m), *m);
            }
    }

    const VCase& vc_;
    const Results& res_;
    const st::File& results_;  // the case's results tensors
    const json& results_json_; // the case's results JSON (live bytes)
    const std::string file_;   // results path without extension
    const prop::CaseConfig& cfg_;
    const uint32_t head_dim_, head_dim_v_;
    const size_t row_elems_, v_row_elems_;
    prop::CacheModel model_;
    const bool quantized_; // codes and scales: every dump has a scales tensor beside it
    std::optional<prop::Mismatch> storage_mismatch_; // the first element dumped unlike the appended one (EQUIV only)
    int step_ = -1;
};

std::string joined(const std::vector<std::string>& words) {
    std::string s;
    for (const std::string& w : words) s += (s.empty() ? "" : ", ") + w;
    return s;
}

Graded grade_case(const VCase& vc, const Results& res, const fs::path& results_dir) {
    Graded g;
    g.r.id = vc.id;
    g.r.property = vc.property;
    g.r.seed = vc.seed;
    g.r.counterexample = vc.c;
    g.outputs = vc.checks.equiv;
    // A q quantized to q8_0 blocks needs whole blocks of 32 per head: a case of another head_dim lies outside the
    // declaration whether or not results were written (the plugin route says the same, before running it).
    const prop::Pipeline& pipeline = res.declared.pipeline;
    if (pipeline.q == KVC_ROUND_Q8_0 && vc.c.cfg.head_dim % 32 != 0) {
        g.outside = true;
        g.needs = {"head_dim " + std::to_string(vc.c.cfg.head_dim) +
                   " not a multiple of 32 (the declared q8_0 query rounding quantizes q in blocks of 32)"};
        return g;
    }
    const fs::path stp = results_dir / (vc.stem + ".safetensors"), jsp = results_dir / (vc.stem + ".json");
    const bool has_st = fs::exists(stp), has_js = fs::exists(jsp);
    if (!has_st && !has_js) {
        const kvc_caps& caps = res.declared.caps;
        std::vector<std::string> missing = unsupported(vc.c, caps);
        const prop::Property* p = prop::find_property(vc.property);
        if (missing.empty() && p && p->feature && !(caps.features & p->feature)) {
            kvc_caps need{};
            need.features = p->feature;
            missing = prop::missing_caps(need, caps);
        }
        if (!missing.empty()) {
            g.outside = true;
            g.needs = missing;
            return g;
        }
        // Skipped by the driver, not outside the declaration: a driver for an older vectors format skips (or
        // fails on) append_batch steps while its manifest still declares "batch".
        g.r.verdict = prop::Verdict::Error;
        g.skipped = true;
        g.r.reason = "no results (" + stp.filename().string() + " and " + jsp.filename().string() +
                     " are missing) although the implementation declares every capability the case needs: the "
                     "driver skipped it";
        return g;
    }
    if (!has_st || !has_js) {
        g.r.verdict = prop::Verdict::Error;
        g.r.reason = has_st ? "" : driver_error_reason(results_dir, jsp.filename().string());
        if (g.r.reason.empty()) g.r.reason = (has_st ? jsp : stp).string() + " is missing";
        return g;
    }
    // The stems are plain names, but either file may be a symbolic link: it must not lead out of the results.
    std::string st_real, js_real;
    try {
        st_real = harness::confined_path(results_dir.string(), stp.filename().string());
        js_real = harness::confined_path(results_dir.string(), jsp.filename().string());
    } catch (const harness::InputError& x) {
        throw BadInput(results_dir.string() + ": " + x.what());
    }
    st::File f;
    try {
        f = st::read_file(st_real);
    } catch (const st::FormatError& e) {
        throw BadInput(stp.string() + ": " + e.problem());
    }
    json js;
    try {
        js = harness::parse_json_strict(harness::read_bounded(js_real, harness::kMaxJsonBytes));
    } catch (const harness::InputError& e) {
        throw BadInput(jsp.string() + ": " + e.what());
    }
    if (!js.is_object()) throw BadInput(jsp.string() + ": not a JSON object");

    // the q8_0 rounding the implementation declares decides the codes its cache must hold, as in evaluate_case
    VCase declared = vc;
    declared.c.cfg.q8_0_rounding = pipeline.q8_0_rounding;
    CaseGrader grader(declared, res, f, js, (results_dir / vc.stem).string());
    try {
        grader.run();
        g.r.headroom = grader.headroom;
        g.r.graded_by = grader.graded_by;
        if (grader.fails_f32_class)
            g.r.notes.push_back("passes its declared precision pipeline but would fail the f32 class");
        std::vector<prop::Pipeline> graders = prop::pipelines_for_dtype(res.declared.caps, vc.c.cfg.cache_dtype);
        graders.push_back(res.declared.pipeline);
        const bool unrounded = std::any_of(graders.begin(), graders.end(),
                                           [](const prop::Pipeline& p) { return p.new_rows_unrounded; });
        if (unrounded && vc.c.cfg.cache_dtype != KVC_DTYPE_F32 && vc.checks.equiv)
            g.r.notes.push_back("declares new rows attended before rounding to the cache dtype: its outputs depend on "
                                "how a prompt is split into calls");
        if (grader.headroom > prop::kQualityWarningHeadroom) {
            g.r.verdict = prop::Verdict::QualityWarning;
            std::ostringstream m;
            m << "passes, but the worst error uses " << grader.headroom * 100 << "% of the allowed bound";
            g.r.reason = m.str();
        }
    } catch (const CaseFail& f2) {
        g.r.verdict = prop::Verdict::Fail;
        g.r.failed_property = vc.property;
        g.r.reason = f2.reason;
        g.r.mismatch = f2.m;
        g.r.headroom = grader.headroom;
        g.step = f2.step;
    } catch (const CaseError& e) {
        g.r.verdict = prop::Verdict::Error;
        g.r.reason = e.reason;
        g.step = e.step;
    }
    return g;
}

} // namespace

int run_grade(const GradeOptions& o, std::ostream& out, std::ostream& err) {
    GradeReport rep; // what grading finds, for report_grade to print and write
    const Results& res = rep.results;
    try {
        if (!fs::is_directory(o.vectors)) throw BadInput(o.vectors + ": not a directory (--vectors)");
        if (!fs::is_directory(o.results)) throw BadInput(o.results + ": not a directory (--results)");
        // before grading: a FIFO, device or symbolic link is never replaced, and --report and --junit naming one
        // file (by identity, not spelling) would leave one of them overwritten by the other
        std::string why;
        if (!harness::check_output_files({{"--report", o.report}, {"--junit", o.junit}}, why))
            throw BadInput("cannot write the report: " + why);
        const Vectors vectors = load_vectors(o.vectors);
        rep.vectors_seed = vectors.seed;
        rep.results = load_results(o.results);
        // Which cases lie outside the declaration must mean one thing for the export and the grade: results that
        // declare less than the export was given would turn exported cases the driver skipped into cases "outside
        // the declaration" without a word. Results that declare more change nothing: every exported case is inside.
        if (vectors.has_declared) {
            const std::vector<std::string> diff =
                narrower_declaration(vectors.declared, "the export", res.declared, "the results");
            if (!diff.empty())
                throw BadInput((fs::path(o.results) / "manifest.json").string() +
                               " declares less than the vectors were exported for (" +
                               (fs::path(o.vectors) / "manifest.json").string() + ", \"declared\"): " + joined(diff) +
                               ". Write the results manifest with the declaration given to `kvcheck export --caps`, "
                               "or export again with the results' declaration");
            if (vectors.declared.has_pipeline && !same_pipeline(vectors.declared, res.declared))
                rep.warnings.push_back("the results declare the pipeline " + res.declared.pipeline_text +
                                       ", the export was given " + vectors.declared.pipeline_text + ": graded for " +
                                       res.declared.pipeline_text);
        }
        for (const Refused& rf : vectors.refused) { // outside the declaration the export was given
            Graded g;
            g.r.id = rf.id;
            g.r.property = rf.property;
            g.r.seed = rf.seed;
            g.outside = true;
            g.exported = false;
            g.needs = rf.needs;
            rep.cases.push_back(std::move(g));
        }
        for (const VCase& vc : vectors.cases) rep.cases.push_back(grade_case(vc, res, o.results));
    } catch (const BadInput& e) {
        err << "kvcheck grade: " << harness::printable(e.what(), true) << "\n";
        return harness::kExitBadInput;
    }

    // the order of the export: property by property, index by index, refused cases among the exported ones
    std::vector<Graded>& all = rep.cases;
    std::map<std::string, size_t> rank;
    for (const Graded& g : all) rank.emplace(g.r.property, rank.size());
    const auto index_of = [](const std::string& id) { // "EQUIV/12" -> 12; an id of another shape sorts first
        const size_t slash = id.rfind('/');
        const std::string n = slash == std::string::npos ? "" : id.substr(slash + 1);
        if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos) return -1L;
        return std::stol(n);
    };
    std::stable_sort(all.begin(), all.end(), [&](const Graded& a, const Graded& b) {
        const size_t ra = rank[a.r.property], rb = rank[b.r.property];
        return ra != rb ? ra < rb : index_of(a.r.id) < index_of(b.r.id);
    });
    rep.properties.resize(rank.size()); // ranks are 0, 1, ... in the order first seen
    for (const auto& [p, r] : rank) rep.properties[r] = p;

    // Cases outside the declaration get no verdict: they are counted apart, grouped by what they need.
    size_t n_outside_exported = 0, n_skipped = 0;
    for (const Graded& g : all) {
        n_skipped += g.skipped;
        if (!g.outside) continue;
        ++rep.n_outside;
        n_outside_exported += g.exported;
        ++rep.outside_by_property[g.r.property];
        const std::string key =
            "needing " + joined(g.needs) + (g.exported ? " (exported, no results)" : " (not exported)");
        auto& groups = rep.outside_groups;
        auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == key; });
        if (it == groups.end()) it = groups.insert(groups.end(), {key, {}});
        it->second.push_back(g.r.id);
    }
    if (n_outside_exported > 0)
        rep.warnings.push_back(std::to_string(n_outside_exported) + " exported case" +
                               (n_outside_exported == 1 ? " has" : "s have") +
                               " no results and lie outside the results' declaration: not graded (export with "
                               "--caps to leave them out, or declare what they need and run them)");
    if (n_skipped > 0)
        rep.warnings.push_back("the driver wrote no results for " + std::to_string(n_skipped) + " case" +
                               (n_skipped == 1 ? "" : "s") +
                               " inside its declaration: each is an ERROR (a driver for an older vectors format "
                               "skips append_batch steps; see docs/vectors.md)");
    return report_grade(rep, o, out, err);
}

} // namespace kvc::vec
