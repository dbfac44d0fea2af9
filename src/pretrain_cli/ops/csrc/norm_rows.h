// The RMSNorm row passes shared by the norm ops (norm_mlp.cc) and the projection that ends in one (linear.cc).
#pragma once

#include "common.h"

namespace pcl {
// h = x + a, y = (h * rstd) * w, rstd = 1/sqrt(mean(h^2) + eps) per row, kept for the backward. `a` may be `h`
// itself (the product a projection just wrote there): each element is read before it is written.
inline void add_rms_norm_rows(const float* xp, const float* ap, const float* wp, float* hp, float* yp, float* rp,
                              int64_t rows, int64_t h, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = xp + i * h;
    const float* ar = ap + i * h;
    float* hr = hp + i * h;
    float* yr = yp + i * h;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < h; ++j) {
      const float v = xr[j] + ar[j];
      hr[j] = v;
      ss += v * v;
    }
    const float r = 1.f / std::sqrt(ss / static_cast<float>(h) + eps);
    rp[i] = r;
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) yr[j] = (hr[j] * r) * wp[j];
  }
}

// The RMSNorm backward over `rows` rows of width h: dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, plus `dres`
// (a residual's gradient, added in the same pass) when given, also written to `dx2` when given; returns
// dw = sum_rows(dy * xhat) (per-thread partial sums added in thread order).
inline paddle::Tensor rms_norm_backward_rows(const float* xp, const paddle::Tensor& w, const float* rp,
                                             const float* gp, const float* dres, float* dxp, float* dx2p, int64_t rows,
                                             int64_t h) {
  const int nthreads = omp_get_max_threads();
  std::vector<float> dw_part(static_cast<size_t>(nthreads) * h, 0.f);
  const float* wp = w.data<float>();
#pragma omp parallel num_threads(nthreads)
  {
    float* acc = dw_part.data() + static_cast<size_t>(omp_get_thread_num()) * h;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const float* xr = xp + i * h;
      const float* gr = gp + i * h;
      float* dxr = dxp + i * h;
      const float r = rp[i];
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < h; ++j) {
        const float xh = xr[j] * r;
        dot += gr[j] * wp[j] * xh;
        acc[j] += gr[j] * xh;
      }
      const float m = dot / static_cast<float>(h);
      if (dres == nullptr) {
#pragma omp simd
        for (int64_t j = 0; j < h; ++j) dxr[j] = r * (gr[j] * wp[j] - xr[j] * r * m);
      } else {
        const float* hr = dres + i * h;
#pragma omp simd
        for (int64_t j = 0; j < h; ++j) dxr[j] = hr[j] + r * (gr[j] * wp[j] - xr[j] * r * m);
      }
      if (dx2p != nullptr) std::memcpy(dx2p + i * h, dxr, sizeof(float) * h);  // the row is still in L1
    }
  }
  auto dw = paddle::empty(w.shape(), w.dtype(), w.place());
  float* dwp = dw.data<float>();
  for (int64_t j = 0; j < h; ++j) dwp[j] = 0.f;
  for (int t = 0; t < nthreads; ++t) {
    const float* acc = dw_part.data() + static_cast<size_t>(t) * h;
    for (int64_t j = 0; j < h; ++j) dwp[j] += acc[j];
  }
  return dw;
}
}  // namespace pcl
