#include "kvcheck/golden/oracle.hpp"

#include "quantities.hpp"

namespace kvc::golden {

Oracle::Oracle() {
    Quantities q(values_);
    add_toy4d(q);
    add_toy2d(q);
    add_memory(q);
    add_shapes(q);
}

const Value* Oracle::find(const std::string& quantity) const {
    auto it = values_.find(quantity);
    return it == values_.end() ? nullptr : &it->second;
}

std::vector<std::string> Oracle::names() const {
    std::vector<std::string> n;
    for (const auto& [name, value] : values_) n.push_back(name);
    return n;
}

} // namespace kvc::golden
