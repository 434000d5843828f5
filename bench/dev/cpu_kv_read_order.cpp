// One core reading a packed KV cache ((tokens, 8 heads, 256 bytes) for K and for V, 64-token
// chunks, K then V) in the orders the CPU decode kernels use, with no arithmetic: 0 memory order;
// 1 blocks of 4 tokens head by head (scores); 3 that with a software prefetch 64 tokens ahead;
// 4 each block first read once in memory order, then head by head (touch_block); 5/6/7 a
// prefetch 4/16/32 tokens ahead in memory order. Each pass after a 512 MB read of another buffer.
//   g++ -O2 -mavx512f -std=c++17 bench/dev/cpu_kv_read_order.cpp -o cpu_kv_read_order && ./cpu_kv_read_order
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
int main() {
  const int N = 32768, Hkv = 8, row = 256, tok = Hkv * row; const size_t n = size_t(N) * tok;
  char* k = static_cast<char*>(std::aligned_alloc(64, n + 64 * tok)); char* v = static_cast<char*>(std::aligned_alloc(64, n + 64 * tok));
  std::memset(k, 1, n + 64 * tok); std::memset(v, 2, n + 64 * tok);
  const size_t fl = size_t(512) << 20; char* f = static_cast<char*>(std::aligned_alloc(64, fl)); std::memset(f, 3, fl);
  auto flush = [&] { volatile long s = 0; for (size_t j = 0; j < fl; j += 64) s += f[j]; };
  for (int mode : {0, 1, 3, 4, 5, 6, 7}) for (int rep = 0; rep < 3; ++rep) {
    flush();
    auto t0 = std::chrono::steady_clock::now();
    __m512i x = _mm512_setzero_si512();
    for (int c0 = 0; c0 < N; c0 += 64) {  // chunks of 64 tokens: K then V
      for (char* buf : {k, v}) {
        if (mode == 0) {  // sequential
          for (size_t j = size_t(c0) * tok; j < size_t(c0 + 64) * tok; j += 64) x = _mm512_add_epi32(x, _mm512_load_si512(buf + j));
        } else if (mode == 1) {  // blocks of 4 tokens, head by head (scores)
          for (int t = c0; t < c0 + 64; t += 4) for (int h = 0; h < Hkv; ++h) for (int j = 0; j < 4; ++j)
            for (int l = 0; l < row; l += 64) x = _mm512_add_epi32(x, _mm512_load_si512(buf + size_t(t + j) * tok + h * row + l));
        } else if (mode == 2) {  // blocks of 8 tokens, head by head (accumulate)
          for (int t = c0; t < c0 + 64; t += 8) for (int h = 0; h < Hkv; ++h) for (int j = 0; j < 8; ++j)
            for (int l = 0; l < row; l += 64) x = _mm512_add_epi32(x, _mm512_load_si512(buf + size_t(t + j) * tok + h * row + l));
        } else if (mode >= 4) {  // 4: touch the block in memory order first; 5/6/7: prefetch 4/16/32 tokens ahead in memory order
          const int dist = mode == 5 ? 4 : mode == 6 ? 16 : 32;
          for (int t = c0; t < c0 + 64; t += 4) {
            if (mode == 4) for (int l = 0; l < 4 * tok; l += 64) x = _mm512_add_epi32(x, _mm512_load_si512(buf + size_t(t) * tok + l));
            else for (int l = 0; l < 4 * tok; l += 64) _mm_prefetch(buf + size_t(t + dist) * tok + l, _MM_HINT_T0);
            for (int h = 0; h < Hkv; ++h) for (int j = 0; j < 4; ++j)
              for (int l = 0; l < row; l += 64) x = _mm512_add_epi32(x, _mm512_load_si512(buf + size_t(t + j) * tok + h * row + l));
          }
        } else {  // mode 1 with a software prefetch of the block 64 tokens ahead
          for (int t = c0; t < c0 + 64; t += 4) {
            for (int l = 0; l < 4 * tok; l += 64) _mm_prefetch(buf + size_t(t + 64) * tok + l, _MM_HINT_T0);
            for (int h = 0; h < Hkv; ++h) for (int j = 0; j < 4; ++j)
              for (int l = 0; l < row; l += 64) x = _mm512_add_epi32(x, _mm512_load_si512(buf + size_t(t + j) * tok + h * row + l));
          }
        }
      }
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("mode %d: %.1f GB/s (%d)\n", mode, 2.0 * n / (ms * 1e6), _mm512_reduce_add_epi32(x) & 1);
  }
}
