// Exhaustive interleaving check of the Hopper kernels' mbarrier hand-offs between the producer
// thread (TMA loads) and the consumer warpgroups, over a CTA's tiles (src/cuda/sm90), on the CPU.
// The named-barrier turns between the consumers are test_sync_protocols.cpp's.
//
// mbarrier model (PTX ISA, mbarrier): a phase completes when its expected number of arrivals has
// arrived, and the phase number goes up by one. try_wait.parity(P) passes while the current phase's
// parity differs from P, i.e. "the last phase of parity P has completed" — so a waiter that falls two
// phases behind sees the parity it started from and blocks until a phase that may never come. A full
// barrier expects 1 arrival (the producer's arrive.expect_tx; the TMA bytes are a delay, which the
// interleavings cover), an empty barrier one per consumer warpgroup.
//
// Operations of a party: wait(barrier, parity), arrive(barrier), load(slot, item, barrier) — the
// producer's TMA load of `item` into the shared-memory `slot` and its arrival —, use(slot, item) — a
// consumer starts reading the slot and expects `item` there (no item: it writes the slot, as the
// forward's epilogue staging O in sQ) — and done(slot, item). Checked over every interleaving:
//   - no deadlock (every party finishes);
//   - a load into a slot comes after every consumer finished every earlier use of that slot;
//   - a use finds its item loaded and not yet replaced.
//
// Where the sequences come from. The forward's: the order of the operations follows the kernel's
// code — mainloop.cuh producer_tile and Consumer::run, and fwd/kernel.cuh's loops around them (its
// release of sQ after the epilogue, its wait on full_q for a tile without keys) — because those issue
// PTX (mbarrier waits and arrivals, TMA loads, wgmma) inline and cannot run on the host; every
// number in them is the kernels' own: the ring positions advance in sm90::PipeState as the kernel
// advances them, stage and parity are sm90::ring_stage / ring_phase (fwd/pipe.hpp, which
// producer_tile and Consumer::run call; sQ is a ring of one buffer, and fwd/kernel.cuh writes its
// parity for a tile without keys inline as `ps.q_loads++ & 1`, which is ring_phase<1>), and the
// causal warpgroups' skipped key blocks range over every count masked_key_blocks can return (0 …
// the tile's key blocks, per warpgroup independently: a warpgroup past the sequence's rows skips a
// whole tile that an earlier one does not, tests/kernels/test_key_tiles.cpp). The backward's is a
// model of inline code in files this test's change could not touch (bwd/producer.cuh bwd_produce,
// the consumer loops of bwd/kernel.cuh and bwd/kernel_wide.cuh): its stage and parity arithmetic
// (it % kStages, (it / kStages) & 1, kv_loads & 1) is written out here as those loops write it.
//
// Known-bad variants, each of which the checker must catch: the forward instance without
// kEmptyTiles given a tile without keys (the producer only waits for sQ's release and loads
// nothing, its consumers release sQ without waiting for an arrival); the producer waiting for sQ's
// release on its first tile too, after that tile's Q load went out; a causal warpgroup releasing a
// skipped stage before waiting for its load; the backward producer loading K/V for a tile without
// query steps that the consumers skip.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "cuda/sm90/fwd/pipe.hpp"
#include "kernels/tile_patterns.hpp"

using fa_test::skip_vectors;
using fa_test::tile_patterns;

namespace {
namespace sm90 = flashattn::cuda::sm90;

enum class Kind : uint8_t { wait, arrive, load, use, done };
struct Op {
  Kind kind;
  int bar = -1, parity = 0;       // wait, arrive, load (its arrival)
  int slot = -1, item = -1;       // load, use, done; item −1: a write of the slot (use, done)
  int order = 0;                  // use: the position among the slot's uses that loads follow
};
using Program = std::vector<Op>;

struct Protocol {
  std::vector<std::string> bar_names, slot_names;
  std::vector<int> expected;     // arrivals per phase
  std::vector<Program> parties;  // [0]: the producer
  int bar(const std::string& name, int arrivals) {
    bar_names.push_back(name);
    expected.push_back(arrivals);
    return int(bar_names.size()) - 1;
  }
  int slot(const std::string& name) {
    slot_names.push_back(name);
    return int(slot_names.size()) - 1;
  }
};

Op wait(int bar, uint32_t parity) { return {Kind::wait, bar, int(parity)}; }
Op arrive(int bar) { return {Kind::arrive, bar}; }
Op load(int slot, int item, int bar) { return {Kind::load, bar, 0, slot, item}; }
Op use(int slot, int item, int order) { return {Kind::use, -1, 0, slot, item, order}; }
Op done(int slot, int item) { return {Kind::done, -1, 0, slot, item}; }

// Depth-first over every interleaving, each state (positions, phases, pending arrivals) once.
class Checker {
 public:
  explicit Checker(const Protocol& p) : P(p), n(int(p.parties.size())), nb(int(p.expected.size())) {
    // Per consumer, each use's matching done (the first done of the same slot and item after it).
    done_of.resize(n);
    for (int c = 1; c < n; ++c) {
      const Program& prog = P.parties[c];
      done_of[c].assign(prog.size(), INT_MAX);
      for (size_t j = 0; j < prog.size(); ++j)
        if (prog[j].kind == Kind::use)
          for (size_t d = j + 1; d < prog.size(); ++d)
            if (prog[d].kind == Kind::done && prog[d].slot == prog[j].slot && prog[d].item == prog[j].item) {
              done_of[c][j] = int(d);
              break;
            }
    }
    // The item in each slot after the producer's first p operations.
    const Program& prod = P.parties[0];
    loaded.assign(prod.size() + 1, std::vector<int>(P.slot_names.size(), INT_MIN));
    for (size_t p = 0; p < prod.size(); ++p) {
      loaded[p + 1] = loaded[p];
      if (prod[p].kind == Kind::load) loaded[p + 1][prod[p].slot] = prod[p].item;
    }
  }
  // "" or the first error found.
  std::string run() {
    std::vector<int> st(size_t(n + 2 * nb), 0);
    explore(st);
    return error;
  }
  size_t states() const { return seen.size(); }

 private:
  const Protocol& P;
  const int n, nb;
  std::vector<std::vector<int>> done_of, loaded;
  std::unordered_set<std::string> seen;
  std::string error;

  std::string name_of_slot(int s) const { return P.slot_names[s]; }
  std::string load_conflict(const std::vector<int>& st, int slot, int item) const {
    for (int c = 1; c < n; ++c) {
      const Program& prog = P.parties[c];
      for (size_t j = 0; j < prog.size(); ++j)
        if (prog[j].kind == Kind::use && prog[j].slot == slot && prog[j].order < item && done_of[c][j] >= st[c]) {
          std::ostringstream os;
          os << "the producer loads item " << item << " into " << name_of_slot(slot) << " while consumer " << c
             << " still uses it (item " << prog[j].item << ")";
          return os.str();
        }
    }
    return "";
  }
  bool explore(std::vector<int>& st) {  // st: positions [0, n), phases [n, n + nb), pending [n + nb, n + 2nb)
    std::string key(reinterpret_cast<const char*>(st.data()), st.size() * sizeof(int));
    if (!seen.insert(std::move(key)).second) return true;
    bool finished = true, moved = false;
    for (int i = 0; i < n; ++i) {
      const Program& prog = P.parties[i];
      if (st[i] == int(prog.size())) continue;
      finished = false;
      const Op& op = prog[size_t(st[i])];
      std::vector<int> next = st;
      if (op.kind == Kind::wait) {
        if ((st[size_t(n + op.bar)] & 1) == op.parity) continue;  // blocked
      } else if (op.kind == Kind::arrive || op.kind == Kind::load) {
        if (op.kind == Kind::load) {
          const std::string e = load_conflict(st, op.slot, op.item);
          if (!e.empty()) {
            error = e;
            return false;
          }
        }
        int& pending = next[size_t(n + nb + op.bar)];
        if (++pending == P.expected[size_t(op.bar)]) {
          pending = 0;
          ++next[size_t(n + op.bar)];
        }
      } else if (op.kind == Kind::use && op.item >= 0) {
        const int have = loaded[size_t(st[0])][size_t(op.slot)];
        if (have != op.item) {
          std::ostringstream os;
          os << "consumer " << i << " uses " << name_of_slot(op.slot) << " expecting item " << op.item << ", finds "
             << (have == INT_MIN ? std::string("nothing") : std::to_string(have));
          error = os.str();
          return false;
        }
      }
      moved = true;
      ++next[size_t(i)];
      if (!explore(next)) return false;
    }
    if (!finished && !moved) {
      std::ostringstream os;
      os << "deadlock at positions (";
      for (int i = 0; i < n; ++i) os << (i ? ", " : "") << st[size_t(i)] << "/" << P.parties[size_t(i)].size();
      os << "), phases (";
      for (int b = 0; b < nb; ++b) os << (b ? ", " : "") << P.bar_names[size_t(b)] << " " << st[size_t(n + b)];
      os << ")";
      error = os.str();
      return false;
    }
    return true;
  }
};

std::string check(const Protocol& p) { return Checker(p).run(); }

std::string pattern(const std::vector<int>& tiles) {
  std::string s = "(";
  for (size_t i = 0; i < tiles.size(); ++i) s += (i ? "," : "") + std::to_string(tiles[i]);
  return s + ")";
}
std::string pattern(const std::vector<std::vector<int>>& skips) {
  std::string s = "[";
  for (size_t i = 0; i < skips.size(); ++i) s += (i ? " " : "") + pattern(skips[i]);
  return s + "]";
}


// ---- the forward: sQ (Q in, O out where staged there) and the K/V ring -------------------------
struct FwdVariant {
  bool empty_tiles = true;          // kEmptyTiles (fwd/kernel.cuh): the instance may get tiles without keys
  bool first_tile_waits_q = false;  // known-bad: the first tile also waits on empty_q after its Q load
  bool skip_without_wait = false;   // known-bad: a skipped stage released before waiting for its load
};

struct FwdBars {
  int full_q, empty_q, q;
  std::vector<int> full_k, empty_k, full_v, empty_v, k, v;
};

FwdBars fwd_bars(Protocol& p, int stages, int consumers) {
  FwdBars b;
  b.full_q = p.bar("full_q", 1);
  b.empty_q = p.bar("empty_q", consumers);
  b.q = p.slot("sQ");
  for (int s = 0; s < stages; ++s) {
    b.full_k.push_back(p.bar("full_k" + std::to_string(s), 1));
    b.empty_k.push_back(p.bar("empty_k" + std::to_string(s), consumers));
    b.full_v.push_back(p.bar("full_v" + std::to_string(s), 1));
    b.empty_v.push_back(p.bar("empty_v" + std::to_string(s), consumers));
    b.k.push_back(p.slot("sK" + std::to_string(s)));
    b.v.push_back(p.slot("sV" + std::to_string(s)));
  }
  return b;
}

// producer_tile (mainloop.cuh) for each tile of the CTA's chain (fwd/kernel.cuh's producer loop).
// tiles[k]: key blocks of tile k (0: no keys).
template <int kStages>
Program fwd_producer(const FwdBars& B, const std::vector<int>& tiles, const FwdVariant& v) {
  Program ops;
  sm90::PipeState ps;
  for (int k = 0; k < int(tiles.size()); ++k) {
    const int n_blocks = tiles[size_t(k)];
    const bool first_tile = ps.tiles == 0;
    const uint32_t q_free_parity = sm90::ring_phase<1>(ps.tiles++) ^ 1;
    if (n_blocks == 0) {
      ops.push_back(wait(B.empty_q, q_free_parity));
      if (v.empty_tiles) {
        ++ps.q_loads;
        ops.push_back(arrive(B.full_q));
      }
      continue;
    }
    for (int it = 0; it < n_blocks; ++it) {
      const int g = ps.kv_it + it;
      const int stage = sm90::ring_stage<kStages>(g);
      const uint32_t phase = sm90::ring_phase<kStages>(g);
      if (it == 0 && first_tile) ops.push_back(load(B.q, k, B.full_q));
      ops.push_back(wait(B.empty_k[size_t(stage)], phase ^ 1));
      ops.push_back(load(B.k[size_t(stage)], g, B.full_k[size_t(stage)]));
      if (it == 0) {
        ++ps.q_loads;
        if (!first_tile) {
          ops.push_back(wait(B.empty_q, q_free_parity));
          ops.push_back(load(B.q, k, B.full_q));
        } else if (v.first_tile_waits_q) {
          ops.push_back(wait(B.empty_q, q_free_parity));
        }
      }
      ops.push_back(wait(B.empty_v[size_t(stage)], phase ^ 1));
      ops.push_back(load(B.v[size_t(stage)], g, B.full_v[size_t(stage)]));
    }
    ps.kv_it += n_blocks;
  }
  return ops;
}

// One consumer warpgroup: Consumer::run (mainloop.cuh) and what fwd/kernel.cuh's consumer loop does
// around it. skips[k]: the key blocks of tile k this warpgroup skips (kSkipMasked; 0 … tiles[k]).
template <int kStages>
Program fwd_consumer(const FwdBars& B, const std::vector<int>& tiles, const std::vector<int>& skips, bool separate_o,
                     const FwdVariant& v) {
  Program ops;
  sm90::PipeState ps;
  for (int k = 0; k < int(tiles.size()); ++k) {
    const int n_blocks = tiles[size_t(k)], skip = skips.empty() ? 0 : skips[size_t(k)];
    bool skipped_all = false;
    if (n_blocks > 0) {  // run(): nothing at all for a tile without keys
      const int it0 = ps.kv_it;
      ps.kv_it += n_blocks;
      const uint32_t q_phase = sm90::ring_phase<1>(ps.q_loads++);
      ops.push_back(wait(B.full_q, q_phase));
      for (int it = 0; it < skip; ++it) {  // skipped key blocks: released once loaded
        const int g = it0 + it, stage = sm90::ring_stage<kStages>(g);
        const uint32_t phase = sm90::ring_phase<kStages>(g);
        if (!v.skip_without_wait) ops.push_back(wait(B.full_k[size_t(stage)], phase));
        ops.push_back(arrive(B.empty_k[size_t(stage)]));
        if (!v.skip_without_wait) ops.push_back(wait(B.full_v[size_t(stage)], phase));
        ops.push_back(arrive(B.empty_v[size_t(stage)]));
      }
      if (skip == n_blocks) {  // every row masked: the state as new
        skipped_all = true;
        if (separate_o) ops.push_back(arrive(B.empty_q));
      } else {
        ops.push_back(use(B.q, k, k));
        const int g0 = it0 + skip, stage0 = sm90::ring_stage<kStages>(g0);
        ops.push_back(wait(B.full_k[size_t(stage0)], sm90::ring_phase<kStages>(g0)));
        ops.push_back(use(B.k[size_t(stage0)], g0, g0));
        ops.push_back(done(B.k[size_t(stage0)], g0));
        ops.push_back(arrive(B.empty_k[size_t(stage0)]));
        for (int it = skip + 1; it < n_blocks; ++it) {
          const int g = it0 + it;
          const int stage = sm90::ring_stage<kStages>(g), prev = sm90::ring_stage<kStages>(g - 1);
          ops.push_back(wait(B.full_k[size_t(stage)], sm90::ring_phase<kStages>(g)));
          ops.push_back(wait(B.full_v[size_t(prev)], sm90::ring_phase<kStages>(g - 1)));
          ops.push_back(use(B.k[size_t(stage)], g, g));
          ops.push_back(use(B.v[size_t(prev)], g - 1, g - 1));
          ops.push_back(done(B.k[size_t(stage)], g));
          ops.push_back(arrive(B.empty_k[size_t(stage)]));
          ops.push_back(done(B.v[size_t(prev)], g - 1));
          ops.push_back(arrive(B.empty_v[size_t(prev)]));
        }
        if (separate_o) {  // every Q·Kᵀ done: sQ goes back before the last P·V
          ops.push_back(done(B.q, k));
          ops.push_back(arrive(B.empty_q));
        }
        const int last = it0 + n_blocks - 1, sl = sm90::ring_stage<kStages>(last);
        ops.push_back(wait(B.full_v[size_t(sl)], sm90::ring_phase<kStages>(last)));
        ops.push_back(use(B.v[size_t(sl)], last, last));
        ops.push_back(done(B.v[size_t(sl)], last));
        ops.push_back(arrive(B.empty_v[size_t(sl)]));
      }
    }
    // fwd/kernel.cuh after run(): a tile without keys waits for the producer's arrival (kEmptyTiles);
    // the epilogue stages O in sQ (O not separate), then sQ is released (O not separate, or no keys).
    if (n_blocks == 0 && v.empty_tiles) ops.push_back(wait(B.full_q, sm90::ring_phase<1>(ps.q_loads++)));
    if (!separate_o || n_blocks == 0) {
      if (!separate_o) {
        if (n_blocks > 0 && !skipped_all) {
          ops.push_back(done(B.q, k));
        } else {
          ops.push_back(use(B.q, -1, k));
          ops.push_back(done(B.q, -1));
        }
      }
      ops.push_back(arrive(B.empty_q));
    }
  }
  return ops;
}

// skips: per consumer, per tile (empty: none).
template <int kStages>
std::string check_fwd(const std::vector<int>& tiles, int consumers, bool separate_o,
                      const std::vector<std::vector<int>>& skips = {}, const FwdVariant& v = {}) {
  Protocol p;
  const FwdBars B = fwd_bars(p, kStages, consumers);
  p.parties.push_back(fwd_producer<kStages>(B, tiles, v));
  for (int c = 0; c < consumers; ++c)
    p.parties.push_back(fwd_consumer<kStages>(B, tiles, skips.empty() ? std::vector<int>{} : skips[size_t(c)], separate_o, v));
  return check(p);
}

const char* o_place(bool separate_o) { return separate_o ? "O separate" : "O in sQ"; }

// The forward's sQ alone: one key block per tile and one stage, so only sQ's hand-off varies; every
// pattern of 1–5 tiles with and without keys.
TEST(SyncMbarriers, ForwardSq) {
  for (int consumers : {2, 3})  // 128- and 192-row query tiles
    for (bool sep : {true, false}) {
      int n = 0;
      for (const auto& t : tile_patterns(5, {1, 0})) {
        const std::string e = check_fwd<1>(t, consumers, sep);
        EXPECT_EQ(e, "") << consumers << " consumers, " << o_place(sep) << ", tiles " << pattern(t);
        ++n;
      }
      std::printf("forward sQ, %d consumers, %s: %d tile patterns\n", consumers, o_place(sep), n);
    }
}

// The whole forward hand-off, K/V ring included: 1–3 tiles of 0–2 key blocks (2 consumers) and 1–2
// tiles (3 consumers), 2 and 3 stages.
template <int kStages>
void forward_ring(int consumers, int max_tiles) {
  for (bool sep : {true, false}) {
    int n = 0;
    for (const auto& t : tile_patterns(max_tiles, {0, 1, 2})) {
      EXPECT_EQ(check_fwd<kStages>(t, consumers, sep), "")
          << kStages << " stages, " << consumers << " consumers, " << o_place(sep) << ", tiles " << pattern(t);
      ++n;
    }
    std::printf("forward sQ + K/V ring, %d stages, %d consumers, %s: %d tile patterns\n", kStages, consumers,
                o_place(sep), n);
  }
}
TEST(SyncMbarriers, ForwardRing) {
  forward_ring<2>(2, 3);
  forward_ring<3>(2, 3);
  forward_ring<2>(3, 2);
  forward_ring<3>(3, 2);
}

// Causal warpgroups that skip a tile's last key blocks (kSkipMasked: d64 with 192-row tiles, 3
// consumers, 3 stages, O separate; d256, 2 consumers, 2 stages, O in sQ; and the other two
// combinations), each warpgroup any count 0 … the tile's blocks: 1–2 tiles of 0–2 key blocks (3
// consumers: at most 3 key blocks in all).
template <int kStages>
void forward_skips(int consumers, bool sep) {
  int n = 0;
  for (const auto& t : tile_patterns(2, {0, 1, 2})) {
    int total = 0;
    for (int b : t) total += b;
    if (consumers == 3 && total > 3) continue;
    // every warpgroup's skip vector: per tile 0 … t[k]
    const std::vector<std::vector<int>> per_wg = skip_vectors(t);
    std::vector<size_t> pick(size_t(consumers), 0);
    for (;;) {
      std::vector<std::vector<int>> skips;
      bool any = false;
      for (size_t c : pick) {
        skips.push_back(per_wg[c]);
        for (int s : per_wg[c]) any |= s > 0;
      }
      if (any) {
        EXPECT_EQ(check_fwd<kStages>(t, consumers, sep, skips), "")
            << kStages << " stages, " << consumers << " consumers, " << o_place(sep) << ", tiles " << pattern(t)
            << ", skips " << pattern(skips);
        ++n;
      }
      size_t c = 0;
      while (c < pick.size() && ++pick[c] == per_wg.size()) pick[c++] = 0;
      if (c == pick.size()) break;
    }
  }
  std::printf("forward with skipped key blocks, %d stages, %d consumers, %s: %d cases\n", kStages, consumers,
              o_place(sep), n);
}
TEST(SyncMbarriers, ForwardSkippedKeyBlocks) {
  forward_skips<3>(3, true);   // d64, 192-row tiles
  forward_skips<2>(2, false);  // d256
  forward_skips<2>(2, true);
  forward_skips<2>(3, true);
}

// The known-bad forward variants must be caught.
TEST(SyncMbarriers, ForwardKnownBadVariants) {
  FwdVariant no_empty;
  no_empty.empty_tiles = false;
  for (int consumers : {2, 3})
    for (bool sep : {true, false}) {
      int caught = 0, cases = 0;
      for (const auto& t : tile_patterns(5, {1, 0})) {
        const std::string e = check_fwd<1>(t, consumers, sep, {}, no_empty);
        caught += e.find("deadlock") != std::string::npos;
        ++cases;
      }
      EXPECT_NE(check_fwd<1>({0}, consumers, sep, {}, no_empty).find("deadlock"), std::string::npos)
          << "a tile without keys in the instance without kEmptyTiles, " << consumers << " consumers, " << o_place(sep)
          << ": the checker misses the deadlock";
      std::printf("  no arrival on full_q for a tile without keys (%d consumers, %s): deadlocks in %d of %d\n",
                  consumers, o_place(sep), caught, cases);
    }
  FwdVariant first_waits;
  first_waits.first_tile_waits_q = true;
  const std::string e1 = check_fwd<2>({1}, 2, true, {}, first_waits);
  EXPECT_NE(e1.find("deadlock"), std::string::npos) << "the first tile waiting for sQ's release: not caught";
  std::printf("  the first tile waiting for sQ's release: %s\n", e1.empty() ? "NOT caught" : e1.c_str());
  // A skipped stage released without waiting for its load: the release can complete the stage's
  // first phase before the producer's first wait (parity 1, a fresh barrier's pass), which then blocks.
  FwdVariant early;
  early.skip_without_wait = true;
  const std::string e2 = check_fwd<2>({2}, 2, true, {{1}, {1}}, early);
  EXPECT_NE(e2, "") << "a skipped stage released before its load: not caught";
  std::printf("  a skipped stage released before its load: %s\n", e2.empty() ? "NOT caught" : e2.c_str());
}

// ---- the backward: K/V once per tile, the Q/dO ring per step; tiles without steps skipped by both
// (a model of bwd/producer.cuh bwd_produce with bwd/kernel.cuh's load_step, and of the consumer
// loops of bwd/kernel.cuh and bwd/kernel_wide.cuh). Wide (d192/d256): Q in its own ring, dO in one
// buffer released mid-step.
struct BwdBars {
  int full_kv, empty_kv, kv, full_do, empty_do, dO;
  std::vector<int> full, empty, q;
};

Program bwd_producer(const BwdBars& B, const std::vector<int>& tiles, int stages, bool wide, bool load_empty_tiles) {
  Program ops;
  int it = 0, kv_loads = 0;
  for (int steps : tiles) {
    if (steps == 0 && !load_empty_tiles) continue;  // bwd_produce: `if (tc.steps == 0) continue;`
    ops.push_back(wait(B.empty_kv, uint32_t((kv_loads & 1) ^ 1)));
    ops.push_back(load(B.kv, kv_loads, B.full_kv));
    ++kv_loads;
    for (int s = 0; s < steps; ++s, ++it) {
      const int stage = it % stages;
      ops.push_back(wait(B.empty[size_t(stage)], uint32_t(((it / stages) & 1) ^ 1)));
      ops.push_back(load(B.q[size_t(stage)], it, B.full[size_t(stage)]));
      if (wide) {
        ops.push_back(wait(B.empty_do, uint32_t((it & 1) ^ 1)));
        ops.push_back(load(B.dO, it, B.full_do));
      }
    }
  }
  return ops;
}

Program bwd_consumer(const BwdBars& B, const std::vector<int>& tiles, int stages, bool wide) {
  Program ops;
  int it = 0, kv_loads = 0;
  for (int steps : tiles) {
    if (steps == 0) continue;  // `if (steps > 0) mbar_wait(full_kv, …)`, and no release
    const int kv = kv_loads;
    ops.push_back(wait(B.full_kv, uint32_t(kv_loads++ & 1)));
    ops.push_back(use(B.kv, kv, kv));
    for (int s = 0; s < steps; ++s, ++it) {
      const int stage = it % stages;
      ops.push_back(wait(B.full[size_t(stage)], uint32_t((it / stages) & 1)));
      ops.push_back(use(B.q[size_t(stage)], it, it));
      if (wide) {  // dO: both dV GEMMs, then released; Q until dK
        ops.push_back(wait(B.full_do, uint32_t(it & 1)));
        ops.push_back(use(B.dO, it, it));
        ops.push_back(done(B.dO, it));
        ops.push_back(arrive(B.empty_do));
      }
      ops.push_back(done(B.q[size_t(stage)], it));
      ops.push_back(arrive(B.empty[size_t(stage)]));
    }
    ops.push_back(done(B.kv, kv));
    ops.push_back(arrive(B.empty_kv));
  }
  return ops;
}

std::string check_bwd(const std::vector<int>& tiles, int stages, bool wide, bool load_empty_tiles = false) {
  const int consumers = 2;
  Protocol p;
  BwdBars B;
  B.full_kv = p.bar("full_kv", 1);
  B.empty_kv = p.bar("empty_kv", consumers);
  B.kv = p.slot("sK/sV");
  B.full_do = p.bar("full_do", 1);
  B.empty_do = p.bar("empty_do", consumers);
  B.dO = p.slot("sdO");
  for (int s = 0; s < stages; ++s) {
    B.full.push_back(p.bar("full" + std::to_string(s), 1));
    B.empty.push_back(p.bar("empty" + std::to_string(s), consumers));
    B.q.push_back(p.slot("sQ" + std::to_string(s)));
  }
  p.parties.push_back(bwd_producer(B, tiles, stages, wide, load_empty_tiles));
  for (int c = 0; c < consumers; ++c) p.parties.push_back(bwd_consumer(B, tiles, stages, wide));
  return check(p);
}

// 1–3 tiles of 0–3 query steps; Q and dO in a 2-stage ring (d64/d128), or Q in a 2-stage ring and
// dO in one buffer (d192/d256).
TEST(SyncMbarriers, Backward) {
  for (bool wide : {false, true}) {
    int n = 0;
    for (const auto& t : tile_patterns(3, {0, 1, 2, 3})) {
      EXPECT_EQ(check_bwd(t, 2, wide), "") << (wide ? "wide " : "") << "backward, tiles " << pattern(t);
      ++n;
    }
    std::printf("backward%s, 2 stages: %d tile patterns\n", wide ? " (wide: K/V + Q ring + dO buffer)" : " K/V + Q/dO ring", n);
  }
  // Known-bad: the producer loads K/V for a tile without steps, which the consumers skip.
  const std::string e = check_bwd({0, 1}, 2, false, true);
  EXPECT_NE(e, "") << "K/V loaded for a tile the consumers skip: not caught";
  std::printf("  K/V loaded for a tile without steps: %s\n", e.empty() ? "NOT caught" : e.c_str());
}

}  // namespace
