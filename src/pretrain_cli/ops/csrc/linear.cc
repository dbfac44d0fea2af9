// A Linear whose output lands on a residual (see common.h for why these kernels exist).
#include "common.h"

using pcl::check_f32;
using pcl::contig;
using pcl::kNoTrans;
using pcl::kRowMajor;
using pcl::kTrans;

// ------------------------------------------------------------------ y = r + a·W, one op
// The decoder layer's last product and its residual add, `h + down_proj(act)`: the GEMM accumulates onto a copy of
// the residual (beta = 1) instead of writing its own output for Paddle's add to read again, and the backward hands
// the residual its gradient as one threaded copy instead of Paddle's add_grad. Paddle's add and add_grad run on one
// thread (docs/PERFORMANCE.md §3.15).
namespace {
struct Dims {
  int64_t rows, in, out;
};

Dims check_linear_residual(const paddle::Tensor& a, const paddle::Tensor& w, const paddle::Tensor& r) {
  check_f32(a, "linear_residual", "input");
  check_f32(w, "linear_residual", "weight");
  check_f32(r, "linear_residual", "residual");
  PD_CHECK(w.shape().size() == 2, "linear_residual: the weight must be [in, out]");
  PD_CHECK(!a.shape().empty() && a.shape().back() == w.shape()[0], "linear_residual: the input's last dim is not the "
           "weight's ", w.shape()[0]);
  auto out_shape = a.shape();
  out_shape.back() = w.shape()[1];
  PD_CHECK(r.shape() == out_shape, "linear_residual: the residual must have the product's shape");
  const int64_t in = w.shape()[0];
  return {in > 0 ? a.numel() / in : r.numel() / std::max<int64_t>(w.shape()[1], 1), in, w.shape()[1]};
}

void copy_threaded(const float* src, float* dst, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}
}  // namespace

std::vector<paddle::Tensor> LinearResidualForward(const paddle::Tensor& a_arg, const paddle::Tensor& w_arg,
                                                  const paddle::Tensor& r_arg) {
  const paddle::Tensor a = contig(a_arg), w = contig(w_arg), r = contig(r_arg);
  const Dims d = check_linear_residual(a, w, r);
  auto y = paddle::empty(r.shape(), r.dtype(), r.place());
  copy_threaded(r.data<float>(), y.data<float>(), r.numel());
  if (d.rows > 0 && d.in > 0 && d.out > 0)
    cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, d.rows, d.out, d.in, 1.f, a.data<float>(), d.in, w.data<float>(), d.out,
                1.f, y.data<float>(), d.out);
  return {y};
}

std::vector<paddle::Tensor> LinearResidualBackward(const paddle::Tensor& a_arg, const paddle::Tensor& w_arg,
                                                   const paddle::Tensor& dy_arg) {
  const paddle::Tensor a = contig(a_arg), w = contig(w_arg), dy = contig(dy_arg);
  const int64_t in = w.shape()[0], out = w.shape()[1], rows = dy.numel() / std::max<int64_t>(out, 1);
  auto da = paddle::empty(a.shape(), a.dtype(), a.place());
  auto dw = paddle::empty(w.shape(), w.dtype(), w.place());
  auto dr = paddle::empty(dy.shape(), dy.dtype(), dy.place());
  copy_threaded(dy.data<float>(), dr.data<float>(), dy.numel());  // d(r + a·W)/dr is the identity
  if (rows > 0 && in > 0 && out > 0) {
    cblas_sgemm(kRowMajor, kNoTrans, kTrans, rows, in, out, 1.f, dy.data<float>(), out, w.data<float>(), out, 0.f,
                da.data<float>(), in);  // da = dy·Wᵀ
    cblas_sgemm(kRowMajor, kTrans, kNoTrans, in, out, rows, 1.f, a.data<float>(), in, dy.data<float>(), out, 0.f,
                dw.data<float>(), out);  // dW = aᵀ·dy
  } else {
    std::fill(da.data<float>(), da.data<float>() + da.numel(), 0.f);
    std::fill(dw.data<float>(), dw.data<float>() + dw.numel(), 0.f);
  }
  return {da, dw, dr};
}

std::vector<std::vector<int64_t>> LinearResidualShape(const std::vector<int64_t>& a, const std::vector<int64_t>& w,
                                                      const std::vector<int64_t>& r) {
  return {r};
}

PD_BUILD_OP(pcl_linear_residual)
    .Inputs({"A", "W", "R"})
    .Outputs({"Y"})
    .SetKernelFn(PD_KERNEL(LinearResidualForward))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearResidualShape));

PD_BUILD_GRAD_OP(pcl_linear_residual)
    .Inputs({"A", "W", paddle::Grad("Y")})
    .Outputs({paddle::Grad("A"), paddle::Grad("W"), paddle::Grad("R")})
    .SetKernelFn(PD_KERNEL(LinearResidualBackward));
