// kvcheck memory: the KV-cache size formula of the documents, bytes = 2 * B * L * T * H_kv * d_h * s, computed
// exactly in 64-bit integers (overflow is an error, never a wrapped number), with presets for the models the
// documents talk about. It reproduces every memory number they print; docs/cli.md lists them.
#include "commands.hpp"

#include "kvcheck/harness/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvc::cli {
namespace {

struct Preset {
    std::string name;
    int64_t layers, kv_heads, head_dim;
    int64_t tokens, batch; // the context the documents use the model with
    double parameters;     // model parameters, for the weights comparison (0: not a real model)
    std::string about;
};

const std::vector<Preset>& presets() {
    static const std::vector<Preset> p = {
        {"llama-2-13b", 40, 40, 128, 4096, 1, 13e9,
         "Llama 2 13B (no GQA: 40 KV heads). Document 000: ~0.8 MB per token; at batch 32 and 4k context the cache "
         "outgrows the 26 GB of fp16 weights"},
        {"llama-3-70b", 80, 8, 128, 8192, 1, 70e9,
         "Llama 3 70B (GQA: 8 KV heads). Document 001: roughly 2.5 GB per sequence at 8k context in fp16; weights "
         "140 GB"},
        {"doc-003-example", 32, 32, 128, 8192, 1, 0,
         "document 003's worked example: B=1, L=32, T=8192, H_kv=32, d_h=128, fp16 -> 4 GiB"},
        {"toy-000", 2, 1, 4, 4, 1, 0,
         "document 000's toy model: 2 layers, 1 head, d=4; one token costs 2 x 1 x 4 x 2 = 16 numbers"},
    };
    return p;
}

struct Options {
    std::string model, dtype = "f16";
    int64_t layers = 0, kv_heads = 0, head_dim = 0, tokens = 0, batch = 1, block_size = 0;
    bool json = false;
    CLI::Option *o_layers = nullptr, *o_kv_heads = nullptr, *o_head_dim = nullptr, *o_tokens = nullptr,
                *o_batch = nullptr, *o_block = nullptr;
};

class BadInput : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

uint64_t mul(uint64_t a, uint64_t b, const char* what) {
    uint64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r))
        throw BadInput(std::string(what) + " does not fit in 64 bits (more than 16 EiB): check the sizes");
    return r;
}

// Up to three decimals, trailing zeros dropped: 4, 2.5, 2.684, 0.819; below 1, three significant digits (0.0312).
std::string decimal(double x) {
    int places = 3;
    if (x > 0 && x < 1) places = std::min(15, 2 - static_cast<int>(std::floor(std::log10(x))));
    std::ostringstream s;
    s << std::fixed << std::setprecision(places) << x;
    std::string t = s.str();
    t.erase(t.find_last_not_of('0') + 1);
    if (!t.empty() && t.back() == '.') t.pop_back();
    return t;
}

std::string binary_units(uint64_t b) {
    return decimal(static_cast<double>(b) / 1048576.0) + " MiB = " +
           decimal(static_cast<double>(b) / 1073741824.0) + " GiB";
}

std::string decimal_units(uint64_t b) {
    return decimal(static_cast<double>(b) / 1e6) + " MB = " + decimal(static_cast<double>(b) / 1e9) + " GB";
}

// How one element is stored: s bytes per number, plus the scale bytes a quantized dtype keeps with each head's row
// (docs/quantized.md). fp8 keeps its scales per layer, not per token: they do not grow with T.
struct Storage {
    std::string name;
    uint64_t s = 2;               // bytes per number (the code, for a quantized dtype)
    uint64_t scale_bytes = 0;     // per head row: int8 one scale, q8_0 one f16 per 32 numbers
    uint64_t block = 0;           // q8_0: head_dim must be a multiple of this
    std::string scale_about;      // what scale_bytes is, for the printout
};

Storage storage_of(const std::string& d, uint64_t head_dim) {
    if (d == "f32" || d == "fp32" || d == "float32") return {"f32", 4, 0, 0, ""};
    if (d == "f16" || d == "fp16" || d == "float16") return {"f16", 2, 0, 0, ""};
    if (d == "bf16" || d == "bfloat16") return {"bf16", 2, 0, 0, ""};
    if (d == "fp8_e4m3" || d == "fp8" || d == "e4m3") return {"fp8_e4m3", 1, 0, 0, ""};
    if (d == "fp8_e5m2" || d == "e5m2") return {"fp8_e5m2", 1, 0, 0, ""};
    if (d == "int8_token" || d == "int8") return {"int8_token", 1, 4, 0, "one f32 scale per token and KV head"};
    if (d == "int8_token_f16") return {"int8_token_f16", 1, 2, 0, "one f16 scale per token and KV head"};
    if (d == "q8_0") return {"q8_0", 1, 2 * (head_dim / 32), 32, "one f16 scale per 32 numbers"};
    throw BadInput("unknown --dtype \"" + d + "\": expected f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8_token, "
                   "int8_token_f16 or q8_0");
}

int run(Options& o) {
    const Preset* preset = nullptr;
    if (!o.model.empty()) {
        for (const Preset& p : presets())
            if (p.name == o.model) preset = &p;
        if (!preset) {
            std::string known;
            for (const Preset& p : presets()) known += " " + p.name;
            throw BadInput("unknown --model \"" + o.model + "\"; presets:" + known);
        }
        // The preset fills what was not given on the command line.
        if (!o.o_layers->count()) o.layers = preset->layers;
        if (!o.o_kv_heads->count()) o.kv_heads = preset->kv_heads;
        if (!o.o_head_dim->count()) o.head_dim = preset->head_dim;
        if (!o.o_tokens->count()) o.tokens = preset->tokens;
        if (!o.o_batch->count()) o.batch = preset->batch;
    } else {
        std::string missing;
        if (!o.o_layers->count()) missing += " --layers";
        if (!o.o_kv_heads->count()) missing += " --kv-heads";
        if (!o.o_head_dim->count()) missing += " --head-dim";
        if (!o.o_tokens->count()) missing += " --tokens";
        if (!missing.empty()) throw BadInput("missing" + missing + " (or give --model NAME)");
    }
    const std::pair<const char*, int64_t> sizes[] = {{"--layers", o.layers},     {"--kv-heads", o.kv_heads},
                                                     {"--head-dim", o.head_dim}, {"--tokens", o.tokens},
                                                     {"--batch", o.batch}};
    for (const auto& [flag, v] : sizes)
        if (v <= 0) throw BadInput(std::string(flag) + " must be a positive integer, got " + std::to_string(v));
    if (o.o_block->count() && o.block_size <= 0)
        throw BadInput("--block-size must be a positive integer, got " + std::to_string(o.block_size));
    const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
    const Storage st = storage_of(o.dtype, u(o.head_dim));
    const std::string& dtype = st.name;
    const uint64_t s = st.s;
    if (st.block && u(o.head_dim) % st.block)
        throw BadInput("--dtype " + dtype + " needs --head-dim a multiple of " + std::to_string(st.block) + ", got " +
                       std::to_string(o.head_dim));

    // elements of one token of one sequence: K and V, every layer, every KV head
    const uint64_t elements_per_token = mul(mul(mul(2, u(o.layers), "elements per token"), u(o.kv_heads),
                                                "elements per token"),
                                            u(o.head_dim), "elements per token");
    // a quantized dtype's per-row scales: K and V rows, every layer and KV head
    const uint64_t scale_bytes_per_token =
        mul(mul(mul(2, u(o.layers), "bytes per token"), u(o.kv_heads), "bytes per token"), st.scale_bytes,
            "bytes per token");
    const uint64_t bytes_per_token = mul(elements_per_token, s, "bytes per token") + scale_bytes_per_token;
    const uint64_t bytes = mul(mul(bytes_per_token, u(o.tokens), "the cache size"), u(o.batch), "the cache size");
    uint64_t blocks = 0, allocated = 0;
    if (o.block_size > 0) {
        blocks = u(o.tokens) / u(o.block_size) + (u(o.tokens) % u(o.block_size) ? 1 : 0);
        allocated = mul(mul(mul(bytes_per_token, blocks, "the allocated size"), u(o.block_size), "the allocated size"),
                        u(o.batch), "the allocated size");
    }
    const double weights = preset && preset->parameters > 0 ? preset->parameters * 2.0 : 0; // fp16 weights

    if (o.json) {
        nlohmann::json j = {{"formula", st.scale_bytes ? "2 * B * L * T * H_kv * (d_h * s + scale bytes per row)"
                                                       : "2 * B * L * T * H_kv * d_h * s"},
                            {"model", preset ? nlohmann::json(preset->name) : nlohmann::json(nullptr)},
                            {"batch", o.batch},
                            {"layers", o.layers},
                            {"tokens", o.tokens},
                            {"kv_heads", o.kv_heads},
                            {"head_dim", o.head_dim},
                            {"dtype", dtype},
                            {"bytes_per_element", s},
                            {"scale_bytes_per_head_row", st.scale_bytes},
                            {"elements_per_token", elements_per_token},
                            {"bytes_per_token", bytes_per_token},
                            {"bytes", bytes},
                            {"mib", static_cast<double>(bytes) / 1048576.0},
                            {"gib", static_cast<double>(bytes) / 1073741824.0},
                            {"mb", static_cast<double>(bytes) / 1e6},
                            {"gb", static_cast<double>(bytes) / 1e9}};
        if (o.block_size > 0) {
            j["block_size"] = o.block_size;
            j["blocks_per_sequence_layer"] = blocks;
            j["allocated_bytes"] = allocated;
        }
        if (weights > 0) {
            j["weights_bytes_fp16"] = static_cast<uint64_t>(weights);
            j["cache_to_weights"] = static_cast<double>(bytes) / weights;
        }
        std::cout << dump_json(j, 2) << "\n";
        return kExitOk;
    }

    std::ostringstream out;
    out << (st.scale_bytes ? "KV cache bytes = 2 * B * L * T * H_kv * (d_h * s + scale bytes per row)\n"
                           : "KV cache bytes = 2 * B * L * T * H_kv * d_h * s\n");
    if (preset) out << "  model: " << preset->name << ": " << preset->about << "\n";
    const std::pair<std::string, uint64_t> inputs[] = {
        {"B    (batch, sequences)", u(o.batch)}, {"L    (layers)", u(o.layers)},
        {"T    (tokens per seq)", u(o.tokens)},   {"H_kv (KV heads)", u(o.kv_heads)},
        {"d_h  (head dim)", u(o.head_dim)},       {"s    (bytes per " + dtype + ")", s}};
    for (const auto& [what, v] : inputs) out << "  " << std::setw(25) << std::left << what << " " << v << "\n";
    if (st.scale_bytes)
        out << "  " << std::setw(25) << std::left << "scale bytes per row" << " " << st.scale_bytes << " ("
            << st.scale_about << ")\n";
    else if (dtype.rfind("fp8", 0) == 0)
        out << "  fp8 scales are per layer (or per layer and KV head), not per token: not in the formula\n";
    out << "elements per token: " << elements_per_token << " (K and V, every layer and KV head, one sequence)\n";
    out << "bytes per token:    " << bytes_per_token << " = " << decimal(static_cast<double>(bytes_per_token) / 1024.0)
        << " KiB = " << decimal(static_cast<double>(bytes_per_token) / 1e6) << " MB\n";
    out << "bytes:              " << bytes << "\n";
    out << "                    = " << binary_units(bytes) << "\n";
    out << "                    = " << decimal_units(bytes) << " (decimal)\n";
    if (o.block_size > 0) {
        out << "in blocks of " << o.block_size << " tokens: " << blocks << " block(s) per sequence and layer, "
            << allocated << " bytes allocated = " << binary_units(allocated) << " (" << (allocated - bytes)
            << " bytes in partly filled last blocks)\n";
    }
    if (weights > 0) {
        out << "model weights (fp16, " << decimal(preset->parameters / 1e9) << "e9 parameters x 2 bytes): "
            << decimal(weights / 1e9) << " GB; the cache is " << decimal(static_cast<double>(bytes) / weights)
            << " x the weights\n";
    }
    std::cout << out.str();
    return kExitOk;
}

} // namespace

void add_memory_command(CLI::App& app, int& exit_code) {
    static Options o; // CLI11 keeps references: the options must outlive parse()
    std::string models;
    for (const Preset& p : presets()) models += (models.empty() ? "" : ", ") + p.name;
    auto* m = app.add_subcommand("memory", "KV-cache size: 2 * B * L * T * H_kv * d_h * s bytes, exact. Exit 0, or 2 "
                                           "on bad input");
    m->add_option("--model", o.model, "a preset: " + models + " (explicit sizes override it)");
    o.o_layers = m->add_option("--layers", o.layers, "L, transformer layers");
    o.o_kv_heads = m->add_option("--kv-heads", o.kv_heads, "H_kv, key/value heads (fewer than query heads with GQA)");
    o.o_head_dim = m->add_option("--head-dim", o.head_dim, "d_h, dimension of one head");
    o.o_tokens = m->add_option("--tokens", o.tokens, "T, cached tokens per sequence");
    o.o_batch = m->add_option("--batch", o.batch, "B, sequences")->capture_default_str();
    m->add_option("--dtype", o.dtype,
                  "cache element type: f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8_token (f32 scales), int8_token_f16 "
                  "or q8_0")
        ->capture_default_str();
    o.o_block = m->add_option("--block-size", o.block_size, "tokens per block: also show whole-block allocation");
    m->add_flag("--json", o.json, "print JSON");
    m->callback([&exit_code] {
        try {
            exit_code = run(o);
        } catch (const BadInput& e) {
            std::cerr << "kvcheck memory: " << printable(e.what(), true) << "\n";
            exit_code = kExitBadInput;
        }
    });
}

} // namespace kvc::cli
