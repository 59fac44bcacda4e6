// How a check reports a violated property: where (in the logical coordinates of the case) and what differed.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace kvc::prop {

// Where a property was violated, in logical coordinates. Fields that do not apply stay at -1 / NaN.
struct Mismatch {
    int op = -1, seq = -1, layer = -1, pos = -1, head = -1, dim = -1;
    std::string what; // "output", "k", "v", "live_bytes", ...
    double expected = 0, actual = 0;
    // What the checker found every mismatching element of the same read-back consistent with ("a RoPE stage in
    // f16"), or empty. Read by EQUIV's diagnosis in the same process; not part of the JSON form.
    std::string consistent_with;
    // ABI 1.3 pipeline rules: the declaration that graded a failing output ("pipeline rule 1 (f16, n >= 64)"), or
    // empty. The runner puts it in the case's graded_by; not part of the mismatch's JSON form.
    std::string graded_by;
    std::string describe() const;
};

// What EQUIV adds to a failure when a row read back differs from the appended one rounded to the cache dtype (the
// first such element): the oracle attends the rows as they should be stored, so the storage explains the error
// better than any narrower pipeline would (a cache storing f16 through bf16 was told "q rounded to f16"). With RoPE
// a key of an unquantized cache that differs names the rotation too: 16-bit cos/sin tables are as likely a cause.
std::string storage_error_clause(uint32_t cache_dtype, uint32_t rope, const Mismatch& first);

// Thrown by a check; the runner turns it into a FAIL verdict of `property`.
class Violation : public std::runtime_error {
public:
    Violation(std::string property, const std::string& reason, Mismatch m)
        : std::runtime_error(reason), property_(std::move(property)), mismatch_(std::move(m)) {}
    const std::string& property() const { return property_; }
    const Mismatch& mismatch() const { return mismatch_; }

private:
    std::string property_;
    Mismatch mismatch_;
};

// What every violation found while a case runs carries: the property checked and the op being applied.
struct CheckScope {
    std::string property;
    int op = -1;
    [[noreturn]] void fail(const std::string& reason, Mismatch m) const {
        if (m.op < 0) m.op = op;
        throw Violation(property, reason, std::move(m));
    }
};

} // namespace kvc::prop
