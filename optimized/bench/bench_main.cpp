// kvcheck_bench: Google Benchmark's table (counters per benchmark), then a summary of the ratios (eight groups) with their
// goals. Run it as `build/bin/kvcheck_bench` (docs/performance.md); filters work as usual (--benchmark_filter=).
#include "bench_common.hpp"

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    kvc::bench::print_machine();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    kvc::bench::print_summary();
    return 0;
}
