// The x86 kernels' walk along a split's rows (part of attention_kernel_x86.hpp, compiled once per instruction set):
// the software prefetcher that runs ahead of the kernel along the block table, and why it runs as it does.
#pragma once

#ifndef KVC_KERNEL_TARGET
#error "include attention_kernel_x86.hpp, which defines the target, not attention_kernel_x86_walk.hpp on its own"
#endif

#include "attention_kernel.hpp"
#include "simd.hpp"

#include "kvcheck/optimized/kv_layout.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace kvc::opt {
namespace {

// The walk (WalkPlan; docs/performance.md, "How the kernel walks the cache"; the measurements behind each choice are
// in docs/log/attention-kernel-notes.md):
//  - Prefetches run 16 rows per head ahead, into L2 (prefetcht1): MHA on one Zen 4 thread reads 18.9 GB/s so, 11.8
//    with the same rows fetched into L1 (prefetcht0). A prefetch into L1 holds one of the core's few L1 miss buffers
//    for a whole DRAM round trip, so a deep L1 prefetch throttles itself; into L2 the requests queue where there are
//    many more, and the demand load finds its line one short hop away. A second, near step into L1 (2 or 4 rows
//    ahead) is slower: its own address walk costs more than the hop it saves.
//  - Tiles of 1-3 rows (MHA decode) visit each head for at most visit_keys keys (16), then move to the next head of
//    the call: a head's prefetcher then runs a whole round of heads ahead of its use, as it does at 16-token
//    blocks, instead of 16 rows (256-token blocks, MHA, one Zen 4 thread: 23.5 GB/s, against 19.1 for whole runs
//    and 19.8 for visits of 32 keys). Intel cores visit 4 keys at a time (machine_walk): there, every step from
//    memory, visits of 4 take 0.84-0.91 of the time of visits of 16, though in cache they cost 18 % (each visit's V
//    accumulators are loaded and stored 4x as often).
//    Tiles of 4+ rows keep whole runs: there the compute per byte is 8x larger, and shorter visits cost 5 %
//    (more 1-key tails of the 4 x 3 score blocks). AMD cores without AVX-512 (Zen 2, Zen 3) keep whole runs for every
//    tile: there whole runs take 0.85-0.88 of the visits' time at 256-token blocks (machine_walk,
//    attention_kernel_avx2.cpp).
//  - Pages primed (WalkPlan::prime_kib, on for Intel cores and Zen 4): the fetch alone keeps one core at 10-11 GB/s
//    on this walk through 4 KiB pieces, a limit of the requests one core holds open, where the hardware streams a
//    contiguous read at 16-19. Touching the first two lines of each page far ahead starts the core's stream
//    prefetcher on that page, which fetches the rest beside the software's requests. Same bits: only prefetches are
//    added.
constexpr WalkPlan kDefaultWalk{};


// The attributes of a lambda the kernel's loops call (a key body, a span step): the kernel's target (a lambda does not
// inherit its enclosing function's) and inlined.
#define KVC_KEY_BODY KVC_KERNEL_TARGET __attribute__((always_inline))

// Where one walk along a split's rows stands: the span holding its next virtual row.
struct SpanCursor {
    uint32_t v = 0;        // the next virtual row
    uint32_t span_v0 = 0;  // the span holding row v: its first virtual row,
    uint32_t span_end = 0; // the virtual row after its last (v == span_end: row v starts the next span)
    uint64_t block = 0;    // its block (an index into the block table)
    uintptr_t base = 0;    // the address of row span_v0
};

// The rows one split reads, in the order it reads them: its K rows, its V rows, then the first K rows of the next
// split (the caller's next call). upto(u) prefetches every row before virtual index u + ahead. Block runs end every B
// rows and the next block can be anywhere in the pool, so the hardware prefetcher cannot see ahead; this can.
// It walks spans, not rows: inside one block a head's rows of one plane are contiguous, so a span (a block run of one
// part) is one address computed once and a line pointer stepped 64 bytes at a time; each line is fetched once. (Row
// by row, with the address recomputed per row, the walk takes 8-10 % of a GQA decode's time in cache: measured.)
struct RowPrefetcher {
    // K rows' geometry, followed for the V rows too. Where V rows have a geometry of their own (multi-head latent
    // attention: narrower rows), the V part's prefetches then land near, not on, its rows; choosing the geometry
    // per span instead made every GQA decode 5-10 % slower (8:1, f16, d = 128, Zen 4, from memory and in cache),
    // though it only moves prefetches. Never read through: the kernels read with SplitArgs' layouts.
    const kvc_kv_layout* l = nullptr;
    const uint32_t* table = nullptr;
    uint32_t head = 0;
    uint64_t k0 = 0;     // the split's first key
    uint32_t n = 0;      // keys this split reads
    uint32_t n_next = 0; // keys of the next split worth fetching (0 when there is none)
    uint32_t ahead = kDefaultWalk.prefetch_rows; // rows fetched ahead of the row in use
    bool to_l2 = kDefaultWalk.prefetch_to_l2;
    bool spread = kDefaultWalk.spread_prefetch; // WalkPlan::spread_prefetch (the AVX-512 group path's V passes)
    uint32_t prime = 0;      // rows ahead of the row in use whose pages are primed (WalkPlan::prime_kib); 0: none
    uint32_t prime_next = 0; // keys of the next split the primer reaches (0 when there is none)
    SpanCursor near{};       // the fetch: every line before row near.v is fetched,
    uintptr_t line = 0;      // and the next line of its span is this one
    SpanCursor far{};        // the primer: every page before row far.v is primed,
    uintptr_t page = 0;      // and the next address of its span to prime is this one
    uint32_t skip = 0;       // keys at the start of the split that it does not read (before a window): never fetched

    // The split reads its keys from `first` on (SplitView::walk_from): both walks start there, in K and in V.
    KVC_KERNEL_TARGET inline __attribute__((always_inline)) void skip_to(uint32_t first) {
        skip = first;
        near.v = near.span_end = far.v = far.span_end = first;
    }

    // Every method is forced inline: a call from a kernel loop clobbers every vector register, so the caller's
    // accumulators would go to the stack around it (out of line, the calls take 12 % of an MHA decode in cache on
    // Zen 3).

    // row c.v starts a span: where it lives, and how many rows of its part follow it in the same block (`next`: the
    // rows of the next split this walk goes on into)
    KVC_KERNEL_TARGET inline __attribute__((always_inline)) void next_span(SpanCursor& c, uint32_t next) const {
        uint32_t part = 0, part_end = n, plane = KVC_PLANE_K, from = skip; // from: the part's rows not read
        uint64_t first = k0; // the part's first position
        if (c.v >= n + n) {
            part = n + n;
            part_end = n + n + next;
            first = k0 + kSplitKeys;
            from = 0;
        } else if (c.v >= n) {
            part = n;
            part_end = n + n;
            plane = KVC_PLANE_V;
        }
        if (c.v < part + from) c.v = part + from; // the V part starts where the K part did
        uint32_t slot = 0;
        if (c.v == part + from) { // a part starts: one division
            const uint64_t pos = first + from;
            c.block = pos / l->block_size;
            slot = static_cast<uint32_t>(pos - c.block * l->block_size);
        } else { // the part goes on at the start of the next block
            ++c.block;
        }
        c.span_v0 = c.v;
        c.span_end = std::min(part_end, c.v + (l->block_size - slot));
        c.base = reinterpret_cast<uintptr_t>(l->block_base[table[c.block]] +
                                             kvc_kv_block_offset(l, slot, plane, head, 0));
    }

    // Moves cursor c on to row `target` span by span (`next`: as in next_span), with `at` set to the first line of
    // each span it enters; step(stop, end) for each stretch, end the address after row stop - 1.
    template <class Step>
    KVC_KERNEL_TARGET inline __attribute__((always_inline)) void walk_to(SpanCursor& c, uintptr_t& at, uint32_t next,
                                                                        uint32_t target, Step step) const {
        while (c.v < target) {
            if (c.v == c.span_end) {
                next_span(c, next);
                at = c.base & ~uintptr_t(63);
                if (c.v >= target) break; // it stepped over rows the split does not read
            }
            const uint32_t stop = std::min(target, c.span_end);
            step(stop, c.base + uintptr_t(stop - c.span_v0) * l->row_bytes);
            c.v = stop;
        }
    }

    template <_mm_hint Hint>
    KVC_KERNEL_TARGET inline __attribute__((always_inline)) void fetch_upto(uint32_t target) {
        walk_to(near, line, n_next, target, [&](uint32_t stop, uintptr_t end) KVC_KEY_BODY {
            // the fetch enters a new page: the primer moves on. Per page, not per call: in cache the primer is pure
            // overhead, and run on every call it takes 5 % of an MHA decode there (Intel model 167).
            if (prime != 0 && ((end - 1) ^ (line - 1)) >> 12 != 0)
                prime_upto(std::min(stop + prime, 2 * n + prime_next));
            for (; line < end; line += 64) _mm_prefetch(reinterpret_cast<const char*>(line), Hint);
        });
    }

    // The primer: the first two lines of every 4 KiB page the walk will enter, far ahead of the fetch. Two ascending
    // misses in a page start the core's own stream prefetcher there, which then brings the page's other lines in
    // without holding the requests the software fetch is limited by (WalkPlan::prime_kib).
    KVC_KERNEL_TARGET inline __attribute__((always_inline)) void prime_upto(uint32_t target) {
        walk_to(far, page, prime_next, target, [&](uint32_t, uintptr_t end) KVC_KEY_BODY {
            for (; page < end; page = (page | 4095) + 1) {
                _mm_prefetch(reinterpret_cast<const char*>(page), _MM_HINT_T1);
                _mm_prefetch(reinterpret_cast<const char*>(page + 64), _MM_HINT_T1);
            }
        });
    }

    // prefetches every row before virtual index `used + ahead` (used: the row about to be read, plus one; the V loops
    // pass the end of their group of kTrickleRows keys, so there the lead is ahead to ahead + 3 rows); the primer
    // follows the fetch `prime` rows further on
    KVC_KERNEL_TARGET inline __attribute__((always_inline)) void upto(uint32_t used) {
        const uint32_t target = std::min(used + ahead, 2 * n + n_next);
        if (target <= near.v) return;
        if (to_l2) fetch_upto<_MM_HINT_T1>(target);
        else fetch_upto<_MM_HINT_T0>(target);
    }
};

} // namespace
} // namespace kvc::opt
