// The conformance properties: each is a stable ID, a structured generator of cases and a check procedure, written
// once against the ABI. docs/conformance.md specifies them in words; `kvcheck list` prints them.
#pragma once

#include "kvcheck/properties/case.hpp"
#include "kvcheck/properties/target.hpp"

#include <rapidcheck.h>

#include <functional>
#include <string>
#include <vector>

namespace kvc::prop {

// What a passing case reports besides "it passed".
struct Outcome {
    double headroom = 0;          // worst error / allowed (tolerance policy)
    bool fails_f32_class = false; // passes its declared 16-bit precision class but would fail f32
    std::vector<std::string> notes; // grades, e.g. "bitwise batch-invariant"
    double quant_loss = -1;         // RunResult::quant_loss: informative, never graded; -1 when not measured
    std::vector<std::string> graded_by; // RunResult::graded_by: the pipeline declarations that graded the outputs
    // A part of the property that could not run, and why (e.g. no CUDA runtime to watch a DEVICE cache's memory).
    // When nothing failed, the case is NOT_SUPPORTED with this reason: never a PASS that skipped a check.
    std::string not_run;
};

struct Property {
    std::string id;      // stable: EQUIV, CACHE-CONTENT, ...
    std::string summary; // one line
    bool core = false;   // part of the mandatory core profile
    uint32_t feature = 0; // the KVC_FEATURE_* bit the property is about (0: none); without it every case is
                          // NOT_SUPPORTED
    // Cases drawn only from what `allow` declares (pass full_caps() to draw from everything).
    std::function<rc::Gen<Case>(const kvc_caps& allow)> gen;
    // Runs the case; throws Violation when the property does not hold, kvc::AbiError when a call fails.
    std::function<Outcome(const Target&, const Case&)> check;
};

const std::vector<Property>& properties();
const Property* find_property(const std::string& id); // nullptr when unknown

// Every capability, no limits: the space the CLI draws from, so undeclared features show as NOT_SUPPORTED.
kvc_caps full_caps();

} // namespace kvc::prop
