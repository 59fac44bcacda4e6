// The worst headroom of a property: the largest share of its allowed error bound any passing case used, and the case
// holding it. The verdict table, the JSON report's per-property summary and `kvcheck grade` all show it, so that a
// pass that came close to the bound is visible without reading every case.
#pragma once

#include "kvcheck/properties/runner.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <iomanip>
#include <sstream>
#include <string>

namespace kvc::harness {

struct WorstHeadroom {
    double value = -1; // -1 while no passing case used any of its bound (nothing graded, or exact outputs)
    std::string case_id;

    // Counts a case that passed (PASS or QUALITY_WARNING); any other verdict says nothing about the bound.
    void add(const prop::CaseResult& r) {
        const bool passed = r.verdict == prop::Verdict::Pass || r.verdict == prop::Verdict::QualityWarning;
        if (passed && std::isfinite(r.headroom) && r.headroom > 0 && r.headroom > value) {
            value = r.headroom;
            case_id = r.id;
        }
    }
    // "0.412 (EQUIV/17)", or "-".
    std::string text() const {
        if (value < 0) return "-";
        std::ostringstream s;
        s << std::fixed << std::setprecision(3) << value << " (" << case_id << ")";
        return s.str();
    }
    // {"value", "case"}, or null.
    nlohmann::json json() const {
        if (value < 0) return nullptr;
        return {{"value", value}, {"case", case_id}};
    }
};

} // namespace kvc::harness
