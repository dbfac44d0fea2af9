// The diagonal square of a causal query block, multiplied over its lower triangle only (attention.cc).
//
// Why: a query block of m rows multiplies the keys its last row sees; the last m of them form an m x m square
// whose upper triangle is masked. MKL multiplies the whole square: at bench's shape (s = 256, 64-row blocks) the
// squares are 40 % of the pairs the blocks multiply and take 2.25 of the 5.6 ms of attention's GEMMs per layer
// (Zen 4, docs/PERFORMANCE.md §3.16). These AVX-512 tiles compute the square's three product forms in tiles of
// 8 rows (or keys) that stop at the diagonal, so 56-63 % of the square is multiplied. The rest of each block
// (the keys before the square) stays one MKL sgemm. head_dim must be a multiple of 16 (up to 128, or 256); other
// head_dims and CPUs without AVX-512 take MKL for the whole block.
//
// The square's rows r and keys j both run 0 .. m-1, key j being the r-th row's own position when j == r: row r
// sees keys j <= r. In the [m, w] block buffers (scores, probabilities, their gradients) the square starts at
// column `off` (the keys before it). Every tile reads entries above the diagonal as they are in those buffers:
// the probabilities hold exact zeros there (the forward writes them) and so does dS = P * (dP - rowsum), as long
// as dP is finite, which `diag_scores` ensures by zeroing the columns its tiles do not reach.
#pragma once

#include "common.h"

#if defined(__AVX512F__)
#include <immintrin.h>

namespace pcl {
constexpr int64_t kTileRows = 8;


inline __mmask16 lanes_below(int64_t n) { return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u); }

// C[r, off + j] = alpha * sum_d A[r, d] * B[j, d] for the tiles of 8 rows x 16 keys that reach j <= r; the columns
// of [off, off + m) no tile reaches are zeroed. `bt` is a scratch of d * round_up(m, 16) floats (B transposed).
inline void diag_scores(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t off,
                        int64_t m, int64_t d, float alpha, float* bt) {
  const int64_t mp = (m + 15) / 16 * 16;
  for (int64_t k = 0; k < d; ++k) {  // bt [d, mp]: key j of B as column j, zero past m
    float* row = bt + k * mp;
    for (int64_t j = 0; j < m; ++j) row[j] = b[j * ldb + k];
    for (int64_t j = m; j < mp; ++j) row[j] = 0.f;
  }
  const __m512 al = _mm512_set1_ps(alpha);
  for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
    const int64_t rows = std::min(kTileRows, m - r0), last = r0 + rows - 1;  // the group's last row sees keys <= last
    for (int64_t j0 = 0; j0 <= last; j0 += 16) {
      __m512 acc[kTileRows];
      for (int64_t t = 0; t < kTileRows; ++t) acc[t] = _mm512_setzero_ps();
      const float* ar = a + r0 * lda;
      if (rows == kTileRows) {
        for (int64_t k = 0; k < d; ++k) {
          const __m512 bv = _mm512_loadu_ps(bt + k * mp + j0);
#pragma GCC unroll 8
          for (int64_t t = 0; t < kTileRows; ++t) acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(ar[t * lda + k]), bv, acc[t]);
        }
      } else {
        for (int64_t k = 0; k < d; ++k) {
          const __m512 bv = _mm512_loadu_ps(bt + k * mp + j0);
          for (int64_t t = 0; t < rows; ++t) acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(ar[t * lda + k]), bv, acc[t]);
        }
      }
      const __mmask16 keep = lanes_below(m - j0);
      for (int64_t t = 0; t < rows; ++t)
        _mm512_mask_storeu_ps(c + (r0 + t) * ldc + off + j0, keep, _mm512_mul_ps(acc[t], al));
    }
    const int64_t reached = std::min(m, (last / 16 + 1) * 16);
    for (int64_t t = 0; t < rows; ++t) std::fill(c + (r0 + t) * ldc + off + reached, c + (r0 + t) * ldc + off + m, 0.f);
  }
}

// Rows (or keys) per tile for D = 16 * NV columns: R * NV accumulators plus NV loads stay within 32 registers.
template <int NV>
constexpr int64_t kTileWidth = NV <= 2 ? 8 : (NV <= 4 ? 4 : (NV <= 8 ? 2 : 1));

// One tile of `diag_weighted`: ROWS rows (a compile-time count, so the accumulators stay in registers).
template <int NV, int64_t ROWS>
inline void weighted_tile(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                          int64_t keys, bool accumulate) {
  __m512 acc[ROWS][NV];
#pragma GCC unroll 16
  for (int64_t t = 0; t < ROWS; ++t)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[t][v] = accumulate ? _mm512_loadu_ps(c + t * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t j = 0; j < keys; ++j) {  // entries past a row's diagonal are zeros in A
    __m512 bv[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + j * ldb + 16 * v);
#pragma GCC unroll 16
    for (int64_t t = 0; t < ROWS; ++t) {
      const __m512 av = _mm512_set1_ps(a[t * lda + j]);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[t][v] = _mm512_fmadd_ps(av, bv[v], acc[t][v]);
    }
  }
#pragma GCC unroll 16
  for (int64_t t = 0; t < ROWS; ++t)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + t * ldc + 16 * v, acc[t][v]);
}

// C[r, :] (+)= sum_{j <= r} A[r, off + j] * B[j, :] over D = 16 * NV columns: R rows per tile.
template <int NV>
inline void diag_weighted(const float* a, int64_t lda, int64_t off, const float* b, int64_t ldb, float* c,
                          int64_t ldc, int64_t m, bool accumulate) {
  constexpr int64_t R = kTileWidth<NV>;
  int64_t r0 = 0;
  for (; r0 + R <= m; r0 += R)
    weighted_tile<NV, R>(a + r0 * lda + off, lda, b, ldb, c + r0 * ldc, ldc, r0 + R, accumulate);
  for (; r0 < m; ++r0)  // the last rows one at a time
    weighted_tile<NV, 1>(a + r0 * lda + off, lda, b, ldb, c + r0 * ldc, ldc, r0 + 1, accumulate);
}

// One tile of `diag_transposed`: KEYS keys (compile-time), rows [first, m) of A and B.
template <int NV, int64_t KEYS>
inline void transposed_tile(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                            int64_t first, int64_t m) {
  __m512 acc[KEYS][NV];
#pragma GCC unroll 16
  for (int64_t t = 0; t < KEYS; ++t)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[t][v] = _mm512_setzero_ps();
  for (int64_t r = first; r < m; ++r) {  // rows before a key's own see it not: zeros in A
    __m512 bv[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + r * ldb + 16 * v);
#pragma GCC unroll 16
    for (int64_t t = 0; t < KEYS; ++t) {
      const __m512 av = _mm512_set1_ps(a[r * lda + t]);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[t][v] = _mm512_fmadd_ps(av, bv[v], acc[t][v]);
    }
  }
#pragma GCC unroll 16
  for (int64_t t = 0; t < KEYS; ++t)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      float* out = c + t * ldc + 16 * v;
      _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(out), acc[t][v]));
    }
}

// C[j, :] += sum_{r >= j} A[r, off + j] * B[r, :] over D = 16 * NV columns: R keys per tile.
template <int NV>
inline void diag_transposed(const float* a, int64_t lda, int64_t off, const float* b, int64_t ldb, float* c,
                            int64_t ldc, int64_t m) {
  constexpr int64_t R = kTileWidth<NV>;
  int64_t j0 = 0;
  for (; j0 + R <= m; j0 += R) transposed_tile<NV, R>(a + off + j0, lda, b, ldb, c + j0 * ldc, ldc, j0, m);
  for (; j0 < m; ++j0) transposed_tile<NV, 1>(a + off + j0, lda, b, ldb, c + j0 * ldc, ldc, j0, m);
}

// Runtime head_dim -> the template instance (square_tiles_fit(d) holds).
#define PCL_DIAG_DISPATCH(d, fn, ...)                 \
  switch ((d) / 16) {                                 \
    case 1: fn<1>(__VA_ARGS__); break;                \
    case 2: fn<2>(__VA_ARGS__); break;                \
    case 3: fn<3>(__VA_ARGS__); break;                \
    case 4: fn<4>(__VA_ARGS__); break;                \
    case 5: fn<5>(__VA_ARGS__); break;                \
    case 6: fn<6>(__VA_ARGS__); break;                \
    case 7: fn<7>(__VA_ARGS__); break;                \
    case 8: fn<8>(__VA_ARGS__); break;                \
    default: fn<16>(__VA_ARGS__); break; /* 256 */    \
  }

// What attention.cc calls: whether the tiles serve this head_dim, and the three products of a block's square.
inline bool square_tiles_fit(int64_t d) { return d % 16 == 0 && d > 0 && (d <= 128 || d == 256); }
inline void square_scores(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t off,
                          int64_t m, int64_t d, float alpha, float* bt) {
  diag_scores(a, lda, b, ldb, c, ldc, off, m, d, alpha, bt);
}
inline void square_weighted(const float* a, int64_t lda, int64_t off, const float* b, int64_t ldb, float* c,
                            int64_t ldc, int64_t m, int64_t d, bool accumulate) {
  PCL_DIAG_DISPATCH(d, diag_weighted, a, lda, off, b, ldb, c, ldc, m, accumulate)
}
inline void square_transposed(const float* a, int64_t lda, int64_t off, const float* b, int64_t ldb, float* c,
                              int64_t ldc, int64_t m, int64_t d) {
  PCL_DIAG_DISPATCH(d, diag_transposed, a, lda, off, b, ldb, c, ldc, m)
}
}  // namespace pcl

#else  // no AVX-512: attention multiplies every block whole with MKL, and never calls the three below
namespace pcl {
inline bool square_tiles_fit(int64_t) { return false; }
inline void square_scores(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, int64_t, int64_t,
                          float, float*) {}
inline void square_weighted(const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t, int64_t,
                            bool) {}
inline void square_transposed(const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                              int64_t) {}
}  // namespace pcl
#endif
