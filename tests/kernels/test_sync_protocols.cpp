// Exhaustive interleaving check of the named-barrier protocols between the consumer warpgroups of
// the Hopper kernels (src/cuda/sm90), on the CPU: the forward's ping-pong turns (mainloop.cuh
// Consumer::turn_begin / turn_end, fwd/kernel.cuh), and the d256 backward's Pᵀ/dSᵀ hand-off between
// its two warpgroups (bwd/kernel_wide.cuh, barriers 3 and 4). The d64/d128 backward's warpgroups
// only meet at a barrier both sync on (barrier 3, once per step), which cannot slip a turn.
//
// Each warpgroup is its sequence of arrive(id) / sync(id) operations (128 threads each, bar.arrive /
// bar.sync with 256 threads). A barrier phase completes when two warpgroup-operations have reached
// it; a sync blocks until the phase it joined completes. Every interleaving is explored. Errors: a
// phase completed by two arrivals (nobody was waiting: the protocol has slipped a turn, and on the
// GPU the warpgroups end up waiting on each other), a deadlock, or arrivals left over when the CTA
// ends.
//
// Where the sequences come from. The forward's barrier ids are the kernel's own:
// sm90::TurnBarriers<kWGs>::own / next (fwd/pipe.hpp), which turn_begin, turn_end and Consumer::run's
// first arrival and skip path call. Their order follows the kernel's code, which issues the
// barriers as PTX inline and cannot run on the host: Consumer::run takes n_blocks + 1 turns per tile
// with keys (skipped key blocks included: one turn each, and the turn of the last P·V), warpgroup 0
// arrives first on the CTA's first tile with keys (fwd/kernel.cuh: first_work), and turn_end hands
// on after every turn but the last warpgroup's last turn of the CTA's last tile with keys (its test,
// `!(last && wg == kConsumerWGs − 1)`, is written out below as turn_end writes it). The d256
// backward's hand-off is a model of inline code of bwd/kernel_wide.cuh.
//
// Known-bad variants, which the checker must catch: the forward's rotation restarted at every tile
// (warpgroup 0 arriving first and the last warpgroup skipping its hand-off on every tile: warpgroup
// 0 then arrives twice on warpgroup 1's barrier, its last turn of one tile and its first of the
// next, before warpgroup 1 waits there); the d256 backward's warpgroup 0 not waiting for dSᵀ
// (barrier 4) before its next step's arrival on barrier 3.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda/sm90/fwd/pipe.hpp"
#include "kernels/tile_patterns.hpp"

using fa_test::skip_vectors;
using fa_test::tile_patterns;

namespace {
namespace sm90 = flashattn::cuda::sm90;

struct BarOp {
  bool sync;  // false: arrive
  int bar;
};
using Seq = std::vector<BarOp>;

class Checker {
 public:
  explicit Checker(const std::vector<Seq>& seqs) : S(seqs), n(int(seqs.size())) {}
  std::string run() {
    State st;
    st.pos.assign(size_t(n), 0);
    st.waiting.assign(size_t(n), -1);
    explore(st);
    return error;
  }

 private:
  struct State {
    std::vector<int> pos, waiting;               // per warpgroup: next op, barrier it is blocked on (−1: none)
    std::map<int, std::pair<int, int>> bars;     // barrier -> (arrivals, syncers as a bit set)
    std::string key() const {
      std::ostringstream os;
      for (int p : pos) os << p << ',';
      os << '|';
      for (int w : waiting) os << w << ',';
      os << '|';
      for (const auto& [b, v] : bars) os << b << ':' << v.first << ':' << v.second << ',';
      return os.str();
    }
  };
  const std::vector<Seq>& S;
  const int n;
  std::set<std::string> seen;
  std::string error;

  bool explore(const State& st) {
    if (!seen.insert(st.key()).second) return true;
    bool all_done = true;
    for (int i = 0; i < n; ++i) all_done &= st.pos[size_t(i)] == int(S[size_t(i)].size()) && st.waiting[size_t(i)] < 0;
    if (all_done) {
      if (!st.bars.empty()) {
        std::ostringstream os;
        os << "arrivals left over when the CTA ends: barrier " << st.bars.begin()->first << " holds "
           << st.bars.begin()->second.first << " arrival(s)";
        error = os.str();
        return false;
      }
      return true;
    }
    bool progressed = false;
    for (int i = 0; i < n; ++i) {
      if (st.waiting[size_t(i)] >= 0 || st.pos[size_t(i)] == int(S[size_t(i)].size())) continue;
      const BarOp op = S[size_t(i)][size_t(st.pos[size_t(i)])];
      State next = st;
      ++next.pos[size_t(i)];
      auto [arrivals, syncers] = next.bars.count(op.bar) ? next.bars[op.bar] : std::make_pair(0, 0);
      if (op.sync) {
        syncers |= 1 << i;
        next.waiting[size_t(i)] = op.bar;
      } else {
        ++arrivals;
      }
      if (arrivals + __builtin_popcount(unsigned(syncers)) == 2) {  // the phase completes
        if (syncers == 0) {
          std::ostringstream os;
          os << "barrier " << op.bar << ": a phase completed by two arrivals (warpgroup " << i << " at operation "
             << st.pos[size_t(i)] << ")";
          error = os.str();
          return false;
        }
        for (int j = 0; j < n; ++j)
          if (syncers & (1 << j)) next.waiting[size_t(j)] = -1;
        next.bars.erase(op.bar);
      } else {
        next.bars[op.bar] = {arrivals, syncers};
      }
      progressed = true;
      if (!explore(next)) return false;
    }
    if (!progressed) {
      std::ostringstream os;
      os << "deadlock at positions (";
      for (int i = 0; i < n; ++i)
        os << (i ? ", " : "") << st.pos[size_t(i)] << "/" << S[size_t(i)].size()
           << (st.waiting[size_t(i)] >= 0 ? " waiting on " + std::to_string(st.waiting[size_t(i)]) : "");
      os << ")";
      error = os.str();
      return false;
    }
    return true;
  }
};

std::string check(const std::vector<Seq>& seqs) { return Checker(seqs).run(); }

// ---- the forward's ping-pong turns ---------------------------------------------------------------
// Warpgroup wg over the CTA's tiles (key blocks per tile; 0: no keys, run() returns before any turn),
// skips[k] of tile k's blocks skipped by this warpgroup. per_tile_restart: the known-bad rotation.
template <int kWGs>
Seq forward_turns(int wg, const std::vector<int>& tiles, const std::vector<int>& skips, bool per_tile_restart) {
  using Turns = sm90::TurnBarriers<kWGs>;
  Seq ops;
  int first_work = -1, last_work = -1;  // fwd/kernel.cuh: first_work, last_work
  for (int k = 0; k < int(tiles.size()); ++k)
    if (tiles[size_t(k)] > 0) {
      if (first_work < 0) first_work = k;
      last_work = k;
    }
  auto turn_begin = [&] { ops.push_back({true, Turns::own(wg)}); };
  auto turn_end = [&](bool last) {
    if (!(last && wg == kWGs - 1)) ops.push_back({false, Turns::next(wg)});  // as turn_end
  };
  for (int k = 0; k < int(tiles.size()); ++k) {
    const int n_blocks = tiles[size_t(k)], skip = skips.empty() ? 0 : skips[size_t(k)];
    if (n_blocks == 0) continue;
    const bool first_of_cta = per_tile_restart || k == first_work;
    const bool last_of_cta = per_tile_restart || k == last_work;
    if (wg == 0 && first_of_cta) ops.push_back({false, Turns::own(0)});  // warpgroup 0 goes first
    for (int it = 0; it < skip; ++it) {
      turn_begin();
      turn_end(false);
    }
    if (skip == n_blocks) {  // the turn of the last P·V, with turn_end's test
      turn_begin();
      turn_end(last_of_cta);
      continue;
    }
    turn_begin();  // the prologue's Q·Kᵀ
    turn_end(false);
    for (int it = skip + 1; it < n_blocks; ++it) {  // Q·Kᵀ with the previous P·V
      turn_begin();
      turn_end(false);
    }
    turn_begin();  // the last P·V
    turn_end(last_of_cta);
  }
  return ops;
}

template <int kWGs>
std::string check_forward(const std::vector<int>& tiles, const std::vector<std::vector<int>>& skips, bool restart) {
  std::vector<Seq> seqs;
  for (int wg = 0; wg < kWGs; ++wg)
    seqs.push_back(forward_turns<kWGs>(wg, tiles, skips.empty() ? std::vector<int>{} : skips[size_t(wg)], restart));
  return check(seqs);
}


std::string pattern(const std::vector<int>& t) {
  std::string s = "(";
  for (size_t i = 0; i < t.size(); ++i) s += (i ? "," : "") + std::to_string(t[i]);
  return s + ")";
}

template <int kWGs>
void forward_rotation(int max_tiles) {
  int n = 0, caught = 0, bad = 0;
  for (const auto& t : tile_patterns(max_tiles, {0, 1, 2, 3})) {
    EXPECT_EQ(check_forward<kWGs>(t, {}, false), "") << kWGs << " warpgroups, tiles " << pattern(t);
    ++n;
    int with_keys = 0;
    for (int b : t) with_keys += b > 0;
    if (with_keys > 1) {  // the restarted rotation must be seen slipping
      ++bad;
      const std::string e = check_forward<kWGs>(t, {}, true);
      caught += !e.empty();
      EXPECT_NE(e, "") << kWGs << " warpgroups, tiles " << pattern(t) << ": the per-tile restart is not caught";
    }
  }
  std::printf("forward turns, %d warpgroups: %d tile patterns pass; the per-tile restart caught in %d of %d\n", kWGs, n,
              caught, bad);
}

TEST(SyncTurns, ForwardRotation) {
  forward_rotation<2>(4);
  forward_rotation<3>(3);
}

// Skipped key blocks (kSkipMasked) keep the turns: every skip count of every warpgroup.
template <int kWGs>
void forward_skips() {
  int n = 0;
  for (const auto& t : tile_patterns(2, {0, 1, 2})) {
    const std::vector<std::vector<int>> per_wg = skip_vectors(t);
    std::vector<size_t> pick(static_cast<size_t>(kWGs), 0);
    for (;;) {
      std::vector<std::vector<int>> skips;
      for (size_t c : pick) skips.push_back(per_wg[c]);
      EXPECT_EQ(check_forward<kWGs>(t, skips, false), "") << kWGs << " warpgroups, tiles " << pattern(t);
      ++n;
      size_t c = 0;
      while (c < pick.size() && ++pick[c] == per_wg.size()) pick[c++] = 0;
      if (c == pick.size()) break;
    }
  }
  std::printf("forward turns with skipped key blocks, %d warpgroups: %d cases\n", kWGs, n);
}

TEST(SyncTurns, ForwardSkippedKeyBlocks) {
  forward_skips<2>();
  forward_skips<3>();
}

// ---- the d256 backward's hand-off (bwd/kernel_wide.cuh) ------------------------------------------
// Per step: warpgroup 0 arrives on 3 (Pᵀ in smem) and syncs on 4 (dSᵀ in smem); warpgroup 1 syncs on
// 3 and arrives on 4. skip_dst_wait: the known-bad warpgroup 0 that does not wait for dSᵀ.
std::vector<Seq> wide_backward(int steps, bool skip_dst_wait) {
  std::vector<Seq> seqs(2);
  for (int s = 0; s < steps; ++s) {
    seqs[0].push_back({false, 3});
    if (!skip_dst_wait) seqs[0].push_back({true, 4});
    seqs[1].push_back({true, 3});
    seqs[1].push_back({false, 4});
  }
  return seqs;
}

TEST(SyncTurns, WideBackwardHandOff) {
  for (int steps = 1; steps <= 8; ++steps) EXPECT_EQ(check(wide_backward(steps, false)), "") << steps << " steps";
  const std::string e = check(wide_backward(2, true));
  EXPECT_NE(e, "") << "warpgroup 0 not waiting for dSᵀ: not caught";
  std::printf("d256 backward hand-off: 1–8 steps pass; without the wait on barrier 4: %s\n",
              e.empty() ? "NOT caught" : e.c_str());
}

}  // namespace
