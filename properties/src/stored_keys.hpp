// The explanations of a wrong stored row (stored_keys.cpp) that the cache model's stored-row check asks for. Each
// returns what every wrong element of one call is consistent with, in words, or "" when not all of them are.
// k_in, v_in: the call's rows as appended; pos0: the position of its first row; got_k, got_v: the rows as stored;
// wrong: element indices of the call's keys that were not acceptable.
#pragma once

#include "kvcheck/properties/cache_model.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvc::prop {

std::string rope_stage_fitting(const CaseConfig& cfg, const float* k_in, uint32_t pos0, const uint8_t* got_k,
                               const StoredRows& want, const std::vector<size_t>& wrong);
std::string rope_over_all_dims(const CaseConfig& cfg, const float* k_in, uint32_t pos0, const uint8_t* got_k,
                               const std::vector<size_t>& wrong);
std::string v_with_k_stride(const CaseConfig& cfg, uint32_t n, const float* v_in, const uint8_t* got_v);

} // namespace kvc::prop
