// RMSNorm, residual add + RMSNorm, packed SwiGLU, and the gate|up GEMM with its SwiGLU (see common.h for why
// these kernels exist).
#include "common.h"
#include "norm_rows.h"

using pcl::check_f32;
using pcl::contig;
using pcl::last_dim;
using pcl::kNoTrans;
using pcl::kRowMajor;
using pcl::kTrans;
using pcl::rms_norm_backward_rows;
using pcl::vexp;

// ------------------------------------------------------------------------------------ RMSNorm
// y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) per row; rstd is kept for the backward.
std::vector<paddle::Tensor> RmsNormForward(const paddle::Tensor& x_arg, const paddle::Tensor& w_arg, float eps) {
  const paddle::Tensor x = contig(x_arg);
  const paddle::Tensor w = contig(w_arg);
  check_f32(x, "rms_norm", "x");
  check_f32(w, "rms_norm", "weight");
  const int64_t h = last_dim(x), rows = x.numel() / h;
  PD_CHECK(w.numel() == h, "rms_norm: weight size ", w.numel(), " != hidden ", h);
  auto y = paddle::empty(x.shape(), x.dtype(), x.place());
  auto rstd = paddle::empty({rows}, x.dtype(), x.place());
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  float* yp = y.data<float>();
  float* rp = rstd.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = xp + i * h;
    float* yr = yp + i * h;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < h; ++j) ss += xr[j] * xr[j];
    const float r = 1.f / std::sqrt(ss / static_cast<float>(h) + eps);
    rp[i] = r;
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) yr[j] = (xr[j] * r) * wp[j];
  }
  return {y, rstd};
}


// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w;  dw = sum_rows(dy * xhat).
std::vector<paddle::Tensor> RmsNormBackward(const paddle::Tensor& x_arg, const paddle::Tensor& w_arg,
                                            const paddle::Tensor& rstd_arg, const paddle::Tensor& dy_arg) {
  const paddle::Tensor x = contig(x_arg);
  const paddle::Tensor w = contig(w_arg);
  const paddle::Tensor rstd = contig(rstd_arg);
  const paddle::Tensor dy = contig(dy_arg);
  const int64_t h = last_dim(x), rows = x.numel() / h;
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  auto dw = rms_norm_backward_rows(x.data<float>(), w, rstd.data<float>(), dy.data<float>(), nullptr,
                                   dx.data<float>(), nullptr, rows, h);
  return {dx, dw};
}

std::vector<std::vector<int64_t>> RmsNormShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < x.size(); ++i) rows *= x[i];
  return {x, {rows}};
}

std::vector<paddle::DataType> RmsNormDtype(const paddle::DataType& x, const paddle::DataType& w) { return {x, x}; }

PD_BUILD_OP(pcl_rms_norm)
    .Inputs({"X", "W"})
    .Outputs({"Y", "Rstd"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(RmsNormForward))
    .SetInferShapeFn(PD_INFER_SHAPE(RmsNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RmsNormDtype));

PD_BUILD_GRAD_OP(pcl_rms_norm)
    .Inputs({"X", "W", "Rstd", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X"), paddle::Grad("W")})
    .SetKernelFn(PD_KERNEL(RmsNormBackward));

// ------------------------------------------------------------------------ residual add + RMSNorm
// h = x + a, y = norm(h) * w in one pass: the decoder layer's `h = x + attn(...)` and the post-attention norm
// that reads h. Paddle's add is a single-threaded pass of its own, and in the backward the two uses of h
// (the residual and the norm) meet in a gradient accumulation, another one; here both are folded into the
// norm's passes. Rstd is kept for the backward as in pcl_rms_norm.
std::vector<paddle::Tensor> AddRmsNormForward(const paddle::Tensor& x_arg, const paddle::Tensor& a_arg,
                                              const paddle::Tensor& w_arg, float eps) {
  const paddle::Tensor x = contig(x_arg);
  const paddle::Tensor a = contig(a_arg);
  const paddle::Tensor w = contig(w_arg);
  check_f32(x, "add_rms_norm", "x");
  check_f32(a, "add_rms_norm", "a");
  check_f32(w, "add_rms_norm", "weight");
  PD_CHECK(x.shape() == a.shape(), "add_rms_norm: x and a must have the same shape");
  const int64_t h = last_dim(x), rows = x.numel() / h;
  PD_CHECK(w.numel() == h, "add_rms_norm: weight size ", w.numel(), " != hidden ", h);
  auto hs = paddle::empty(x.shape(), x.dtype(), x.place());
  auto y = paddle::empty(x.shape(), x.dtype(), x.place());
  auto rstd = paddle::empty({rows}, x.dtype(), x.place());
  const float* xp = x.data<float>();
  const float* ap = a.data<float>();
  const float* wp = w.data<float>();
  float* hp = hs.data<float>();
  float* yp = y.data<float>();
  float* rp = rstd.data<float>();
  pcl::add_rms_norm_rows(xp, ap, wp, hp, yp, rp, rows, h, eps);
  return {hs, y, rstd};
}

// dh = dH + rstd * (g - hhat * mean(g * hhat)), g = dY * w, written as both dX and dA (the add passes it on);
// dw = sum_rows(dY * hhat). A missing dH (h unused downstream) counts as zero.
std::vector<paddle::Tensor> AddRmsNormBackward(const paddle::Tensor& h_arg, const paddle::Tensor& w_arg,
                                               const paddle::Tensor& rstd_arg, const paddle::Tensor& dh_arg,
                                               const paddle::Tensor& dy_arg) {
  const paddle::Tensor hs = contig(h_arg);
  const paddle::Tensor w = contig(w_arg);
  const paddle::Tensor rstd = contig(rstd_arg);
  const paddle::Tensor dy = contig(dy_arg);
  const bool has_dh = dh_arg.initialized();
  const paddle::Tensor dh = has_dh ? contig(dh_arg) : dh_arg;
  const int64_t h = last_dim(hs), rows = hs.numel() / h;
  auto dx = paddle::empty(hs.shape(), hs.dtype(), hs.place());
  auto da = paddle::empty(hs.shape(), hs.dtype(), hs.place());
  auto dw = rms_norm_backward_rows(hs.data<float>(), w, rstd.data<float>(), dy.data<float>(),
                                   has_dh ? dh.data<float>() : nullptr, dx.data<float>(), da.data<float>(), rows, h);
  return {dx, da, dw};
}

std::vector<std::vector<int64_t>> AddRmsNormShape(const std::vector<int64_t>& x, const std::vector<int64_t>& a,
                                                  const std::vector<int64_t>& w) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < x.size(); ++i) rows *= x[i];
  return {x, x, {rows}};
}

std::vector<paddle::DataType> AddRmsNormDtype(const paddle::DataType& x, const paddle::DataType& a,
                                              const paddle::DataType& w) {
  return {x, x, x};
}

PD_BUILD_OP(pcl_add_rms_norm)
    .Inputs({"X", "A", "W"})
    .Outputs({"H", "Y", "Rstd"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(AddRmsNormForward))
    .SetInferShapeFn(PD_INFER_SHAPE(AddRmsNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AddRmsNormDtype));

PD_BUILD_GRAD_OP(pcl_add_rms_norm)
    .Inputs({"H", "W", "Rstd", paddle::Grad("H"), paddle::Grad("Y")})
    .Outputs({paddle::Grad("X"), paddle::Grad("A"), paddle::Grad("W")})
    .SetKernelFn(PD_KERNEL(AddRmsNormBackward));

// ------------------------------------------------------------------------ packed SwiGLU
namespace {
// rows of [2I] laid out [gate | up] -> silu(gate) * up, rows of [I]
void swiglu_rows(const float* in, float* op, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = in + r * 2 * inter;
    const float* u = g + inter;
    float* o = op + r * inter;
#pragma omp simd
    for (int64_t j = 0; j < inter; ++j) o[j] = g[j] / (1.f + vexp(-g[j])) * u[j];
  }
}

// d gate = dy * up * sig * (1 + g * (1 - sig)),  d up = dy * silu(g)
void swiglu_grad_rows(const float* in, const float* gp, float* dp, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = in + r * 2 * inter;
    const float* u = g + inter;
    const float* d = gp + r * inter;
    float* dg = dp + r * 2 * inter;
    float* du = dg + inter;
#pragma omp simd
    for (int64_t j = 0; j < inter; ++j) {
      const float sig = 1.f / (1.f + vexp(-g[j]));
      du[j] = d[j] * g[j] * sig;
      dg[j] = d[j] * u[j] * sig * (1.f + g[j] * (1.f - sig));
    }
  }
}
}  // namespace

// [..., 2I] laid out [gate | up] -> silu(gate) * up  [..., I]
std::vector<paddle::Tensor> SwigluForward(const paddle::Tensor& gu_arg) {
  const paddle::Tensor gu = contig(gu_arg);
  check_f32(gu, "swiglu", "gate_up");
  const int64_t two_i = last_dim(gu), inter = two_i / 2, rows = gu.numel() / two_i;
  PD_CHECK(two_i % 2 == 0, "swiglu: last dim must be even");
  auto shape = gu.shape();
  shape.back() = inter;
  auto out = paddle::empty(shape, gu.dtype(), gu.place());
  swiglu_rows(gu.data<float>(), out.data<float>(), rows, inter);
  return {out};
}

std::vector<paddle::Tensor> SwigluBackward(const paddle::Tensor& gu_arg, const paddle::Tensor& dy_arg) {
  const paddle::Tensor gu = contig(gu_arg);
  const paddle::Tensor dy = contig(dy_arg);
  const int64_t two_i = last_dim(gu), inter = two_i / 2, rows = gu.numel() / two_i;
  auto dgu = paddle::empty(gu.shape(), gu.dtype(), gu.place());
  swiglu_grad_rows(gu.data<float>(), dy.data<float>(), dgu.data<float>(), rows, inter);
  return {dgu};
}

std::vector<std::vector<int64_t>> SwigluShape(const std::vector<int64_t>& gu) {
  std::vector<int64_t> out = gu;
  out.back() /= 2;
  return {out};
}

PD_BUILD_OP(pcl_swiglu)
    .Inputs({"GU"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(SwigluForward))
    .SetInferShapeFn(PD_INFER_SHAPE(SwigluShape));

PD_BUILD_GRAD_OP(pcl_swiglu)
    .Inputs({"GU", paddle::Grad("Out")})
    .Outputs({paddle::Grad("GU")})
    .SetKernelFn(PD_KERNEL(SwigluBackward));

// ------------------------------------------------------------------ gate|up GEMM + SwiGLU, one op
// act = silu(x·Wg) * (x·Wu), with GU = x·[Wg | Wu] ([..., 2I] laid out [gate | up]) kept for the backward.
// One op instead of Paddle's weight concat, matmul and the SwiGLU kernel (and, in the backward, the concat's
// split, the matmul's gradient and SwiGLU's): the [H, 2I] packed weight lives only inside each pass, never as a
// tensor the autograd graph holds, and dGU (the SwiGLU gradient) only between the backward's GEMMs. The GEMMs
// are the single [N, H]·[H, 2I] product and its two gradients, as fast as one Linear of width 2I
// (two half-width sgemms were ~2 % slower; docs/PERFORMANCE.md §6).
namespace {
// [H, I] and [H, I] -> [H, 2I] rows laid out [g | u] (the packed weight), and its gradient back to the two
void pack_rows(const float* g, const float* u, float* packed, int64_t h, int64_t inter) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < h; ++r) {
    std::memcpy(packed + r * 2 * inter, g + r * inter, sizeof(float) * inter);
    std::memcpy(packed + r * 2 * inter + inter, u + r * inter, sizeof(float) * inter);
  }
}

void unpack_rows(const float* packed, float* g, float* u, int64_t h, int64_t inter) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < h; ++r) {
    std::memcpy(g + r * inter, packed + r * 2 * inter, sizeof(float) * inter);
    std::memcpy(u + r * inter, packed + r * 2 * inter + inter, sizeof(float) * inter);
  }
}

void check_mlp_in(const paddle::Tensor& x, const paddle::Tensor& wg, const paddle::Tensor& wu) {
  check_f32(x, "mlp_in", "x");
  check_f32(wg, "mlp_in", "gate weight");
  check_f32(wu, "mlp_in", "up weight");
  PD_CHECK(wg.shape().size() == 2 && wg.shape() == wu.shape(), "mlp_in: gate and up weights must be [hidden, inter]");
  PD_CHECK(last_dim(x) == wg.shape()[0], "mlp_in: x's last dim ", last_dim(x), " != hidden ", wg.shape()[0]);
}
}  // namespace

std::vector<paddle::Tensor> MlpInForward(const paddle::Tensor& x_arg, const paddle::Tensor& wg_arg,
                                         const paddle::Tensor& wu_arg) {
  const paddle::Tensor x = contig(x_arg), wg = contig(wg_arg), wu = contig(wu_arg);
  check_mlp_in(x, wg, wu);
  const int64_t h = wg.shape()[0], inter = wg.shape()[1], rows = x.numel() / h;
  auto shape = x.shape();
  shape.back() = 2 * inter;
  auto gu = paddle::empty(shape, x.dtype(), x.place());
  shape.back() = inter;
  auto act = paddle::empty(shape, x.dtype(), x.place());
  auto w = paddle::empty({h, 2 * inter}, x.dtype(), x.place());
  pack_rows(wg.data<float>(), wu.data<float>(), w.data<float>(), h, inter);
  if (rows > 0)
    cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, rows, 2 * inter, h, 1.f, x.data<float>(), h, w.data<float>(),
                2 * inter, 0.f, gu.data<float>(), 2 * inter);
  swiglu_rows(gu.data<float>(), act.data<float>(), rows, inter);
  return {act, gu};
}

std::vector<paddle::Tensor> MlpInBackward(const paddle::Tensor& x_arg, const paddle::Tensor& wg_arg,
                                          const paddle::Tensor& wu_arg, const paddle::Tensor& gu_arg,
                                          const paddle::Tensor& dact_arg) {
  const paddle::Tensor x = contig(x_arg), wg = contig(wg_arg), wu = contig(wu_arg), gu = contig(gu_arg),
                       dact = contig(dact_arg);
  const int64_t h = wg.shape()[0], inter = wg.shape()[1], rows = x.numel() / h;
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  auto dwg = paddle::empty(wg.shape(), wg.dtype(), wg.place());
  auto dwu = paddle::empty(wu.shape(), wu.dtype(), wu.place());
  auto dgu = paddle::empty(gu.shape(), gu.dtype(), gu.place());
  swiglu_grad_rows(gu.data<float>(), dact.data<float>(), dgu.data<float>(), rows, inter);
  auto w = paddle::empty({h, 2 * inter}, x.dtype(), x.place());  // [Wg | Wu], then d[Wg | Wu]
  float* wp = w.data<float>();
  pack_rows(wg.data<float>(), wu.data<float>(), wp, h, inter);
  if (rows > 0) {
    cblas_sgemm(kRowMajor, kNoTrans, kTrans, rows, h, 2 * inter, 1.f, dgu.data<float>(), 2 * inter, wp, 2 * inter, 0.f,
                dx.data<float>(), h);  // dx = dGU · [Wg | Wu]ᵀ
    cblas_sgemm(kRowMajor, kTrans, kNoTrans, h, 2 * inter, rows, 1.f, x.data<float>(), h, dgu.data<float>(), 2 * inter,
                0.f, wp, 2 * inter);  // d[Wg | Wu] = xᵀ · dGU
  } else {
    std::fill(wp, wp + h * 2 * inter, 0.f);
  }
  unpack_rows(wp, dwg.data<float>(), dwu.data<float>(), h, inter);
  return {dx, dwg, dwu};
}

std::vector<std::vector<int64_t>> MlpInShape(const std::vector<int64_t>& x, const std::vector<int64_t>& wg,
                                             const std::vector<int64_t>& wu) {
  std::vector<int64_t> act = x, gu = x;
  act.back() = wg.back();
  gu.back() = 2 * wg.back();
  return {act, gu};
}

PD_BUILD_OP(pcl_mlp_in)
    .Inputs({"X", "Wg", "Wu"})
    .Outputs({"Act", "GU"})
    .SetKernelFn(PD_KERNEL(MlpInForward))
    .SetInferShapeFn(PD_INFER_SHAPE(MlpInShape));

PD_BUILD_GRAD_OP(pcl_mlp_in)
    .Inputs({"X", "Wg", "Wu", "GU", paddle::Grad("Act")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Wg"), paddle::Grad("Wu")})
    .SetKernelFn(PD_KERNEL(MlpInBackward));
