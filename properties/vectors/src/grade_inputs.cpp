#include "grade_inputs.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/harness/input_file.hpp"
#include "kvcheck/vectors/safetensors.hpp"

#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <type_traits>

namespace kvc::vec {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

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
        const AppendInputs in = step_inputs(vc.c, s);
        const std::pair<const char*, const std::vector<float>*> parts[] = {{"q", &in.q}, {"k", &in.k}, {"v", &in.v}};
        for (const auto& [what, want] : parts) {
            const std::string name = "step" + std::to_string(i) + "." + what;
            const st::Tensor* t = f.find(name);
            const uint64_t heads = std::string(what) == "q" ? cfg.n_q_heads : cfg.n_kv_heads;
            const std::vector<uint64_t> shape{s.n_new, heads, std::string(what) == "v" ? cfg.dv() : cfg.head_dim};
            if (!t) throw BadInput(file.string() + ": tensor \"" + name + "\" is missing");
            if (t->dtype != st::DType::F32 || t->shape != shape)
                throw BadInput(file.string() + ": tensor \"" + name + "\" is " + st::dtype_name(t->dtype) + " " +
                               st::shape_text(t->shape) + ", expected F32 " + st::shape_text(shape));
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

} // namespace

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
    if (j.contains("declared")) {
        try {
            v.declared = declared_from_json(j["declared"], false);
        } catch (const std::invalid_argument& e) {
            throw BadInput(m + ": field \"declared\": " + e.what());
        }
        v.has_declared = true;
    }
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
        if (vc.c.cfg.evict)
            throw BadInput(where + ": the case lets the cache evict rows (\"evict\": true), which the vectors route "
                                   "does not judge: a dump cannot say which rows were dropped (judge an evicting "
                                   "cache through `kvcheck validate --plugin` or `--connect`)");
        // export writes only cases inside the declaration it echoes: a case outside it (a window over max_window,
        // a head_dim_v over max_head_dim_v) was written by hand, and its results would be graded against a
        // declaration that excludes it
        if (v.has_declared) {
            const std::vector<std::string> needs = unsupported(vc.c, v.declared.caps);
            if (!needs.empty()) {
                std::string list;
                for (const std::string& x : needs) list += (list.empty() ? "" : ", ") + x;
                throw BadInput(where + ": lies outside the manifest's own \"declared\" (needs " + list +
                               "); kvcheck export never writes such a case");
            }
        }
        vc.steps = expand_steps(vc.c);
        if (!steps.is_array() || steps.size() != vc.steps.size())
            throw BadInput(where + ": \"steps\" does not list the " + std::to_string(vc.steps.size()) +
                           " steps of the case's script");
        for (size_t i = 0; i < vc.steps.size(); ++i)
            if (steps[i] != step_json(vc.steps[i], i, dtype_is_quantized(vc.c.cfg.cache_dtype)))
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

std::string driver_error_reason(const fs::path& results_dir, const std::string& json_name) {
    try {
        const json j = harness::parse_json_strict(harness::read_bounded(
            harness::confined_path(results_dir.string(), json_name), harness::kMaxJsonBytes));
        if (!j.is_object() || !j.contains("error") || !j["error"].is_object()) return "";
        const json& e = j["error"];
        if (!e.contains("message") || !e["message"].is_string()) return "";
        constexpr std::size_t kMaxMessage = 2000; // a traceback may be long; the first part says what failed
        std::string message = e["message"].get<std::string>();
        if (message.size() > kMaxMessage) message = message.substr(0, kMaxMessage) + "...";
        std::string where;
        if (e.contains("step") && e["step"].is_number_integer()) where = " at step " + e["step"].dump();
        if (e.contains("call") && e["call"].is_string())
            where += " (" + harness::printable(e["call"].get<std::string>()) + ")";
        // one line: the reason stands in a table of one line per case (a traceback's newlines are escaped)
        return "the driver recorded an error" + where + ": " + harness::printable(message);
    } catch (const std::exception&) {
        return "";
    }
}

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

} // namespace kvc::vec
