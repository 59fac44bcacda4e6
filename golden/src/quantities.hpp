// Private to the oracle: the table each oracle_*.cpp fills, one function per document (or per kind of claim).
#pragma once

#include "kvcheck/golden/oracle.hpp"
#include "kvcheck/reference/attention.hpp"

#include <map>
#include <stdexcept>
#include <string>

namespace kvc::golden {

class Quantities {
public:
    explicit Quantities(std::map<std::string, Value>& out) : out_(out) {}

    void scalar(const std::string& name, long double x) { put(name, Value{{x}, {}}); }
    void vector(const std::string& name, std::vector<long double> xs) {
        const size_t n = xs.size();
        put(name, Value{std::move(xs), {n}});
    }
    template <typename Derived>
    void vector(const std::string& name, const Eigen::MatrixBase<Derived>& v) {
        std::vector<long double> xs;
        for (Eigen::Index i = 0; i < v.size(); ++i) xs.push_back(static_cast<long double>(v(i)));
        vector(name, std::move(xs));
    }
    template <typename Derived>
    void matrix(const std::string& name, const Eigen::MatrixBase<Derived>& m) {
        Value v;
        for (Eigen::Index r = 0; r < m.rows(); ++r)
            for (Eigen::Index c = 0; c < m.cols(); ++c) v.data.push_back(static_cast<long double>(m(r, c)));
        v.shape = {static_cast<size_t>(m.rows()), static_cast<size_t>(m.cols())};
        put(name, std::move(v));
    }

private:
    void put(const std::string& name, Value v) {
        if (!out_.emplace(name, std::move(v)).second) throw std::logic_error("oracle: quantity defined twice: " + name);
    }
    std::map<std::string, Value>& out_;
};

void add_toy4d(Quantities& q);   // 000: the 4-d toy, both decode turns
void add_toy2d(Quantities& q);   // 002: the 2-d toy, K/V projection counts
void add_memory(Quantities& q);  // 000, 001, 003: cache and weight sizes
void add_shapes(Quantities& q);  // 003: prefill/decode shapes

} // namespace kvc::golden
