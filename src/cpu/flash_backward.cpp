// CPU flash backward: dQ, dK, dV from Q, K, V, O, dO and the forward's LSE, recomputing P tile by
// tile (no N×N buffer anywhere).
//
// Per (key tile, query tile), with D_i = rowsum(dO_i ∘ O_i) and lse in log2 units:
//   S  = (scale·log2e·Q) Kᵀ  (+softcap, mask)     (kBlockM, kBlockN)
//   P  = exp2(S − lse2)                            (kBlockM, kBlockN)
//   dP = dO Vᵀ                                     (kBlockM, kBlockN)
//   dS = P ∘ (dP − D) [∘ (1 − tanh²) with softcap]
//   dV += Pᵀ dO,  dK += dSᵀ Q,  dQ += dS K         (scale folded in at the stores)
// P is exp(S − LSE) with the LSE and D with the O the caller passes: a caller that splits the keys
// (a ring's blocks) passes the whole row's LSE and O and gets its block's share of the gradients.
// With a 16-bit O, a row whose whole softmax lies in one key tile takes D = Σ P·dP from the tile
// (see backward_step).
//
// Threading and determinism (no atomics; bitwise identical for any thread count or schedule):
// work unit = (batch, KV head, key chunk c). The key tiles of a (batch, KV head) pair are dealt
// round-robin to kChunks chunks (tile t goes to chunk t % kChunks, which balances causal work).
// A unit owns its key tiles' dK/dV outright: it sums over the query heads sharing the KV head
// (GQA) and over query tiles in a fixed order and stores them once. dQ, which every key tile
// touches, goes to the unit's private fp32 accumulator (group heads × q_len × d_pad); after the
// parallel loop each dQ row is summed over c = 0, 1, … in that order and stored with the scale.
// kChunks depends on the shape only (never on the thread count): enough units for the threads
// while the extra memory, kChunks × |dQ| in fp32, stays linear in N.
//
// Per-row inputs (qmult·Q and dO in fp32, D_i, lse2_i) are prepared once for all query heads
// before the key-tile loop (another 2·|Q| fp32): every key tile re-reads them contiguous, instead
// of re-converting the strided tensor rows and recomputing D_i per (key tile, query tile).
// Kᵀ and Vᵀ copies stay: they are built once per key tile and feed OpenBLAS's NN path, which
// measured 10-25 % faster here than gemm_nt on K/V rows (docs/perf/log.md, P-017).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/backend.hpp"
#include "cpu/flash_common.hpp"
#include "cpu/isa.hpp"

namespace flashattn::cpu {

namespace {

// Units wanted: shape-derived, so results never depend on the number of threads.
constexpr int64_t kTargetUnits = 16;
constexpr int64_t kMaxChunks = 8;

struct BackwardScratch {
  int64_t d_pad;
  detail::Scratch<float> k, kt, vtmp, vt, s, ds, t, dk, dv;
  std::vector<KeyRange> range;
  BackwardScratch(int64_t d, int64_t d_pad_)
      : d_pad(d_pad_),
        k(zeroed(size_t(BwdTiles::kBlockN * d_pad_))),
        kt(zeroed(size_t(d * BwdTiles::kBlockN))),
        vtmp(zeroed(size_t(BwdTiles::kBlockN * d_pad_))),
        vt(zeroed(size_t(d * BwdTiles::kBlockN))),
        s(zeroed(size_t(BwdTiles::kBlockM * BwdTiles::kBlockN))),
        ds(zeroed(size_t(BwdTiles::kBlockM * BwdTiles::kBlockN))),
        t(zeroed(size_t(BwdTiles::kBlockM * BwdTiles::kBlockN))),
        dk(zeroed(size_t(BwdTiles::kBlockN * d_pad_))),
        dv(zeroed(size_t(BwdTiles::kBlockN * d_pad_))),
        range(BwdTiles::kBlockM) {}
};

// Per-query-row inputs of one query head, prepared once before the key-tile loop (rows of one
// (pair, group head) are contiguous): qmult·Q and dO in fp32 (ld d_pad, zero padding), D and lse2.
struct RowInputs {
  const float* q;
  const float* dout;
  const float* dsum;
  const float* lse2;
};

// One (key tile, query tile) step for one query head (its rows in `in`): updates w.dk, w.dv and
// dq_acc rows [i0, i0+mq).
void backward_step(const detail::Params& p, const TileKernels& tk, const detail::SeqSpan& sp,
                   int64_t j0, int nk, int64_t i0, int mq, const RowInputs& in,
                   float* dq_acc, BackwardScratch& w) {
  constexpr int BN = BwdTiles::kBlockN;
  const int d = int(p.head_dim);
  const int64_t d_pad = w.d_pad;
  const int nk_pad = int(pad_n(nk));
  const bool capped = p.softcap > 0;
  const float* q = in.q + i0 * d_pad;
  const float* dout = in.dout + i0 * d_pad;
  const float* dsum = in.dsum + i0;
  const float* lse2 = in.lse2 + i0;
  for (int r = 0; r < mq; ++r) w.range[r] = detail::visible_keys(p, i0 + r, sp.q_len, sp.k_len);

  float* sS = w.s.data();   // S, then P
  float* sdS = w.ds.data();  // dP, then dS
  float* sT = capped ? w.t.data() : nullptr;
  tk.gemm(mq, nk_pad, d, q, d_pad, 1, w.kt.data(), BN, sS, BN, nullptr, false);
  if (capped)
    for (int r = 0; r < mq; ++r) tk.softcap(sS + r * BN, nk, p.softcap, kLog2e, sT + r * BN);
  mask_tile(w.range.data(), mq, j0, nk, sS, BN);
  // A 16-bit O carries its own rounding (2^-9 relative for bf16) into D = dO·O. A row whose visible
  // keys all lie in this tile and whose P, from the given LSE, sums to 1 within kWholeRow holds
  // its whole softmax here: it takes D = Σ_j P_j·dP_j from the tile instead, the same quantity
  // without O's rounding. A caller that passes the LSE of a larger key set (a ring's block) sees
  // a sum short of 1 by the other keys' share and keeps D from O, unless that share is below
  // kWholeRow, where the two D differ by less than O's own rounding.
  const bool wide_o = p.dtype != DType::f32;
  constexpr float kWholeRow = 0x1p-12f;
  float row_sum[BwdTiles::kBlockM];
  for (int r = 0; r < mq; ++r) {
    float* row = sS + r * BN;
    row_sum[r] = 0.0f;
    if (lse2[r] == -std::numeric_limits<float>::infinity()) std::fill(row, row + nk, 0.0f);  // row sees no key
    else row_sum[r] = tk.exp2_sum(row, nk, lse2[r]);
  }
  tk.gemm(mq, nk_pad, d, dout, d_pad, 1, w.vt.data(), BN, sdS, BN, nullptr, false);
  for (int r = 0; r < mq; ++r) {
    // A row that sees a single key, in this tile: its dP is taken by the same dot product as its
    // D = dO·O, so that when O is that key's V (the row's whole softmax is the one key) dP − D is 0
    // exactly and the row adds nothing to dQ and dK, as softmax's derivative says; a GEMM's other
    // summation order would leave an fp32 residue that dK sums over every row seeing the key.
    // Otherwise (O from a larger key set, as a ring's block passes it) dS follows the same formula.
    const KeyRange kr = w.range[r];
    const bool in_tile = kr.lo >= j0 && kr.hi <= j0 + nk;
    float D = dsum[r];
    if (in_tile && kr.hi - kr.lo == 1)
      sdS[r * BN + (kr.lo - j0)] = tk.dot(dout + r * d_pad, w.vtmp.data() + (kr.lo - j0) * d_pad, d);
    else if (in_tile && wide_o && std::abs(row_sum[r] - 1.0f) <= kWholeRow)
      D = tk.dot(sS + r * BN, sdS + r * BN, nk);
    tk.dsoftmax(sS + r * BN, sdS + r * BN, D, sT ? sT + r * BN : nullptr, nk, sdS + r * BN);
  }

  // dV += Pᵀ dO and dK += dSᵀ Q: (nk, d_pad), A read through the transposed view (rsa 1, csa BN).
  tk.gemm(nk, int(d_pad), mq, sS, 1, BN, dout, d_pad, w.dv.data(), d_pad, nullptr, true);
  tk.gemm(nk, int(d_pad), mq, sdS, 1, BN, q, d_pad, w.dk.data(), d_pad, nullptr, true);
  // dQ += dS K: (mq, d_pad)
  tk.gemm(mq, int(d_pad), nk, sdS, BN, 1, w.k.data(), d_pad, dq_acc + i0 * d_pad, d_pad, nullptr, true);
}

}  // namespace

void flash_backward(const detail::Params& p) {
  constexpr int BM = BwdTiles::kBlockM, BN = BwdTiles::kBlockN;
  const TileKernels& tk = tile_kernels();
  const int64_t d = p.head_dim, d_pad = pad_n(d), G = p.group_size();
  const int64_t pairs = p.batch * p.heads_kv;
  if (pairs == 0) return;
  const size_t esz = dtype_bytes(p.dtype);
  const bool capped = p.softcap > 0;
  const float qmult = capped ? p.scale : p.scale * kLog2e;
  const float dk_mult = p.scale / qmult;  // dK = scale·dSᵀ Q, and sQ holds qmult·Q

  // Chunks per pair and the dQ accumulators' offsets (per pair: chunks × G × q_len × d_pad).
  int64_t max_tiles = 0;
  std::vector<int64_t> acc_off(size_t(pairs) + 1, 0);
  for (int64_t b = 0; b < p.batch; ++b)
    max_tiles = std::max(max_tiles, (detail::seq_span(p, b).k_len + BN - 1) / BN);
  const int64_t chunks = std::clamp<int64_t>((kTargetUnits + pairs - 1) / pairs, 1,
                                             std::clamp<int64_t>(max_tiles, 1, kMaxChunks));
  for (int64_t pr = 0; pr < pairs; ++pr)
    acc_off[size_t(pr) + 1] =
        acc_off[size_t(pr)] + chunks * G * detail::seq_span(p, pr / p.heads_kv).q_len * d_pad;
  detail::Scratch<float> dq_acc(size_t(acc_off.back()));  // zeroed by the unit that owns each part
  const int64_t units = pairs * chunks;

  // Row inputs of every query head, prepared once (not once per key tile): rows of pair pr start
  // at row_off[pr], group head g of it at row_off[pr] + g·q_len. 2·|Q| floats + 2 per row.
  std::vector<int64_t> row_off(size_t(pairs) + 1, 0);
  for (int64_t pr = 0; pr < pairs; ++pr)
    row_off[size_t(pr) + 1] = row_off[size_t(pr)] + G * detail::seq_span(p, pr / p.heads_kv).q_len;
  const int64_t rows_all = row_off.back();
  detail::Scratch<float> q_all(static_cast<size_t>(rows_all * d_pad));
  detail::Scratch<float> do_all(static_cast<size_t>(rows_all * d_pad));
  detail::Scratch<float> dsum_all(static_cast<size_t>(rows_all));
  detail::Scratch<float> lse2_all(static_cast<size_t>(rows_all));
  const int64_t row_blocks = (rows_all + BM - 1) / BM;

#pragma omp parallel
  {
    BackwardScratch w(d, d_pad);
    {
      detail::Scratch<float> orow(zeroed(size_t(d_pad)));
      const char* obase = static_cast<const char*>(p.out.data);
#pragma omp for schedule(static)
      for (int64_t rb = 0; rb < row_blocks; ++rb) {
        const int64_t r1 = std::min(rows_all, (rb + 1) * BM);
        for (int64_t r = rb * BM; r < r1; ++r) {
          const int64_t pr = int64_t(std::upper_bound(row_off.begin(), row_off.end(), r) - row_off.begin()) - 1;
          const int64_t b = pr / p.heads_kv, hk = pr % p.heads_kv;
          const detail::SeqSpan sp = detail::seq_span(p, b);
          const int64_t g = (r - row_off[size_t(pr)]) / sp.q_len, i = (r - row_off[size_t(pr)]) % sp.q_len;
          const int64_t h = hk * G + g;
          float* qr = q_all.data() + r * d_pad;
          float* dor = do_all.data() + r * d_pad;
          load_rows(p, tk, p.q, sp, sp.q_start, h, i, 1, qmult, qr, d_pad);
          load_rows(p, tk, p.dout, sp, sp.q_start, h, i, 1, 1.0f, dor, d_pad);
          std::fill(qr + d, qr + d_pad, 0.0f);
          std::fill(dor + d, dor + d_pad, 0.0f);
          tk.load(obase + p.out.offset(sp.batch_index, sp.q_start + i, h) * int64_t(esz), p.dtype,
                  int(d), 1.0f, orow.data());
          dsum_all[size_t(r)] = tk.dot(dor, orow.data(), int(d));
          lse2_all[size_t(r)] = p.lse.data[p.lse.offset(sp.batch_index, h, sp.q_start + i)] * kLog2e;
        }
      }
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t pr = u / chunks, c = u % chunks;
      const int64_t b = pr / p.heads_kv, hk = pr % p.heads_kv;
      const detail::SeqSpan sp = detail::seq_span(p, b);
      float* acc = dq_acc.data() + acc_off[size_t(pr)] + c * G * sp.q_len * d_pad;  // (G, q_len, d_pad)
      std::fill(acc, acc + G * sp.q_len * d_pad, 0.0f);
      const int64_t ntiles = (sp.k_len + BN - 1) / BN;
      for (int64_t kt = c; kt < ntiles; kt += chunks) {
        const int64_t j0 = kt * BN;
        const int nk = int(std::min<int64_t>(BN, sp.k_len - j0));
        load_rows(p, tk, p.k, sp, sp.k_start, hk, j0, nk, 1.0f, w.k.data(), d_pad);
        transpose_tile(w.k.data(), nk, int(d), d_pad, w.kt.data(), BN);
        load_rows(p, tk, p.v, sp, sp.k_start, hk, j0, nk, 1.0f, w.vtmp.data(), d_pad);
        transpose_tile(w.vtmp.data(), nk, int(d), d_pad, w.vt.data(), BN);
        std::fill(w.dk.data(), w.dk.data() + w.dk.size(), 0.0f);
        std::fill(w.dv.data(), w.dv.data() + w.dv.size(), 0.0f);

        // Query rows that see at least one key of [j0, j1): contiguous, since every row's visible
        // range [lo, hi) moves right with the row (bottom-right aligned window).
        const int64_t j1 = j0 + nk;
        int64_t i_lo = 0, i_hi = sp.q_len;
        if (p.window_right >= 0) i_lo = std::max<int64_t>(0, j0 - sp.k_len + sp.q_len - p.window_right);
        if (p.window_left >= 0) i_hi = std::min<int64_t>(sp.q_len, j1 - sp.k_len + sp.q_len + p.window_left);
        for (int64_t g = 0; g < G; ++g) {
          float* acc_h = acc + g * sp.q_len * d_pad;
          const int64_t r0 = row_off[size_t(pr)] + g * sp.q_len;
          const RowInputs in{q_all.data() + r0 * d_pad, do_all.data() + r0 * d_pad,
                             dsum_all.data() + r0, lse2_all.data() + r0};
          for (int64_t i0 = i_lo; i0 < i_hi; i0 += BM)
            backward_step(p, tk, sp, j0, nk, i0, int(std::min<int64_t>(BM, i_hi - i0)), in, acc_h,
                          w);
        }

        char* dkb = static_cast<char*>(p.dk.data);
        char* dvb = static_cast<char*>(p.dv.data);
        for (int r = 0; r < nk; ++r) {
          const int64_t j = sp.k_start + j0 + r;
          tk.store(&w.dk[size_t(r * d_pad)], int(d), dk_mult, p.dtype,
                   dkb + p.dk.offset(sp.batch_index, j, hk) * int64_t(esz));
          tk.store(&w.dv[size_t(r * d_pad)], int(d), 1.0f, p.dtype,
                   dvb + p.dv.offset(sp.batch_index, j, hk) * int64_t(esz));
        }
      }
    }

    // dQ = scale · Σ_c acc[c], summed in chunk order: the fixed-order reduction. The pair's key
    // padding (rows past seqused_k, which no unit visits) gets its zero dK, dV here.
    detail::Scratch<float> row(static_cast<size_t>(d_pad));
#pragma omp for schedule(static)
    for (int64_t pr = 0; pr < pairs; ++pr) {
      const int64_t b = pr / p.heads_kv, hk = pr % p.heads_kv;
      const detail::SeqSpan sp = detail::seq_span(p, b);
      zero_key_padding(p, sp, hk);
      const int64_t per_chunk = G * sp.q_len * d_pad;
      const float* acc = dq_acc.data() + acc_off[size_t(pr)];
      char* dqb = static_cast<char*>(p.dq.data);
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < sp.q_len; ++i) {
          const float* src = acc + (g * sp.q_len + i) * d_pad;
          std::copy(src, src + d, row.data());
          for (int64_t c = 1; c < chunks; ++c)
            for (int64_t e = 0; e < d; ++e) row[size_t(e)] += src[c * per_chunk + e];
          tk.store(row.data(), int(d), p.scale, p.dtype,
                   dqb + p.dq.offset(sp.batch_index, sp.q_start + i, hk * G + g) * int64_t(esz));
        }
    }
  }
}

}  // namespace flashattn::cpu
