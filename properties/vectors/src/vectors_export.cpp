// kvcheck export: conformance cases written as files. For every case: the inputs of every call (safetensors), and
// apart from them what a correct cache must produce (the long double oracle's outputs, per-row tolerance bounds,
// the rows it must store, the live bytes after every step). Deterministic: same options, same bytes.
#include "kvcheck/vectors/vectors.hpp"

#include "kvcheck/harness/errors.hpp"
#include "kvcheck/harness/input_file.hpp"
#include "kvcheck/harness/report.hpp"
#include "kvcheck/vectors/safetensors.hpp"
#include "kvcheck/vectors/caps.hpp"
#include "kvcheck/vectors/model.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/oracle.hpp"
#include "kvcheck/properties/properties.hpp"
#include "kvcheck/properties/runner.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

namespace kvc::vec {

namespace fs = std::filesystem;

namespace {

int dtype_from_word(const std::string& w) {
    for (uint32_t d = KVC_DTYPE_F32; d <= KVC_DTYPE_Q8_0; ++d)
        if (w == dtype_name(d)) return static_cast<int>(d);
    return -1;
}

// Test hook (tests/cli/test_hostile_files.cpp): KVCHECK_TEST_EXPORT_KILL_BEFORE_MANIFEST=1 makes export SIGKILL
// itself after every data file and before the manifest, the worst moment for a re-export to die.
void maybe_killed_before_manifest() {
    const char* hook = std::getenv("KVCHECK_TEST_EXPORT_KILL_BEFORE_MANIFEST");
    if (hook && std::string(hook) == "1") std::raise(SIGKILL);
}

std::string step_name(size_t i, const char* what) { return "step" + std::to_string(i) + "." + what; }

struct Written {
    nlohmann::json entry;  // the case in manifest.json
    st::File inputs, expected;
    nlohmann::json expected_json;
};

// q8_0_rounding: the declared rounding of q8_0 codes (Pipeline::q8_0_rounding), which decides the expected codes.
Written export_case(const prop::Property& p, const prop::RunSettings& settings, int index, const prop::Case& c,
                    uint32_t q8_0_rounding) {
    prop::CaseConfig cfg = c.cfg;
    cfg.q8_0_rounding = q8_0_rounding;
    const bool quantized = dtype_is_quantized(cfg.cache_dtype);
    const std::string id = prop::case_id(p.id, index);
    const std::string stem = case_stem(id);
    // dv: V rows and output rows have head_dim_v dims where the case sets it (latent attention)
    const uint64_t Hq = cfg.n_q_heads, Hkv = cfg.n_kv_heads, d = cfg.head_dim, dv = cfg.dv();
    const st::DType cdt = cache_st_dtype(cfg.cache_dtype);

    Written w;
    w.inputs.metadata = {{"format", "kvcheck-vectors-inputs"}, {"case", id}};
    w.expected.metadata = {{"format", "kvcheck-vectors-expected"}, {"case", id}};

    prop::CacheModel model(cfg); // the rows each (seq, layer) must hold after each step
    nlohmann::json steps = nlohmann::json::array(), expected_steps = nlohmann::json::array();
    const std::vector<Step> expanded = expand_steps(c);
    for (size_t i = 0; i < expanded.size(); ++i) {
        const Step& step = expanded[i];
        steps.push_back(step_json(step, i, quantized));
        nlohmann::json ej = {{"step", i}};
        if (step.appends()) {
            const AppendInputs in = step_inputs(c, step);
            const uint64_t n = step.n_new;
            st::put_f32(w.inputs.add(step_name(i, "q"), st::DType::F32, {n, Hq, d}), in.q.data(), in.q.size());
            st::put_f32(w.inputs.add(step_name(i, "k"), st::DType::F32, {n, Hkv, d}), in.k.data(), in.k.size());
            st::put_f32(w.inputs.add(step_name(i, "v"), st::DType::F32, {n, Hkv, dv}), in.v.data(), in.v.size());

            // per slice, packed like the inputs: [n][..]
            std::vector<double> oracle, allowed_f32, allowed_c16;
            std::vector<float> v_scale;
            std::vector<uint8_t> k_bits, v_bits, k_scales, v_scales;
            nlohmann::json rows = nlohmann::json::array();
            for (const Slice& sl : step.slices) {
                const float* q = in.q.data() + sl.token_begin * Hq * d;
                const float* k = in.k.data() + sl.token_begin * Hkv * d;
                const float* v = in.v.data() + sl.token_begin * Hkv * dv;
                const StoredRows r = model.store_expected(sl.seq, step.layer, sl.n_new, k, v);
                const prop::CacheModel::Stream& strm = model.stream(sl.seq, step.layer);
                k_bits.insert(k_bits.end(), r.k_bits.begin(), r.k_bits.end());
                v_bits.insert(v_bits.end(), r.v_bits.begin(), r.v_bits.end());
                k_scales.insert(k_scales.end(), r.k_scale_bits.begin(), r.k_scale_bits.end());
                v_scales.insert(v_scales.end(), r.v_scale_bits.begin(), r.v_scale_bits.end());
                rows.push_back(strm.len);
                if (sl.n_new == 0) continue;
                const prop::Expected e = prop::expect_outputs(cfg, q, sl.n_new, strm.k_eff, strm.v_eff, strm.len,
                                                              prop::HeadMap::Repeat, 0, step.layer);
                oracle.insert(oracle.end(), e.oracle.begin(), e.oracle.end());
                v_scale.insert(v_scale.end(), e.v_scale.begin(), e.v_scale.end());
                const RowBounds bounds = row_bounds(cfg, e);
                allowed_f32.insert(allowed_f32.end(), bounds.f32.begin(), bounds.f32.end());
                allowed_c16.insert(allowed_c16.end(), bounds.cache_dtype.begin(), bounds.cache_dtype.end());
            }
            st::put_f64(w.expected.add(step_name(i, "out"), st::DType::F64, {n, Hq, dv}), oracle.data(),
                        oracle.size());
            st::put_f32(w.expected.add(step_name(i, "v_scale"), st::DType::F32, {n, Hq}), v_scale.data(),
                        v_scale.size());
            st::put_f64(w.expected.add(step_name(i, "allowed_f32"), st::DType::F64, {n, Hq}), allowed_f32.data(),
                        allowed_f32.size());
            st::put_f64(w.expected.add(step_name(i, "allowed_cache_dtype"), st::DType::F64, {n, Hq}),
                        allowed_c16.data(), allowed_c16.size());
            w.expected.add(step_name(i, "k"), cdt, {n, Hkv, d}).data = k_bits;
            w.expected.add(step_name(i, "v"), cdt, {n, Hkv, dv}).data = v_bits;
            if (quantized) {
                w.expected.add(scales_name(step_name(i, "k")), scales_st_dtype(cfg), scales_shape(cfg, n)).data =
                    k_scales;
                w.expected.add(scales_name(step_name(i, "v")), scales_st_dtype(cfg), scales_shape(cfg, n)).data =
                    v_scales;
            }
            // an append gives the length of its (seq, layer); a batch one length per slice
            ej["rows"] = step.kind == StepKind::Append ? rows[0] : rows;
        } else if (step.kind == StepKind::Fork) {
            model.fork(step.seq, step.child);
        } else {
            model.release(step.seq);
        }
        ej["live_bytes"] = model.live_bytes();
        expected_steps.push_back(ej);
    }
    nlohmann::json finals = nlohmann::json::array();
    for (uint32_t sq = 0; sq < cfg.max_seqs; ++sq)
        for (uint32_t l = 0; l < cfg.n_layers; ++l)
            if (model.length(sq, l) > 0) {
                const std::string base = "final.s" + std::to_string(sq) + ".l" + std::to_string(l);
                nlohmann::json f = {{"seq", sq}, {"layer", l}, {"rows", model.length(sq, l)}};
                f.update(dump_names_json(base + ".k", base + ".v", quantized));
                finals.push_back(f);
            }

    w.entry = {{"id", id},
               {"property", p.id},
               {"index", index},
               {"seed", prop::case_seed(settings.seed, p.id, index)},
               {"file", stem},
               {"inputs", "inputs/" + stem + ".safetensors"},
               {"expected", "expected/" + stem + ".safetensors"},
               {"expected_json", "expected/" + stem + ".json"},
               {"requires", required_words(c)},
               {"config", config_json(cfg)},
               {"steps", steps},
               {"final_dumps", finals},
               {"case", prop::to_json(c)},
               {"case_text", prop::describe(c)}};
    w.expected_json = {{"kvcheck_vectors_expected", kVectorsFormat}, {"id", id}, {"steps", expected_steps},
                       {"final_dumps", finals}};
    if (quantized) { // what the expected codes and scales were made with, beside them
        w.expected_json["quantization"] = quant_config_json(cfg);
        w.expected_json["quantization"]["q8_0_rounding"] = prop::q8_0_rounding_name(q8_0_rounding);
    }
    return w;
}

} // namespace

int run_export(const ExportOptions& o, std::ostream& out, std::ostream& err) {
    using harness::kExitBadInput;
    // Up to 200 indices are drawn per case wanted, counted in an int: a bound here keeps that product exact
    // (--cases 2147483647 overflowed it and wrote nothing, exit 0) and a typo from filling the disk.
    if (o.cases < 1 || o.cases > kMaxExportCases) {
        err << "kvcheck export: --cases " << o.cases << ": must be from 1 to " << kMaxExportCases << "\n";
        return kExitBadInput;
    }
    std::vector<const prop::Property*> props;
    for (const std::string& id : o.properties) {
        const prop::Property* p = prop::find_property(id);
        if (!p) {
            err << "kvcheck export: unknown property \"" << id << "\" (kvcheck list shows them)\n";
            return kExitBadInput;
        }
        if (!offline_property(id).ok) {
            err << "kvcheck export: property " << id
                << " cannot be graded from files (it watches the allocator and reruns the case); offline "
                   "properties:";
            for (const std::string& x : offline_property_ids()) err << " " << x;
            err << "\n";
            return kExitBadInput;
        }
        if (std::find(props.begin(), props.end(), p) == props.end()) props.push_back(p);
    }
    std::set<uint32_t> dtypes;
    for (const std::string& w : o.dtypes) {
        const int dt = dtype_from_word(w);
        if (dt < 0) {
            err << "kvcheck export: unknown dtype \"" << w
                << "\" (f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8_token, q8_0)\n";
            return kExitBadInput;
        }
        dtypes.insert(static_cast<uint32_t>(dt));
    }
    if (props.empty() || dtypes.empty()) {
        err << "kvcheck export: nothing to export (empty --properties or --dtypes)\n";
        return kExitBadInput;
    }

    // The implementation's declaration: cases outside it are listed as not supported instead of exported.
    Declared declared;
    const bool have_caps = !o.caps.empty();
    if (have_caps) {
        try {
            declared = declared_from_json(harness::read_json_file(o.caps), false);
        } catch (const harness::InputError& e) { // missing, not a regular file, too large, not JSON, a key twice
            err << "kvcheck export: " << harness::printable(e.what(), true) << " (--caps)\n";
            return kExitBadInput;
        } catch (const std::invalid_argument& e) {
            err << "kvcheck export: " << o.caps << ": " << harness::printable(e.what(), true) << "\n";
            return kExitBadInput;
        }
    }

    // Without --caps, cases are drawn as for an implementation that declares everything (prop::full_caps, 16-bit
    // dtypes only); a quantized dtype asked for is added to that declaration with every scale form, so that its
    // cases are drawn at all (an export of 16-bit dtypes alone draws what it always drew).
    kvc_caps draw_caps = prop::full_caps();
    const kvc_caps* draw_limits = have_caps ? &declared.caps : nullptr;
    if (!have_caps)
        for (uint32_t d : dtypes)
            if (dtype_is_quantized(d)) {
                draw_caps.dtypes |= 1u << d;
                draw_caps.quant = KVC_QUANT_FP8_SCALE_TENSOR | KVC_QUANT_FP8_SCALE_KV_HEAD | KVC_QUANT_INT8_SCALE_F16;
                draw_limits = &draw_caps;
            }
    const uint32_t q8_0_rounding = have_caps ? declared.pipeline.q8_0_rounding : 0u;

    const fs::path dir(o.out);
    std::error_code ec;
    for (const fs::path& sub : {dir, dir / "inputs", dir / "expected"}) {
        fs::create_directories(sub, ec);
        if (ec || !fs::is_directory(sub)) {
            err << "kvcheck export: " << sub.string() << ": cannot create the directory"
                << (ec ? " (" + ec.message() + ")" : std::string()) << "\n";
            return kExitBadInput;
        }
    }

    // The manifest is the commit mark of an export: the old one goes before the first data file is replaced and
    // the new one is written last, so an export killed midway leaves a directory without manifest (grade refuses
    // it: exit 2) instead of an old manifest over new files. grade opens only files the manifest names.
    const fs::path manifest_path = dir / "manifest.json";
    if (::unlink(manifest_path.c_str()) != 0 && errno != ENOENT) {
        err << "kvcheck export: " << manifest_path.string() << ": cannot remove the previous manifest ("
            << std::strerror(errno) << ")\n";
        return kExitBadInput;
    }

    prop::RunSettings settings;
    settings.seed = o.seed;
    settings.cases = o.cases;
    nlohmann::json cases = nlohmann::json::array(), not_supported = nlohmann::json::array();
    std::vector<std::string> used_props, used_dtypes;
    for (uint32_t d : dtypes) used_dtypes.emplace_back(dtype_name(d));
    size_t n_files = 0;
    const auto refuse = [&](const prop::Property& p, int index, const std::vector<std::string>& needs) {
        not_supported.push_back({{"id", prop::case_id(p.id, index)},
                                 {"property", p.id},
                                 {"index", index},
                                 {"seed", prop::case_seed(settings.seed, p.id, index)},
                                 {"needs", needs}});
    };
    try {
        for (const prop::Property* p : props) {
            used_props.push_back(p->id);
            // A property about a feature the implementation lacks: every case is not supported, as in validate.
            if (have_caps && p->feature && !(declared.caps.features & p->feature)) {
                kvc_caps need{};
                need.features = p->feature;
                const std::vector<std::string> needs = prop::missing_caps(need, declared.caps);
                for (int index = 0; index < o.cases; ++index) refuse(*p, index, needs);
                continue;
            }
            // Case `index` is exactly `kvcheck validate`'s case `index` for the same seed, --cases and limits (drawn
            // inside the declared sizes and head_dim multiples); cases of a dtype not asked for are skipped and
            // cases outside the declaration listed as not supported, so the indices may have gaps.
            int accepted = 0;
            const int limit = o.cases * 200;
            for (int index = 0; accepted < o.cases && index < limit; ++index) {
                const prop::Case c = prop::generate_case(*p, settings, index, draw_limits);
                if (!dtypes.count(c.cfg.cache_dtype)) continue;
                if (have_caps) {
                    const std::vector<std::string> needs = unsupported(c, declared.caps);
                    if (!needs.empty()) {
                        refuse(*p, index, needs);
                        continue;
                    }
                }
                ++accepted;
                const Written w = export_case(*p, settings, index, c, q8_0_rounding);
                // flushed once, with the whole directory, before the manifest (one sync instead of two a file)
                st::write_file((dir / w.entry["inputs"].get<std::string>()).string(), w.inputs, false);
                st::write_file((dir / w.entry["expected"].get<std::string>()).string(), w.expected, false);
                st::write_bytes_atomically((dir / w.entry["expected_json"].get<std::string>()).string(),
                                           w.expected_json.dump(1) + "\n", false);
                n_files += 3;
                cases.push_back(w.entry);
            }
            if (accepted < o.cases)
                err << "kvcheck export: warning: only " << accepted << " cases of " << p->id
                    << " with the requested dtypes" << (have_caps ? " inside the declared capabilities" : "")
                    << " among the first " << limit << " indices\n";
        }
        nlohmann::json manifest = {
            {"kvcheck_vectors", kVectorsFormat},
            {"kvcheck_version", KVCHECK_VERSION},
            {"seed", o.seed},
            {"cases_per_property", o.cases},
            {"properties", used_props},
            {"dtypes", used_dtypes},
            {"results_format", kResultsFormat},
            {"about", "kvcheck conformance vectors; docs/vectors.md describes every file and the results to write "
                      "back for `kvcheck grade`"}};
        if (have_caps) manifest["declared"] = declared_to_json(declared);
        manifest["not_supported"] = not_supported;
        manifest["cases"] = cases;
        if (std::string why; !harness::flush_filesystem(dir.string(), why)) throw std::runtime_error(why);
        maybe_killed_before_manifest();
        st::write_bytes_atomically(manifest_path.string(), manifest.dump(1) + "\n");
    } catch (const std::runtime_error& e) { // a file could not be written
        err << "kvcheck export: " << harness::printable(e.what(), true) << "\n";
        return kExitBadInput;
    }
    out << "kvcheck export: " << cases.size() << " cases (" << n_files + 1 << " files) written to " << dir.string();
    if (!not_supported.empty()) out << "; " << not_supported.size() << " outside the declared capabilities";
    out << "\n";
    return harness::kExitOk;
}

} // namespace kvc::vec
