// The safetensors reader and writer of tools/kvcheck on crafted bytes: what it writes it reads back, and every
// malformed file is refused with the file's name and the problem in the message.
#include "kvcheck/vectors/safetensors.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

using kvc::st::DType;
using kvc::st::File;
using kvc::st::FormatError;

// A file from a header given as JSON text and a data buffer of `data_bytes` bytes (the header is used verbatim).
std::vector<uint8_t> craft(const std::string& header, size_t data_bytes, uint64_t declared_len = UINT64_MAX) {
    const uint64_t len = declared_len == UINT64_MAX ? header.size() : declared_len;
    std::vector<uint8_t> b(8);
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(len >> (8 * i));
    b.insert(b.end(), header.begin(), header.end());
    b.resize(b.size() + data_bytes, 0xAB);
    return b;
}

// The problem the reader reports for these bytes, or "" when it accepts them.
std::string problem(const std::vector<uint8_t>& bytes, const std::string& name = "crafted.safetensors") {
    try {
        kvc::st::parse(bytes.data(), bytes.size(), name);
        return "";
    } catch (const FormatError& e) {
        EXPECT_EQ(std::string(e.what()).rfind(name + ": ", 0), 0u) << "the message names the file: " << e.what();
        EXPECT_EQ(e.file(), name);
        return e.problem();
    }
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

File sample() {
    File f;
    f.metadata = {{"case", "EQUIV/0"}, {"format", "test"}};
    const float q[6] = {1.f, -2.f, 0.5f, 3.25f, -0.f, 7.f};
    kvc::st::put_f32(f.add("step0.q", DType::F32, {1, 2, 3}), q, 6);
    kvc::st::Tensor& h = f.add("step0.k", DType::F16, {2, 1});
    h.data = {0x00, 0x3c, 0x00, 0xc0}; // 1.0, -2.0
    f.add("empty", DType::BF16, {0, 4, 2});
    const double o[1] = {0.1};
    kvc::st::put_f64(f.add("scalar", DType::F64, {}), o, 1);
    return f;
}

TEST(Safetensors, WrittenFileReadsBackTheSame) {
    const File f = sample();
    const std::vector<uint8_t> bytes = kvc::st::serialize(f);
    uint64_t len = 0;
    std::memcpy(&len, bytes.data(), 8);
    EXPECT_EQ(len % 8, 0u) << "the data starts 8-byte aligned";
    const File g = kvc::st::parse(bytes.data(), bytes.size(), "x");
    EXPECT_EQ(g.metadata, f.metadata);
    ASSERT_EQ(g.tensors.size(), f.tensors.size());
    for (const auto& [name, t] : f.tensors) {
        const kvc::st::Tensor* u = g.find(name);
        ASSERT_NE(u, nullptr) << name;
        EXPECT_EQ(u->dtype, t.dtype) << name;
        EXPECT_EQ(u->shape, t.shape) << name;
        EXPECT_EQ(u->data, t.data) << name;
    }
    EXPECT_EQ(kvc::st::to_f32(*g.find("step0.q"))[3], 3.25f);
    EXPECT_EQ(kvc::st::serialize(g).size(), bytes.size());
}

TEST(Safetensors, SameFileSameBytes) { EXPECT_EQ(kvc::st::serialize(sample()), kvc::st::serialize(sample())); }

// A quantized cache's dumps: fp8 codes in their own dtypes, int8 codes as I8, scales as F32 or F16; each one byte
// per code, and a byte span that is not the element count times that size is refused, naming the dtype.
TEST(Safetensors, QuantizedCodeAndScaleDtypes) {
    File f;
    f.add("step0.k", DType::F8_E4M3, {1, 2, 4}).data = {0x38, 0x7e, 0xb8, 0x80, 0x00, 0x01, 0x3a, 0xfe};
    f.add("step0.v", DType::F8_E5M2, {1, 2, 4}).data = {0x3c, 0x7b, 0xbc, 0x80, 0x00, 0x01, 0x3d, 0xfb};
    f.add("step1.k", DType::I8, {1, 1, 4}).data = {0x81, 0xff, 0x00, 0x7f};
    f.add("step1.k.scales", DType::F16, {1, 1, 2}).data = {0x00, 0x3c, 0x00, 0x20};
    const std::vector<uint8_t> bytes = kvc::st::serialize(f);
    const File g = kvc::st::parse(bytes.data(), bytes.size(), "q.safetensors");
    for (const auto& [name, t] : f.tensors) {
        const kvc::st::Tensor* u = g.find(name);
        ASSERT_NE(u, nullptr) << name;
        EXPECT_EQ(u->dtype, t.dtype) << name;
        EXPECT_EQ(u->data, t.data) << name;
    }
    for (const char* dt : {"F8_E4M3", "F8_E5M2", "I8"}) {
        EXPECT_EQ(kvc::st::dtype_size(*kvc::st::dtype_from_name(dt)), 1u) << dt;
        const std::string h = std::string(R"({"c":{"dtype":")") + dt + R"(","shape":[2,4],"data_offsets":[0,16]}})";
        EXPECT_TRUE(contains(problem(craft(h, 16)), std::string("dtype ") + dt)) << problem(craft(h, 16));
    }
    EXPECT_FALSE(kvc::st::dtype_from_name("F8_E4M3FN").has_value()); // the safetensors name has no FN
}

TEST(Safetensors, AcceptsAMinimalFile) {
    EXPECT_EQ(problem(craft("{}", 0)), "");
    EXPECT_EQ(problem(craft(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}   )", 3)), "");
}

TEST(Safetensors, TruncatedHeaderLength) {
    EXPECT_TRUE(contains(problem({1, 0, 0}), "truncated")) << problem({1, 0, 0});
    EXPECT_TRUE(contains(problem({}), "truncated"));
}

TEST(Safetensors, HeaderLengthLargerThanTheFile) {
    const auto b = craft("{}", 0, 4096);
    EXPECT_TRUE(contains(problem(b), "larger than the file")) << problem(b);
}

TEST(Safetensors, HeaderLengthOverTheLimit) {
    const auto b = craft("{}", 0, kvc::st::kMaxHeaderBytes + 1);
    EXPECT_TRUE(contains(problem(b), "exceeds the limit")) << problem(b);
    const auto huge = craft("{}", 0, UINT64_MAX - 1);
    EXPECT_TRUE(contains(problem(huge), "exceeds the limit")) << problem(huge);
}

TEST(Safetensors, HeaderNotJson) {
    EXPECT_TRUE(contains(problem(craft("{\"a\": ", 0)), "not valid JSON"));
    EXPECT_TRUE(contains(problem(craft("[1, 2]", 0)), "does not start with a JSON object"));
    EXPECT_TRUE(contains(problem(craft("{} trailing", 0)), "not valid JSON"));
}

TEST(Safetensors, UnknownDtype) {
    const auto b = craft(R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4);
    EXPECT_TRUE(contains(problem(b), "unknown dtype \"F33\"")) << problem(b);
}

TEST(Safetensors, MissingOrMistypedFields) {
    EXPECT_TRUE(contains(problem(craft(R"({"a":{"dtype":"F32","shape":[1]}})", 4)), "has no \"data_offsets\""));
    EXPECT_TRUE(contains(problem(craft(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4)), "has no \"shape\""));
    EXPECT_TRUE(contains(problem(craft(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)),
                         "not a non-negative integer"));
    EXPECT_TRUE(contains(problem(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4)),
                         "two integers"));
    EXPECT_TRUE(contains(problem(craft(R"({"a":[1]})", 0)), "is not an object"));
    EXPECT_TRUE(contains(problem(craft(R"({"__metadata__":{"k":1}})", 0)), "is not a string"));
}

TEST(Safetensors, OffsetsOutOfRange) {
    const auto b = craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8);
    EXPECT_TRUE(contains(problem(b), "out of range")) << problem(b);
    const auto backwards = craft(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", 8);
    EXPECT_TRUE(contains(problem(backwards), "end before they begin")) << problem(backwards);
}

TEST(Safetensors, OverlappingTensors) {
    const auto b = craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         12);
    EXPECT_TRUE(contains(problem(b), "overlap")) << problem(b);
}

TEST(Safetensors, GapsAndUncoveredBytes) {
    const auto gap = craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
    EXPECT_TRUE(contains(problem(gap), "belong to no tensor")) << problem(gap);
    const auto trailing = craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8);
    EXPECT_TRUE(contains(problem(trailing), "cover 4 bytes but the data buffer holds 8")) << problem(trailing);
}

TEST(Safetensors, ByteSizeMustBeElementsTimesDtypeSize) {
    const auto b = craft(R"({"a":{"dtype":"F16","shape":[2,3],"data_offsets":[0,24]}})", 24);
    EXPECT_TRUE(contains(problem(b), "needs 12 bytes")) << problem(b);
    const auto overflow =
        craft(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8);
    EXPECT_TRUE(contains(problem(overflow), "more than 2^64")) << problem(overflow);
}

TEST(Safetensors, FilesOnDisk) {
    const std::string dir = ::testing::TempDir();
    const std::string path = dir + "/kvcheck_st_roundtrip.safetensors";
    kvc::st::write_file(path, sample());
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/.kvcheck_st_roundtrip.safetensors.kvcheck-tmp")); // report.hpp's name
    const File g = kvc::st::read_file(path);
    EXPECT_EQ(g.tensors.size(), 4u);
    std::filesystem::remove(path);
    try {
        kvc::st::read_file(path);
        FAIL() << "a missing file was read";
    } catch (const FormatError& e) {
        EXPECT_TRUE(contains(e.what(), path)) << e.what();
        EXPECT_TRUE(contains(e.what(), "cannot be opened")) << e.what();
    }
}

} // namespace
