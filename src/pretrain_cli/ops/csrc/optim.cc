// The optimizer step over all parameters at once: the global gradient norm and AdamW (with the clipping
// coefficient folded into the gradient read). Paddle runs one squared_l2_norm, one scale_ and one adamw_ kernel
// per parameter, each a Python dispatch plus a pass over memory; here each is one threaded pass over every
// tensor. Work is cut into fixed chunks of every tensor, so a chunk's result never depends on the thread
// count, and the norm's partial sums are added in chunk order: the same bits on 1 or 64 threads.
#include "common.h"

using pcl::check_f32;

namespace {
constexpr int64_t kChunk = 1 << 14;  // 16 Ki floats (64 KiB) per task

struct Span {
  int64_t tensor, begin, end;
};

std::vector<Span> spans(const std::vector<paddle::Tensor>& ts) {
  std::vector<Span> out;
  for (int64_t t = 0; t < static_cast<int64_t>(ts.size()); ++t) {
    const int64_t n = ts[t].numel();
    for (int64_t b = 0; b < n; b += kChunk) out.push_back({t, b, std::min(n, b + kChunk)});
  }
  return out;
}

void check_dense(const paddle::Tensor& t, const char* op, const char* name) {
  check_f32(t, op, name);
  PD_CHECK(t.is_dense_tensor() && t.is_contiguous(), op, ": ", name, " must be a contiguous dense tensor");
}
}  // namespace

// Sum of squares of every gradient, accumulated in double per chunk: `[1]` float32.
std::vector<paddle::Tensor> GlobalSqNorm(const std::vector<paddle::Tensor>& grads) {
  for (const auto& g : grads) check_dense(g, "global_sq_norm", "gradient");
  const std::vector<Span> work = spans(grads);
  std::vector<const float*> data(grads.size());
  for (size_t t = 0; t < grads.size(); ++t) data[t] = grads[t].data<float>();
  std::vector<double> part(work.size());
  const int64_t n_work = static_cast<int64_t>(work.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n_work; ++i) {
    const float* p = data[work[i].tensor];
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = work[i].begin; j < work[i].end; ++j) s += static_cast<double>(p[j]) * p[j];
    part[i] = s;
  }
  double total = 0.0;
  for (double s : part) total += s;  // chunk order: independent of the thread count
  auto out = paddle::empty({1}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  out.data<float>()[0] = static_cast<float>(total);
  return {out};
}

std::vector<std::vector<int64_t>> GlobalSqNormShape(const std::vector<std::vector<int64_t>>& grads) { return {{1}}; }

std::vector<paddle::DataType> GlobalSqNormDtype(const std::vector<paddle::DataType>& grads) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(pcl_global_sq_norm)  // no "_grad" in op names: Paddle reads it as a gradient op
    .Inputs({paddle::Vec("Grads")})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(GlobalSqNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(GlobalSqNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(GlobalSqNormDtype));

// AdamW in place over every parameter, with Paddle's arithmetic (phi's CPU adamw/adam kernels): per tensor
// lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t) and eps_t = eps * sqrt(1 - beta2^t) from its own beta-power
// accumulators; decoupled decay p -= lr * coeff * p where `decay[i]` (PaddleNLP's exclusions decided by
// the caller); the gradient is read times `grad_scale` (the global-norm clipping coefficient, 1 = none).
void AdamWMulti(std::vector<paddle::Tensor>& params, const std::vector<paddle::Tensor>& grads,
                std::vector<paddle::Tensor>& moment1, std::vector<paddle::Tensor>& moment2,
                std::vector<paddle::Tensor>& beta1_pow, std::vector<paddle::Tensor>& beta2_pow,
                const std::vector<int>& decay, float lr, float beta1, float beta2, float epsilon, float coeff,
                float grad_scale) {
  const size_t n = params.size();
  PD_CHECK(grads.size() == n && moment1.size() == n && moment2.size() == n && beta1_pow.size() == n &&
               beta2_pow.size() == n && decay.size() == n,
           "adamw: one gradient, two moments, two beta powers and a decay flag per parameter");
  struct Slot {
    float* p;
    const float* g;
    float* m1;
    float* m2;
    float lr, eps, decay;  // decay: lr * coeff, applied when `decays`
    bool decays;
  };
  std::vector<Slot> slots(n);
  for (size_t t = 0; t < n; ++t) {
    check_dense(params[t], "adamw", "parameter");
    check_dense(grads[t], "adamw", "gradient");
    check_dense(moment1[t], "adamw", "moment1");
    check_dense(moment2[t], "adamw", "moment2");
    check_f32(beta1_pow[t], "adamw", "beta1_pow");
    check_f32(beta2_pow[t], "adamw", "beta2_pow");
    const int64_t numel = params[t].numel();
    PD_CHECK(grads[t].numel() == numel && moment1[t].numel() == numel && moment2[t].numel() == numel,
             "adamw: parameter ", t, " and its gradient/moments differ in size");
    float* b1p = beta1_pow[t].data<float>();
    float* b2p = beta2_pow[t].data<float>();
    const float b1 = b1p[0], b2 = b2p[0];
    slots[t] = {params[t].data<float>(), grads[t].data<float>(), moment1[t].data<float>(), moment2[t].data<float>(),
                lr * (std::sqrt(1 - b2) / (1 - b1)), epsilon * std::sqrt(1 - b2), lr * coeff, decay[t] != 0};
    b1p[0] = beta1 * b1;
    b2p[0] = beta2 * b2;
  }
  const std::vector<Span> work = spans(params);
  const int64_t n_work = static_cast<int64_t>(work.size());
  const float one_b1 = 1 - beta1, one_b2 = 1 - beta2;
  const bool scaled = grad_scale != 1.f;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n_work; ++i) {
    const Slot s = slots[work[i].tensor];
    const float neg_lr = -s.lr;
    const int64_t j0 = work[i].begin, j1 = work[i].end;
    if (!s.decays) {  // phi's adam kernel (AdamW without decay calls it)
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) {
        const float g = scaled ? s.g[j] * grad_scale : s.g[j];
        const float m1 = beta1 * s.m1[j] + one_b1 * g;
        const float m2 = beta2 * s.m2[j] + one_b2 * g * g;
        s.m1[j] = m1;
        s.m2[j] = m2;
        s.p[j] = s.p[j] + neg_lr * (m1 / (std::sqrt(m2) + s.eps));
      }
      continue;
    }
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) {
      const float g = scaled ? s.g[j] * grad_scale : s.g[j];
#if defined(__AVX512F__)
      // phi's AdamW JIT kernel, used on AVX-512 CPUs: fused multiply-adds, and g * g before the (1 - beta2)
      const float p = std::fma(-s.decay, s.p[j], s.p[j]);
      const float m1 = std::fma(beta1, s.m1[j], one_b1 * g);
      const float m2 = std::fma(beta2, s.m2[j], one_b2 * (g * g));
      s.p[j] = std::fma(m1 / (std::sqrt(m2) + s.eps), neg_lr, p);
#else
      // phi's reference AdamW (other CPUs)
      const float p = s.p[j] - s.decay * s.p[j];
      const float m1 = beta1 * s.m1[j] + one_b1 * g;
      const float m2 = beta2 * s.m2[j] + one_b2 * g * g;
      s.p[j] = p + neg_lr * (m1 / (std::sqrt(m2) + s.eps));
#endif
      s.m1[j] = m1;
      s.m2[j] = m2;
    }
  }
}

PD_BUILD_OP(pcl_adamw)
    .Inputs({paddle::Vec("Params"), paddle::Vec("Grads"), paddle::Vec("Moment1"), paddle::Vec("Moment2"),
             paddle::Vec("Beta1Pow"), paddle::Vec("Beta2Pow")})
    .Outputs({paddle::Vec("ParamsOut"), paddle::Vec("Moment1Out"), paddle::Vec("Moment2Out"),
              paddle::Vec("Beta1PowOut"), paddle::Vec("Beta2PowOut")})
    .SetInplaceMap({{paddle::Vec("Params"), paddle::Vec("ParamsOut")},
                    {paddle::Vec("Moment1"), paddle::Vec("Moment1Out")},
                    {paddle::Vec("Moment2"), paddle::Vec("Moment2Out")},
                    {paddle::Vec("Beta1Pow"), paddle::Vec("Beta1PowOut")},
                    {paddle::Vec("Beta2Pow"), paddle::Vec("Beta2PowOut")}})
    .Attrs({"decay: std::vector<int>", "lr: float", "beta1: float", "beta2: float", "epsilon: float", "coeff: float",
            "grad_scale: float"})
    .SetKernelFn(PD_KERNEL(AdamWMulti));
