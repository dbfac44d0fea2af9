// Cross-entropy over the vocabulary (see common.h for why these kernels exist).
#include "common.h"

using pcl::check_f32;
using pcl::contig;
using pcl::last_dim;
using pcl::vexp;

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
    for (int64_t j = 0; j < v; ++j) sum += vexp(x[j] - m);
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
    for (int64_t j = 0; j < v; ++j) o[j] = g * vexp(x[j] - l);
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
