#include "kvcheck/harness/selection.hpp"

#include "kvcheck/harness/errors.hpp"
#include "kvcheck/model/model_properties.hpp"
#include "kvcheck/properties/runner.hpp"

#include <algorithm>
#include <optional>
#include <regex>

namespace kvc::harness {

uint64_t parse_seed(const std::string& text) {
    static const std::regex digits("[0-9]{1,20}");
    try {
        if (std::regex_match(text, digits)) return std::stoull(text);
    } catch (const std::out_of_range&) {
    }
    throw BadInput("--seed " + text + ": expected an integer from 0 to 18446744073709551615");
}

int parse_shrink_first(const std::string& text) {
    if (text == "all") return kShrinkAll;
    static const std::regex digits("[0-9]{1,18}");
    if (!std::regex_match(text, digits))
        throw BadInput("--shrink-first " + text + ": expected a number of failures (0 = none) or all");
    return static_cast<int>(std::min<long long>(std::stoll(text), kShrinkAll));
}

Shard parse_shard(const std::string& text) {
    static const std::regex form("([0-9]{1,9})/([0-9]{1,9})");
    std::smatch m;
    if (!std::regex_match(text, m, form))
        throw BadInput("--shard " + text + ": expected I/N with 0 <= I < N, e.g. 0/4");
    Shard s{std::stoull(m[1].str()), std::stoull(m[2].str())};
    if (s.count == 0 || s.index >= s.count)
        throw BadInput("--shard " + text + ": expected I/N with 0 <= I < N, e.g. 0/4");
    return s;
}

namespace {

// libstdc++ compiles a regular expression by recursion: 20,000 nested groups overflowed the stack (a segfault, not
// an exit 2). A filter selects property and case ids; none needs more than this.
constexpr std::size_t kMaxFilterLength = 1000;
constexpr int kMaxFilterNesting = 32;

void check_filter_shape(const std::string& text) {
    if (text.size() > kMaxFilterLength)
        throw BadInput("--filter: " + std::to_string(text.size()) + " characters; at most " +
                       std::to_string(kMaxFilterLength));
    int depth = 0, deepest = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\\') {
            ++i; // an escaped character opens nothing
            continue;
        }
        if (text[i] == '(') deepest = std::max(deepest, ++depth);
        else if (text[i] == ')') depth = std::max(depth - 1, 0);
    }
    if (deepest > kMaxFilterNesting)
        throw BadInput("--filter: groups nested " + std::to_string(deepest) + " deep; at most " +
                       std::to_string(kMaxFilterNesting));
}

} // namespace

bool model_property_core(const std::string& id) { return id == "MODEL-LOGITS" || id == "MODEL-MEMORY"; }

bool CaseRef::core() const { return property ? property->core : model_property_core(model_property); }

namespace {

std::vector<CaseRef> share(const std::vector<CaseRef>& all, const Shard& shard) {
    std::vector<CaseRef> mine;
    for (std::size_t k = 0; k < all.size(); ++k)
        if (k % shard.count == shard.index) mine.push_back(all[k]);
    return mine;
}

} // namespace

Selection select_cases(const std::string& profile, int cases, const std::string& filter_text, const Shard& shard) {
    std::optional<std::regex> filter;
    if (!filter_text.empty()) {
        check_filter_shape(filter_text);
        try {
            filter.emplace(filter_text, std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
            throw BadInput("--filter " + filter_text + ": not a valid regular expression (" + e.what() + ")");
        }
    }
    const auto add = [&](std::vector<CaseRef>& out, CaseRef ref, bool core) {
        if (profile == "core" && !core) return;
        const std::string& id = ref.property_id();
        const bool whole_property = filter && std::regex_search(id, *filter);
        for (int i = 0; i < cases; ++i)
            if (!filter || whole_property || std::regex_search(prop::case_id(id, i), *filter)) {
                ref.index = i;
                out.push_back(ref);
            }
    };
    std::vector<CaseRef> op, mod;
    for (const prop::Property& p : prop::properties()) add(op, {Level::Operation, &p, "", 0}, p.core);
    for (const std::string& id : model::model_property_ids())
        add(mod, {Level::Model, nullptr, id, 0}, model_property_core(id));
    Selection s;
    s.operation_before_shard = op.size();
    s.model_before_shard = mod.size();
    s.operation = share(op, shard);
    s.model = share(mod, shard);
    return s;
}

} // namespace kvc::harness
