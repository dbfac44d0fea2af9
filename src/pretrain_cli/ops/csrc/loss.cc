// Cross-entropy over the vocabulary (see common.h for why these kernels exist).
#include "common.h"

#include <memory>

using pcl::check_f32;
using pcl::contig;
using pcl::last_dim;
using pcl::exp_from_max;
using pcl::vexp_nonpos;

// -------------------------------------------------------------------------- cross-entropy
// logits [N, V], labels [N] int64 -> loss [N] (0 where label == ignore_index), lse [N] kept for
// the backward. Unlike Paddle's fused op it does not store a [N, V] softmax (262 MB at 2048 x 32k).
std::vector<paddle::Tensor> CrossEntropyForward(const paddle::Tensor& logits_arg, const paddle::Tensor& labels_arg,
                                                int64_t ignore_index) {
  const paddle::Tensor logits = contig(logits_arg);
  const paddle::Tensor labels = contig(labels_arg);
  check_f32(logits, "cross_entropy", "logits");
  PD_CHECK(labels.dtype() == paddle::DataType::INT64, "cross_entropy: labels must be int64");
  const int64_t v = last_dim(logits), n = logits.numel() / v;
  PD_CHECK(labels.numel() == n, "cross_entropy: ", labels.numel(), " labels for ", n, " rows");
  const int64_t* lp = labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    PD_CHECK(lp[i] == ignore_index || (lp[i] >= 0 && lp[i] < v), "cross_entropy: label ", lp[i],
             " outside the vocabulary [0, ", v, ")");
  auto loss = paddle::empty({n}, logits.dtype(), logits.place());
  auto lse = paddle::empty({n}, logits.dtype(), logits.place());
  const float* xp = logits.data<float>();
  float* lossp = loss.data<float>();
  float* lsep = lse.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* x = xp + i * v;
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int64_t j = 1; j < v; ++j) m = x[j] > m ? x[j] : m;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) sum += vexp_nonpos(x[j] - m);
    const float l = m + std::log(sum);
    lsep[i] = l;
    lossp[i] = lp[i] == ignore_index ? 0.f : l - x[lp[i]];
  }
  return {loss, lse};
}

// dlogits = dloss * (softmax - onehot), rows with an ignored label are 0.
std::vector<paddle::Tensor> CrossEntropyBackward(const paddle::Tensor& logits_arg, const paddle::Tensor& labels_arg,
                                                 const paddle::Tensor& lse_arg, const paddle::Tensor& dloss_arg,
                                                 int64_t ignore_index) {
  const paddle::Tensor logits = contig(logits_arg);
  const paddle::Tensor labels = contig(labels_arg);
  const paddle::Tensor lse = contig(lse_arg);
  const paddle::Tensor dloss = contig(dloss_arg);
  const int64_t v = last_dim(logits), n = logits.numel() / v;
  auto dx = paddle::empty(logits.shape(), logits.dtype(), logits.place());
  const float* xp = logits.data<float>();
  const int64_t* lp = labels.data<int64_t>();
  const float* lsep = lse.data<float>();
  const float* gp = dloss.data<float>();
  float* dxp = dx.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float* o = dxp + i * v;
    if (lp[i] == ignore_index) {
      for (int64_t j = 0; j < v; ++j) o[j] = 0.f;
      continue;
    }
    const float* x = xp + i * v;
    const float l = lsep[i], g = gp[i];
#pragma omp simd
    for (int64_t j = 0; j < v; ++j) o[j] = g * vexp_nonpos(x[j] - l);
    o[lp[i]] -= g;
  }
  return {dx};
}

std::vector<std::vector<int64_t>> CrossEntropyShape(const std::vector<int64_t>& x, const std::vector<int64_t>& l,
                                                    const int64_t& ignore_index) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < x.size(); ++i) rows *= x[i];
  return {{rows}, {rows}};
}

std::vector<paddle::DataType> CrossEntropyDtype(const paddle::DataType& x, const paddle::DataType& l) { return {x, x}; }

PD_BUILD_OP(pcl_cross_entropy)
    .Inputs({"Logits", "Labels"})
    .Outputs({"Loss", "Lse"})
    .Attrs({"ignore_index: int64_t"})
    .SetKernelFn(PD_KERNEL(CrossEntropyForward))
    .SetInferShapeFn(PD_INFER_SHAPE(CrossEntropyShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(CrossEntropyDtype));

PD_BUILD_GRAD_OP(pcl_cross_entropy)
    .Inputs({"Logits", "Labels", "Lse", paddle::Grad("Loss")})
    .Outputs({paddle::Grad("Logits")})
    .Attrs({"ignore_index: int64_t"})
    .SetKernelFn(PD_KERNEL(CrossEntropyBackward));

// -------------------------------------------------------------------------- fused LM head + cross-entropy
// h [N, D] (the final norm's output), w the head weight: [D, V] (a Linear) or, vocab_major, [V, D] (the tied
// embedding), int64 labels [N] -> the SUM of the token losses (ignored rows count 0), without ever holding the
// [N, V] logits: rows go in chunks of `chunk`, each chunk's logits [chunk, V] are one sgemm into a scratch
// buffer, then max / sum-exp / target logit per row. The _grad variant also turns the buffer into
// softmax - onehot (0 for ignored rows) and accumulates dh = P·wᵀ and dw += hᵀ·P (or Pᵀ·h) from it, so the
// gradients of the sum come out of the same pass: three GEMMs of N·D·V like the unfused head + loss, where a
// recomputing backward would need four. The caller scales them by d(loss) in place (`pcl_scale_by_`).
// The GEMMs are called outside any OpenMP region, so MKL threads them; the row passes are OpenMP loops.
namespace {
using pcl::kNoTrans;
using pcl::kRowMajor;
using pcl::kTrans;

struct HeadShape {
  int64_t n, d, v;
};

HeadShape check_head(const paddle::Tensor& h, const paddle::Tensor& w, const paddle::Tensor& labels,
                     bool vocab_major, int64_t ignore_index, int64_t chunk) {
  check_f32(h, "linear_cross_entropy", "hidden states");
  check_f32(w, "linear_cross_entropy", "head weight");
  PD_CHECK(labels.dtype() == paddle::DataType::INT64, "linear_cross_entropy: labels must be int64");
  PD_CHECK(w.shape().size() == 2, "linear_cross_entropy: the head weight must be 2-D");
  PD_CHECK(chunk > 0, "linear_cross_entropy: chunk must be > 0");
  const int64_t d = last_dim(h), n = h.numel() / d;
  const int64_t wd = vocab_major ? w.shape()[1] : w.shape()[0], v = vocab_major ? w.shape()[0] : w.shape()[1];
  PD_CHECK(wd == d && v > 0, "linear_cross_entropy: hidden size ", d, " does not match the head weight");
  PD_CHECK(labels.numel() == n, "linear_cross_entropy: ", labels.numel(), " labels for ", n, " rows");
  const int64_t* lp = labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    PD_CHECK(lp[i] == ignore_index || (lp[i] >= 0 && lp[i] < v), "linear_cross_entropy: label ", lp[i],
             " outside the vocabulary [0, ", v, ")");
  return {n, d, v};
}

// One pass over the chunks; dh/dw null = loss only. Returns the loss sum (rows added in order: deterministic).
float head_pass(const float* h, const float* w, const int64_t* lp, HeadShape s, bool vocab_major,
                int64_t ignore_index, int64_t chunk, float* dh, float* dw) {
  const int64_t n = s.n, d = s.d, v = s.v;
  const int64_t rows = std::min(chunk, std::max<int64_t>(n, 1));
  std::unique_ptr<float[]> buf(new float[rows * v]);  // [chunk, V]: the only logits ever held
  std::vector<float> row_loss(n);
  if (dw != nullptr && n == 0) std::fill(dw, dw + d * v, 0.f);
  for (int64_t c0 = 0; c0 < n; c0 += rows) {
    const int m = static_cast<int>(std::min(rows, n - c0));
    const float* hc = h + c0 * d;
    float* x = buf.get();
    if (vocab_major)  // [m, D] · [V, D]ᵀ
      cblas_sgemm(kRowMajor, kNoTrans, kTrans, m, v, d, 1.f, hc, d, w, d, 0.f, x, v);
    else  // [m, D] · [D, V]
      cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, m, v, d, 1.f, hc, d, w, v, 0.f, x, v);
    const bool grad = dw != nullptr;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      float* r = x + i * v;
      const int64_t label = lp[c0 + i];
      if (label == ignore_index) {
        row_loss[c0 + i] = 0.f;
        if (grad) std::fill(r, r + v, 0.f);
        continue;
      }
      const float target = r[label];
      float mx;
      const float sum = exp_from_max(r, v, &mx);
      row_loss[c0 + i] = mx + std::log(sum) - target;
      if (grad) {
        const float inv = 1.f / sum;
#pragma omp simd
        for (int64_t j = 0; j < v; ++j) r[j] *= inv;
        r[label] -= 1.f;
      }
    }
    if (!grad) continue;
    const float beta = c0 == 0 ? 0.f : 1.f;
    if (vocab_major) {
      cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, m, d, v, 1.f, x, v, w, d, 0.f, dh + c0 * d, d);  // P·w
      cblas_sgemm(kRowMajor, kTrans, kNoTrans, v, d, m, 1.f, x, v, hc, d, beta, dw, d);  // [V, D] += Pᵀ·h
    } else {
      cblas_sgemm(kRowMajor, kNoTrans, kTrans, m, d, v, 1.f, x, v, w, v, 0.f, dh + c0 * d, d);  // P·wᵀ
      cblas_sgemm(kRowMajor, kTrans, kNoTrans, d, v, m, 1.f, hc, d, x, v, beta, dw, v);  // [D, V] += hᵀ·P
    }
  }
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += row_loss[i];
  return static_cast<float>(total);
}
}  // namespace

namespace {
// {loss sum [1]} or, with `grad`, {loss sum, d(sum)/dh, d(sum)/dw}: both ops are one pass over the chunks.
std::vector<paddle::Tensor> head_op(const paddle::Tensor& h_arg, const paddle::Tensor& w_arg,
                                    const paddle::Tensor& labels_arg, int64_t ignore_index, bool vocab_major,
                                    int64_t chunk, bool grad) {
  const paddle::Tensor h = contig(h_arg), w = contig(w_arg), labels = contig(labels_arg);
  const HeadShape s = check_head(h, w, labels, vocab_major, ignore_index, chunk);
  auto loss = paddle::empty({1}, h.dtype(), h.place());
  if (!grad) {
    loss.data<float>()[0] = head_pass(h.data<float>(), w.data<float>(), labels.data<int64_t>(), s, vocab_major,
                                      ignore_index, chunk, nullptr, nullptr);
    return {loss};
  }
  auto dh = paddle::empty(h.shape(), h.dtype(), h.place());
  auto dw = paddle::empty(w.shape(), w.dtype(), w.place());
  loss.data<float>()[0] = head_pass(h.data<float>(), w.data<float>(), labels.data<int64_t>(), s, vocab_major,
                                    ignore_index, chunk, dh.data<float>(), dw.data<float>());
  return {loss, dh, dw};
}
}  // namespace

std::vector<paddle::Tensor> LinearCrossEntropy(const paddle::Tensor& h, const paddle::Tensor& w,
                                               const paddle::Tensor& labels, int64_t ignore_index,
                                               bool vocab_major, int64_t chunk) {
  return head_op(h, w, labels, ignore_index, vocab_major, chunk, false);
}

std::vector<paddle::Tensor> LinearCrossEntropyGrad(const paddle::Tensor& h, const paddle::Tensor& w,
                                                   const paddle::Tensor& labels, int64_t ignore_index,
                                                   bool vocab_major, int64_t chunk) {
  return head_op(h, w, labels, ignore_index, vocab_major, chunk, true);
}

std::vector<std::vector<int64_t>> LinearCrossEntropyShape(const std::vector<int64_t>& h,
                                                          const std::vector<int64_t>& w,
                                                          const std::vector<int64_t>& l) {
  return {{1}};
}

std::vector<std::vector<int64_t>> LinearCrossEntropyGradShape(const std::vector<int64_t>& h,
                                                              const std::vector<int64_t>& w,
                                                              const std::vector<int64_t>& l) {
  return {{1}, h, w};
}

std::vector<paddle::DataType> LinearCrossEntropyDtype(const paddle::DataType& h, const paddle::DataType& w,
                                                      const paddle::DataType& l) {
  return {h};
}

std::vector<paddle::DataType> LinearCrossEntropyGradDtype(const paddle::DataType& h, const paddle::DataType& w,
                                                          const paddle::DataType& l) {
  return {h, h, w};
}

PD_BUILD_OP(pcl_linear_cross_entropy)
    .Inputs({"H", "W", "Labels"})
    .Outputs({"Loss"})
    .Attrs({"ignore_index: int64_t", "vocab_major: bool", "chunk: int64_t"})
    .SetKernelFn(PD_KERNEL(LinearCrossEntropy))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearCrossEntropyShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearCrossEntropyDtype));

PD_BUILD_OP(pcl_linear_cross_entropy_grad)
    .Inputs({"H", "W", "Labels"})
    .Outputs({"Loss", "DH", "DW"})
    .Attrs({"ignore_index: int64_t", "vocab_major: bool", "chunk: int64_t"})
    .SetKernelFn(PD_KERNEL(LinearCrossEntropyGrad))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearCrossEntropyGradShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearCrossEntropyGradDtype));

// -------------------------------------------------------------------------- scale
// x * g[0] for a one-element g, threaded (Paddle's CPU multiply runs on one thread): the fused head's
// gradients times d(loss) in its backward.
// x *= g[0] in place on every thread: the fused loss's backward scales the gradients it kept (dh, and dW of the
// whole head) by d(loss) without a second buffer of each (Paddle's CPU multiply_ runs on one thread).
void ScaleByInplace(paddle::Tensor& x, const paddle::Tensor& g_arg) {
  const paddle::Tensor g = contig(g_arg);
  check_f32(x, "scale_by", "x");
  check_f32(g, "scale_by", "g");
  PD_CHECK(g.numel() == 1, "scale_by: g must have one element");
  const float s = g.data<float>()[0];
  float* xp = x.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) xp[i] *= s;
}

PD_BUILD_OP(pcl_scale_by_)
    .Inputs({"X", "G"})
    .Outputs({"Out"})
    .SetInplaceMap({{"X", "Out"}})
    .SetKernelFn(PD_KERNEL(ScaleByInplace));
