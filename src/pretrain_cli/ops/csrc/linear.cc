// A Linear whose output lands on a residual, and the token embedding (see common.h for why these kernels exist).
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
