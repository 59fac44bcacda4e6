// kvcheck_bench_cuda: the GPU goals of docs/gpu.md, each a ratio of two things measured in this run.
//
//   decode bytes/s (bf16, >= 1 GiB of K/V, MHA and GQA 8:1, block 16)  /  device-to-device cudaMemcpy bytes/s
//   decode step time, blocks shuffled  /  the same, blocks contiguous  - 1
//   causal prefill TFLOP/s  /  cuBLAS bf16 GEMM TFLOP/s
//
// Timings: CUDA events on the legacy default stream, warm-up calls first, the median of the repeats. The engine is
// driven through its ABI table only (engine_cases.hpp says what that includes). Prints the GPU first, a table of
// every case, the ratios with their goals, and writes the same as JSON (--json FILE).
//
// Exit: 0 every case ran (goals met or not: they are reported, not enforced); 1 a case failed (its error is
// printed); 2 bad usage; 3 no usable CUDA device (the CUDA error is printed; tools/gpu/run.sh reports "skipped").
#include "common.hpp"
#include "cublas_gemm.hpp"
#include "device_info.hpp"
#include "engine_cases.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

using namespace kvc::gpubench;
using nlohmann::json;

namespace {

struct Options {
    std::string json_path;
    bool quick = false, probe = false;
    int warmup = 3, repeats = 15;
};

int usage(const char* msg) {
    std::fprintf(stderr,
                 "%s%susage: kvcheck_bench_cuda [--json FILE] [--quick] [--warmup N] [--repeats N] | --probe\n"
                 "  --json FILE   also write every figure as JSON\n"
                 "  --quick       small sizes (a smoke run: its ratios are not the goals' shapes)\n"
                 "  --probe       only say whether a CUDA device is usable (exit 0) or why not (exit 3)\n",
                 msg, *msg ? "\n" : "");
    return 2;
}

bool parse_int(const char* s, int lo, int hi, int& out) {
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return false;
    out = static_cast<int>(v);
    return true;
}

json stats_json(const Stats& s) {
    return {{"median_ms", s.median_ms}, {"min_ms", s.min_ms}, {"max_ms", s.max_ms}, {"repeats", s.repeats}};
}

json decode_json(const DecodeResult& r, const DecodeShape& s) {
    json j = {{"shape", r.shape}, {"order", r.order}, {"ran", r.ran}, {"n_q_heads", s.n_q_heads},
              {"n_kv_heads", s.n_kv_heads}, {"head_dim", s.head_dim}, {"seqs", s.seqs}, {"tokens", s.tokens},
              {"block_hint", s.block}, {"dtype", "bf16"}};
    if (!r.ran) {
        j["why_not"] = r.why_not;
        return j;
    }
    j.update({{"kv_bytes_per_step", r.kv_bytes}, {"step", stats_json(r.step)}, {"bytes_per_s", r.bytes_per_s},
              {"host_io_ms", r.host_io_ms}, {"device_bytes_per_s_estimate", r.device_bytes_per_s},
              {"batched", r.batched}, {"block_size_reported", r.block_size}, {"fill_s", r.fill_s}});
    return j;
}

struct Ratio {
    std::string what;
    double value;
    bool have;
    std::string goal; // "" when none
    bool met;
    std::string note;
};

void print_decode(const DecodeResult& r) {
    if (!r.ran) {
        std::printf("  %-26s %-10s  n/a: %s\n", r.shape.c_str(), r.order.c_str(), r.why_not.c_str());
        return;
    }
    std::printf("  %-26s %-10s  %7.3f ms  %7.1f MiB  %7.3f TB/s  (host copies %.3f ms; without them ~%.3f TB/s)  "
                "block %u, %s\n",
                r.shape.c_str(), r.order.c_str(), r.step.median_ms, r.kv_bytes / 1048576.0, r.bytes_per_s / 1e12,
                r.host_io_ms, r.device_bytes_per_s / 1e12, r.block_size,
                r.batched ? "one append_attend_batch" : "one append_attend per sequence");
}

} // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
        if (a == "--json") {
            const char* v = value();
            if (!v) return usage("--json needs a file");
            o.json_path = v;
        } else if (a == "--quick") {
            o.quick = true;
        } else if (a == "--probe") {
            o.probe = true;
        } else if (a == "--warmup" || a == "--repeats") {
            const char* v = value();
            int n = 0;
            if (!v || !parse_int(v, a == "--warmup" ? 0 : 1, 1000, n)) return usage((a + " needs a count").c_str());
            (a == "--warmup" ? o.warmup : o.repeats) = n;
        } else if (a == "-h" || a == "--help") {
            usage("");
            return 0;
        } else {
            return usage(("unknown argument: " + a).c_str());
        }
    }

    const std::string why = no_device_reason();
    if (!why.empty()) {
        std::printf("kvcheck_bench_cuda: %s\n", why.c_str());
        return 3;
    }
    json report = {{"kvcheck_bench_cuda", 1}, {"quick", o.quick}, {"warmup", o.warmup}, {"repeats", o.repeats}};
    try {
        json gpu;
        std::fputs(describe_device(gpu).c_str(), stdout);
        report["gpu"] = gpu;
        if (o.probe) return 0;
        std::fflush(stdout);

        // Shapes: head_dim 128, bf16, block 16. MHA 32 x 4096 tokens x 32 heads = 2 GiB; GQA 8:1 (32 query heads
        // over 4 KV heads) 64 x 8192 = 1 GiB. --quick: 64 MiB and 16 MiB.
        const DecodeShape mha{"decode MHA 32:32", 32, 32, 128, o.quick ? 4u : 32u, o.quick ? 1024u : 4096u, 16};
        const DecodeShape gqa{"decode GQA 32:4 (8:1)", 32, 4, 128, o.quick ? 8u : 64u, o.quick ? 1024u : 8192u, 16};
        const uint32_t prefill_tokens = o.quick ? 2048 : 16384;
        const int gemm_n = o.quick ? 2048 : 8192;
        const std::size_t copy_bytes = o.quick ? (256u << 20) : (std::size_t(2) << 30);

        std::printf("\nbaselines\n");
        const CopyResult copy = device_copy(copy_bytes, o.warmup, o.repeats);
        std::printf("  device-to-device cudaMemcpy of %.0f MiB: %.3f ms, %.3f TB/s (bytes read + written)\n",
                    copy.bytes / 1048576.0, copy.time.median_ms, copy.bytes_per_s / 1e12);
        report["device_copy"] = {{"bytes", copy.bytes}, {"time", stats_json(copy.time)}, {"bytes_per_s", copy.bytes_per_s}};
        std::fflush(stdout);
        const GemmResult gemm = cublas_bf16_gemm(gemm_n, o.warmup, o.repeats);
        if (gemm.ran) {
            std::printf("  cuBLAS bf16 GEMM %d^3 (f32 accumulation): %.3f ms, %.1f TFLOP/s  [%s]\n", gemm.n,
                        gemm.time.median_ms, gemm.tflops, gemm.library.c_str());
            report["cublas_gemm"] = {{"n", gemm.n}, {"time", stats_json(gemm.time)}, {"tflops", gemm.tflops},
                                     {"library", gemm.library}};
        } else {
            std::printf("  cuBLAS bf16 GEMM: n/a: %s\n", gemm.why_not.c_str());
            report["cublas_gemm"] = {{"n", gemm.n}, {"ran", false}, {"why_not", gemm.why_not}};
        }
        std::fflush(stdout);

        bool failed = false;
        std::string why_engine;
        const kvc_plugin_api* api = cuda_engine(why_engine);
        std::printf("\nthe CUDA engine through its ABI (page-locked host inputs; each figure includes the engine's own "
                    "host<->device copies)\n");
        if (!api) {
            std::printf("  n/a: %s\n", why_engine.c_str());
            report["engine"] = {{"ran", false}, {"why_not", why_engine}};
            failed = true;
        }
        std::vector<Ratio> ratios;
        if (api) {
            report["engine"] = {{"name", api->name}, {"version", api->version}};
            const auto [contig, shuffled] = decode_contiguous_vs_shuffled(api, mha, o.warmup, o.repeats);
            print_decode(contig);
            print_decode(shuffled);
            std::fflush(stdout);
            const DecodeResult g = decode(api, gqa, o.warmup, o.repeats);
            print_decode(g);
            std::fflush(stdout);
            const PrefillResult p = prefill(api, prefill_tokens, 32, 32, 128, o.warmup, o.repeats);
            if (p.ran)
                std::printf("  prefill %u tokens, 32:32 heads, d 128, causal: %.3f ms, %.1f TFLOP/s  (host copies "
                            "%.3f ms; without them ~%.1f TFLOP/s)\n",
                            p.tokens, p.call.median_ms, p.tflops, p.host_io_ms, p.device_tflops);
            else
                std::printf("  prefill: n/a: %s\n", p.why_not.c_str());
            failed = !contig.ran || !shuffled.ran || !g.ran || !p.ran;
            report["decode"] = {decode_json(contig, mha), decode_json(shuffled, mha), decode_json(g, gqa)};
            json pj = {{"ran", p.ran}, {"tokens", p.tokens}, {"n_q_heads", p.n_q_heads}, {"n_kv_heads", p.n_kv_heads},
                       {"head_dim", p.head_dim}, {"flops", p.flops}};
            if (p.ran)
                pj.update({{"call", stats_json(p.call)}, {"tflops", p.tflops}, {"host_io_ms", p.host_io_ms},
                           {"device_tflops_estimate", p.device_tflops}});
            else
                pj["why_not"] = p.why_not;
            report["prefill"] = pj;

            auto add = [&](const std::string& what, bool have, double v, const std::string& goal, bool met,
                           const std::string& note) { ratios.push_back({what, v, have, goal, met, note}); };
            const double c = copy.bytes_per_s;
            add("decode MHA / D2D copy", contig.ran, contig.bytes_per_s / c, ">= 0.90", contig.bytes_per_s / c >= 0.90,
                "ABI call, host copies included");
            add("decode GQA 8:1 / D2D copy", g.ran, g.bytes_per_s / c, ">= 0.90", g.bytes_per_s / c >= 0.90,
                "ABI call, host copies included");
            add("decode MHA / D2D copy, est. without host copies", contig.ran, contig.device_bytes_per_s / c, "", false,
                "estimate");
            add("decode GQA / D2D copy, est. without host copies", g.ran, g.device_bytes_per_s / c, "", false,
                "estimate");
            const double slower = shuffled.step.median_ms / contig.step.median_ms - 1.0;
            add("shuffled / contiguous blocks - 1 (MHA)", contig.ran && shuffled.ran, slower, "<= 0.05", slower <= 0.05,
                "timed alternately");
            add("prefill / cuBLAS GEMM", p.ran && gemm.ran, p.tflops / gemm.tflops, ">= 0.50",
                p.tflops / gemm.tflops >= 0.50, gemm.ran ? "ABI call, host copies included" : "n/a: " + gemm.why_not);
            add("prefill / cuBLAS GEMM, est. without host copies", p.ran && gemm.ran, p.device_tflops / gemm.tflops, "",
                false, "estimate");
        }

        std::printf("\n%-50s %9s  %-8s  %-6s  %s\n", "ratio", "value", "goal", "status", "note");
        json rj = json::array();
        for (const Ratio& r : ratios) {
            const std::string status = !r.have ? "n/a" : r.goal.empty() ? "" : r.met ? "met" : "missed";
            if (r.have)
                std::printf("%-50s %9.3f  %-8s  %-6s  %s\n", r.what.c_str(), r.value, r.goal.c_str(), status.c_str(),
                            r.note.c_str());
            else
                std::printf("%-50s %9s  %-8s  %-6s  %s\n", r.what.c_str(), "-", r.goal.c_str(), status.c_str(),
                            r.note.c_str());
            json e = {{"ratio", r.what}, {"goal", r.goal}, {"status", status}, {"note", r.note}};
            e["value"] = r.have ? json(r.value) : json(nullptr);
            rj.push_back(e);
        }
        report["ratios"] = rj;
        report["exit_code"] = failed ? 1 : 0;
        if (!o.json_path.empty()) {
            std::ofstream f(o.json_path);
            f << report.dump(1) << "\n";
            if (!f) {
                std::fprintf(stderr, "kvcheck_bench_cuda: cannot write %s\n", o.json_path.c_str());
                return 1;
            }
        }
        return failed ? 1 : 0;
    } catch (const std::exception& e) {
        std::printf("kvcheck_bench_cuda: error: %s\n", e.what());
        if (!o.json_path.empty()) {
            report["error"] = e.what();
            report["exit_code"] = 1;
            std::ofstream(o.json_path) << report.dump(1) << "\n";
        }
        return 1;
    }
}
