// kvcheck grade: what an implementation wrote back for exported vectors, graded with the checks that make sense
// offline (EQUIV, CACHE-CONTENT, APPEND-ONLY, MEMORY and the properties built from them). The harness's model is
// rebuilt from the case's script and data seed, exactly as the plugin session keeps it, and each step of the
// results is checked against it. docs/vectors.md specifies the results.
#include "vectors_commands.hpp"

#include "commands.hpp"
#include "kvcheck/harness/input_file.hpp"
#include "kvcheck/harness/report.hpp"
#include "safetensors.hpp"
#include "vectors_caps.hpp"
#include "vectors_model.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/oracle.hpp"
#include "kvcheck/properties/properties.hpp"
#include "kvcheck/properties/runner.hpp"
#include "kvcheck/properties/tolerance.hpp"
#include "kvcheck/reference/dtype.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace kvc::vec {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A missing or malformed file: grading stops with exit 2. The message names the file and the problem.
class BadInput : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

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

// Bounded, regular files only, duplicate keys refused, any parser exception (1e400) a BadInput naming the file.
json read_json(const fs::path& p) {
    try {
        return harness::read_json_file(p.string());
    } catch (const harness::InputError& e) {
        throw BadInput(e.what());
    }
}

template <typename T>
T field(const json& j, const char* key, const std::string& where) {
    if (!j.is_object() || !j.contains(key)) throw BadInput(where + ": missing field \"" + key + "\"");
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) { // checked before narrowing: 2^32+1 is not 1
        const std::optional<T> v = harness::integer_of<T>(j.at(key));
        if (!v)
            throw BadInput(where + ": field \"" + key + "\" is " + j.at(key).dump() + ", not an integer from " +
                           std::to_string(std::numeric_limits<T>::min()) + " to " +
                           std::to_string(std::numeric_limits<T>::max()));
        return *v;
    }
    T value;
    try {
        value = j.at(key).get<T>();
    } catch (const json::exception&) {
        throw BadInput(where + ": field \"" + key + "\" has the wrong type");
    }
    // Ids, file stems and names reach the verdict table and messages: a control character (an escape sequence that
    // recolours or retitles the terminal) is refused here, where the field can still be named. export writes none.
    const auto refuse_controls = [&](const std::string& text) {
        for (const char ch : text)
            if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
                throw BadInput(where + ": field \"" + key + "\" holds a control character (byte " +
                               std::to_string(static_cast<int>(ch)) + ")");
    };
    if constexpr (std::is_same_v<T, std::string>) refuse_controls(value);
    if constexpr (std::is_same_v<T, std::vector<std::string>>)
        for (const std::string& text : value) refuse_controls(text);
    return value;
}

st::DType cache_st_dtype(uint32_t dtype) {
    return dtype == KVC_DTYPE_F32 ? st::DType::F32 : dtype == KVC_DTYPE_F16 ? st::DType::F16 : st::DType::BF16;
}

std::string shape_text(const std::vector<uint64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
}

// ---- the exported vectors ----

struct VCase {
    std::string id, property, stem;
    int index = 0;
    uint64_t seed = 0;
    std::vector<std::string> requires_;
    prop::Case c;
    OfflineChecks checks;
    std::vector<Step> steps;
};

// A case `kvcheck export` did not write because it lies outside the declared capabilities.
struct Refused {
    std::string id, property;
    uint64_t seed = 0;
    std::vector<std::string> needs;
};

struct Vectors {
    uint64_t seed = 0;
    std::vector<VCase> cases;
    std::vector<Refused> refused;
};

// The inputs file must hold exactly what the case's data seed gives: the numbers the implementation computed with
// are the numbers the harness grades against.
// `real` is the file opened (confined_path's result), `file` the path as the manifest names it, for messages.
void check_inputs(const std::string& real, const fs::path& file, const VCase& vc) {
    st::File f;
    try {
        f = st::read_file(real);
    } catch (const st::FormatError& e) {
        throw BadInput(file.string() + ": " + e.problem());
    }
    const prop::CaseConfig& cfg = vc.c.cfg;
    for (size_t i = 0; i < vc.steps.size(); ++i) {
        const Step& s = vc.steps[i];
        if (!s.appends()) continue;
        const StepInputs in = step_inputs(vc.c, s);
        const std::pair<const char*, const std::vector<float>*> parts[] = {{"q", &in.q}, {"k", &in.k}, {"v", &in.v}};
        for (const auto& [what, want] : parts) {
            const std::string name = "step" + std::to_string(i) + "." + what;
            const st::Tensor* t = f.find(name);
            const uint64_t heads = std::string(what) == "q" ? cfg.n_q_heads : cfg.n_kv_heads;
            const std::vector<uint64_t> shape{s.n_new, heads, cfg.head_dim};
            if (!t) throw BadInput(file.string() + ": tensor \"" + name + "\" is missing");
            if (t->dtype != st::DType::F32 || t->shape != shape)
                throw BadInput(file.string() + ": tensor \"" + name + "\" is " + st::dtype_name(t->dtype) + " " +
                               shape_text(t->shape) + ", expected F32 " + shape_text(shape));
            // An empty tensor (a step with no new tokens) has no data pointer: memcmp must not see it (UBSan).
            if (!t->data.empty() && std::memcmp(t->data.data(), want->data(), t->data.size()) != 0)
                throw BadInput(file.string() + ": tensor \"" + name +
                               "\" differs from the values the case's data_seed gives (the vectors were modified)");
        }
    }
}

// A directory's manifest.json, refused before it is opened when it is a symbolic link leading out of the directory
// (as every file grade reads: its bytes could otherwise show in a message, or a manifest elsewhere be graded).
json read_manifest(const fs::path& dir) {
    const fs::path mpath = dir / "manifest.json";
    std::error_code ec;
    if (fs::is_symlink(mpath, ec)) {
        try {
            harness::confined_path(dir.string(), "manifest.json");
        } catch (const harness::InputError& x) {
            throw BadInput(mpath.string() + ": " + x.what());
        }
    }
    return read_json(mpath);
}

Vectors load_vectors(const fs::path& dir) {
    const fs::path mpath = dir / "manifest.json";
    const std::string m = mpath.string();
    const json j = read_manifest(dir);
    if (!j.is_object()) throw BadInput(m + ": not a JSON object");
    const int format = field<int>(j, "kvcheck_vectors", m);
    if (format != kVectorsFormat)
        throw BadInput(m + ": vectors format " + std::to_string(format) + ", this kvcheck reads format " +
                       std::to_string(kVectorsFormat));
    Vectors v;
    v.seed = field<uint64_t>(j, "seed", m);
    const json cases = field<json>(j, "cases", m);
    if (!cases.is_array()) throw BadInput(m + ": field \"cases\" is not an array");
    std::set<std::string> seen;
    if (j.contains("not_supported")) {
        const json& ns = j["not_supported"];
        if (!ns.is_array()) throw BadInput(m + ": field \"not_supported\" is not an array");
        for (size_t k = 0; k < ns.size(); ++k) {
            const std::string where = m + ": not_supported #" + std::to_string(k);
            Refused r;
            r.id = field<std::string>(ns[k], "id", where);
            r.property = field<std::string>(ns[k], "property", where);
            r.seed = field<uint64_t>(ns[k], "seed", where);
            r.needs = field<std::vector<std::string>>(ns[k], "needs", where);
            if (!seen.insert(r.id).second) throw BadInput(where + ": case " + r.id + " listed twice");
            v.refused.push_back(std::move(r));
        }
    }
    for (size_t k = 0; k < cases.size(); ++k) {
        const json& e = cases[k];
        const std::string where0 = m + ": case #" + std::to_string(k);
        VCase vc;
        vc.id = field<std::string>(e, "id", where0);
        const std::string where = m + ": case " + vc.id;
        if (!seen.insert(vc.id).second) throw BadInput(where + ": listed twice");
        vc.property = field<std::string>(e, "property", where);
        const OfflineProperty op = offline_property(vc.property);
        if (!op.ok) throw BadInput(where + ": property \"" + vc.property + "\" cannot be graded from files");
        vc.checks = op.checks;
        vc.index = field<int>(e, "index", where);
        vc.seed = field<uint64_t>(e, "seed", where);
        vc.stem = field<std::string>(e, "file", where);
        if (vc.stem.empty() || vc.stem.find_first_of("/\\") != std::string::npos || vc.stem[0] == '.')
            throw BadInput(where + ": field \"file\" must be a plain file stem");
        vc.requires_ = field<std::vector<std::string>>(e, "requires", where);
        const std::string inputs = field<std::string>(e, "inputs", where);
        const json config = field<json>(e, "config", where);
        const json steps = field<json>(e, "steps", where);
        try {
            vc.c = prop::case_from_json(field<json>(e, "case", where));
        } catch (const std::invalid_argument& x) {
            throw BadInput(where + ": field \"case\": " + x.what());
        }
        if (config != config_json(vc.c.cfg))
            throw BadInput(where + ": \"config\" does not match the case's script (field \"case\")");
        vc.steps = expand_steps(vc.c);
        if (!steps.is_array() || steps.size() != vc.steps.size())
            throw BadInput(where + ": \"steps\" does not list the " + std::to_string(vc.steps.size()) +
                           " steps of the case's script");
        for (size_t i = 0; i < vc.steps.size(); ++i)
            if (steps[i] != step_json(vc.steps[i], i))
                throw BadInput(where + ": step " + std::to_string(i) + " does not match the case's script");
        // Only files inside the vectors directory are opened (no absolute path, no "..", no symbolic link leading
        // out of it): a manifest must not make grade read /etc/shadow, nor show its bytes in an error.
        std::string real;
        try {
            real = harness::confined_path(dir.string(), inputs);
        } catch (const harness::InputError& x) {
            throw BadInput(where + ": field \"inputs\": " + x.what());
        }
        check_inputs(real, dir / inputs, vc);
        v.cases.push_back(std::move(vc));
    }
    // export never writes such a manifest; graded, it would pass with nothing judged
    if (v.cases.empty() && v.refused.empty())
        throw BadInput(m + ": lists no case (\"cases\" and \"not_supported\" are empty)");
    return v;
}

// ---- the results ----

struct Results {
    std::string name, version;
    Declared declared; // capabilities, limits and the pipeline it is graded for
};

Results load_results(const fs::path& dir) {
    const fs::path mpath = dir / "manifest.json";
    const std::string m = mpath.string();
    const json j = read_manifest(dir);
    if (!j.is_object()) throw BadInput(m + ": not a JSON object");
    const int format = field<int>(j, "kvcheck_results", m);
    if (format != kResultsFormat)
        throw BadInput(m + ": results format " + std::to_string(format) + ", this kvcheck reads format " +
                       std::to_string(kResultsFormat));
    Results r;
    r.name = field<std::string>(j, "implementation", m);
    r.version = j.contains("version") ? field<std::string>(j, "version", m) : "";
    try {
        r.declared = declared_from_json(j, true);
    } catch (const std::invalid_argument& e) {
        throw BadInput(m + ": " + e.what());
    }
    return r;
}

// ---- grading one case ----

// The harness's model of one (sequence, layer): what the oracle computes with and what was dumped before.
struct Stream {
    uint32_t len = 0;
    std::vector<float> k_eff, v_eff;         // [len][Hkv*d]
    std::vector<uint8_t> k_known, v_known;   // [len][Hkv*d*s] bits as first dumped
};

class CaseGrader {
public:
    CaseGrader(const VCase& vc, const Results& res, const st::File& f, const json& js, std::string file)
        : vc_(vc), res_(res), f_(f), js_(js), file_(std::move(file)), cfg_(vc.c.cfg), d_(cfg_.head_dim),
          row_(static_cast<size_t>(cfg_.n_kv_heads) * d_), es_(dtype_size(cfg_.dtype)),
          streams_(cfg_.max_seqs, std::vector<Stream>(cfg_.n_layers)) {}

    // Throws CaseFail / CaseError.
    void run() {
        if (js_.contains("case") && js_["case"] != vc_.id)
            error(-1, file_ + ".json says it holds case " + js_["case"].dump() + ", not " + vc_.id);
        if (vc_.checks.memory) {
            if (!js_.contains("live_bytes") || !js_["live_bytes"].is_array() ||
                js_["live_bytes"].size() != vc_.steps.size())
                error(-1, file_ + ".json: \"live_bytes\" must be an array of one integer per step (" +
                              std::to_string(vc_.steps.size()) + " steps)");
            for (const json& x : js_["live_bytes"])
                if (!x.is_number_unsigned())
                    error(-1, file_ + ".json: \"live_bytes\" holds " + x.dump() + ", not a non-negative integer");
        }
        for (size_t i = 0; i < vc_.steps.size(); ++i) {
            step_ = static_cast<int>(i);
            const Step& s = vc_.steps[i];
            switch (s.kind) {
            case StepKind::Append:
            case StepKind::AppendBatch: append(s); break;
            case StepKind::Fork:
                for (uint32_t l = 0; l < cfg_.n_layers; ++l) streams_[s.child][l] = streams_[s.seq][l];
                break;
            case StepKind::Release:
                for (uint32_t l = 0; l < cfg_.n_layers; ++l) streams_[s.seq][l] = Stream{};
                break;
            }
            if (vc_.checks.memory) check_memory(s);
        }
        step_ = -1;
        finals();
    }

    double headroom = 0;
    bool fails_f32_class = false;

private:
    // The rows the call's queries attend with its new rows as given (rotated, unrounded): what a pipeline that
    // declares new_rows_unrounded computes with, and the hypothesis the diagnosis of a failure tries.
    prop::Expected unrounded(const Stream& strm, const Slice& sl, const float* q, const float* k, const float* v) {
        std::vector<float> ku = strm.k_eff, vu = strm.v_eff;
        const size_t first = static_cast<size_t>(strm.len - sl.n_new) * row_;
        for (uint32_t i = 0; i < sl.n_new; ++i)
            prop::expected_rotated_key(cfg_, k + i * row_, sl.pos_begin + i, ku.data() + first + i * row_);
        std::copy(v, v + static_cast<size_t>(sl.n_new) * row_, vu.begin() + static_cast<std::ptrdiff_t>(first));
        return prop::expect_outputs(cfg_, q, sl.n_new, ku, vu, strm.len, prop::HeadMap::Repeat, sl.n_new);
    }

    [[noreturn]] void error(int step, const std::string& reason) { throw CaseError{reason, step}; }

    [[noreturn]] void fail(const std::string& reason, prop::Mismatch m) {
        if (m.op < 0 && step_ >= 0) m.op = static_cast<int>(vc_.steps[static_cast<size_t>(step_)].op);
        throw CaseFail{reason, std::move(m), step_};
    }

    const st::Tensor& tensor(const std::string& name, st::DType dt) {
        const st::Tensor* t = f_.find(name);
        if (!t) error(step_, file_ + ".safetensors: tensor \"" + name + "\" is missing");
        if (t->dtype != dt)
            error(step_, file_ + ".safetensors: tensor \"" + name + "\" is " + st::dtype_name(t->dtype) +
                             ", expected " + st::dtype_name(dt));
        return *t;
    }

    // A dump of every row of one (sequence, layer): [rows][Hkv][d] in the cache dtype, rows as the model says.
    const st::Tensor& dump(const std::string& name, uint32_t seq, uint32_t layer, uint32_t rows) {
        const st::Tensor& t = tensor(name, cache_st_dtype(cfg_.dtype));
        if (t.shape.size() != 3 || t.shape[1] != cfg_.n_kv_heads || t.shape[2] != d_)
            error(step_, file_ + ".safetensors: tensor \"" + name + "\" has shape " + shape_text(t.shape) +
                             ", expected [rows, " + std::to_string(cfg_.n_kv_heads) + ", " + std::to_string(d_) + "]");
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
        return t;
    }

    prop::Mismatch at_element(const char* what, uint32_t seq, uint32_t layer, size_t element) const {
        prop::Mismatch m;
        m.what = what;
        m.seq = static_cast<int>(seq);
        m.layer = static_cast<int>(layer);
        m.pos = static_cast<int>(element / row_);
        m.head = static_cast<int>(element % row_ / d_);
        m.dim = static_cast<int>(element % d_);
        return m;
    }

    // Rows dumped earlier are bitwise what they were when first dumped.
    void check_unchanged(const Stream& s, const st::Tensor& k, const st::Tensor& v, uint32_t seq, uint32_t layer) {
        const std::pair<const std::vector<uint8_t>*, const st::Tensor*> pairs[] = {{&s.k_known, &k}, {&s.v_known, &v}};
        for (int pass = 0; pass < 2; ++pass) {
            const auto& want = *pairs[pass].first;
            const uint8_t* got = pairs[pass].second->data.data();
            if (want.empty() || std::memcmp(want.data(), got, want.size()) == 0) continue;
            size_t byte = 0;
            while (want[byte] == got[byte]) ++byte;
            const size_t el = byte / es_;
            prop::Mismatch m = at_element(pass == 0 ? "k" : "v", seq, layer, el);
            m.expected = ref::load_dtype(want.data() + el * es_, cfg_.dtype);
            m.actual = ref::load_dtype(got + el * es_, cfg_.dtype);
            fail("a row dumped earlier changed: the past of the cache was rewritten", m);
        }
    }

    void append(const Step& s) {
        const std::string base = "step" + std::to_string(step_) + ".";
        const StepInputs in = step_inputs(vc_.c, s);
        const st::Tensor& out = tensor(base + "out", st::DType::F32);
        const std::vector<uint64_t> out_shape{s.n_new, cfg_.n_q_heads, d_};
        if (out.shape != out_shape)
            error(step_, file_ + ".safetensors: tensor \"" + base + "out\" has shape " + shape_text(out.shape) +
                             ", expected " + shape_text(out_shape));
        const std::vector<float> actual = st::to_f32(out);
        const size_t qrow = static_cast<size_t>(cfg_.n_q_heads) * d_;
        for (const Slice& sl : s.slices)
            append_slice(s, sl, in.q.data() + sl.token_begin * qrow, in.k.data() + sl.token_begin * row_,
                         in.v.data() + sl.token_begin * row_, actual.data() + sl.token_begin * qrow);
    }

    // One sequence's part of an append step: q [n][Hq*d], k, v [n][Hkv*d] its inputs, out [n][Hq*d] its outputs.
    void append_slice(const Step& s, const Slice& sl, const float* q, const float* k, const float* v,
                      const float* out) {
        Stream& strm = streams_[sl.seq][s.layer];
        const StoredRows want = expected_new_rows(cfg_, sl, k, v);
        const uint32_t before = strm.len, after = before + sl.n_new;
        const size_t i_step = static_cast<size_t>(step_);
        const st::Tensor& kd = dump(dump_name(s, i_step, sl, "k"), sl.seq, s.layer, after);
        const st::Tensor& vd = dump(dump_name(s, i_step, sl, "v"), sl.seq, s.layer, after);

        // the new rows: rounded to the cache dtype, keys rotated (within an f32 rotation's error when rotated)
        for (uint32_t i = 0; i < sl.n_new; ++i)
            for (size_t x = 0; x < row_; ++x) {
                const size_t e = i * row_ + x, at = (static_cast<size_t>(before) + i) * row_ + x;
                const uint8_t* got_k = kd.data.data() + at * es_;
                const uint8_t* got_v = vd.data.data() + at * es_;
                const uint8_t* want_k = want.k_bits.data() + e * es_;
                const uint8_t* want_v = want.v_bits.data() + e * es_;
                const float gk = ref::load_dtype(got_k, cfg_.dtype), gv = ref::load_dtype(got_v, cfg_.dtype);
                const bool k_ok = std::memcmp(want_k, got_k, es_) == 0 ||
                                  (cfg_.rope != KVC_ROPE_NONE &&
                                   prop::stored_key_acceptable(cfg_, res_.declared.pipeline.rope, k + i * row_,
                                                               before + i, static_cast<uint32_t>(x), want.rotated[e],
                                                               gk));
                const bool v_ok = std::memcmp(want_v, got_v, es_) == 0;
                strm.k_eff.push_back(k_ok ? gk : want.k[e]);
                strm.v_eff.push_back(want.v[e]);
                if (!k_ok || !v_ok) {
                    prop::Mismatch m = at_element(!k_ok ? "k" : "v", sl.seq, s.layer, at);
                    m.expected = !k_ok ? want.k[e] : want.v[e];
                    m.actual = !k_ok ? gk : gv;
                    if (!vc_.checks.content) { // EQUIV's diagnosis names the first
                        if (!storage_mismatch_) storage_mismatch_ = m;
                        continue;
                    }
                    fail(std::string("dumped ") + m.what + " differs from the appended value rounded to " +
                             dtype_name(cfg_.dtype) +
                             (cfg_.rope != KVC_ROPE_NONE && !k_ok
                                  ? " and rotated (not the rounding of an f32 rotation, nor within the bound of the "
                                    "declared RoPE stage)"
                                  : " (bitwise)"),
                         m);
                }
            }
        if (vc_.checks.unchanged) check_unchanged(strm, kd, vd, sl.seq, s.layer);
        const auto old_bytes = static_cast<std::ptrdiff_t>(static_cast<size_t>(before) * row_ * es_);
        strm.k_known.insert(strm.k_known.end(), kd.data.begin() + old_bytes, kd.data.end());
        strm.v_known.insert(strm.v_known.end(), vd.data.begin() + old_bytes, vd.data.end());
        strm.len = after;

        if (!vc_.checks.equiv || sl.n_new == 0) return;
        // graded for the pipeline it declares, new rows attended unrounded included (as the plugin session does)
        const prop::Pipeline& pipe = res_.declared.pipeline;
        const bool narrow_cache = cfg_.dtype != KVC_DTYPE_F32;
        const bool declared_unrounded = pipe.new_rows_unrounded && narrow_cache;
        const prop::Expected e = declared_unrounded
                                     ? unrounded(strm, sl, q, k, v)
                                     : prop::expect_outputs(cfg_, q, sl.n_new, strm.k_eff, strm.v_eff, strm.len);
        const bool stored_right = !storage_mismatch_; // else the storage, not a pipeline, is named
        prop::Grade g = prop::grade_outputs(cfg_, pipe, out, e, nullptr, stored_right);
        headroom = std::max(headroom, g.headroom);
        fails_f32_class = fails_f32_class || g.fails_f32_class;
        if (g.pass) return;
        if (narrow_cache && !declared_unrounded && !g.nan) { // is it the new rows attended before rounding?
            const prop::Expected alt = unrounded(strm, sl, q, k, v);
            g = prop::grade_outputs(cfg_, pipe, out, e, &alt, stored_right);
        }
        prop::Mismatch m;
        m.what = "output";
        m.seq = static_cast<int>(sl.seq);
        m.layer = static_cast<int>(s.layer);
        m.pos = static_cast<int>(before + g.worst.token);
        m.head = static_cast<int>(g.worst.head);
        m.dim = static_cast<int>(g.worst.dim);
        m.expected = g.worst.expected;
        m.actual = g.worst.actual;
        fail(g.message + (storage_mismatch_ ? prop::storage_error_clause(cfg_.dtype, *storage_mismatch_) : ""), m);
    }

    void check_memory(const Step& s) {
        std::vector<std::vector<uint32_t>> lengths(cfg_.max_seqs, std::vector<uint32_t>(cfg_.n_layers));
        for (uint32_t q = 0; q < cfg_.max_seqs; ++q)
            for (uint32_t l = 0; l < cfg_.n_layers; ++l) lengths[q][l] = streams_[q][l].len;
        const uint64_t want = live_bytes(cfg_, lengths);
        const uint64_t got = js_["live_bytes"][static_cast<size_t>(step_)].get<uint64_t>();
        if (got == want) return;
        prop::Mismatch m;
        m.what = "live_bytes";
        m.op = static_cast<int>(s.op);
        m.expected = static_cast<double>(want);
        m.actual = static_cast<double>(got);
        fail("reported live bytes differ from 2 * tokens * n_kv_heads * head_dim * sizeof(dtype)", m);
    }

    // After the last step: every started (sequence, layer) dumped whole, lengths as the model says, and no row
    // changed since it was first dumped (forks share their parent's rows, releases forget).
    void finals() {
        for (uint32_t q = 0; q < cfg_.max_seqs; ++q)
            for (uint32_t l = 0; l < cfg_.n_layers; ++l) {
                const Stream& s = streams_[q][l];
                if (s.len == 0) continue;
                const std::string base = "final.s" + std::to_string(q) + ".l" + std::to_string(l) + ".";
                const st::Tensor& k = dump(base + "k", q, l, s.len);
                const st::Tensor& v = dump(base + "v", q, l, s.len);
                if (vc_.checks.unchanged) check_unchanged(s, k, v, q, l);
            }
    }

    const VCase& vc_;
    const Results& res_;
    const st::File& f_;
    const json& js_;
    const std::string file_; // results path without extension
    const prop::CaseConfig& cfg_;
    const uint32_t d_;
    const size_t row_, es_;
    std::vector<std::vector<Stream>> streams_; // [seq][layer]
    std::optional<prop::Mismatch> storage_mismatch_; // the first element dumped unlike the appended one (EQUIV only)
    int step_ = -1;
};

struct Graded {
    prop::CaseResult r;
    int step = -1;         // the step of the first failure or error (-1: none, or not tied to a step)
    bool outputs = false;  // the case's property grades outputs (headroom means something)
};

Graded grade_case(const VCase& vc, const Results& res, const fs::path& results_dir) {
    Graded g;
    g.r.id = vc.id;
    g.r.property = vc.property;
    g.r.seed = vc.seed;
    g.r.counterexample = vc.c;
    g.outputs = vc.checks.equiv;
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
        std::ostringstream m;
        if (!missing.empty()) {
            g.r.verdict = prop::Verdict::NotSupported;
            m << "needs";
            for (size_t k = 0; k < missing.size(); ++k) m << (k ? ", " : " ") << missing[k];
        } else {
            g.r.verdict = prop::Verdict::Error;
            m << "no results (" << stp.filename().string() << " and " << jsp.filename().string()
              << " are missing) although the implementation declares every capability the case needs";
        }
        g.r.reason = m.str();
        return g;
    }
    if (!has_st || !has_js) {
        g.r.verdict = prop::Verdict::Error;
        g.r.reason = (has_st ? jsp : stp).string() + " is missing";
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

    CaseGrader grader(vc, res, f, js, (results_dir / vc.stem).string());
    try {
        grader.run();
        g.r.headroom = grader.headroom;
        if (grader.fails_f32_class)
            g.r.notes.push_back("passes its declared precision pipeline but would fail the f32 class");
        if (res.declared.pipeline.new_rows_unrounded && vc.c.cfg.dtype != KVC_DTYPE_F32 && vc.checks.equiv)
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

// ---- reports ----

std::string detail(const Graded& g) {
    std::string d = g.r.reason;
    if (g.step >= 0) d += " [step " + std::to_string(g.step) + "]";
    if (g.r.mismatch) d += "; first mismatch: " + g.r.mismatch->describe();
    return d;
}

} // namespace

int run_grade(const GradeOptions& o, std::ostream& out, std::ostream& err) {
    Vectors vectors;
    Results res;
    std::vector<Graded> all;
    try {
        if (!fs::is_directory(o.vectors)) throw BadInput(o.vectors + ": not a directory (--vectors)");
        if (!fs::is_directory(o.results)) throw BadInput(o.results + ": not a directory (--results)");
        // before grading: a FIFO, device or symbolic link is never replaced, and --report and --junit naming one
        // file (by identity, not spelling) would leave one of them overwritten by the other
        std::string why;
        if (!harness::check_output_files({{"--report", o.report}, {"--junit", o.junit}}, why))
            throw BadInput("cannot write the report: " + why);
        vectors = load_vectors(o.vectors);
        res = load_results(o.results);
        for (const Refused& rf : vectors.refused) { // outside the declaration the export was given
            Graded g;
            g.r.id = rf.id;
            g.r.property = rf.property;
            g.r.seed = rf.seed;
            g.r.verdict = prop::Verdict::NotSupported;
            g.r.reason = "needs";
            for (size_t k = 0; k < rf.needs.size(); ++k) g.r.reason += (k ? ", " : " ") + rf.needs[k];
            g.r.reason += " (not exported)";
            all.push_back(std::move(g));
        }
        for (const VCase& vc : vectors.cases) all.push_back(grade_case(vc, res, o.results));
    } catch (const BadInput& e) {
        err << "kvcheck grade: " << harness::printable(e.what(), true) << "\n";
        return harness::kExitBadInput;
    }

    // the order of the export: property by property, index by index, refused cases among the exported ones
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

    const prop::Verdict order[] = {prop::Verdict::Pass, prop::Verdict::QualityWarning, prop::Verdict::Fail,
                                   prop::Verdict::Error, prop::Verdict::NotSupported};
    constexpr int kVerdictWidth = 15; // QUALITY_WARNING, the longest verdict name
    std::map<std::string, int> counts;
    std::map<std::string, std::map<std::string, int>> by_property;
    std::map<std::string, int> notes; // note -> cases carrying it
    bool bad = false;
    size_t width = 8;
    for (const Graded& g : all) width = std::max(width, g.r.id.size());
    out << "kvcheck grade: " << res.name << (res.version.empty() ? "" : " " + res.version) << ", pipeline "
        << res.declared.pipeline_text << ", " << all.size() << " cases\n";
    for (const Graded& g : all) {
        const char* v = prop::verdict_name(g.r.verdict);
        ++counts[v];
        ++by_property[g.r.property][v];
        for (const std::string& n : g.r.notes) ++notes[n];
        bad = bad || g.r.verdict == prop::Verdict::Fail || g.r.verdict == prop::Verdict::Error;
        std::ostringstream line;
        line << "  " << std::left << std::setw(static_cast<int>(width)) << g.r.id << "  " << std::setw(kVerdictWidth)
             << v << "  ";
        if (g.r.verdict == prop::Verdict::Fail) line << g.r.failed_property << ": ";
        if (g.r.verdict == prop::Verdict::Pass) {
            if (g.outputs) line << std::setprecision(3) << "headroom " << g.r.headroom;
        } else {
            line << detail(g);
        }
        std::string text = line.str();
        text.erase(text.find_last_not_of(' ') + 1);
        out << text << "\n";
    }
    // counts per property, one fixed-width column per verdict
    size_t pw = 8;
    for (const auto& [p, c] : by_property) pw = std::max(pw, p.size());
    out << "  " << std::left << std::setw(static_cast<int>(pw)) << "property";
    for (prop::Verdict v : order) out << "  " << std::right << std::setw(kVerdictWidth) << prop::verdict_name(v);
    out << "\n";
    std::vector<std::pair<size_t, std::string>> props;
    for (const auto& [p, r] : rank) props.emplace_back(r, p);
    std::sort(props.begin(), props.end());
    for (const auto& pr : props) {
        out << "  " << std::left << std::setw(static_cast<int>(pw)) << pr.second;
        for (prop::Verdict v : order)
            out << "  " << std::right << std::setw(kVerdictWidth) << by_property[pr.second][prop::verdict_name(v)];
        out << "\n";
    }
    for (const auto& [n, k] : notes) out << "note (" << k << (k == 1 ? " case" : " cases") << "): " << n << "\n";
    out << std::left << "summary:";
    for (const auto& [v, n] : counts) out << " " << n << " " << v;
    out << (bad ? "  => NOT CONFORMANT" : "  => every case passes or is not supported") << "\n";
    const int code = bad ? harness::kExitNotConformant : harness::kExitOk;

    try {
        if (!o.report.empty() || !o.junit.empty()) {
            json cases = json::array();
            for (const Graded& g : all) {
                json j = prop::to_json(g.r);
                if (g.step >= 0) j["step"] = g.step;
                cases.push_back(j);
            }
            json summary = json::object();
            for (const auto& [v, n] : counts) summary[v] = n;
            // The same shape as validate's report, so one JUnit writer (report.hpp) serves both.
            const json report = {{"kvcheck_grade", 1},
                                 {"kvcheck_version", KVCHECK_VERSION},
                                 {"suite_version", KVCHECK_VERSION},
                                 {"run", {{"seed", vectors.seed}, {"profile", "offline"}}},
                                 {"implementations",
                                  json::array({{{"name", res.name},
                                                {"label", res.name},
                                                {"version", res.version},
                                                {"precision", res.declared.pipeline_text},
                                                {"pipeline", prop::to_json(res.declared.pipeline)},
                                                {"capabilities", capability_words(res.declared.caps)},
                                                {"declared", declared_to_json(res.declared)},
                                                {"cases", cases}}})},
                                 {"vectors_seed", vectors.seed},
                                 {"summary", summary},
                                 {"exit_code", code}};
            std::vector<std::pair<std::string, std::string>> files; // both or neither
            if (!o.report.empty()) files.emplace_back(o.report, harness::dump_json(report, 1) + "\n");
            if (!o.junit.empty()) files.emplace_back(o.junit, harness::junit_from_report(report));
            std::string error;
            if (!harness::write_files_atomically(files, error)) { // exit 3, as validate (docs/cli.md)
                err << "kvcheck grade: cannot write the report: " << error << "\n";
                return harness::kExitInternal;
            }
        }
    } catch (const std::runtime_error& e) {
        err << "kvcheck grade: " << harness::printable(e.what(), true) << "\n";
        return harness::kExitBadInput;
    }
    return code;
}

} // namespace kvc::vec
