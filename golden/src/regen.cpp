// golden regen: sets every entry's `computed` from the oracle and rewrites the file in canonical layout. It never
// touches what a person wrote (printed values, provenance, notes), and refuses files it cannot read.
#include "kvcheck/golden/canonical_json.hpp"
#include "kvcheck/golden/golden.hpp"
#include "kvcheck/golden/oracle.hpp"
#include "kvcheck/golden/validate.hpp"

#include "files.hpp"
#include "strict_json.hpp"

#include <memory>
#include <stdexcept>

namespace kvc::golden {
namespace {

using nlohmann::json;

// The value in the entry's unit, shaped like the entry: a number, an array, or an array of rows.
json to_json(const Value& v, long double divisor) {
    auto at = [&](size_t i) { return json(static_cast<double>(v.data[i] / divisor)); };
    if (v.shape.empty()) return at(0);
    json out = json::array();
    if (v.shape.size() == 1) {
        for (size_t i = 0; i < v.shape[0]; ++i) out.push_back(at(i));
        return out;
    }
    for (size_t r = 0; r < v.shape[0]; ++r) {
        json row = json::array();
        for (size_t c = 0; c < v.shape[1]; ++c) row.push_back(at(r * v.shape[1] + c));
        out.push_back(row);
    }
    return out;
}

} // namespace

std::string regen_text(const std::string& name, const std::string& text, const Oracle& oracle) {
    json doc;
    try {
        doc = parse_strict(text);
    } catch (const json::exception& ex) {
        throw FormatError("", std::string("not valid JSON: ") + ex.what());
    }
    const GoldenFile g = parse_golden(doc, name, /*need_computed=*/false);
    for (const Entry& e : g.entries) {
        const Value* v = oracle.find(e.quantity);
        const std::string p = "/entries/" + std::to_string(e.index);
        if (!v) throw FormatError(p + "/quantity", "unknown quantity \"" + e.quantity + "\"");
        if (e.kind == "printed" && v->shape != e.shape)
            throw FormatError(p + "/printed", "\"" + e.id + "\" does not have the shape of " + e.quantity);
        doc["entries"][e.index]["computed"] = to_json(*v, e.unit_divisor);
    }
    return canonical_json(doc);
}

std::vector<std::string> finish_interrupted_regen(const std::filesystem::path& dir) {
    (void)golden_files(dir); // a missing directory or a plain file is named as such, not as a journal it lacks
    std::vector<std::string> finished;
    if (std::string err = finish_interrupted(dir, finished); !err.empty()) throw std::runtime_error(err);
    return finished;
}

std::vector<RegenResult> regen_dir(const std::filesystem::path& dir, std::string& internal_error) {
    std::vector<RegenResult> results;
    const auto files = golden_files(dir); // throws std::runtime_error: the caller reports bad input
    finish_interrupted_regen(dir);        // a killed regen's set: completed (committed) or its temporaries dropped
    std::unique_ptr<Oracle> oracle;
    try {
        oracle = std::make_unique<Oracle>();
    } catch (const std::exception& ex) {
        internal_error = std::string("the reference oracle failed: ") + ex.what();
        return results;
    }
    // Everything is computed and checked before anything is written: one bad file leaves the whole set as it was.
    std::vector<Rewrite> rewrites;
    std::vector<size_t> rewritten; // index into results of each rewrite
    bool refused = false;
    for (const auto& f : files) {
        RegenResult r;
        r.file = f.filename().string();
        std::string text;
        if (std::string why = replace_refusal(f); !why.empty()) {
            r.error = why;
        } else if (std::string why = read_file(f, text); !why.empty()) {
            r.error = why;
        } else {
            try {
                const std::string fresh = regen_text(r.file, text, *oracle);
                r.changed = fresh != text;
                if (r.changed) {
                    rewrites.push_back({f, fresh});
                    rewritten.push_back(results.size());
                }
            } catch (const FormatError& ex) {
                r.error = describe(ex);
            }
        }
        refused = refused || !r.error.empty();
        results.push_back(r);
    }
    if (refused || rewrites.empty()) return results;
    const std::string err = write_set(dir, rewrites);
    for (size_t i : rewritten) {
        if (err.empty()) results[i].written = true;
        else results[i].error = "cannot write the regenerated set: " + err;
    }
    return results;
}

} // namespace kvc::golden
