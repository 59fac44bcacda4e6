// The rules of golden/schema/golden.schema.json, in the order the schema lists them. Every accessor checks the
// JSON type before reading, so a malformed file ends in a FormatError, never in a nlohmann exception.
#include "kvcheck/golden/validate.hpp"

#include "kvcheck/golden/golden.hpp"

#include <cmath>
#include <set>

namespace kvc::golden {
namespace {

using nlohmann::json;

std::string at(const std::string& path, const std::string& key) { return path + "/" + key; }
std::string at(const std::string& path, size_t i) { return path + "/" + std::to_string(i); }

const json& need(const json& obj, const std::string& path, const std::string& key) {
    auto it = obj.find(key);
    if (it == obj.end()) throw FormatError(path, "missing field \"" + key + "\"");
    return *it;
}

void only_keys(const json& obj, const std::string& path, const std::set<std::string>& allowed) {
    for (auto it = obj.begin(); it != obj.end(); ++it)
        if (!allowed.count(it.key())) throw FormatError(at(path, it.key()), "unknown field \"" + it.key() + "\"");
}

const json& need_object(const json& obj, const std::string& path, const std::string& key) {
    const json& v = need(obj, path, key);
    if (!v.is_object()) throw FormatError(at(path, key), "\"" + key + "\" must be an object");
    return v;
}

std::string need_string(const json& obj, const std::string& path, const std::string& key) {
    const json& v = need(obj, path, key);
    if (!v.is_string() || v.get_ref<const std::string&>().empty())
        throw FormatError(at(path, key), "\"" + key + "\" must be a non-empty string");
    return v.get<std::string>();
}

const json& need_array(const json& obj, const std::string& path, const std::string& key) {
    const json& v = need(obj, path, key);
    if (!v.is_array()) throw FormatError(at(path, key), "\"" + key + "\" must be an array");
    return v;
}

// A list of small objects whose fields are all non-empty strings (omissions, inconsistencies, excluded).
void string_records(const json& doc, const std::string& key, const std::set<std::string>& fields) {
    const json& list = need_array(doc, "", key);
    for (size_t i = 0; i < list.size(); ++i) {
        const std::string p = at("/" + key, i);
        if (!list[i].is_object()) throw FormatError(p, "must be an object");
        only_keys(list[i], p, fields);
        for (const auto& f : fields) need_string(list[i], p, f);
    }
}

// A scalar, a vector or a rectangular matrix (at least one element per level) of leaves that pass `leaf`.
template <typename Leaf>
std::vector<size_t> flatten(const json& v, const std::string& path, Leaf leaf) {
    if (!v.is_array()) {
        leaf(v, path);
        return {};
    }
    if (v.empty()) throw FormatError(path, "must not be empty");
    const bool matrix = v[0].is_array();
    const size_t cols = matrix ? v[0].size() : 0;
    for (size_t r = 0; r < v.size(); ++r) {
        const std::string pr = at(path, r);
        if (!matrix) {
            if (v[r].is_array()) throw FormatError(pr, "mixes numbers and rows");
            leaf(v[r], pr);
            continue;
        }
        if (!v[r].is_array() || v[r].size() != cols || cols == 0)
            throw FormatError(pr, "rows must be non-empty arrays of equal length");
        for (size_t c = 0; c < cols; ++c) {
            if (v[r][c].is_array()) throw FormatError(at(pr, c), "more than two levels of nesting");
            leaf(v[r][c], at(pr, c));
        }
    }
    return matrix ? std::vector<size_t>{v.size(), cols} : std::vector<size_t>{v.size()};
}

void printed_entry(const json& e, const std::string& p, Entry& out) {
    const json& d = need(e, p, "decimals");
    if (!d.is_number_integer() || d.get<long>() < 0 || d.get<long>() > 30)
        throw FormatError(at(p, "decimals"), "\"decimals\" must be an integer 0..30");
    out.decimals = d.get<int>();
    const json& x = need(e, p, "exact");
    if (!x.is_boolean()) throw FormatError(at(p, "exact"), "\"exact\" must be true or false");
    out.exact = x.get<bool>();
    out.tolerance = printed_tolerance(out.decimals, out.exact);
    const json& t = need(e, p, "tolerance");
    if (!t.is_number() || std::fabs(t.get<long double>() - out.tolerance) > 1e-9L * out.tolerance)
        throw FormatError(at(p, "tolerance"), "\"tolerance\" must be " + std::to_string(static_cast<double>(
                                                  out.tolerance)) + " (exact ? 0 : 0.5 * 10^-decimals)");
    out.shape = flatten(need(e, p, "printed"), at(p, "printed"), [&](const json& v, const std::string& vp) {
        if (!v.is_string()) throw FormatError(vp, "printed values are strings, as printed");
        Printed pr;
        try {
            pr = parse_printed(v.get<std::string>());
        } catch (const FormatError& err) {
            throw FormatError(vp, err.what());
        }
        if (pr.decimals != out.decimals)
            throw FormatError(vp, "\"" + v.get<std::string>() + "\" has " + std::to_string(pr.decimals) +
                                      " decimals, the entry says " + std::to_string(out.decimals));
        out.printed.push_back(v.get<std::string>());
    });
}

void derivation(const json& e, const std::string& p) {
    const json& d = need_object(e, p, "derivation");
    const std::string dp = at(p, "derivation");
    only_keys(d, dp, {"method", "unique"});
    need_string(d, dp, "method");
    if (!need(d, dp, "unique").is_boolean()) throw FormatError(at(dp, "unique"), "\"unique\" must be true or false");
}

Entry entry(const json& e, const std::string& p, const std::string& document, bool need_computed) {
    if (!e.is_object()) throw FormatError(p, "an entry must be an object");
    Entry out;
    out.id = need_string(e, p, "id");
    out.kind = need_string(e, p, "kind");
    const bool printed = out.kind == "printed", derived = out.kind == "derived", assumed = out.kind == "assumed";
    if (!printed && !derived && !assumed)
        throw FormatError(at(p, "kind"), "\"kind\" must be printed, derived or assumed (got \"" + out.kind + "\")");
    std::set<std::string> allowed = {"id",   "kind",    "role", "what",         "source", "quantity",
                                     "note", "computed", "unit", "unit_divisor", "claim"};
    if (printed) allowed.insert({"printed", "decimals", "exact", "tolerance"});
    if (derived) allowed.insert("derivation");
    if (assumed) allowed.insert("assumption");
    only_keys(e, p, allowed);

    const std::string role = need_string(e, p, "role");
    if (role != "input" && role != "output") throw FormatError(at(p, "role"), "\"role\" must be input or output");
    need_string(e, p, "what");
    const json& src = need_object(e, p, "source");
    only_keys(src, at(p, "source"), {"document", "section"});
    if (need_string(src, at(p, "source"), "document") != document)
        throw FormatError(at(at(p, "source"), "document"), "must be the file's document, \"" + document + "\"");
    need_string(src, at(p, "source"), "section");
    out.quantity = need_string(e, p, "quantity");
    if (e.contains("note")) need_string(e, p, "note");

    if (e.contains("unit") != e.contains("unit_divisor"))
        throw FormatError(p, "\"unit\" and \"unit_divisor\" go together");
    if (e.contains("unit")) {
        need_string(e, p, "unit");
        const json& u = e.at("unit_divisor");
        if (!u.is_number() || !(u.get<long double>() > 0))
            throw FormatError(at(p, "unit_divisor"), "\"unit_divisor\" must be a positive number");
        out.unit_divisor = u.get<long double>();
    }
    if (e.contains("claim")) {
        const json& c = need_object(e, p, "claim");
        only_keys(c, at(p, "claim"), {"text", "greater_than"});
        need_string(c, at(p, "claim"), "text");
        const json& g = need(c, at(p, "claim"), "greater_than");
        if (!g.is_number()) throw FormatError(at(at(p, "claim"), "greater_than"), "must be a number");
        out.greater_than = g.get<long double>();
    }

    if (printed) printed_entry(e, p, out);
    if (derived) derivation(e, p);
    if (assumed) need_string(e, p, "assumption");

    if (!e.contains("computed")) {
        if (need_computed)
            throw FormatError(at(p, "computed"), "missing field \"computed\" (run " + std::string(kRegenCommand) + ")");
        return out;
    }
    std::vector<long double> values;
    const auto shape = flatten(e.at("computed"), at(p, "computed"), [&](const json& v, const std::string& vp) {
        if (!v.is_number()) throw FormatError(vp, "computed values are numbers");
        values.push_back(v.get<long double>());
    });
    if (printed && shape != out.shape) throw FormatError(at(p, "computed"), "shape differs from \"printed\"");
    out.shape = shape;
    out.computed = std::move(values);
    return out;
}

} // namespace

GoldenFile parse_golden(const json& doc, const std::string& file_name, bool need_computed) {
    if (!doc.is_object()) throw FormatError("", "the top level must be an object");
    only_keys(doc, "", {"schema_version", "document", "title", "entries", "omissions", "inconsistencies", "excluded"});
    const json& v = need(doc, "", "schema_version");
    if (!v.is_number_integer() || v.get<long>() != kSchemaVersion)
        throw FormatError("/schema_version", "schema_version must be " + std::to_string(kSchemaVersion) + " (got " +
                                                 v.dump() + ")");
    GoldenFile out;
    out.document = need_string(doc, "", "document");
    const auto stem = [](const std::string& s) { return s.substr(0, s.rfind('.')); };
    if (out.document.size() < 5 || out.document.substr(out.document.size() - 4) != ".txt" ||
        stem(out.document) != stem(file_name))
        throw FormatError("/document", "\"" + out.document + "\" is not the document this file is named after (" +
                                           stem(file_name) + ".txt)");
    need_string(doc, "", "title");
    string_records(doc, "omissions", {"what", "handling"});
    string_records(doc, "inconsistencies", {"section", "what"});
    string_records(doc, "excluded", {"printed", "section", "why"});

    const json& entries = need_array(doc, "", "entries");
    if (entries.empty()) throw FormatError("/entries", "no entries");
    std::set<std::string> ids;
    for (size_t i = 0; i < entries.size(); ++i) {
        out.entries.push_back(entry(entries[i], at("/entries", i), out.document, need_computed));
        out.entries.back().index = i;
        if (!ids.insert(out.entries.back().id).second)
            throw FormatError(at(at("/entries", i), "id"), "duplicate id \"" + out.entries.back().id + "\"");
    }
    return out;
}

} // namespace kvc::golden
