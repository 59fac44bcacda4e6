// A model-level case as JSON, so that a case that is not what its seed draws (a shrunk one) travels from the case
// process to the parent and into a replay file exactly. Read strictly: the text may come from a file anyone wrote.
#include "kvcheck/model/model_case.hpp"

#include <cfloat>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>

namespace kvc::model {
namespace {

using nlohmann::json;

const char* const kRopes[] = {"none", "neox", "gptj"};
const char* const kFormats[] = {"safetensors", "flat_f32"};

[[noreturn]] void bad(const std::string& field, const std::string& what) {
    throw std::invalid_argument("case: field \"" + field + "\" " + what);
}

// Every field of `fields` present, and nothing else.
void exact_fields(const json& j, const std::string& where, std::initializer_list<const char*> fields) {
    if (!j.is_object()) throw std::invalid_argument("case: " + where + " is not an object");
    const std::set<std::string> known(fields.begin(), fields.end());
    for (const auto& item : j.items())
        if (!known.count(item.key()))
            throw std::invalid_argument("case: unknown field \"" + (where == "the case" ? "" : where + ".") +
                                        item.key() + "\" in " + where);
    for (const char* f : fields)
        if (!j.contains(f)) throw std::invalid_argument("case: missing field \"" + std::string(f) + "\" in " + where);
}

// An integer that is not negative (parsed text holds it unsigned, a document built in memory may hold it signed).
bool natural(const json& v) { return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0); }

// An integer from 0 to hi, checked before it is narrowed.
uint64_t unsigned_field(const json& j, const std::string& name, const char* key, uint64_t hi) {
    const json& v = j.at(key);
    if (!natural(v)) bad(name, "is " + v.dump() + ", expected an integer from 0 to " + std::to_string(hi));
    const uint64_t x = v.get<uint64_t>();
    if (x > hi) bad(name, "is " + v.dump() + ", more than " + std::to_string(hi));
    return x;
}

double number_field(const json& j, const std::string& name, const char* key) {
    const json& v = j.at(key);
    if (!v.is_number()) bad(name, "is " + v.dump() + ", expected a number");
    const double x = v.get<double>();
    if (!std::isfinite(x)) bad(name, "is not finite");
    return x;
}

float float_field(const json& j, const std::string& name, const char* key) {
    const double x = number_field(j, name, key);
    if (std::fabs(x) > FLT_MAX) bad(name, "is " + j.at(key).dump() + ", out of the range of a float32");
    return static_cast<float>(x);
}

template <size_t N>
uint32_t word_field(const json& j, const std::string& name, const char* key, const char* const (&words)[N]) {
    const json& v = j.at(key);
    for (size_t i = 0; i < N; ++i)
        if (v.is_string() && v.get_ref<const std::string&>() == words[i]) return static_cast<uint32_t>(i);
    std::string list;
    for (size_t i = 0; i < N; ++i) list += std::string(i ? ", " : "") + "\"" + words[i] + "\"";
    bad(name, "is " + v.dump() + ", expected one of " + list);
}

// A list of at most CaseBounds::context integers from lo (tokens: 0; chunk sizes: 1) to INT32_MAX.
std::vector<int> int_list(const json& j, const char* key, int lo) {
    const json& v = j.at(key);
    if (!v.is_array()) bad(key, "is not an array");
    if (v.size() > CaseBounds::context)
        bad(key, "has " + std::to_string(v.size()) + " entries, more than max_context can be (" +
                     std::to_string(CaseBounds::context) + ")");
    std::vector<int> out;
    for (size_t i = 0; i < v.size(); ++i) {
        const std::string name = std::string(key) + "[" + std::to_string(i) + "]";
        const json& x = v[i];
        if (!natural(x) || x.get<uint64_t>() < static_cast<uint64_t>(lo) || x.get<uint64_t>() > INT32_MAX)
            bad(name, "is " + x.dump() + ", expected an integer from " + std::to_string(lo) + " to " +
                          std::to_string(INT32_MAX));
        out.push_back(static_cast<int>(x.get<uint64_t>()));
    }
    return out;
}

} // namespace

nlohmann::json to_json(const ModelCase& c) {
    const kvcm_model_desc& d = c.desc;
    return {{"seed", c.seed},
            {"weights_format", c.weights_format <= 1 ? kFormats[c.weights_format] : "?"},
            {"embed_rms", c.embed_rms},
            {"desc",
             {{"dim", d.dim},
              {"hidden_dim", d.hidden_dim},
              {"n_layers", d.n_layers},
              {"n_heads", d.n_heads},
              {"n_kv_heads", d.n_kv_heads},
              {"head_dim", d.head_dim},
              {"vocab_size", d.vocab_size},
              {"rope", d.rope <= 2 ? kRopes[d.rope] : "?"},
              {"rope_theta", static_cast<double>(d.rope_theta)}, // a float's value, exactly
              {"rms_eps", static_cast<double>(d.rms_eps)},
              {"tied", d.tied != 0},
              {"cache_dtype", d.cache_dtype == KVC_DTYPE_F32 ? "f32" : "?"},
              {"max_context", d.max_context},
              {"max_seqs", d.max_seqs}}},
            {"prompt", c.prompt},
            {"prompt2", c.prompt2},
            {"n_steps", c.n_steps},
            {"chunks", c.chunks},
            {"tail", c.tail},
            {"tail2", c.tail2}};
}

ModelCase case_from_json(const nlohmann::json& j) {
    exact_fields(j, "the case",
                 {"seed", "weights_format", "embed_rms", "desc", "prompt", "prompt2", "n_steps", "chunks", "tail",
                  "tail2"});
    ModelCase c;
    c.seed = unsigned_field(j, "seed", "seed", std::numeric_limits<uint64_t>::max());
    c.weights_format = word_field(j, "weights_format", "weights_format", kFormats);
    c.embed_rms = number_field(j, "embed_rms", "embed_rms");
    const json& dj = j.at("desc");
    exact_fields(dj, "desc",
                 {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "rope",
                  "rope_theta", "rms_eps", "tied", "cache_dtype", "max_context", "max_seqs"});
    kvcm_model_desc& d = c.desc;
    d.struct_size = sizeof d;
    const auto size = [&](const char* key) {
        return static_cast<uint32_t>(unsigned_field(dj, std::string("desc.") + key, key, UINT32_MAX));
    };
    d.dim = size("dim");
    d.hidden_dim = size("hidden_dim");
    d.n_layers = size("n_layers");
    d.n_heads = size("n_heads");
    d.n_kv_heads = size("n_kv_heads");
    d.head_dim = size("head_dim");
    d.vocab_size = size("vocab_size");
    d.max_context = size("max_context");
    d.max_seqs = size("max_seqs");
    d.rope = word_field(dj, "desc.rope", "rope", kRopes);
    d.rope_theta = float_field(dj, "desc.rope_theta", "rope_theta");
    d.rms_eps = float_field(dj, "desc.rms_eps", "rms_eps");
    if (!dj.at("tied").is_boolean()) bad("desc.tied", "is " + dj.at("tied").dump() + ", expected true or false");
    d.tied = dj.at("tied").get<bool>() ? 1u : 0u;
    static const char* const dtypes[] = {"f32"};
    word_field(dj, "desc.cache_dtype", "cache_dtype", dtypes);
    d.cache_dtype = KVC_DTYPE_F32;
    c.prompt = int_list(j, "prompt", 0);
    c.prompt2 = int_list(j, "prompt2", 0);
    c.n_steps = static_cast<int>(unsigned_field(j, "n_steps", "n_steps", CaseBounds::context));
    c.chunks = int_list(j, "chunks", 1);
    c.tail = int_list(j, "tail", 0);
    c.tail2 = int_list(j, "tail2", 0);
    if (const std::string e = case_error(c); !e.empty()) throw std::invalid_argument("case: " + e);
    return c;
}

} // namespace kvc::model
