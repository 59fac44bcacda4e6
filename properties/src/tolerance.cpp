#include "kvcheck/properties/tolerance.hpp"

#include "kvcheck/abi.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace kvc::prop {

double tolerance_floor(uint32_t precision, uint32_t dtype) {
    if (precision == KVC_PRECISION_F32 || dtype == KVC_DTYPE_F32) return 1e-5;
    return dtype == KVC_DTYPE_F16 ? 1e-3 : 8e-3;
}

namespace {

const char* class_name(uint32_t p) {
    return p == KVC_PRECISION_F32 ? "f32" : "q-and-v-accumulated-in-cache-dtype";
}

// Worst error / bound over all rows for one candidate output against one naive baseline.
struct RowScan {
    double headroom = 0, error = 0, allowed = 0;
    bool nan = false;
    Worst worst;
};

RowScan scan(const CaseConfig& cfg, const float* actual, const Expected& e, const std::vector<float>& naive,
             double floor) {
    RowScan r;
    const uint32_t d = cfg.head_dim, Hq = cfg.n_q_heads;
    for (uint32_t i = 0; i < e.n_new; ++i)
        for (uint32_t h = 0; h < Hq; ++h) {
            const size_t o = (static_cast<size_t>(i) * Hq + h) * d;
            const double vs = e.v_scale[static_cast<size_t>(i) * Hq + h];
            double err = 0, nerr = 0;
            uint32_t at = 0;
            for (uint32_t x = 0; x < d; ++x) {
                const double want = static_cast<double>(e.oracle[o + x]);
                if (std::isnan(actual[o + x])) {
                    if (!r.nan) r.worst = {i, h, x, want, actual[o + x]};
                    r.nan = true;
                    continue;
                }
                const double ex = std::fabs(actual[o + x] - want) / vs;
                if (ex > err) err = ex, at = x;
                nerr = std::max(nerr, std::fabs(naive[o + x] - want) / vs);
            }
            const double allowed = std::max(2.0 * nerr, floor);
            if (!r.nan && err / allowed > r.headroom) {
                r.headroom = err / allowed;
                r.error = err;
                r.allowed = allowed;
                r.worst = {i, h, at, static_cast<double>(e.oracle[o + at]), actual[o + at]};
            }
        }
    return r;
}

} // namespace

Grade grade_outputs(const CaseConfig& cfg, uint32_t declared, const float* actual, const Expected& e) {
    const bool wide = declared == KVC_PRECISION_F32 || cfg.dtype == KVC_DTYPE_F32;
    const RowScan f32 = scan(cfg, actual, e, e.naive_f32, tolerance_floor(KVC_PRECISION_F32, cfg.dtype));
    const RowScan c16 = scan(cfg, actual, e, e.naive_cache_accum,
                             tolerance_floor(KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE, cfg.dtype));
    const RowScan& mine = wide ? f32 : c16;
    Grade g;
    g.nan = mine.nan;
    g.error = mine.error;
    g.allowed = mine.allowed;
    g.headroom = mine.headroom;
    g.worst = mine.worst;
    g.pass = !mine.nan && mine.headroom <= 1.0;
    g.fails_f32_class = g.pass && !wide && f32.headroom > 1.0;
    std::ostringstream m;
    if (mine.nan) {
        m << "NaN in the output (token " << g.worst.token << ", head " << g.worst.head << ", dim " << g.worst.dim
          << ")";
    } else if (!g.pass) {
        m << "error " << g.error << " (relative to max|v|) exceeds the bound " << g.allowed << " of precision class "
          << class_name(wide ? uint32_t{KVC_PRECISION_F32} : declared) << " at token " << g.worst.token << ", head "
          << g.worst.head << ", dim " << g.worst.dim << ": expected " << g.worst.expected << ", got "
          << g.worst.actual;
        // Name the likely cause only when the error has the size 16-bit arithmetic would give, not merely fits it.
        if (wide && cfg.dtype != KVC_DTYPE_F32 && c16.headroom <= 1.0 && c16.headroom >= 0.125)
            m << "; the error is consistent with q rounded to " << dtype_name(cfg.dtype) << " and V accumulated in "
              << dtype_name(cfg.dtype) << " while the implementation declares the f32 class";
    }
    g.message = m.str();
    return g;
}

} // namespace kvc::prop
