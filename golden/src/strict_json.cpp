#include "strict_json.hpp"

#include "kvcheck/golden/printed.hpp" // FormatError
#include "kvcheck/strict_json.hpp"

namespace kvc::golden {

nlohmann::json parse_strict(const std::string& text) {
    try {
        return json_strict::parse(text);
    } catch (const json_strict::Violation& v) {
        if (v.kind() == json_strict::Violation::Kind::DuplicateKey)
            throw FormatError(v.pointer(), "duplicate key \"" + v.key() + "\" (JSON keeps only one of them)");
        throw FormatError(v.pointer(), v.what());
    }
}

} // namespace kvc::golden
