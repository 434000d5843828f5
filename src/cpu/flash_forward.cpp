// CPU flash forward: O = softmax(scale · Q Kᵀ + mask) V without materializing S or P.
//
// Work item = (batch, head, query tile of kBlockM rows), spread over OpenMP threads with a dynamic
// schedule (causal tiles differ in cost). Per item the thread keeps, in its private scratch:
//   sQ   (kBlockM, d_pad)   the query tile in fp32, pre-multiplied by scale·log2(e)
//   sK   (kBlockN, d_pad)   the key tile in fp32, and
//   sKt  (d, kBlockN)       the same transposed (the B operand of S = Q Kᵀ)
//   sV   (kBlockN, d_pad)   the value tile
//   sS   (kBlockM, kBlockN) scores, then probabilities, of one key tile
//   acc  (kBlockM, d_pad)   the running output, normalized once at the end
// and one SoftmaxState<float, kLog2 = true> per row (row_max, row_sum). Scratch is O(tile):
// independent of the sequence length. Sizes and the cache budget: docs/cpu-kernels.md.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "core/backend.hpp"
#include "cpu/flash_common.hpp"
#include "cpu/isa.hpp"
#include "flashattn/online_softmax.hpp"

namespace flashattn::cpu {

namespace {

using State = SoftmaxState<float, /*kLog2=*/true>;

struct ForwardScratch {
  int64_t d_pad;
  detail::Scratch<float> q, k, kt, v, s, acc, alpha;
  std::vector<State> state;
  std::vector<KeyRange> range;
  explicit ForwardScratch(int64_t d, int64_t d_pad_)
      : d_pad(d_pad_),
        q(zeroed(size_t(FwdTiles::kBlockM * d_pad_))),
        k(zeroed(size_t(FwdTiles::kBlockN * d_pad_))),
        kt(zeroed(size_t(d * FwdTiles::kBlockN))),
        v(zeroed(size_t(FwdTiles::kBlockN * d_pad_))),
        s(zeroed(size_t(FwdTiles::kBlockM * FwdTiles::kBlockN))),
        acc(zeroed(size_t(FwdTiles::kBlockM * d_pad_))),
        alpha(zeroed(FwdTiles::kBlockM)),
        state(FwdTiles::kBlockM),
        range(FwdTiles::kBlockM) {}
};

// One query tile of one (batch, head): rows [i0, i0 + mq) of sequence `sp`.
void forward_tile(const detail::Params& p, const TileKernels& tk, const detail::SeqSpan& sp,
                  int64_t h, int64_t i0, int mq, ForwardScratch& w) {
  constexpr int BN = FwdTiles::kBlockN;
  const int d = int(p.head_dim);
  const int64_t d_pad = w.d_pad;
  const int64_t hk = h / p.group_size();
  const DType dt = p.dtype;
  const size_t esz = dtype_bytes(dt);
  const bool capped = p.softcap > 0;
  const float qmult = capped ? p.scale : p.scale * kLog2e;

  // Visible key range per row; the key tiles to visit cover their union.
  int64_t kmin = sp.k_len, kmax = 0;
  for (int r = 0; r < mq; ++r) {
    w.range[r] = detail::visible_keys(p, i0 + r, sp.q_len, sp.k_len);
    if (w.range[r].lo < w.range[r].hi) {
      kmin = std::min(kmin, w.range[r].lo);
      kmax = std::max(kmax, w.range[r].hi);
    }
  }

  load_rows(p, tk, p.q, sp, sp.q_start, h, i0, mq, qmult, w.q.data(), d_pad);
  for (int r = 0; r < mq; ++r) w.state[r] = State{};
  std::fill(w.acc.data(), w.acc.data() + mq * d_pad, 0.0f);

  float* sS = w.s.data();
  for (int64_t j0 = kmin / BN * BN; j0 < kmax; j0 += BN) {
    const int nk = int(std::min<int64_t>(BN, sp.k_len - j0));
    const int nk_pad = int(pad_n(nk));
    load_rows(p, tk, p.k, sp, sp.k_start, hk, j0, nk, 1.0f, w.k.data(), d_pad);
    transpose_tile(w.k.data(), nk, d, d_pad, w.kt.data(), BN);
    load_rows(p, tk, p.v, sp, sp.k_start, hk, j0, nk, 1.0f, w.v.data(), d_pad);

    // S = (scale·log2e·Q) Kᵀ, (mq, nk_pad)
    tk.gemm(mq, nk_pad, d, w.q.data(), d_pad, 1, w.kt.data(), BN, sS, BN, nullptr, false);
    if (capped)
      for (int r = 0; r < mq; ++r) tk.softcap(sS + r * BN, nk, p.softcap, kLog2e, nullptr);
    mask_tile(w.range.data(), mq, j0, nk, sS, BN);

    // Online softmax, row by row: the state does the bookkeeping, the table the vector work.
    for (int r = 0; r < mq; ++r) {
      float* srow = sS + r * BN;
      State& st = w.state[r];
      w.alpha[r] = st.begin_tile(tk.row_max(srow, nk));
      if (st.row_max == softmax_math::neg_inf<float>()) {
        std::fill(srow, srow + nk, 0.0f);  // nothing visible yet: P = 0, no exp of -inf - -inf
      } else {
        st.add_sum(tk.exp2_sum(srow, nk, st.exp_offset()));
      }
    }
    // acc = acc ∘ alpha + P V, (mq, d_pad)
    tk.gemm(mq, int(d_pad), nk, sS, BN, 1, w.v.data(), d_pad, w.acc.data(), d_pad, w.alpha.data(),
            true);
  }

  // One normalization at the end: O = acc / row_sum (0 for empty rows), LSE in natural log.
  char* obase = static_cast<char*>(p.out.data);
  for (int r = 0; r < mq; ++r) {
    const int64_t off = p.out.offset(sp.batch_index, sp.q_start + i0 + r, h);
    tk.store(&w.acc[size_t(r * d_pad)], d, w.state[r].inv_sum(), dt, obase + off * int64_t(esz));
    if (p.lse.data) p.lse.data[p.lse.offset(sp.batch_index, h, sp.q_start + i0 + r)] = w.state[r].lse();
  }
}

}  // namespace

void flash_forward(const detail::Params& p) {
  constexpr int BM = FwdTiles::kBlockM;
  const TileKernels& tk = tile_kernels();
  // Query tiles per sequence, as a prefix sum so that one flat index covers (b, tile).
  std::vector<int64_t> tiles(size_t(p.batch) + 1, 0);
  for (int64_t b = 0; b < p.batch; ++b)
    tiles[size_t(b) + 1] = tiles[size_t(b)] + (detail::seq_span(p, b).q_len + BM - 1) / BM;
  const int64_t per_head = tiles.back();
  const int64_t items = per_head * p.heads;
  if (items == 0) return;
  const int64_t d_pad = pad_n(p.head_dim);

#pragma omp parallel
  {
    ForwardScratch w(p.head_dim, d_pad);
    // Descending item index: the last query tiles of a causal sequence (the most keys) start first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = items - 1; it >= 0; --it) {
      const int64_t t = it / p.heads, h = it % p.heads;
      const int64_t b = int64_t(std::upper_bound(tiles.begin(), tiles.end(), t) - tiles.begin()) - 1;
      const detail::SeqSpan sp = detail::seq_span(p, b);
      const int64_t i0 = (t - tiles[size_t(b)]) * BM;
      forward_tile(p, tk, sp, h, i0, int(std::min<int64_t>(BM, sp.q_len - i0)), w);
    }
  }
}

}  // namespace flashattn::cpu
