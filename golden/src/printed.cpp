#include "kvcheck/golden/printed.hpp"

#include <cctype>
#include <cmath>

namespace kvc::golden {

Printed parse_printed(const std::string& text) {
    auto bad = [&](const char* why) { return FormatError("", "printed value \"" + text + "\": " + why); };
    std::string s = text;
    for (const std::string approx : {"~", "\xE2\x89\x88" /* ≈ */})
        if (s.compare(0, approx.size(), approx) == 0) s.erase(0, approx.size());
    bool negative = false;
    if (!s.empty() && s[0] == '-') {
        negative = true;
        s.erase(0, 1);
    }
    // Digits with commas only between groups of three, then an optional fraction.
    std::string digits;
    size_t i = 0, group = 0;
    bool commas = false;
    for (; i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == ','); ++i) {
        if (s[i] == ',') {
            if (digits.empty() || (commas && group != 3) || (!commas && group > 3)) throw bad("misplaced comma");
            commas = true;
            group = 0;
        } else {
            digits += s[i];
            ++group;
        }
    }
    if (digits.empty()) throw bad("no digits");
    if (commas && group != 3) throw bad("misplaced comma");
    int decimals = 0;
    if (i < s.size() && s[i] == '.') {
        for (++i; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, ++decimals) digits += s[i];
        if (decimals == 0) throw bad("no digits after the point");
    }
    if (i != s.size()) throw bad("unexpected characters");
    // Exact decimal: the integer of all digits, scaled once.
    long double v = 0;
    for (char c : digits) v = v * 10 + (c - '0');
    v /= std::pow(10.0L, decimals);
    return Printed{negative ? -v : v, decimals};
}

long double printed_tolerance(int decimals, bool exact) {
    return exact ? 0.0L : 0.5L * std::pow(10.0L, -decimals);
}

} // namespace kvc::golden
