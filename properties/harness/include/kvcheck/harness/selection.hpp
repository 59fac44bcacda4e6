// Which cases a run holds: the properties of each level in suite order (profile applied), indices 0..cases-1,
// filtered by a regular expression; then the shard's share (position k belongs to shard k % N).
#pragma once

#include "kvcheck/harness/subjects.hpp"
#include "kvcheck/properties/properties.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace kvc::harness {

struct Shard {
    uint64_t index = 0, count = 1;
};

constexpr int kShrinkAll = 1000000000;

// Each throws BadInput with the option's name and the expected form.
uint64_t parse_seed(const std::string& text);
int parse_shrink_first(const std::string& text); // "all" or a count from 0 (kShrinkAll and more mean all)
Shard parse_shard(const std::string& text);      // "I/N", 0 <= I < N

// One case of the run: an operation-level property's case or a model-level property's case.
struct CaseRef {
    Level level = Level::Operation;
    const prop::Property* property = nullptr; // operation level
    std::string model_property;               // model level
    int index = 0;
    const std::string& property_id() const { return property ? property->id : model_property; }
    bool core() const;
};

// The model-level properties of the core profile (the others run in the full profile only): those every engine
// can run, whatever it declares.
bool model_property_core(const std::string& id);

struct Selection {
    std::vector<CaseRef> operation, model; // the shard's share of each level
    std::size_t operation_before_shard = 0, model_before_shard = 0;
};

// Throws BadInput for a filter that is not a regular expression.
Selection select_cases(const std::string& profile, int cases, const std::string& filter, const Shard& shard);

} // namespace kvc::harness
