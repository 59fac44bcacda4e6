#include "kvcheck/golden/canonical_json.hpp"

namespace kvc::golden {
namespace {

constexpr size_t kInlineObjectWidth = 100;

bool is_scalar(const nlohmann::json& j) { return !j.is_object() && !j.is_array(); }

void write(const nlohmann::json& j, int indent, std::string& out) {
    const std::string pad(static_cast<size_t>(indent) + 2, ' ');
    if (j.is_object()) {
        if (j.empty()) {
            out += "{}";
            return;
        }
        // a small record of scalars (an entry's source) reads best on one line
        std::string line = "{";
        bool scalars = true;
        for (auto it = j.begin(); it != j.end(); ++it) {
            scalars = scalars && is_scalar(it.value());
            line += (line.size() > 1 ? ", " : "") + nlohmann::json(it.key()).dump() + ": " + it.value().dump();
        }
        if (scalars && line.size() + 1 <= kInlineObjectWidth) {
            out += line + "}";
            return;
        }
        out += "{\n";
        bool first = true;
        for (auto it = j.begin(); it != j.end(); ++it) { // std::map: sorted keys
            if (!first) out += ",\n";
            first = false;
            out += pad + nlohmann::json(it.key()).dump() + ": ";
            write(it.value(), indent + 2, out);
        }
        out += "\n" + std::string(static_cast<size_t>(indent), ' ') + "}";
    } else if (j.is_array()) {
        bool scalars = true;
        for (const auto& e : j) scalars = scalars && is_scalar(e);
        if (scalars) { // a vector (or a matrix row) reads best on one line
            out += "[";
            for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + j[i].dump();
            out += "]";
            return;
        }
        out += "[\n";
        for (size_t i = 0; i < j.size(); ++i) {
            out += pad;
            write(j[i], indent + 2, out);
            out += i + 1 < j.size() ? ",\n" : "\n";
        }
        out += std::string(static_cast<size_t>(indent), ' ') + "]";
    } else {
        out += j.dump(); // shortest round-trip text for doubles; strings escaped, UTF-8 kept
    }
}

} // namespace

std::string canonical_json(const nlohmann::json& j) {
    std::string out;
    write(j, 0, out);
    out += "\n";
    return out;
}

} // namespace kvc::golden
