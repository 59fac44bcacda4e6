// Bad input at the model level is a clear error, never a crash: a malformed description, a weights file that is
// short, misshaped or of the wrong classifier, a table that declares what it lacks. Also: the loadable modules
// export the model entry (and the operation-level plugin does not), and both weight formats round-trip.
#include "kvcheck/model/model_properties.hpp"
#include "kvcheck/model/weights_io.hpp"
#include "model_engine_abi.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <fstream>

extern "C" const kvcm_model_api* kvcm_model_example_entry(uint32_t, uint32_t);

namespace {

using namespace kvc::model;

kvcm_model_desc small_desc(bool tied) {
    kvcm_model_desc d{};
    d.struct_size = sizeof d;
    d.dim = 8;
    d.hidden_dim = 12;
    d.n_layers = 2;
    d.n_heads = 4;
    d.n_kv_heads = 2;
    d.head_dim = 2;
    d.vocab_size = 11;
    d.rope = KVC_ROPE_NEOX;
    d.rope_theta = 10000.0f;
    d.rms_eps = 1e-5f;
    d.tied = tied ? 1 : 0;
    d.cache_dtype = KVC_DTYPE_F32;
    d.max_context = 16;
    d.max_seqs = 1;
    return d;
}

// The message of a create that must fail with status want.
std::string create_error(kvcm_entry_fn entry, const kvcm_model_desc& d, uint32_t format, const std::string& bytes,
                         kvc_status want, const std::string& path = "") {
    const ModelTarget t = ModelTarget::from_entry(entry);
    try {
        Model m(t, d, format, bytes, path);
    } catch (const CallError& e) {
        EXPECT_EQ(e.status(), want) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "create succeeded";
    return "";
}

std::string safetensors_for(const kvcm_model_desc& d, uint64_t seed = 1) {
    const auto cfg = config_of(d);
    return write_safetensors(cfg, draw_weights(cfg, seed));
}

TEST(ModelInputs, DescriptionErrorsNameTheField) {
    kvcm_model_desc d = small_desc(false);
    d.n_heads = 3; // not a multiple of n_kv_heads
    EXPECT_NE(create_error(kvcm_model_engine_entry, d, KVCM_WEIGHTS_SAFETENSORS, safetensors_for(small_desc(false)),
                           KVC_ERR_INVALID_ARGUMENT)
                  .find("n_q_heads (3) must be a multiple of n_kv_heads (2)"),
              std::string::npos);
    d = small_desc(false);
    d.struct_size = 8;
    EXPECT_NE(create_error(kvcm_model_engine_entry, d, KVCM_WEIGHTS_SAFETENSORS, "", KVC_ERR_INVALID_ARGUMENT).find("struct_size"),
              std::string::npos);
    d = small_desc(false);
    d.rope = 7;
    EXPECT_NE(create_error(kvcm_model_engine_entry, d, KVCM_WEIGHTS_SAFETENSORS, "", KVC_ERR_INVALID_ARGUMENT).find("rope 7"),
              std::string::npos);
    d = small_desc(false);
    d.rms_eps = 0;
    EXPECT_NE(create_error(kvcm_model_engine_entry, d, KVCM_WEIGHTS_SAFETENSORS, "", KVC_ERR_INVALID_ARGUMENT).find("rms_eps"),
              std::string::npos);
}

TEST(ModelInputs, SafetensorsErrorsNameTheTensor) {
    const kvcm_model_desc d = small_desc(false);
    const std::string good = safetensors_for(d);
    EXPECT_NE(create_error(kvcm_model_engine_entry, d, KVCM_WEIGHTS_SAFETENSORS, good.substr(0, 5), KVC_ERR_INVALID_ARGUMENT)
                  .find("shorter than the 8-byte header length"),
              std::string::npos);
    EXPECT_NE(create_error(kvcm_model_engine_entry, d, KVCM_WEIGHTS_SAFETENSORS, good.substr(0, good.size() - 4),
                           KVC_ERR_INVALID_ARGUMENT)
                  .find("lm_head.weight\": data_offsets"),
              std::string::npos)
        << "the last tensor runs past the truncated data";
    std::string garbage = good;
    garbage[8] = '!';
    EXPECT_NE(create_error(kvcm_model_engine_entry, d, KVCM_WEIGHTS_SAFETENSORS, garbage, KVC_ERR_INVALID_ARGUMENT)
                  .find("not a JSON object"),
              std::string::npos);
    std::string huge = good;
    huge[7] = '\x7f';
    EXPECT_NE(create_error(kvcm_model_engine_entry, d, KVCM_WEIGHTS_SAFETENSORS, huge, KVC_ERR_INVALID_ARGUMENT)
                  .find("runs past the end of the file"),
              std::string::npos);
    // weights of another shape: the description says hidden_dim 12, the file has 13
    kvcm_model_desc wider = d;
    wider.hidden_dim = 13;
    EXPECT_NE(create_error(kvcm_model_engine_entry, d, KVCM_WEIGHTS_SAFETENSORS, safetensors_for(wider), KVC_ERR_INVALID_ARGUMENT)
                  .find("\"model.layers.0.mlp.gate_proj.weight\" is [13, 8], the description needs [12, 8]"),
              std::string::npos);
    // tied and separate mixed up, both ways
    EXPECT_NE(create_error(kvcm_model_engine_entry, small_desc(true), KVCM_WEIGHTS_SAFETENSORS, good, KVC_ERR_INVALID_ARGUMENT)
                  .find("\"lm_head.weight\" is not part of this model (the description says the classifier is tied)"),
              std::string::npos);
    EXPECT_NE(create_error(kvcm_model_engine_entry, d, KVCM_WEIGHTS_SAFETENSORS, safetensors_for(small_desc(true)),
                           KVC_ERR_INVALID_ARGUMENT)
                  .find("\"lm_head.weight\" is missing"),
              std::string::npos);
    // the other format is refused by name
    EXPECT_NE(create_error(kvcm_model_engine_entry, d, KVCM_WEIGHTS_FLAT_F32, good, KVC_ERR_UNSUPPORTED).find("safetensors only"),
              std::string::npos);
}

TEST(ModelInputs, FlatCheckpointErrors) {
    const kvcm_model_desc d = small_desc(false);
    const auto cfg = config_of(d);
    const std::string good = write_flat_f32(cfg, draw_weights(cfg, 1), d.max_context);
    EXPECT_NE(create_error(kvcm_model_example_entry, d, KVCM_WEIGHTS_FLAT_F32, good.substr(0, 20),
                           KVC_ERR_INVALID_ARGUMENT)
                  .find("shorter than its 28-byte header"),
              std::string::npos);
    EXPECT_NE(create_error(kvcm_model_example_entry, d, KVCM_WEIGHTS_FLAT_F32, good.substr(0, good.size() - 4),
                           KVC_ERR_INVALID_ARGUMENT)
                  .find("the header's sizes need"),
              std::string::npos);
    EXPECT_NE(create_error(kvcm_model_example_entry, small_desc(true), KVCM_WEIGHTS_FLAT_F32, good,
                           KVC_ERR_INVALID_ARGUMENT)
                  .find("does not match the description"),
              std::string::npos)
        << "a separate classifier (negative vocab_size) given to a tied description";
    std::string bad = good;
    const int32_t minus = -1;
    std::memcpy(&bad[0], &minus, 4);
    EXPECT_NE(create_error(kvcm_model_example_entry, d, KVCM_WEIGHTS_FLAT_F32, bad, KVC_ERR_INVALID_ARGUMENT)
                  .find("header value 0 (-1) is out of range"),
              std::string::npos);
}

TEST(ModelInputs, WeightsFromAFile) {
    const kvcm_model_desc d = small_desc(true);
    const std::string bytes = safetensors_for(d);
    const std::string path = ::testing::TempDir() + "kvcheck_model_inputs.safetensors";
    {
        std::ofstream f(path, std::ios::binary);
        f << bytes;
    }
    const ModelTarget t = ModelTarget::from_entry(kvcm_model_engine_entry);
    Model m(t, d, KVCM_WEIGHTS_SAFETENSORS, "", path);
    EXPECT_EQ(m.forward(0, {1, 2, 3}).size(), 11u);
    std::remove(path.c_str());
    EXPECT_NE(create_error(kvcm_model_engine_entry, d, KVCM_WEIGHTS_SAFETENSORS, "", KVC_ERR_INVALID_ARGUMENT, path)
                  .find("cannot be opened"),
              std::string::npos);
    EXPECT_NE(create_error(kvcm_model_example_entry, small_desc(true), KVCM_WEIGHTS_FLAT_F32, "",
                           KVC_ERR_INVALID_ARGUMENT, path)
                  .find("cannot be opened"),
              std::string::npos);
}

TEST(ModelInputs, SafetensorsRoundTripIsBitExact) {
    for (bool tied : {false, true}) {
        const auto cfg = config_of(small_desc(tied));
        const auto w = draw_weights(cfg, 9);
        const auto back = read_safetensors(write_safetensors(cfg, w), cfg);
        EXPECT_EQ(back.embedding, w.embedding);
        EXPECT_EQ(back.layers[1].w_k, w.layers[1].w_k);
        EXPECT_EQ(back.layers[0].w_down, w.layers[0].w_down);
        EXPECT_EQ(back.layers[0].rms_mlp, w.layers[0].rms_mlp);
        EXPECT_EQ(back.w_unembed, w.w_unembed);
        EXPECT_NE(w.layers[0].rms_attn(0), 1.0) << "norm gains are drawn, not all ones";
        EXPECT_EQ(static_cast<double>(static_cast<float>(w.layers[0].w_q(0, 1))), w.layers[0].w_q(0, 1))
            << "every weight is an f32 value";
    }
}

// The documented layout, checked against hand-placed bytes: header, then the embedding row-major, then rms_att.
TEST(ModelInputs, FlatCheckpointLayout) {
    const auto cfg = config_of(small_desc(false));
    const auto w = draw_weights(cfg, 4);
    const std::string b = write_flat_f32(cfg, w, 16);
    int32_t h[7];
    std::memcpy(h, b.data(), sizeof h);
    EXPECT_EQ(std::vector<int32_t>(h, h + 7), (std::vector<int32_t>{8, 12, 2, 4, 2, -11, 16}));
    float e;
    std::memcpy(&e, b.data() + 28 + 4 * (3 * 8 + 5), 4); // embedding[3][5]
    EXPECT_EQ(e, static_cast<float>(w.embedding(3, 5)));
    std::memcpy(&e, b.data() + 28 + 4 * (11 * 8 + 8 + 2), 4); // rms_att[1][2]
    EXPECT_EQ(e, static_cast<float>(w.layers[1].rms_attn(2)));
    std::memcpy(&e, b.data() + 28 + 4 * (11 * 8 + 2 * 8 + 2 * 8 + 3), 4); // wq[0][out 2][in 3] = W_q(3, 2)
    EXPECT_EQ(e, static_cast<float>(w.layers[0].w_q(3, 2)));
    const size_t floats = 11 * 8 + 2 * 8 + 2 * 64 + 2 * 2 * 4 * 8 + 2 * 64 + 2 * 8 + 3 * 2 * 8 * 12 + 8 + 2 * 16 * 1 + 11 * 8;
    EXPECT_EQ(b.size(), 28 + 4 * floats);
}

TEST(ModelInputs, LoadableModulesExportTheModelEntry) {
    for (const char* so : {KVCHECK_MODEL_ENGINE_SO, KVCHECK_MODEL_EXAMPLE_SO}) {
        EXPECT_TRUE(ModelTarget::library_exports_model_entry(so)) << so;
        const ModelTarget t = ModelTarget::from_library(so);
        EXPECT_FALSE(t.name().empty());
        EXPECT_EQ(run_model_property(t, "MODEL-LOGITS", 7, 3).verdict, Verdict::Pass) << so;
    }
    EXPECT_FALSE(ModelTarget::library_exports_model_entry(KVCHECK_OP_PLUGIN_SO)) << "an operation-level plugin only";
    // our model engine exports both levels from one library; the C example only the model level
    void* both = dlopen(KVCHECK_MODEL_ENGINE_SO, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(both, nullptr);
    EXPECT_NE(dlsym(both, KVC_ENTRY_SYMBOL), nullptr);
    dlclose(both);
    void* model_only = dlopen(KVCHECK_MODEL_EXAMPLE_SO, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(model_only, nullptr);
    EXPECT_EQ(dlsym(model_only, KVC_ENTRY_SYMBOL), nullptr);
    dlclose(model_only);
    try {
        ModelTarget::from_library(KVCHECK_OP_PLUGIN_SO);
        ADD_FAILURE() << "loaded";
    } catch (const TargetError& e) {
        EXPECT_NE(std::string(e.what()).find("does not export kvcheck_model_entry"), std::string::npos) << e.what();
    }
    EXPECT_THROW(ModelTarget::from_library("no/such/library.so"), TargetError);
}

// A table that declares what it lacks is refused at load, naming the member.
kvcm_model_api g_bad;
const kvcm_model_api* bad_entry(uint32_t, uint32_t) { return &g_bad; }

TEST(ModelInputs, TablesThatDeclareWhatTheyLackAreRefused) {
    g_bad = *kvcm_model_example_entry(1, 0);
    g_bad.read_kv = nullptr; // READ_KV still declared
    try {
        ModelTarget::from_entry(bad_entry);
        ADD_FAILURE() << "loaded";
    } catch (const TargetError& e) {
        EXPECT_NE(std::string(e.what()).find("read_kv"), std::string::npos) << e.what();
    }
    g_bad = *kvcm_model_example_entry(1, 0);
    g_bad.abi_major = 2;
    EXPECT_THROW(ModelTarget::from_entry(bad_entry), TargetError);
    g_bad = *kvcm_model_example_entry(1, 0);
    g_bad.forward = nullptr;
    EXPECT_THROW(ModelTarget::from_entry(bad_entry), TargetError);
    EXPECT_EQ(kvcm_model_example_entry(2, 0), nullptr) << "an unknown major version is not served";
}

// A forward outside what is held is refused with a message, and the model stays usable.
TEST(ModelInputs, BadCallsAreErrorsNotCrashes) {
    const kvcm_model_desc d = small_desc(false);
    for (kvcm_entry_fn entry : {kvcm_model_engine_entry, kvcm_model_example_entry}) {
        const ModelTarget t = ModelTarget::from_entry(entry);
        const auto cfg = config_of(d);
        const auto w = draw_weights(cfg, 2);
        const std::string bytes = t.caps().weight_formats & (1u << KVCM_WEIGHTS_SAFETENSORS)
                                      ? write_safetensors(cfg, w)
                                      : write_flat_f32(cfg, w, d.max_context);
        const uint32_t format = t.caps().weight_formats & (1u << KVCM_WEIGHTS_SAFETENSORS) ? KVCM_WEIGHTS_SAFETENSORS
                                                                                          : KVCM_WEIGHTS_FLAT_F32;
        Model m(t, d, format, bytes);
        EXPECT_THROW(m.forward(0, {11}), CallError) << t.name() << ": token outside the vocabulary";
        EXPECT_THROW(m.forward(5, {1}), CallError) << t.name() << ": a sequence id past max_seqs";
        EXPECT_NE(m.try_release(0), KVC_OK) << t.name() << ": release of an empty sequence";
        EXPECT_EQ(m.forward(0, {1, 2}).size() % 11, 0u);
    }
}

} // namespace
