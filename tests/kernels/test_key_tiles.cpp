// The Hopper kernels' key and query tile ranges and masks for windows, on the CPU, against the
// visibility rule of include/flashattn (bottom-right aligned: row i sees key j < Nk with
// i + diag − wl <= j <= i + diag + wr, diag = Nk − Nq, a negative bound meaning none). Every
// function checked is the kernels' own, compiled for the host; the window is the one the dispatch
// hands the kernels (sm90.hpp kernel_window_left / kernel_window_right: the causal kernels serve
// every window, causal being (−1, 0); no window at all is the non-causal kernels').
// Forward (fwd/key_tiles.hpp: key_range, KeyTileNeedsMask = Consumer::run's needs_mask,
// mask_scores = FragmentSoftmax::mask, live_column_blocks, masked_key_blocks; scheduler.cuh
// set_schedule's every_tile_has_keys):
//   - every key a row of the query block sees lies in the block's key tiles [begin, end);
//   - a key tile run without the mask (needs_mask false) is visible to every row of the block that
//     exists (rows < Nq);
//   - the mask keeps exactly the visible keys of every row: every register of every consumer thread
//     (accumulator layout acc_row / acc_col), the tile's keys past Nk included;
//   - the window as clamped for the kernels (an unbounded right side as Nq, a left one past every
//     key as none) means the same keys as the caller's;
//   - a block has no key tile exactly when (m + 1)·bm + diag + wr <= 0, and set_schedule's
//     every_tile_has_keys is false exactly when some block has none;
//   - the exponentials a warp skips in a key tile (column blocks from 8·live_column_blocks on,
//     FragmentSoftmax::step<true>) and the key blocks a warpgroup skips (masked_key_blocks,
//     kSkipMasked) hold no key visible to any of their rows;
//   - the non-causal instances: every key tile, masked only where it passes Nk.
// Backward (bwd/query_tiles.hpp: query_range, step_needs_mask, step_mask / StepMask::hides):
//   - every query that sees a key of the key tile lies in the tile's query tiles [m_begin, m_end);
//     with varlen none of them lies past the sequence's rows, and a key tile past its keys has none;
//   - a step without the mask is visible for every existing (query, key) pair;
//   - StepMask hides exactly the invisible (query, key) pairs of every register of every consumer
//     thread (the d64/d128 kernel; the d256 kernel masks with inline code of bwd/kernel_wide.cuh,
//     not checked here);
//   - Options::deterministic: the key tiles seeing a query tile take their dQ turns (dq_turn) in
//     the order the work tiles are taken (bwd_tile_key), 0, 1, 2, … without gaps; and a replay of
//     the turn protocol (bwd/dq_turns.cuh) on grids of 1, 7 and 132 resident CTAs finishes.
// Tiles: the forward's (d64 with 192 rows, d128, d192, d256) and the backward's (d64, d128, d256).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/params.hpp"
#include "cuda/sm90/bwd/query_tiles.hpp"
#include "cuda/sm90/fwd/key_tiles.hpp"
#include "cuda/sm90/fwd/scheduler.cuh"
#include "cuda/sm90/primitives/acc_layout.hpp"
#include "cuda/sm90/sm90.hpp"
#include "cuda/sm90/tile_size.hpp"

namespace {
namespace sm90 = flashattn::cuda::sm90;

// A problem as the caller gives it: lengths and the library's window (−1: unbounded).
struct Window {
  int nq, nk, wl, wr;
};

bool visible(int i, int j, int nq, int nk, int wl, int wr) {
  const int diag = nk - nq;
  if (j < 0 || j >= nk) return false;
  if (wr >= 0 && j > i + diag + wr) return false;
  if (wl >= 0 && j < i + diag - wl) return false;
  return true;
}
bool visible(int i, int j, const Window& w) { return visible(i, j, w.nq, w.nk, w.wl, w.wr); }

std::string describe(const Window& w, int bm, int bn) {
  std::ostringstream os;
  os << "Nq=" << w.nq << " Nk=" << w.nk << " window=(" << w.wl << "," << w.wr << ") tiles " << bm << "x" << bn;
  return os.str();
}

// The window as the kernels take it (sm90.hpp): (−1, −1) for the non-causal kernels.
std::pair<int, int> kernel_window(const Window& w) {
  flashattn::detail::Params p;
  p.seqlen_q = w.nq;
  p.seqlen_k = w.nk;
  p.window_left = w.wl;
  p.window_right = w.wr;
  return {sm90::kernel_window_left(p), sm90::kernel_window_right(p)};
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The fixed cases of the model this replaced and random ones (more of them, longer sequences, and
// windows without any bound: the non-causal kernels).
std::vector<Window> cases() {
  std::vector<Window> out = {{1, 1, -1, 0},      {17, 17, 0, 0},     {113, 203, -1, 0},  {203, 113, -1, 0},
                             {300, 300, 64, 16}, {300, 200, -1, 40}, {256, 512, 64, -1}, {700, 900, 100, 0},
                             {513, 513, 100, 100}, {130, 70, 5, 3},  {1, 300, -1, -1},   {300, 1, -1, -1},
                             {129, 257, -1, -1}, {64, 64, 0, -1},    {100, 600, 499, 0}, {600, 100, 0, 599},
                             // the first block's right bound exactly at the first key, and one off:
                             // (0 + 1)·bm + Nk − Nq + wr = 0 for bm = 128 and 192
                             {228, 100, -1, 0},  {227, 100, -1, 0},  {229, 100, -1, 0},  {292, 100, -1, 0},
                             {185, 50, 3, 7},    {249, 50, -1, 7},   {356, 100, 20, 0},  {420, 100, -1, 0}};
  std::mt19937 rng(11);
  const int wls[] = {-1, 0, 1, 3, 50, 129, 500}, wrs[] = {-1, 0, 1, 7, 64, 300};
  for (int c = 0; c < 240; ++c) {
    const int nq = 1 + int(rng() % 419), nk = 1 + int(rng() % 419);
    out.push_back({nq, nk, wls[rng() % 7], wrs[rng() % 6]});
  }
  for (int c = 0; c < 160; ++c) {  // longer sequences, any window size
    const int nq = 1 + int(rng() % 1100), nk = 1 + int(rng() % 1100);
    const int wl = int(rng() % 4) == 0 ? -1 : int(rng() % 1200), wr = int(rng() % 4) == 0 ? -1 : int(rng() % 1200);
    out.push_back({nq, nk, wl, wr});
  }
  return out;
}

// ---- forward -----------------------------------------------------------------------------------
template <class Tile, bool kCausal>
bool check_forward_instance(const Window& w, int wl, int wr) {
  constexpr int bm = Tile::kBlockM, bn = Tile::kBlockN, kRegs = bn / 2, kWGs = Tile::kConsumerWGs;
  const int nq = w.nq, nk = w.nk, m_blocks = ceil_div(nq, bm);
  const std::string what = describe(w, bm, bn) + (kCausal ? " (causal kernel)" : " (non-causal kernel)");
  sm90::FwdArgs a{};
  a.seqlen_q = nq;
  a.seqlen_k = nk;
  a.window_left = wl;
  a.window_right = wr;
  const sm90::SeqRows s{0, 0, nq, nk, 0};
  bool any_empty = false;
  for (int m = 0; m < m_blocks; ++m) {
    const sm90::KeyTiles keys = sm90::key_range<Tile, kCausal>(a, s, m);
    const int begin = keys.begin, end = keys.end;
    const int row_end = std::min((m + 1) * bm, nq);
    if (end < begin || begin < 0 || (end > begin && end > ceil_div(nk, bn))) {
      ADD_FAILURE() << what << " m=" << m << ": key_range [" << begin << "," << end << ") is no range of key tiles";
      return false;
    }
    // scheduler.cuh set_schedule's rule: a block is empty exactly when its last row's right bound
    // is below the first key, whatever the left window.
    const bool empty = keys.count() == 0;
    any_empty |= empty;
    if (empty != (kCausal && (m + 1) * bm + (nk - nq) + wr <= 0)) {
      ADD_FAILURE() << what << " m=" << m << ": key_range [" << begin << "," << end << ") is "
                    << (empty ? "" : "not ") << "empty, (m + 1)·bm + diag + wr = " << (m + 1) * bm + (nk - nq) + wr;
      return false;
    }
    for (int i = m * bm; i < row_end; ++i)
      for (int j = 0; j < nk; ++j) {
        const bool vis = visible(i, j, w);
        if (vis != visible(i, j, nq, nk, wl, wr)) {
          ADD_FAILURE() << what << ": the kernel's window (" << wl << "," << wr << ") changes row " << i << " key " << j;
          return false;
        }
        if (vis && !(begin <= j / bn && j / bn < end)) {
          ADD_FAILURE() << what << " m=" << m << ": row " << i << " sees key " << j << " outside the key tiles ["
                        << begin << "," << end << ")";
          return false;
        }
      }
    const int diag_row_min = m * bm + nk - nq;
    const sm90::KeyTileNeedsMask<Tile, kCausal> needs_mask{diag_row_min, nk, wl, wr};
    for (int n = begin; n < end; ++n) {
      if (!needs_mask(n))
        for (int i = m * bm; i < row_end; ++i)
          for (int j = n * bn; j < (n + 1) * bn; ++j)
            if (!visible(i, j, w)) {
              ADD_FAILURE() << what << " m=" << m << " n=" << n << ": the tile runs unmasked but row " << i
                            << " does not see key " << j;
              return false;
            }
      // The mask, as every consumer thread applies it to its fragment (any tile: it is exact).
      for (int wg = 0; wg < kWGs; ++wg)
        for (int t = 0; t < 128; ++t) {
          float acc[kRegs];
          for (float& x : acc) x = 1.f;
          const int row0 = m * bm + 64 * wg + 16 * (t / 32) + (t % 32) / 4;
          sm90::mask_scores<kCausal>(acc, n * bn + 2 * (t % 4), row0, nk, nq, wl, wr);
          for (int r = 0; r < kRegs; ++r) {
            const int i = m * bm + 64 * wg + sm90::acc_row(t, r), j = n * bn + sm90::acc_col(t, r);
            if (i >= nq) continue;  // rows past Nq are not stored
            const bool hidden = std::isinf(acc[r]) && acc[r] < 0;
            if (!hidden && acc[r] != 1.f) {
              ADD_FAILURE() << what << ": the mask wrote " << acc[r] << " into a kept score";
              return false;
            }
            if (hidden == visible(i, j, w)) {
              ADD_FAILURE() << what << " m=" << m << " n=" << n << " warpgroup " << wg << " thread " << t
                            << " register " << r << ": the mask " << (hidden ? "hides" : "keeps") << " key " << j
                            << " of row " << i;
              return false;
            }
          }
        }
    }
    if (!kCausal) continue;
    // Skipped exponentials (live column blocks, every tile of the range) and skipped key blocks.
    for (int n = begin; n < end; ++n)
      for (int wg = 0; wg < kWGs; ++wg)
        for (int warp = 0; warp < 4; ++warp) {
          const int warp_row0 = m * bm + 64 * wg + 16 * warp;
          const int live = sm90::live_column_blocks<Tile>(warp_row0, n, nk, nq, wr);
          if (live < 0 || live > bn / 8) {
            ADD_FAILURE() << what << ": live_column_blocks " << live << " outside [0, " << bn / 8 << "]";
            return false;
          }
          for (int i = warp_row0; i < std::min(warp_row0 + 16, nq); ++i)
            for (int j = n * bn + 8 * live; j < std::min((n + 1) * bn, nk); ++j)
              if (visible(i, j, w)) {
                ADD_FAILURE() << what << " m=" << m << " n=" << n << " warp " << warp << " of warpgroup " << wg
                              << ": live column blocks " << live << " skip key " << j << ", visible to row " << i;
                return false;
              }
        }
    for (int wg = 0; wg < kWGs; ++wg) {
      const int wg_row0 = m * bm + 64 * wg;
      const int skip = sm90::masked_key_blocks<Tile>(keys, wg_row0, nq, nk, wr);
      if (skip < 0 || skip > keys.count()) {
        ADD_FAILURE() << what << " m=" << m << ": masked_key_blocks " << skip << " of " << keys.count() << " tiles";
        return false;
      }
      for (int n = end - skip; n < end; ++n)
        for (int i = wg_row0; i < std::min(wg_row0 + 64, nq); ++i)
          for (int j = n * bn; j < std::min((n + 1) * bn, nk); ++j)
            if (visible(i, j, w)) {
              ADD_FAILURE() << what << " m=" << m << " warpgroup " << wg << ": skips key tile " << n << " (" << skip
                            << " of [" << begin << "," << end << ")) but row " << i << " sees key " << j;
              return false;
            }
    }
  }
  if (kCausal) {
    // set_schedule's every_tile_has_keys (its empty-block half; a schedule without virtual tiles).
    a.m_blocks = m_blocks;
    a.block_m = bm;
    a.heads = a.batch = 1;
    a.sched = sm90::kOnePerCta;
    sm90::set_schedule(a, true, 1, m_blocks);
    if (bool(a.every_tile_has_keys) == any_empty) {
      ADD_FAILURE() << what << ": set_schedule says every_tile_has_keys = " << a.every_tile_has_keys << " but "
                    << (any_empty ? "a" : "no") << " query block has no key tile";
      return false;
    }
  }
  return true;
}

template <class Tile>
bool check_forward(const Window& w) {
  const auto [wl, wr] = kernel_window(w);
  if (wl >= 0 || wr >= 0) return check_forward_instance<Tile, true>(w, wl, wr);
  return check_forward_instance<Tile, false>(w, wl, wr);
}

TEST(SchedKeyTiles, ForwardRangesAndMasks) {
  int checked = 0;
  for (const Window& w : cases()) {
    ASSERT_TRUE(check_forward<sm90::FwdTile<128>>(w));
    ASSERT_TRUE((check_forward<sm90::FwdTile<64, 192>>(w)));
    ASSERT_TRUE(check_forward<sm90::FwdTile<192>>(w));
    ASSERT_TRUE(check_forward<sm90::FwdTile<256>>(w));
    checked += 4;
  }
  std::printf("forward key tiles: %d cases (128x128, 192x128, 128x112, 128x80 tiles)\n", checked);
}

// ---- backward ----------------------------------------------------------------------------------
template <class Tile, bool kCausal>
bool check_backward_instance(const Window& w, int wl, int wr, bool varlen, bool step_mask) {
  constexpr int bm = Tile::kBlockM, bn = Tile::kBlockN, kRegs = bm / 2;
  const int nq = w.nq, nk = w.nk;
  const std::string what = describe(w, bm, bn) + (kCausal ? " (causal kernel" : " (non-causal kernel") +
                           (varlen ? ", varlen)" : ")");
  sm90::BwdArgs a{};
  a.seqlen_q = nq;
  a.seqlen_k = nk;
  a.window_left = wl;
  a.window_right = wr;
  a.m_blocks = ceil_div(nq, bm);
  static const int cu_dummy[2] = {0, 0};  // query_range only tests it for null
  int n_blocks = ceil_div(nk, bn);
  if (varlen) {  // the longest sequence has more tiles than this one
    a.cu_seqlens_q = a.cu_seqlens_k = cu_dummy;
    a.m_blocks += 2;
    n_blocks += 1;
  }
  const sm90::SeqRows s{0, 0, nq, nk, 0};
  for (int n = 0; n < n_blocks; ++n) {
    int m_begin = -1, m_end = -1;
    sm90::bwd::query_range<Tile, kCausal, true>(a, s, n, m_begin, m_end);
    if (!varlen) {  // the kernel instance without varlen (kVarlen false) must agree
      int b2 = -1, e2 = -1;
      sm90::bwd::query_range<Tile, kCausal, false>(a, s, n, b2, e2);
      if (b2 != m_begin || e2 != m_end) {
        ADD_FAILURE() << what << " n=" << n << ": kVarlen true/false differ without cu_seqlens";
        return false;
      }
    }
    if (m_begin < 0 || (m_end > m_begin && m_end > a.m_blocks)) {
      ADD_FAILURE() << what << " n=" << n << ": query_range [" << m_begin << "," << m_end << ") is no range of query tiles";
      return false;
    }
    if (varlen && m_end > m_begin && (m_end > ceil_div(nq, bm) || n * bn >= nk)) {
      ADD_FAILURE() << what << " n=" << n << ": query_range [" << m_begin << "," << m_end
                    << ") reaches past the sequence's rows or keys";
      return false;
    }
    for (int j = n * bn; j < std::min((n + 1) * bn, nk); ++j)
      for (int i = 0; i < nq; ++i)
        if (visible(i, j, w) && !(m_begin <= i / bm && i / bm < m_end)) {
          ADD_FAILURE() << what << " n=" << n << ": query " << i << " sees key " << j << " outside the query tiles ["
                        << m_begin << "," << m_end << ")";
          return false;
        }
    for (int m = m_begin; m < m_end; ++m) {
      const int q0 = m * bm;
      if (!sm90::bwd::step_needs_mask<Tile, kCausal>(a, s, n, q0))
        for (int i = q0; i < std::min(q0 + bm, nq); ++i)
          for (int j = n * bn; j < (n + 1) * bn; ++j)
            if (!visible(i, j, w)) {
              ADD_FAILURE() << what << " n=" << n << " m=" << m << ": the step runs unmasked but query " << i
                            << " does not see key " << j;
              return false;
            }
      if (!step_mask) continue;
      for (int g = 0; g < 2; ++g)  // the consumer warpgroups: keys 64g … 64g + 63 of the tile
        for (int t = 0; t < 128; ++t) {
          const int lane = t % 32;
          const int key_row0 = n * bn + 64 * g + 16 * (t / 32) + lane / 4;
          const sm90::bwd::StepMask mask = sm90::bwd::step_mask<kCausal>(a, s, key_row0, q0 + 2 * (lane % 4));
          for (int r = 0; r < kRegs; ++r) {
            const int key = n * bn + 64 * g + sm90::acc_row(t, r), query = q0 + sm90::acc_col(t, r);
            if (query >= nq) continue;  // padding rows: LSE = +inf
            if (mask.hides(r) == visible(query, key, w)) {
              ADD_FAILURE() << what << " n=" << n << " m=" << m << " warpgroup " << g << " thread " << t << " register "
                            << r << ": StepMask " << (mask.hides(r) ? "hides" : "keeps") << " key " << key
                            << " of query " << query;
              return false;
            }
          }
        }
    }
  }
  // Options::deterministic: the key tiles that see query tile m take turns 0, 1, 2, … at its dQ
  // blocks (dq_turn) in the order the work tiles are taken (bwd_tile_key: work tile idx of key
  // tile n), so a tile waits only for tiles started before it.
  a.n_blocks = n_blocks;
  a.flags = sm90::kBwdDeterministic;
  std::vector<int> next_turn(a.m_blocks, 0);
  for (int idx = 0; idx < n_blocks; ++idx) {
    const int n = sm90::bwd::bwd_tile_key<kCausal>(a, idx);
    int m_begin = -1, m_end = -1;
    sm90::bwd::query_range<Tile, kCausal, true>(a, s, n, m_begin, m_end);
    for (int m = m_begin; m < m_end; ++m) {
      const int turn = sm90::bwd::dq_turn<Tile, kCausal>(a, s, n, m);
      if (turn != next_turn[m]) {
        ADD_FAILURE() << what << " work tile " << idx << " (key tile " << n << ") at query tile " << m << ": turn "
                      << turn << ", expected " << next_turn[m] << " (the tiles taken before it that see m)";
        return false;
      }
      ++next_turn[m];
    }
  }
  return true;
}

template <class Tile>
bool check_backward(const Window& w, bool varlen, bool step_mask) {
  const auto [wl, wr] = kernel_window(w);
  if (wl >= 0 || wr >= 0) return check_backward_instance<Tile, true>(w, wl, wr, varlen, step_mask);
  return check_backward_instance<Tile, false>(w, wl, wr, varlen, step_mask);
}

TEST(SchedKeyTiles, BackwardRangesAndMasks) {
  int checked = 0;
  for (const Window& w : cases()) {
    ASSERT_TRUE(check_backward<sm90::BwdTile<64>>(w, false, true));
    ASSERT_TRUE(check_backward<sm90::BwdTile<128>>(w, false, true));
    ASSERT_TRUE(check_backward<sm90::BwdTile<256>>(w, false, false));  // StepMask: not the d256 kernel's
    checked += 3;
  }
  std::printf("backward query tiles: %d cases (128x128, 64x128, 64x64 steps)\n", checked);
}

// Options::deterministic, replayed: the backward's work tiles run on a grid of `slots` resident CTAs
// (a CTA takes the next tile in blockIdx order when one finishes; with the persistent grid every
// CTA walks its own tiles), each step waiting until its query tile's counter shows its turn
// (dq_turn), and — as bwd/dq_turns.cuh does — advancing the counters of a step only once the next
// step's turn came (or the tile ended). The replay must finish: a tile that holds a query tile while
// it waits for another is how such an order deadlocks (P-172).
template <class Tile, bool kCausal>
bool replay_deterministic(int nq, int nk, int window_left, int window_right, int heads_kv, int batch, int group,
                          bool persistent, int slots) {
  sm90::BwdArgs a{};
  a.seqlen_q = nq, a.seqlen_k = nk, a.window_left = window_left, a.window_right = window_right;
  a.m_blocks = ceil_div(nq, Tile::kBlockM), a.n_blocks = ceil_div(nk, Tile::kBlockN);
  a.heads_kv = heads_kv, a.batch = batch, a.group = group, a.heads = heads_kv * group;
  a.flags = sm90::kBwdDeterministic;
  const int tiles = a.n_blocks * heads_kv * batch;
  a.grid = persistent ? std::min(tiles, slots) : tiles;
  const sm90::SeqRows s{0, 0, nq, nk, 0};
  struct Cta {
    long long idx;  // current work tile
    int st = 0, held = -1;
  };
  std::vector<Cta> ctas;
  long long next_idx = 0;  // one CTA per tile: the next blockIdx to start
  auto start = [&](long long idx) { ctas.push_back(Cta{idx}); };
  if (persistent)
    for (int c = 0; c < a.grid; ++c) start(c);
  else
    while (next_idx < std::min<long long>(tiles, slots)) start(next_idx++);
  std::vector<int> counter(size_t(batch) * a.heads * a.m_blocks, 0);
  long long done = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t c = 0; c < ctas.size(); ++c) {
      Cta& x = ctas[c];
      if (x.idx < 0) continue;
      const int n = sm90::bwd::bwd_tile_key<kCausal>(a, int(x.idx)), head_kv = int(x.idx / a.n_blocks) % heads_kv,
                b = int(x.idx / (a.n_blocks * heads_kv));
      int m_begin = 0, m_end = 0;
      sm90::bwd::query_range<Tile, kCausal, true>(a, s, n, m_begin, m_end);
      const int count = std::max(0, m_end - m_begin), steps = count * group;
      if (x.st < steps) {
        const int head = head_kv * group + x.st / count, m = m_begin + x.st % count;
        const int key = (b * a.heads + head) * a.m_blocks + m;
        if (counter[key] != sm90::bwd::dq_turn<Tile, kCausal>(a, s, n, m)) continue;  // waits
        if (x.held >= 0) ++counter[x.held];
        x.held = key;
        ++x.st;
        progress = true;
      }
      if (x.st == steps) {  // the tile's end: its last turns advance, the CTA takes its next tile
        if (x.held >= 0) ++counter[x.held];
        x.held = -1, x.st = 0, ++done, progress = true;
        if (persistent) x.idx = x.idx + a.grid < tiles ? x.idx + a.grid : -1;
        else x.idx = next_idx < tiles ? next_idx++ : -1;
      }
    }
  }
  if (done != tiles)
    ADD_FAILURE() << "deterministic replay, Nq=" << nq << " Nk=" << nk << " window=(" << window_left << ","
                  << window_right << ") " << Tile::kBlockM << "x" << Tile::kBlockN << (kCausal ? " causal" : "")
                  << " heads_kv " << heads_kv << " batch " << batch << " group " << group
                  << (persistent ? " persistent" : "") << " grid " << a.grid << ": " << tiles - done
                  << " work tiles never finish (a cycle of waits)";
  return done == tiles;
}

TEST(SchedKeyTiles, BackwardDeterministicReplayFinishes) {
  int replays = 0;
  for (int slots : {1, 7, 132})
    for (const auto& [nq, nk] : std::vector<std::pair<int, int>>{{2048, 2048}, {333, 517}, {1, 300}, {1000, 129}, {4096, 1024}})
      for (const auto& [hkv, batch, group] : std::vector<std::tuple<int, int, int>>{{1, 1, 1}, {8, 4, 1}, {2, 3, 4}}) {
        // As dispatch_bwd.cu runs them: persistent at d64/d128 without causal, a CTA per tile else.
        ASSERT_TRUE((replay_deterministic<sm90::BwdTile<64>, false>(nq, nk, -1, -1, hkv, batch, group, true, slots)));
        ASSERT_TRUE((replay_deterministic<sm90::BwdTile<128>, false>(nq, nk, -1, -1, hkv, batch, group, true, slots)));
        ASSERT_TRUE((replay_deterministic<sm90::BwdTile<256>, false>(nq, nk, -1, -1, hkv, batch, group, false, slots)));
        ASSERT_TRUE((replay_deterministic<sm90::BwdTile<64>, true>(nq, nk, -1, 0, hkv, batch, group, false, slots)));
        ASSERT_TRUE((replay_deterministic<sm90::BwdTile<128>, true>(nq, nk, 100, 0, hkv, batch, group, false, slots)));
        ASSERT_TRUE((replay_deterministic<sm90::BwdTile<256>, true>(nq, nk, -1, 0, hkv, batch, group, false, slots)));
        replays += 6;
      }
  std::printf("deterministic backward replays: %d, every one finished\n", replays);
}

TEST(SchedKeyTiles, BackwardVarlenRanges) {
  int checked = 0;
  for (const Window& w : cases()) {  // varlen: the d64/d128 kernel
    ASSERT_TRUE(check_backward<sm90::BwdTile<64>>(w, true, true));
    ASSERT_TRUE(check_backward<sm90::BwdTile<128>>(w, true, true));
    checked += 2;
  }
  std::printf("backward query tiles with varlen: %d cases\n", checked);
}

}  // namespace
