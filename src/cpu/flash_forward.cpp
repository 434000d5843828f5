// CPU flash forward: O = softmax(scale · Q Kᵀ + mask) V without materializing S or P.
//
// Work item = (batch, head, query tile of kBlockM rows), spread over OpenMP threads with a dynamic
// schedule (causal tiles differ in cost). Per item the thread keeps, in its private scratch:
//   sQ   (kBlockM, d_pad)   the query tile in fp32, pre-multiplied by scale·log2(e)
//   sK   (kBlockN, d_pad)   the key tile converted to fp32 (f16/bf16 only: fp32 K is read in
//   sV   (kBlockN, d_pad)   place, S = Q Kᵀ through gemm_nt), and the value tile likewise
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
  detail::Scratch<float> q, k, v, s, acc, alpha;
  std::vector<State> state;
  std::vector<KeyRange> range;
  // kv_rows: rows of the converted K and V tiles; 0 when the GEMMs read K and V in place.
  ForwardScratch(int64_t d_pad_, int64_t kv_rows)
      : d_pad(d_pad_),
        q(zeroed(size_t(FwdTiles::kBlockM * d_pad_))),
        k(zeroed(size_t(kv_rows * d_pad_))),
        v(zeroed(size_t(kv_rows * d_pad_))),
        s(zeroed(size_t(FwdTiles::kBlockM * FwdTiles::kBlockN))),
        acc(zeroed(size_t(FwdTiles::kBlockM * d_pad_))),
        alpha(zeroed(FwdTiles::kBlockM)),
        state(FwdTiles::kBlockM),
        range(FwdTiles::kBlockM) {}
};

// fp32 K and V need no conversion: the GEMMs read their rows where they lie. cblas wants an int
// leading dimension of at least the row width, so other layouts (e.g. a broadcast row stride of 0)
// are converted into the tile buffers like f16/bf16.
bool reads_kv_in_place(const detail::Params& p) {
  const auto fits = [&](int64_t ld) { return ld >= p.head_dim && ld <= std::numeric_limits<int>::max(); };
  return p.dtype == DType::f32 && fits(p.k.row_stride) && fits(p.v.row_stride);
}

// Rows of one key tile as the GEMMs read them: in place (fp32 tensors, the tensor's own row
// stride), or converted to fp32 in the thread's scratch (f16/bf16).
struct KvTile {
  const float* rows;
  int64_t ld;
};

KvTile kv_tile(const detail::Params& p, const TileKernels& tk, const detail::TensorRef& t,
               const detail::SeqSpan& sp, int64_t hk, int64_t j0, int nk, bool in_place,
               float* scratch, int64_t d_pad) {
  if (in_place)
    return {static_cast<const float*>(t.data) + t.offset(sp.batch_index, sp.k_start + j0, hk),
            t.row_stride};
  load_rows(p, tk, t, sp, sp.k_start, hk, j0, nk, 1.0f, scratch, d_pad);
  return {scratch, d_pad};
}

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
  const bool in_place = reads_kv_in_place(p);

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
    const KvTile k = kv_tile(p, tk, p.k, sp, hk, j0, nk, in_place, w.k.data(), d_pad);
    const KvTile v = kv_tile(p, tk, p.v, sp, hk, j0, nk, in_place, w.v.data(), d_pad);

    // S = (scale·log2e·Q) Kᵀ, (mq, nk): columns past nk are never read.
    tk.gemm_nt(mq, nk, d, w.q.data(), d_pad, k.rows, k.ld, sS, BN);
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
    // acc = acc ∘ alpha + P V, (mq, d): acc's padding columns stay zero.
    tk.gemm(mq, d, nk, sS, BN, 1, v.rows, v.ld, w.acc.data(), d_pad, w.alpha.data(), true);
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
    ForwardScratch w(d_pad, reads_kv_in_place(p) ? 0 : FwdTiles::kBlockN);
    // Head-major, descending: the threads work through one head's query tiles together, so that
    // head's K and V (4 MiB at N = 4096, d = 128) are re-read from L3 rather than DRAM (measured
    // +2-7 %, docs/perf/log.md, P-014); within a head the last query tiles of a causal sequence (the most
    // keys) start first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = items - 1; it >= 0; --it) {
      const int64_t h = it / per_head, t = it % per_head;
      const int64_t b = int64_t(std::upper_bound(tiles.begin(), tiles.end(), t) - tiles.begin()) - 1;
      const detail::SeqSpan sp = detail::seq_span(p, b);
      const int64_t i0 = (t - tiles[size_t(b)]) * BM;
      forward_tile(p, tk, sp, h, i0, int(std::min<int64_t>(BM, sp.q_len - i0)), w);
    }
  }
}

}  // namespace flashattn::cpu
