// What the reference says, by name. Every quantity a golden file names is computed here: the toy models by
// kvc::ref::forward / generate / attend_head in long double, cache sizes by the formula 2·B·L·T·H_kv·d_h·s.
// Nothing here reads a golden file, so a golden file can never vouch for itself.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace kvc::golden {

// One quantity: a scalar, a vector or a matrix, row-major.
struct Value {
    std::vector<long double> data;
    std::vector<size_t> shape; // {} scalar, {n} vector, {rows, cols} matrix
};

class Oracle {
public:
    // Runs every scenario once (a few milliseconds). Throws std::logic_error if a derivation that the golden files
    // rely on no longer holds (e.g. W_Q is no longer the unique {1,2,3} solution): a bug, not bad input.
    Oracle();
    const Value* find(const std::string& quantity) const; // nullptr when no such quantity
    std::vector<std::string> names() const;

private:
    std::map<std::string, Value> values_;
};

} // namespace kvc::golden
