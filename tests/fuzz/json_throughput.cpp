// The strict JSON reader (kvcheck/strict_json.hpp) stays linear on the shapes that made nlohmann's callback parser
// quadratic. Each shape is parsed at up to 1 MB and its time is compared with parsing a flat array of numbers of
// the same size, in the same run: a ratio, never a wall-clock limit. A quadratic reader is thousands of times
// slower than the flat array at 1 MB (an array of {} took 13 s at 480 KB); a linear one stays within a small
// constant. Run in every build and in the fuzz stage (ctest fuzz.json.throughput). Exit 0 pass, 1 fail.
#include "kvcheck/strict_json.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace {

// Seconds for the fastest of `reps` parses: the minimum is the least disturbed by a shared machine.
double parse_seconds(const std::string& text, int reps) {
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        const nlohmann::json j = kvc::json_strict::parse(text, {128, std::size_t{1} << 24});
        const auto t1 = std::chrono::steady_clock::now();
        if (j.is_discarded()) return 1e30;
        best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    }
    return best;
}

// A document of about `bytes` bytes: `open`, then `unit` repeated with `sep` between, then `close`.
std::string repeated(std::size_t bytes, const std::string& open, const std::string& unit, const std::string& sep,
                     const std::string& close) {
    std::string s = open;
    for (std::size_t i = 0; s.size() + unit.size() + close.size() < bytes; ++i) s += (i ? sep : "") + unit;
    return s + close;
}

std::string many_keys(std::size_t bytes) { // one object with tens of thousands of distinct keys
    std::string s = "{";
    for (std::size_t i = 0; s.size() < bytes; ++i) s += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
    return s + "}";
}

std::string nested_records(std::size_t bytes) { // the shape of a results manifest: an array of small objects
    return repeated(bytes, "[", R"({"id":"EQUIV/0","v":[1,2,3],"o":{"a":null}})", ",", "]");
}

} // namespace

int main() {
    constexpr double kMaxRatio = 30; // per byte, against the flat array; quadratic readers exceed it by orders
    const std::vector<std::pair<const char*, std::function<std::string(std::size_t)>>> shapes = {
        {"array of {}", [](std::size_t n) { return repeated(n, "[", "{}", ",", "]"); }},
        {"array of []", [](std::size_t n) { return repeated(n, "[", "[]", ",", "]"); }},
        {"array of {\"a\":{}}", [](std::size_t n) { return repeated(n, "[", "{\"a\":{}}", ",", "]"); }},
        {"one object, many keys", many_keys},
        {"array of records", nested_records},
    };
    bool ok = true;
    for (std::size_t bytes : {std::size_t{64} << 10, std::size_t{256} << 10, std::size_t{1} << 20}) {
        const std::string flat = repeated(bytes, "[", "0", ",", "]");
        const double base = parse_seconds(flat, 5) / static_cast<double>(flat.size());
        for (const auto& [name, make] : shapes) {
            const std::string text = make(bytes);
            const double per_byte = parse_seconds(text, 3) / static_cast<double>(text.size());
            const double ratio = per_byte / base;
            const bool pass = ratio <= kMaxRatio;
            ok = ok && pass;
            std::printf("%-24s %8zu bytes: %6.2f x the flat array's time per byte%s\n", name, text.size(), ratio,
                        pass ? "" : "  FAIL (limit 30: not linear)");
        }
    }
    std::printf(ok ? "json throughput: linear\n" : "json throughput: FAILED\n");
    return ok ? 0 : 1;
}
