// Shared by the fused CPU kernels (cpu_build.py builds them, cpu_ops.py loads them).
//
// Why they exist: Paddle 3.3.1's CPU element-wise kernels run on one thread with no fusion, and its strided
// copies are element by element, so RMSNorm, attention's scale + mask + softmax, SwiGLU, RoPE, head
// transposes and the 32k-vocab cross-entropy cost ~40% of a CPU step (docs/PERFORMANCE.md). Each kernel
// is one or two passes over memory, threaded with OpenMP (linked to the Intel runtime MKL uses, so GEMMs
// and these kernels share one thread pool) and vectorised by the compiler. Every kernel has a reference
// path on Paddle's ops (reference.py, attention.py, rope.py) that the tests compare against, forward and backward.
// NaN/Inf propagate through arithmetic (no -ffast-math), so the trainer's NaN policy still sees them.
// OpenMP loops use schedule(static) only: GCC-compiled dynamic schedules on Intel's runtime gave wrong
// results here (the GOMP_loop_dynamic compatibility path).
#pragma once

#include "paddle/extension.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

// MKL's row-major sgemm (Paddle ships MKL; cpu_build.py links it). Called outside an OpenMP region MKL threads
// it; inside one (attention's per-block GEMMs) it runs on the calling thread.
extern "C" void cblas_sgemm(int layout, int transa, int transb, int m, int n, int k, float alpha, const float* a,
                            int lda, const float* b, int ldb, float beta, float* c, int ldc);

namespace pcl {
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // CBLAS_LAYOUT / CBLAS_TRANSPOSE values

// exp for the softmax/CE/SiLU inner loops: Cephes expf (range reduction + degree-6 polynomial),
// ~1 ulp, written so GCC vectorises it (libm's expf does not vectorise without -ffast-math).
// `exp_in_range` is the polynomial for x already clamped to [kExpLo, kExpHi]; the two callers clamp.
// kExpLo = ln of float's smallest normal; kExpHi just under 127.5 · ln 2, so the reduction's 2^n fits an exponent
constexpr float kExpLo = -87.3365447505531f, kExpHi = 88.3762626647949f;
inline float exp_in_range(float x) {
  // round to nearest by adding 1.5 * 2^23 (|x * log2 e| <= 128 here): plain arithmetic vectorises,
  // std::floor becomes a libm call unless -fno-trapping-math (6x slower on 32k-vocab rows)
  const float magic = 12582912.f;
  const float fx = (x * 1.44269504088896341f + magic) - magic;
  float r = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(fx) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(float));
  return p * scale;
}

inline float vexp(float x_in) {
  float x = x_in > kExpHi ? kExpHi : x_in;
  x = x < kExpLo ? kExpLo : x;
  // above the float range: +inf (SiLU of a huge negative gate is then -0, not a finite garbage value)
  return x_in > kExpHi ? INFINITY : exp_in_range(x);
}

// exp(x) for x <= 0 (a softmax term x - max, always <= 0): vexp without the upper clamp and its +inf case,
// the same value for every x <= 0 in ~25 % fewer vector instructions. NaN propagates; below -87.3 it clamps
// (~1e-38, where the true value underflows anyway).
inline float vexp_nonpos(float x_in) { return exp_in_range(x_in < kExpLo ? kExpLo : x_in); }

#if defined(__AVX512F__)
// vexp_nonpos on 16 lanes, the same operations in the same order (so the same bits), except that 2^n is applied
// with vscalefps instead of building its exponent bits and multiplying: ~20 % fewer cycles per row (softmax
// rows of attention and the loss, docs/PERFORMANCE.md §3.14). NaN stays NaN (the clamp keeps a NaN operand).
inline __m512 exp_nonpos16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(kExpLo), x);  // max(lo, NaN) is the second operand: NaN
  const __m512 magic = _mm512_set1_ps(12582912.f);
  const __m512 fx = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic), magic);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(fx, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, fx);  // p * 2^fx, fx integral: exact, as the exponent-bits product
}
#endif

// One softmax row in place, up to the normalisation: row[j] = exp(row[j] - max), returns the sum and writes
// the max (attention and the fused LM head + loss both need them: the loss is max + log(sum) - target).
// A NaN element does not enter the max (as `row[j] > mx` skips it) but makes its own exp, so the sum, NaN.
// The last n % 16 elements go through a masked 16-lane block instead of a scalar remainder loop: attention's
// causal rows have every length 1..S, and the scalar tail was ~40 % of their exp time.
inline float exp_from_max(float* row, int64_t n, float* max_out) {
  constexpr int64_t kLanes = 16;
  const int64_t body = n - n % kLanes, rest = n - body;
#if defined(__AVX512F__)
  const __mmask16 tail = static_cast<__mmask16>((1u << rest) - 1u);
  __m512 vmx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < body; j += kLanes) vmx = _mm512_max_ps(_mm512_loadu_ps(row + j), vmx);  // NaN: vmx kept
  if (rest > 0) vmx = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail, row + body), vmx);
  const float mx = _mm512_reduce_max_ps(vmx);
  const __m512 m = _mm512_set1_ps(mx);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < body; j += kLanes) {
    const __m512 e = exp_nonpos16(_mm512_sub_ps(_mm512_loadu_ps(row + j), m));
    _mm512_storeu_ps(row + j, e);
    acc = _mm512_add_ps(acc, e);
  }
  if (rest > 0) {
    const __m512 e = exp_nonpos16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + body), m));
    _mm512_mask_storeu_ps(row + body, tail, e);
    acc = _mm512_mask_add_ps(acc, tail, acc, e);
  }
  *max_out = mx;
  return _mm512_reduce_add_ps(acc);
#else
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < body; ++j) mx = row[j] > mx ? row[j] : mx;
  for (int64_t j = body; j < n; ++j) mx = row[j] > mx ? row[j] : mx;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < body; ++j) {
    const float e = vexp_nonpos(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  if (rest > 0) {
    alignas(64) float t[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) t[j] = j < rest ? row[body + j] : -INFINITY;
    float tail = 0.f;
#pragma omp simd reduction(+ : tail)
    for (int64_t j = 0; j < kLanes; ++j) {
      const float e = j < rest ? vexp_nonpos(t[j] - mx) : 0.f;
      t[j] = e;
      tail += e;
    }
    std::memcpy(row + body, t, sizeof(float) * rest);
    sum += tail;
  }
  *max_out = mx;
  return sum;
#endif
}

inline void check_f32(const paddle::Tensor& t, const char* op, const char* name) {
  PD_CHECK(t.is_cpu(), op, ": ", name, " must be a CPU tensor");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32, op, ": ", name, " must be float32");
}

// The size rows are divided by; 0 would be a SIGFPE in `numel / last_dim`, so it is an error instead.
inline int64_t last_dim(const paddle::Tensor& t) {
  PD_CHECK(!t.shape().empty() && t.shape().back() > 0, "fused CPU op: the last dimension must be > 0");
  return t.shape().back();
}

// Kernels index raw memory: a strided view (e.g. a transposed gradient) is copied first.
inline paddle::Tensor contig(const paddle::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

}  // namespace pcl
