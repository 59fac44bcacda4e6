// NO-Q part (4): a query store hidden in a declared workspace.
//
// A workspace is scratch for one call: it may be any fixed size, and may scale with what one call can be given (the
// tokens of a sequence, the sequences of a batch), but it never grows with the number of layers, because one call
// attends one layer. A store of every past query row is indexed by (layer, sequence, token), so its size grows with
// the layers AND with the sequences by at least one query row per (layer, sequence, token) of the configuration.
// The probe creates the implementation twice more, once with twice the layers and once with twice the sequences,
// and compares what each declares besides its K/V (workspace, plus what create() allocated unreported) with the
// case's own. Both growths at least a query row per added (layer, sequence, token) is a Q store: FAIL NO-Q. Either
// growth below it passes: a scratch sized by one call's tokens, or by a batch's sequences, is not a store.
#pragma once

#include "kvcheck/properties/case.hpp"
#include "kvcheck/properties/session.hpp"
#include "kvcheck/properties/target.hpp"

#include <string>

namespace kvc::prop {

// The smallest a kept query row can be: n_q_heads * head_dim elements of 16 bits, or of 8 bits for an 8-bit cache
// (an fp8 pipeline may quantize q too). Anything smaller than this per (layer, sequence, token) stores no query.
uint64_t min_query_row_bytes(const CaseConfig& cfg);

// `cfg` with n_layers layers (per-layer windows and scales repeat the existing layers' in order).
CaseConfig with_layers(const CaseConfig& cfg, uint32_t n_layers);

// Runs the probe against `case_run`, the NO-Q run of case `c` whose create() was judged. Throws Violation("NO-Q")
// for a Q store. Returns a note for the report: what was compared, or why a half could not run (the declared caps
// leave no room to double the layers or sequences, or the bigger configuration was refused).
std::string probe_q_store(const Target& t, const Case& c, const RunResult& case_run);

} // namespace kvc::prop
