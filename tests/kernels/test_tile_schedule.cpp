// The Hopper forward's tile schedules (src/cuda/sm90/fwd/scheduler.cuh), on the CPU, with the
// scheduler's own functions compiled for the host: the host's sched_mode, grid_size, set_schedule
// and set_stream_k, and the kernel's TileScheduler<kCausal>::first / next / valid / coord and
// StreamKTail::of / first / end / item, given the grid and the CTA that the kernel reads from
// gridDim and blockIdx. For many (query blocks M, heads·batch, CTAs):
//   - every real tile is visited exactly once, and its head and batch are in range;
//   - virtual tiles (m_block = M) occur only in kPaired with an odd heads·batch, exactly when
//     set_schedule's every_tile_has_keys says so;
//   - the chain (first, next) equals the per-round closed forms where those exist (kStrided,
//     kOnePerCta, kSnake, kPaired: a second derivation, written here);
//   - the paired causal schedules give every CTA nearly the same number of key blocks (within one
//     pair's cost, M + 1), and on the FlashAttention grid the paired schedule with a snake tail
//     balances at least as well as pure pairs;
//   - FastDiv (args.hpp) divides exactly for 0 <= n < 2^31 (the edges of many divisors; the host's
//     umulhi is its definition, the device takes __umulhi);
//   - the non-causal stream-K tail: every (tile, key block) once; a tile cut at most once, between
//     CTAs c and c + 1, c's low part its last item and c + 1's high part its first tail item, both
//     in split slot c + 1 (1 <= slot < G), the parts meeting; every CTA's load within one key block
//     of every other's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/sm90/args.hpp"
#include "cuda/sm90/fwd/scheduler.cuh"
#include "cuda/sm90/tile_size.hpp"

namespace {
namespace sm90 = flashattn::cuda::sm90;
constexpr int kSms = 132;  // H200

const char* mode_name(int mode) {
  switch (mode) {
    case sm90::kStrided: return "strided";
    case sm90::kOnePerCta: return "one-per-CTA";
    case sm90::kSnake: return "snake";
    case sm90::kPaired: return "paired";
    case sm90::kPairedTail: return "paired+tail";
  }
  return "?";
}

// heads·batch = hb, split into heads × batch where hb allows (coord's batch division is exercised).
sm90::FwdArgs schedule_args(int mode, bool causal, int m_blocks, int hb, int g) {
  sm90::FwdArgs a{};
  a.m_blocks = m_blocks;
  a.heads = hb % 4 == 0 ? 4 : hb % 3 == 0 ? 3 : hb;
  a.batch = hb / a.heads;
  a.sched = mode;
  a.block_m = 128;
  a.seqlen_q = a.seqlen_k = m_blocks * 128;  // square tiles: no block without keys
  a.window_left = -1;
  a.window_right = causal ? 0 : -1;
  sm90::set_schedule(a, causal, hb, g);
  return a;
}

// CTA c's tile indices in the order the kernel's loops visit them (first, next), or a failure when
// the chain does not end within sched_total + 1 steps.
template <bool kCausal>
bool chain(const sm90::FwdArgs& a, int g, int c, std::vector<int>* out) {
  using S = sm90::TileScheduler<kCausal>;
  out->clear();
  for (int idx = S::first(a, g, c); S::valid(a, idx); idx = S::next(a, idx, g, c)) {
    if (int(out->size()) > a.sched_total || idx < 0) return false;
    out->push_back(idx);
  }
  return true;
}

// The same chain by the closed forms per round k: kPaired 2·(⌊k/2⌋·G + c) + (k mod 2) (heavy, then
// light tile of pair ⌊k/2⌋·G + c); kSnake k·G + (c, or G − 1 − c in odd rounds); else k·G + c.
std::vector<int> by_round(const sm90::FwdArgs& a, int mode, bool causal, int g, int c) {
  std::vector<int> out;
  for (int k = 0;; ++k) {
    const int idx = causal && mode == sm90::kPaired ? 2 * ((k >> 1) * g + c) + (k & 1)
                                                    : k * g + (causal && mode == sm90::kSnake && (k & 1) ? g - 1 - c : c);
    if (idx >= a.sched_total) return out;
    out.push_back(idx);
  }
}

template <bool kCausal>
sm90::TileCoord coord(const sm90::FwdArgs& a, int idx) {
  return sm90::TileScheduler<kCausal>::coord(a, idx);
}

struct ScheduleResult {
  bool ok = true;
  std::vector<long long> loads;  // key blocks per CTA (square tiles: m + 1 causal, M otherwise)
};

template <bool kCausal>
ScheduleResult check_schedule(int mode, int m_blocks, int hb, int g) {
  ScheduleResult res;
  const sm90::FwdArgs a = schedule_args(mode, kCausal, m_blocks, hb, g);
  std::ostringstream tag;
  tag << (kCausal ? "causal " : "non-causal ") << mode_name(mode) << " M=" << m_blocks << " heads·batch=" << hb
      << " G=" << g;
  std::vector<int> seen(size_t(m_blocks) * hb, 0);
  bool virtual_tiles = false;
  std::vector<int> idx;
  for (int c = 0; c < g; ++c) {
    if (!chain<kCausal>(a, g, c, &idx)) {
      ADD_FAILURE() << tag.str() << ": CTA " << c << "'s chain does not end";
      res.ok = false;
      return res;
    }
    if (mode != sm90::kPairedTail && idx != by_round(a, mode, kCausal, g, c)) {
      ADD_FAILURE() << tag.str() << ": CTA " << c << "'s chain differs from the per-round closed form";
      res.ok = false;
    }
    long long load = 0;
    for (int i : idx) {
      const sm90::TileCoord tc = coord<kCausal>(a, i);
      if (tc.m_block >= m_blocks) {  // virtual: kPaired only, past the last head (odd heads·batch)
        if (!(kCausal && mode == sm90::kPaired && tc.m_block == m_blocks && hb % 2)) {
          ADD_FAILURE() << tag.str() << ": virtual tile m_block=" << tc.m_block << " at index " << i;
          res.ok = false;
        }
        virtual_tiles = true;
        continue;
      }
      if (tc.m_block < 0 || tc.head < 0 || tc.head >= a.heads || tc.batch < 0 || tc.batch >= a.batch) {
        ADD_FAILURE() << tag.str() << ": index " << i << " gives (m " << tc.m_block << ", head " << tc.head
                      << ", batch " << tc.batch << ")";
        res.ok = false;
        return res;
      }
      ++seen[size_t(tc.batch * a.heads + tc.head) * m_blocks + tc.m_block];
      load += kCausal ? tc.m_block + 1 : m_blocks;
    }
    res.loads.push_back(load);
  }
  // set_schedule's every_tile_has_keys (its virtual-tile half): the kernel trusts it to take the
  // chain's last tile as its last with keys.
  if (virtual_tiles == bool(a.every_tile_has_keys)) {
    ADD_FAILURE() << tag.str() << ": virtual tiles " << (virtual_tiles ? "occur" : "do not occur")
                  << " but every_tile_has_keys = " << a.every_tile_has_keys;
    res.ok = false;
  }
  for (size_t t = 0; t < seen.size(); ++t)
    if (seen[t] != 1) {
      ADD_FAILURE() << tag.str() << ": tile (m " << t % m_blocks << ", head·batch " << t / m_blocks << ") visited "
                    << seen[t] << " times";
      res.ok = false;
      break;
    }
  if (kCausal && sm90::paired_mode(mode)) {
    // Every CTA gets whole pairs of cost M + 1; rounds differ by at most one pair (kPairedTail: at
    // most one pair's cost too, its tail being finer).
    const auto [lo, hi] = std::minmax_element(res.loads.begin(), res.loads.end());
    if (*hi - *lo > m_blocks + 1) {
      ADD_FAILURE() << tag.str() << ": loads " << *lo << " … " << *hi << " differ by more than M + 1";
      res.ok = false;
    }
  }
  return res;
}

TEST(SchedTiles, EveryTileOnceAndBalanced) {
  double worst_tail = 0;
  std::string worst_at;
  int configs = 0;
  for (bool causal : {false, true})
    for (int m_blocks : {1, 2, 3, 4, 5, 7, 8, 11, 16, 33, 64, 128})
      for (int hb : {1, 2, 3, 5, 16, 67, 132, 512}) {
        const long long hbl = hb;
        std::vector<int> modes = {sm90::sched_mode(causal, m_blocks, hbl, kSms)};  // the default
        if (causal) modes.insert(modes.end(), {sm90::kSnake, sm90::kPaired, sm90::kPairedTail});
        for (int mode : modes) {
          const int g = sm90::grid_size(mode, m_blocks, hbl, kSms);
          const ScheduleResult r = causal ? check_schedule<true>(mode, m_blocks, hb, g)
                                          : check_schedule<false>(mode, m_blocks, hb, g);
          ASSERT_TRUE(r.ok);
          ++configs;
          if (causal && mode == sm90::kPairedTail && g == kSms) {
            long long sum = 0, mx = 0;
            for (long long l : r.loads) sum += l, mx = std::max(mx, l);
            const double ratio = double(mx) * g / double(sum);
            if (ratio > worst_tail) {
              worst_tail = ratio;
              worst_at = "M=" + std::to_string(m_blocks) + ", heads·batch=" + std::to_string(hb);
            }
          }
        }
      }
  std::printf("tile schedules: %d configurations; paired with tail: largest CTA load / mean, worst %.3f (%s)\n",
              configs, worst_tail, worst_at.c_str());
}

// The FlashAttention grid (batch·N = 16384, heads·d = 2048), causal, the query tile as the dispatch
// picks it (tile_size.hpp fwd_block_m): the tail must balance at least as well as pure pairs
// (largest CTA load over the mean, key blocks of square tiles).
TEST(SchedTiles, PairedTailBalancesTheGrid) {
  for (int d : {64, 128, 256})
    for (int n : {512, 1024, 2048, 4096, 8192, 16384}) {
      const int bm = sm90::fwd_block_m(d, true, n, n, false);
      const int m_blocks = (n + bm - 1) / bm, hb = (16384 / n) * (2048 / d);
      double ratio[2];
      for (int k = 0; k < 2; ++k) {
        const int mode = k ? sm90::kPairedTail : sm90::kPaired;
        const int g = sm90::grid_size(mode, m_blocks, hb, kSms);
        const ScheduleResult r = check_schedule<true>(mode, m_blocks, hb, g);
        ASSERT_TRUE(r.ok);
        long long sum = 0, mx = 0;
        for (long long l : r.loads) sum += l, mx = std::max(mx, l);
        ratio[k] = double(mx) * g / double(sum);
      }
      EXPECT_LE(ratio[1], ratio[0] + 1e-9) << "d" << d << " N=" << n << ": the tail balances worse than pairs";
      std::printf("  grid d%d N=%d: largest/mean load paired %.3f, with tail %.3f\n", d, n, ratio[0], ratio[1]);
    }
}

TEST(SchedTiles, FastDivExact) {
  std::mt19937 rng(7);
  std::vector<int64_t> divisors;
  for (int d = 1; d < 2050; ++d) divisors.push_back(d);
  for (int i = 0; i < 3000; ++i) divisors.push_back(1 + int64_t(rng() % ((1u << 31) - 1)));
  for (int64_t d : {int64_t(1) << 30, (int64_t(1) << 30) + 1, (int64_t(1) << 31) - 1}) divisors.push_back(d);
  int fails = 0;
  for (int64_t d : divisors) {
    const sm90::FastDiv f{int(d)};
    for (int64_t n : {int64_t(0), int64_t(1), d - 1, d, d + 1, 2 * d - 1, 2 * d, (int64_t(1) << 31) - 1,
                      (int64_t(1) << 31) - 2, int64_t(rng() % (1u << 31))}) {
      if (n < 0 || n >= (int64_t(1) << 31)) continue;
      if (f.div(int(n)) != n / d || f.mod(int(n)) != n % d) {
        if (++fails <= 5) ADD_FAILURE() << "FastDiv(" << d << "): " << n << " / d = " << f.div(int(n)) << ", not " << n / d;
      }
    }
  }
  EXPECT_EQ(fails, 0);
}

// ---- the stream-K tail ---------------------------------------------------------------------------
struct Item {
  int idx, b, e, slot;
};

// CTA c's items in the order the kernel's loops take them (fwd/kernel.cuh, kStreamK): its strided
// chain (whole tiles, ended at sched_total = sk_begin), then its tail items.
std::vector<Item> stream_k_items(const sm90::FwdArgs& a, int g, int c) {
  std::vector<Item> out;
  using S = sm90::TileScheduler<false>;
  for (int idx = S::first(a, g, c); S::valid(a, idx); idx = S::next(a, idx, g, c)) out.push_back({idx, 0, a.sk_blocks, -1});
  if (a.sk_begin < a.sk_total) {
    const sm90::StreamKTail st = sm90::StreamKTail::of(a, c);
    for (int t = st.first(a); t < st.end(a); ++t) {
      const sm90::SkItem it = st.item(a, t, c);
      out.push_back({it.idx, it.kb_begin, it.kb_end, it.slot});
    }
  }
  return out;
}

bool check_stream_k(int tiles, int blocks, std::vector<long long>* loads_out = nullptr) {
  const int g = std::min(tiles, kSms);
  std::ostringstream tag;
  tag << "stream-K tiles=" << tiles << " blocks=" << blocks << " G=" << g;
  sm90::FwdArgs a = schedule_args(sm90::kStrided, false, tiles, 1, g);
  const int slots = sm90::set_stream_k(a, a.sched_total, g, blocks, true);
  const int begin = a.sk_begin;
  const bool tail = begin < tiles;
  if (slots != (tail ? g : 0) || a.sk_total != tiles || a.sched_total != begin) {
    ADD_FAILURE() << tag.str() << ": set_stream_k returned " << slots << " slots, sk_begin " << begin << ", sk_total "
                  << a.sk_total << ", sched_total " << a.sched_total;
    return false;
  }
  std::vector<uint8_t> cover(size_t(tiles) * blocks, 0);
  std::map<int, std::vector<Item>> parts;  // slot -> the two parts (idx, b, e, CTA in slot)
  std::vector<long long> loads;
  for (int c = 0; c < g; ++c) {
    const std::vector<Item> its = stream_k_items(a, g, c);
    long long load = 0;
    int k0 = 0;  // the position of c's first tail item
    while (k0 < int(its.size()) && its[k0].idx < begin) ++k0;
    for (int k = 0; k < int(its.size()); ++k) {
      const Item& it = its[k];
      if (it.idx < 0 || it.idx >= tiles || it.b < 0 || it.e > blocks || it.b >= it.e) {
        ADD_FAILURE() << tag.str() << ": CTA " << c << " item (tile " << it.idx << ", [" << it.b << "," << it.e << "))";
        return false;
      }
      load += it.e - it.b;
      for (int kb = it.b; kb < it.e; ++kb) ++cover[size_t(it.idx) * blocks + kb];
      if (it.slot >= 0) {
        // the low part is the CTA's last item (slot c + 1), the high part its first tail item (slot c)
        const bool low = it.b == 0;
        if ((low && (k != int(its.size()) - 1 || it.slot != c + 1)) || (!low && (k != k0 || it.slot != c))) {
          ADD_FAILURE() << tag.str() << ": CTA " << c << " cut part of tile " << it.idx << " [" << it.b << "," << it.e
                        << ") out of place (item " << k << ", slot " << it.slot << ")";
          return false;
        }
        if (it.slot < 1 || it.slot >= g) {
          ADD_FAILURE() << tag.str() << ": split slot " << it.slot << " out of [1, G)";
          return false;
        }
        parts[it.slot].push_back({it.idx, it.b, it.e, c});
      }
    }
    loads.push_back(load);
  }
  for (size_t i = 0; i < cover.size(); ++i)
    if (cover[i] != 1) {
      ADD_FAILURE() << tag.str() << ": tile " << i / blocks << " key block " << i % blocks << " covered " << int(cover[i])
                    << " times";
      return false;
    }
  for (auto& [slot, ps] : parts) {  // two parts of one tile, from CTAs slot − 1 and slot, meeting
    std::sort(ps.begin(), ps.end(), [](const Item& x, const Item& y) { return x.b < y.b; });
    if (ps.size() != 2 || ps[0].idx != ps[1].idx || ps[0].slot != slot - 1 || ps[1].slot != slot || ps[0].e != ps[1].b) {
      ADD_FAILURE() << tag.str() << ": split slot " << slot << " holds " << ps.size() << " parts that do not meet";
      return false;
    }
  }
  const auto [lo, hi] = std::minmax_element(loads.begin(), loads.end());
  if (tail && *hi - *lo > 1) {
    ADD_FAILURE() << tag.str() << ": CTA loads " << *lo << " … " << *hi << " key blocks";
    return false;
  }
  if (loads_out) *loads_out = loads;
  return true;
}

TEST(SchedTiles, StreamKTail) {
  std::vector<int> tile_counts;
  for (int t = 1; t < 3 * kSms + 7; ++t) tile_counts.push_back(t);
  for (int t : {1024, 2048, 2816, 3072, 10000}) tile_counts.push_back(t);
  int cases = 0;
  for (int tiles : tile_counts)
    for (int blocks : {1, 4, 8, 15, 16, 17, 47, 128}) {
      ASSERT_TRUE(check_stream_k(tiles, blocks));
      ++cases;
    }
  // set_stream_k leaves no tail where G · units would overflow StreamKTail::of's 32-bit products
  // (2^20 tiles on 132 CTAs leave 232 for the tail: 232 · 2^14 · 132 fits, 232 · 2^17 · 132 does not).
  for (int blocks : {1 << 14, 1 << 17}) {
    sm90::FwdArgs big = schedule_args(sm90::kStrided, false, 1 << 20, 1, kSms);
    EXPECT_EQ(sm90::set_stream_k(big, big.sched_total, kSms, blocks, true), blocks == 1 << 14 ? kSms : 0)
        << "2^20 tiles of " << blocks << " key blocks";
  }
  // The FlashAttention grid at d128 (2048 tiles): every CTA ends within one key block.
  for (int n : {2048, 4096, 8192}) {
    const int nb = n / 128;
    std::vector<long long> loads;
    ASSERT_TRUE(check_stream_k(2048, nb, &loads));
    std::printf("  stream-K d128 grid N=%d: %.1f key blocks per CTA on average, largest %lld (16 rounds of whole tiles: %d)\n",
                n, 2048.0 * nb / kSms, *std::max_element(loads.begin(), loads.end()), 16 * nb);
  }
  std::printf("stream-K: %d cases\n", cases);
}

}  // namespace
