// The table over kvc::opt::ModelEngine. The engine is used as it is; what the table adds is only what the ABI asks
// and the engine's class does not have:
//  - weights arrive as safetensors (read with the harness's documented reader) and a tied classifier is handed to
//    the engine as an explicit W_U = embeddingᵀ (the engine's f32 copy of it is the same numbers);
//  - fork replays the parent's tokens into the child: ModelEngine does not expose its cache's fork, so the child
//    gets the same history by recomputation (same values, no sharing; its K/V projections count in
//    kv_projections). A sharing fork needs ModelEngine::fork (cache_.fork) in optimized/.
//  - read_kv is not declared: ModelEngine does not expose its cache either.
//  - forward returns the last token's logits only (ModelEngine::forward's contract): no KVCM_FEATURE_ALL_LOGITS.
#include "model_engine_abi.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/model/weights_io.hpp"
#include "kvcheck/optimized/model_engine.hpp"

#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

struct kvcm_model {
    kvcm_model_desc desc{};
    std::unique_ptr<kvc::opt::ModelEngine> engine;
    std::vector<std::vector<int>> history; // per sequence: every token it holds (fork replays it)
    std::string error;
};

namespace {

std::string g_create_error = "no error";

// Runs f, turning any exception into a status and a message.
template <typename F>
kvc_status guarded(std::string& error, F&& f) {
    try {
        f();
        return KVC_OK;
    } catch (const kvc::AbiError& e) {
        error = e.what();
        return e.status();
    } catch (const kvc::ref::ConfigError& e) {
        error = e.what();
        return KVC_ERR_INVALID_ARGUMENT;
    } catch (const std::invalid_argument& e) {
        error = e.what();
        return KVC_ERR_INVALID_ARGUMENT;
    } catch (const std::out_of_range& e) {
        error = e.what();
        return KVC_ERR_INVALID_ARGUMENT;
    } catch (const std::bad_alloc&) {
        error = "out of memory";
        return KVC_ERR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
        error = e.what();
        return KVC_ERR_INTERNAL;
    }
}

uint32_t dtype_size(uint32_t dtype) { return dtype == KVC_DTYPE_F32 ? 4 : 2; }

void engine_get_caps(kvcm_caps* out) {
    kvcm_caps c{};
    c.struct_size = sizeof c;
    c.features = KVCM_FEATURE_PROMPT | KVCM_FEATURE_CHUNKED | KVCM_FEATURE_FORK | KVCM_FEATURE_RELEASE |
                 KVCM_FEATURE_TIED | KVCM_FEATURE_UNTIED | KVCM_FEATURE_FREE_HEAD_DIM | KVCM_FEATURE_KV_PROJECTIONS;
    c.weight_formats = 1u << KVCM_WEIGHTS_SAFETENSORS;
    c.cache_dtypes = (1u << KVC_DTYPE_F32) | (1u << KVC_DTYPE_F16) | (1u << KVC_DTYPE_BF16);
    c.rope_variants = (1u << KVC_ROPE_NONE) | (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    c.max_context = 1u << 16;
    c.max_seqs = 64;
    c.max_layers = 64;
    c.max_heads = 64;
    c.max_kv_heads = 64;
    c.max_head_dim = 256;
    c.max_dim = 8192;
    c.max_hidden_dim = 32768;
    c.max_vocab = 1u << 18;
    *out = c;
}

kvc_status engine_create(const kvcm_model_desc* desc, const kvcm_weights* wt, kvcm_model** out) {
    if (desc == nullptr || wt == nullptr || out == nullptr || wt->struct_size < sizeof(kvcm_weights)) {
        g_create_error = "create: a NULL argument or a weights struct_size below ABI 1.0";
        return KVC_ERR_INVALID_ARGUMENT;
    }
    if (wt->format != KVCM_WEIGHTS_SAFETENSORS) {
        g_create_error = "weights format " + std::to_string(wt->format) + ": this engine reads safetensors only";
        return KVC_ERR_UNSUPPORTED;
    }
    if ((wt->path == nullptr) == (wt->data == nullptr)) {
        g_create_error = "weights: exactly one of path and data must be set";
        return KVC_ERR_INVALID_ARGUMENT;
    }
    auto m = std::make_unique<kvcm_model>();
    const kvc_status s = guarded(g_create_error, [&] {
        kvc::ref::ModelConfig cfg = kvc::model::config_of(*desc);
        const std::string bytes = wt->data ? std::string(static_cast<const char*>(wt->data), static_cast<size_t>(wt->size))
                                           : kvc::model::read_file_bytes(wt->path);
        kvc::ref::Weights<double> w = kvc::model::read_safetensors(bytes, cfg);
        if (cfg.tied) { // the engine takes an explicit W_U: the embedding's transpose, the same numbers
            w.w_unembed = w.embedding.transpose();
            cfg.tied = false;
        }
        kvc::opt::ModelEngineOptions o;
        o.cache_dtype = desc->cache_dtype;
        o.max_tokens = desc->max_context;
        o.max_seqs = desc->max_seqs;
        m->engine = std::make_unique<kvc::opt::ModelEngine>(cfg, w, o);
        m->desc = *desc;
        m->history.resize(desc->max_seqs);
    });
    if (s != KVC_OK) return s;
    *out = m.release();
    return KVC_OK;
}

void engine_destroy(kvcm_model* m) { delete m; }

const char* engine_last_error(const kvcm_model* m) { return m ? m->error.c_str() : g_create_error.c_str(); }

bool known_seq(kvcm_model* m, uint32_t seq, const char* what) {
    if (seq < m->history.size()) return true;
    m->error = std::string(what) + ": sequence " + std::to_string(seq) + " is not below max_seqs " +
               std::to_string(m->history.size());
    return false;
}

kvc_status engine_forward(kvcm_model* m, uint32_t seq, uint32_t n, const int32_t* tokens, float* logits) {
    if (!known_seq(m, seq, "forward")) return KVC_ERR_INVALID_ARGUMENT;
    if (n == 0 || tokens == nullptr || logits == nullptr) {
        m->error = "forward: no tokens or a NULL buffer";
        return KVC_ERR_INVALID_ARGUMENT;
    }
    return guarded(m->error, [&] {
        const std::vector<int> t(tokens, tokens + n);
        const std::vector<float> last = m->engine->forward(seq, t);
        std::memcpy(logits, last.data(), last.size() * sizeof(float));
        auto& h = m->history[seq];
        h.insert(h.end(), t.begin(), t.end());
    });
}

kvc_status engine_fork(kvcm_model* m, uint32_t parent, uint32_t child) {
    if (!known_seq(m, parent, "fork") || !known_seq(m, child, "fork")) return KVC_ERR_INVALID_ARGUMENT;
    if (m->history[parent].empty() || !m->history[child].empty() || parent == child) {
        m->error = "fork: the parent must hold tokens and the child none";
        return KVC_ERR_INVALID_ARGUMENT;
    }
    return guarded(m->error, [&] {
        m->engine->forward(child, m->history[parent]); // replay: the child's cache gets the parent's K/V
        m->history[child] = m->history[parent];
    });
}

kvc_status engine_release(kvcm_model* m, uint32_t seq) {
    if (!known_seq(m, seq, "release")) return KVC_ERR_INVALID_ARGUMENT;
    if (m->history[seq].empty()) {
        m->error = "release: sequence " + std::to_string(seq) + " holds no token";
        return KVC_ERR_INVALID_ARGUMENT;
    }
    return guarded(m->error, [&] {
        m->engine->release(seq);
        m->history[seq].clear();
    });
}

kvc_status engine_memory(kvcm_model* m, kvcm_memory* out) {
    if (out == nullptr || out->struct_size < sizeof(kvcm_memory)) {
        m->error = "memory: NULL or a struct_size below ABI 1.0";
        return KVC_ERR_INVALID_ARGUMENT;
    }
    return guarded(m->error, [&] {
        const kvc_memory c = m->engine->memory();
        out->bytes_per_token = 2ull * m->desc.n_layers * m->desc.n_kv_heads * m->desc.head_dim *
                               dtype_size(m->desc.cache_dtype);
        out->live_bytes = c.live_bytes; // the cache's own count
        out->reserved_bytes = c.capacity_bytes + c.pool_bytes;
    });
}

kvc_status engine_kv_projections(kvcm_model* m, uint64_t* out) {
    if (out == nullptr) return KVC_ERR_INVALID_ARGUMENT;
    *out = static_cast<uint64_t>(m->engine->kv_projections());
    return KVC_OK;
}

const kvcm_model_api kModelEngineApi = {sizeof(kvcm_model_api), KVCM_ABI_VERSION_MAJOR, KVCM_ABI_VERSION_MINOR,
                                        "kvcheck-cpu-model-engine", "1.0", engine_get_caps, engine_create,
                                        engine_destroy, engine_last_error, engine_forward, nullptr /* read_kv */,
                                        engine_fork, engine_release, engine_memory, engine_kv_projections};

} // namespace

extern "C" const kvcm_model_api* kvcm_model_engine_entry(uint32_t harness_abi_major, uint32_t /*harness_abi_minor*/) {
    return harness_abi_major == KVCM_ABI_VERSION_MAJOR ? &kModelEngineApi : nullptr;
}
