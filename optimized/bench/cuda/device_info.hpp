// What the GPU benchmarks print first: which GPU, driver and runtime, and its clocks (device_info.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace kvc::gpubench {

// Device 0 described in words (several lines) and as JSON. Requires a usable device.
std::string describe_device(nlohmann::json& out);

} // namespace kvc::gpubench
