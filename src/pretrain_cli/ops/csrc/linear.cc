// The Linears whose output lands on a residual (the layer's two, one with the norm after it), and the token
// embedding (see common.h for why these kernels exist).
#include "common.h"
#include "norm_rows.h"

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

// `op` names the op in the errors (pcl_linear_residual's, pcl_linear_add_rms_norm's)
Dims check_linear_residual(const paddle::Tensor& a, const paddle::Tensor& w, const paddle::Tensor& r,
                           const char* op = "linear_residual") {
  check_f32(a, op, "input");
  check_f32(w, op, "weight");
  check_f32(r, op, "residual");
  PD_CHECK(w.shape().size() == 2, op, ": the weight must be [in, out]");
  PD_CHECK(!a.shape().empty() && a.shape().back() == w.shape()[0], op, ": the input's last dim is not the weight's ",
           w.shape()[0]);
  auto out_shape = a.shape();
  out_shape.back() = w.shape()[1];
  PD_CHECK(r.shape() == out_shape, op, ": the residual must have the product's shape");
  const int64_t in = w.shape()[0];
  return {in > 0 ? a.numel() / in : r.numel() / std::max<int64_t>(w.shape()[1], 1), in, w.shape()[1]};
}

void copy_threaded(const float* src, float* dst, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

// A Linear's two gradients from its output's, g [rows, out]: da = g·Wᵀ [rows, in], dW = aᵀ·g [in, out] (zeros when
// a dimension is empty, where sgemm would leave them unwritten).
void linear_grads(const paddle::Tensor& a, const paddle::Tensor& w, const float* g, paddle::Tensor& da,
                  paddle::Tensor& dw, int64_t rows) {
  const int64_t in = w.shape()[0], out = w.shape()[1];
  if (rows > 0 && in > 0 && out > 0) {
    cblas_sgemm(kRowMajor, kNoTrans, kTrans, rows, in, out, 1.f, g, out, w.data<float>(), out, 0.f, da.data<float>(),
                in);
    cblas_sgemm(kRowMajor, kTrans, kNoTrans, in, out, rows, 1.f, a.data<float>(), in, g, out, 0.f, dw.data<float>(),
                out);
  } else {
    std::fill(da.data<float>(), da.data<float>() + da.numel(), 0.f);
    std::fill(dw.data<float>(), dw.data<float>() + dw.numel(), 0.f);
  }
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
  const int64_t out = w.shape()[1], rows = dy.numel() / std::max<int64_t>(out, 1);
  auto da = paddle::empty(a.shape(), a.dtype(), a.place());
  auto dw = paddle::empty(w.shape(), w.dtype(), w.place());
  auto dr = paddle::empty(dy.shape(), dy.dtype(), dy.place());
  copy_threaded(dy.data<float>(), dr.data<float>(), dy.numel());  // d(r + a·W)/dr is the identity
  linear_grads(a, w, dy.data<float>(), da, dw, rows);
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

// ------------------------------------------------------- h = x + a·W, y = RMSNorm(h), one op
// The attention's output projection, the layer's first residual add and the post-attention norm: the GEMM writes
// its product where h goes and one row pass adds x and normalises (pcl_add_rms_norm's pass, reading the product
// the GEMM just wrote). The backward's row pass writes dh once, the residual's gradient and the GEMMs' input,
// where Paddle's matmul_grad read a second copy of it (pcl_add_rms_norm hands the add's two inputs one each).
// Off wherever linear_residual is, and under full_attn recompute (docs/PERFORMANCE.md §3.18).
std::vector<paddle::Tensor> LinearAddRmsNormForward(const paddle::Tensor& a_arg, const paddle::Tensor& w_arg,
                                                    const paddle::Tensor& x_arg, const paddle::Tensor& wn_arg,
                                                    float eps) {
  const paddle::Tensor a = contig(a_arg), w = contig(w_arg), x = contig(x_arg), wn = contig(wn_arg);
  const Dims d = check_linear_residual(a, w, x, "linear_add_rms_norm");
  check_f32(wn, "linear_add_rms_norm", "norm weight");
  PD_CHECK(wn.numel() == d.out, "linear_add_rms_norm: norm weight size ", wn.numel(), " != hidden ", d.out);
  auto hs = paddle::empty(x.shape(), x.dtype(), x.place());
  auto y = paddle::empty(x.shape(), x.dtype(), x.place());
  auto rstd = paddle::empty({d.rows}, x.dtype(), x.place());
  float* hp = hs.data<float>();
  if (d.rows > 0 && d.in > 0 && d.out > 0)
    cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, d.rows, d.out, d.in, 1.f, a.data<float>(), d.in, w.data<float>(), d.out,
                0.f, hp, d.out);
  else
    std::fill(hp, hp + hs.numel(), 0.f);
  pcl::add_rms_norm_rows(x.data<float>(), hp, wn.data<float>(), hp, y.data<float>(), rstd.data<float>(), d.rows,
                         d.out, eps);
  return {hs, y, rstd};
}

std::vector<paddle::Tensor> LinearAddRmsNormBackward(const paddle::Tensor& a_arg, const paddle::Tensor& w_arg,
                                                     const paddle::Tensor& h_arg, const paddle::Tensor& wn_arg,
                                                     const paddle::Tensor& rstd_arg, const paddle::Tensor& dh_arg,
                                                     const paddle::Tensor& dy_arg) {
  const paddle::Tensor a = contig(a_arg), w = contig(w_arg), hs = contig(h_arg), wn = contig(wn_arg),
                       rstd = contig(rstd_arg), dy = contig(dy_arg);
  const bool has_dh = dh_arg.initialized();  // h unused downstream: its own gradient counts as zero
  const paddle::Tensor dh = has_dh ? contig(dh_arg) : dh_arg;
  const int64_t out = w.shape()[1], rows = hs.numel() / std::max<int64_t>(out, 1);
  auto dx = paddle::empty(hs.shape(), hs.dtype(), hs.place());  // d(loss)/dh: the residual's and the GEMMs' input
  auto da = paddle::empty(a.shape(), a.dtype(), a.place());
  auto dw = paddle::empty(w.shape(), w.dtype(), w.place());
  auto dwn = pcl::rms_norm_backward_rows(hs.data<float>(), wn, rstd.data<float>(), dy.data<float>(),
                                         has_dh ? dh.data<float>() : nullptr, dx.data<float>(), nullptr, rows, out);
  linear_grads(a, w, dx.data<float>(), da, dw, rows);
  return {da, dw, dx, dwn};
}

std::vector<std::vector<int64_t>> LinearAddRmsNormShape(const std::vector<int64_t>& a, const std::vector<int64_t>& w,
                                                        const std::vector<int64_t>& x,
                                                        const std::vector<int64_t>& wn) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < x.size(); ++i) rows *= x[i];
  return {x, x, {rows}};
}

std::vector<paddle::DataType> LinearAddRmsNormDtype(const paddle::DataType& a, const paddle::DataType& w,
                                                    const paddle::DataType& x, const paddle::DataType& wn) {
  return {x, x, x};
}

PD_BUILD_OP(pcl_linear_add_rms_norm)
    .Inputs({"A", "W", "X", "Wn"})
    .Outputs({"H", "Y", "Rstd"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(LinearAddRmsNormForward))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearAddRmsNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearAddRmsNormDtype));

PD_BUILD_GRAD_OP(pcl_linear_add_rms_norm)
    .Inputs({"A", "W", "H", "Wn", "Rstd", paddle::Grad("H"), paddle::Grad("Y")})
    .Outputs({paddle::Grad("A"), paddle::Grad("W"), paddle::Grad("X"), paddle::Grad("Wn")})
    .SetKernelFn(PD_KERNEL(LinearAddRmsNormBackward));

// ------------------------------------------------------------------ the token embedding's lookup
// out[t] = W[ids[t]]; the backward's dW = zeros, then dW[ids[t]] += dout[t] for every token. Paddle's CPU embedding
// gradient runs on one thread, zero-fill included ([vocab, hidden]: 8 MB at bench's shape); here each thread zeroes
// and accumulates the rows of its own vocabulary range, every token in order, so the result is the same on any
// thread count.
namespace {
void check_embedding(const paddle::Tensor& ids, const paddle::Tensor& w) {
  PD_CHECK(ids.dtype() == paddle::DataType::INT64, "embedding: ids must be int64");
  check_f32(w, "embedding", "weight");
  PD_CHECK(w.shape().size() == 2, "embedding: the weight must be [vocab, hidden]");
}
}  // namespace

std::vector<paddle::Tensor> EmbeddingForward(const paddle::Tensor& ids_arg, const paddle::Tensor& w_arg) {
  const paddle::Tensor ids = contig(ids_arg), w = contig(w_arg);
  check_embedding(ids, w);
  const int64_t n = ids.numel(), vocab = w.shape()[0], h = w.shape()[1];
  const int64_t* ip = ids.data<int64_t>();
  for (int64_t t = 0; t < n; ++t)
    PD_CHECK(ip[t] >= 0 && ip[t] < vocab, "embedding: token id ", ip[t], " outside the vocabulary [0, ", vocab, ")");
  auto shape = ids.shape();
  shape.push_back(h);
  auto out = paddle::empty(shape, w.dtype(), w.place());
  const float* wp = w.data<float>();
  float* op = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) std::memcpy(op + t * h, wp + ip[t] * h, sizeof(float) * h);
  return {out};
}

std::vector<paddle::Tensor> EmbeddingBackward(const paddle::Tensor& ids_arg, const paddle::Tensor& w_arg,
                                              const paddle::Tensor& dout_arg) {
  const paddle::Tensor ids = contig(ids_arg), dout = contig(dout_arg);
  const int64_t n = ids.numel(), vocab = w_arg.shape()[0], h = w_arg.shape()[1];
  auto dw = paddle::empty(w_arg.shape(), dout.dtype(), dout.place());
  const int64_t* ip = ids.data<int64_t>();
  const float* gp = dout.data<float>();
  float* dp = dw.data<float>();
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t lo = vocab * me / threads, hi = vocab * (me + 1) / threads;  // this thread's rows of dW
    std::fill(dp + lo * h, dp + hi * h, 0.f);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t row = ip[t];
      if (row < lo || row >= hi) continue;
      float* d = dp + row * h;
      const float* g = gp + t * h;
#pragma omp simd
      for (int64_t j = 0; j < h; ++j) d[j] += g[j];
    }
  }
  return {dw};
}

std::vector<std::vector<int64_t>> EmbeddingShape(const std::vector<int64_t>& ids, const std::vector<int64_t>& w) {
  std::vector<int64_t> out = ids;
  out.push_back(w[1]);
  return {out};
}

std::vector<paddle::DataType> EmbeddingDtype(const paddle::DataType& ids, const paddle::DataType& w) { return {w}; }

PD_BUILD_OP(pcl_embedding)
    .Inputs({"Ids", "W"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(EmbeddingForward))
    .SetInferShapeFn(PD_INFER_SHAPE(EmbeddingShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(EmbeddingDtype));

PD_BUILD_GRAD_OP(pcl_embedding)
    .Inputs({"Ids", "W", paddle::Grad("Out")})
    .Outputs({paddle::Grad("W")})
    .SetKernelFn(PD_KERNEL(EmbeddingBackward));
