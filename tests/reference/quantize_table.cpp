// Prints the reference fp8 encoder's and decoder's answers as a text table, for quantize_ml_dtypes.py to compare
// with ml_dtypes (an independent implementation of the same formats):
//   decode FORMAT CODE F32BITS        every code of both formats (FORMAT: e4m3fn, e5m2; hex)
//   encode F32BITS E4M3FN E5M2        seeded random floats across the fp8 ranges, both signs, plus ties
#include "kvcheck/reference/quantize.hpp"
#include "kvcheck/reference/splitmix64.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>

namespace {

uint32_t bits_of(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

void print_encode(float x) {
    std::printf("encode %08x %02x %02x\n", bits_of(x), kvc::ref::encode_e4m3fn(x), kvc::ref::encode_e5m2(x));
}

} // namespace

int main() {
    for (int c = 0; c < 256; ++c) {
        const auto code = static_cast<uint8_t>(c);
        std::printf("decode e4m3fn %02x %08x\n", c, bits_of(kvc::ref::decode_e4m3fn(code)));
        std::printf("decode e5m2 %02x %08x\n", c, bits_of(kvc::ref::decode_e5m2(code)));
    }
    // Random sign, exponent in [-26, 17] (below E5M2's smallest subnormal 2^-16 / 2 up to above its max), random
    // 23-bit mantissa; then the same with the mantissa cut to 5 bits, which puts many inputs on exact fp8 ties.
    kvc::SplitMix64 rng{20261129u};
    for (int i = 0; i < 4000; ++i) {
        const uint64_t r = rng.next();
        const uint32_t sign = static_cast<uint32_t>(r >> 63) << 31;
        const int exp = static_cast<int>((r >> 32) % 44) - 26;
        uint32_t mant = static_cast<uint32_t>(r) & 0x7fffffu;
        if (i % 2 == 1) mant &= 0x7c0000u; // 5 leading mantissa bits: midpoints of E4M3FN and E5M2 neighbours
        print_encode(std::ldexp(1.0f + static_cast<float>(mant) / 8388608.0f, exp) * (sign ? -1.0f : 1.0f));
    }
    for (const float x : {0.0f, -0.0f, 448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 65536.0f, 1e30f, -1e30f,
                          INFINITY, -INFINITY, NAN, -NAN, 1e-45f, -1e-45f})
        print_encode(x);
    return 0;
}
