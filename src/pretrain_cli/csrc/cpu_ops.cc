// Fused fp32 CPU kernels for the training step (pretrain_cli/cpu_ops.py builds and loads them).
//
// Why they exist: Paddle 3.3.1's CPU element-wise kernels run on one thread with no fusion, so
// RMSNorm, the attention softmax + causal mask + scale, SwiGLU, RoPE and the 32k-vocab
// cross-entropy cost ~40% of a CPU step (docs/PERFORMANCE.md). Each op here is one pass (or two)
// over memory, threaded with OpenMP (the process links Intel's OpenMP runtime, the one MKL uses,
// so GEMMs and these kernels share one thread pool), vectorised by the compiler.
// Every kernel has a reference path in kernels.py that the tests compare against.
// NaN/Inf propagate through arithmetic (no -ffast-math) so the trainer's NaN policy still sees them.
#include "paddle/extension.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

namespace {

// exp for the softmax/CE/SiLU inner loops: Cephes expf (range reduction + degree-6 polynomial),
// ~1 ulp, written so GCC vectorises it (libm's expf does not vectorise without -ffast-math).
inline float vexp(float x) {
  x = x > 88.3762626647949f ? 88.3762626647949f : x;
  x = x < -87.3365447505531f ? -87.3365447505531f : x;
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

void check_f32(const paddle::Tensor& t, const char* op, const char* name) {
  PD_CHECK(t.is_cpu(), op, ": ", name, " must be a CPU tensor");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32, op, ": ", name, " must be float32");
}

int64_t last_dim(const paddle::Tensor& t) { return t.shape().back(); }

// Kernels index raw memory: a strided view (e.g. a transposed gradient) is copied first.
paddle::Tensor contig(const paddle::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

}  // namespace

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
  const int nthreads = omp_get_max_threads();
  std::vector<float> dw_part(static_cast<size_t>(nthreads) * h, 0.f);
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* rp = rstd.data<float>();
  const float* gp = dy.data<float>();
  float* dxp = dx.data<float>();
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
#pragma omp simd
      for (int64_t j = 0; j < h; ++j) dxr[j] = r * (gr[j] * wp[j] - xr[j] * r * m);
    }
  }
  auto dw = paddle::empty(w.shape(), w.dtype(), w.place());
  float* dwp = dw.data<float>();
  for (int64_t j = 0; j < h; ++j) dwp[j] = 0.f;
  for (int t = 0; t < nthreads; ++t) {
    const float* acc = dw_part.data() + static_cast<size_t>(t) * h;
    for (int64_t j = 0; j < h; ++j) dwp[j] += acc[j];
  }
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

// ------------------------------------------------------------------------ causal softmax
// scores [..., rows, k_len] -> probs: softmax(scale * s) over the keys row r may see: its query is
// i = r mod q_len (rows may stack several heads' queries) and sees j <= k_len - q_len + i, i.e.
// bottom-right aligned as in kernels._causal_bool_mask; 0 elsewhere.
// Replaces q*scale, the additive mask, softmax and their three backward kernels.
std::vector<paddle::Tensor> CausalSoftmaxForward(const paddle::Tensor& s_arg, float scale, int64_t q_len) {
  const paddle::Tensor s = contig(s_arg);
  check_f32(s, "causal_softmax", "scores");
  const auto& shape = s.shape();
  PD_CHECK(shape.size() >= 2, "causal_softmax: scores need [..., rows, k_len]");
  const int64_t k_len = shape.back();
  PD_CHECK(q_len >= 1 && q_len <= k_len && shape[shape.size() - 2] % q_len == 0, "causal_softmax: q_len ", q_len,
           " must divide the rows and be <= k_len ", k_len);
  const int64_t rows = s.numel() / k_len, shift = k_len - q_len;
  auto p = paddle::empty(shape, s.dtype(), s.place());
  const float* sp = s.data<float>();
  float* pp = p.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = shift + (r % q_len) + 1;  // visible keys of this row
    const float* in = sp + r * k_len;
    float* out = pp + r * k_len;
    float m = in[0];
#pragma omp simd reduction(max : m)
    for (int64_t j = 1; j < n; ++j) m = in[j] > m ? in[j] : m;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      const float e = vexp((in[j] - m) * scale);
      out[j] = e;
      sum += e;
    }
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) out[j] *= inv;
    for (int64_t j = n; j < k_len; ++j) out[j] = 0.f;
  }
  return {p};
}

// ds = scale * p * (dp - sum_j p*dp); masked entries have p = 0 and get 0.
std::vector<paddle::Tensor> CausalSoftmaxBackward(const paddle::Tensor& p_arg, const paddle::Tensor& dp_arg, float scale,
                                                  int64_t q_len) {
  const paddle::Tensor p = contig(p_arg);
  const paddle::Tensor dp = contig(dp_arg);
  const auto& shape = p.shape();
  const int64_t k_len = shape.back();
  const int64_t rows = p.numel() / k_len, shift = k_len - q_len;
  auto ds = paddle::empty(shape, p.dtype(), p.place());
  const float* pp = p.data<float>();
  const float* gp = dp.data<float>();
  float* dsp = ds.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = shift + (r % q_len) + 1;
    const float* pr = pp + r * k_len;
    const float* gr = gp + r * k_len;
    float* out = dsp + r * k_len;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < n; ++j) dot += pr[j] * gr[j];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) out[j] = scale * pr[j] * (gr[j] - dot);
    for (int64_t j = n; j < k_len; ++j) out[j] = 0.f;
  }
  return {ds};
}

PD_BUILD_OP(pcl_causal_softmax)
    .Inputs({"S"})
    .Outputs({"P"})
    .Attrs({"scale: float", "q_len: int64_t"})
    .SetKernelFn(PD_KERNEL(CausalSoftmaxForward));

PD_BUILD_GRAD_OP(pcl_causal_softmax)
    .Inputs({"P", paddle::Grad("P")})
    .Outputs({paddle::Grad("S")})
    .Attrs({"scale: float", "q_len: int64_t"})
    .SetKernelFn(PD_KERNEL(CausalSoftmaxBackward));

// ------------------------------------------------------------------------ packed SwiGLU
// [..., 2I] laid out [gate | up] -> silu(gate) * up  [..., I]
std::vector<paddle::Tensor> SwigluForward(const paddle::Tensor& gu_arg) {
  const paddle::Tensor gu = contig(gu_arg);
  check_f32(gu, "swiglu", "gate_up");
  const int64_t two_i = last_dim(gu), inter = two_i / 2, rows = gu.numel() / two_i;
  PD_CHECK(two_i % 2 == 0, "swiglu: last dim must be even");
  auto shape = gu.shape();
  shape.back() = inter;
  auto out = paddle::empty(shape, gu.dtype(), gu.place());
  const float* in = gu.data<float>();
  float* op = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = in + r * two_i;
    const float* u = g + inter;
    float* o = op + r * inter;
#pragma omp simd
    for (int64_t j = 0; j < inter; ++j) o[j] = g[j] / (1.f + vexp(-g[j])) * u[j];
  }
  return {out};
}

// d gate = dy * up * sig * (1 + g * (1 - sig)),  d up = dy * silu(g)
std::vector<paddle::Tensor> SwigluBackward(const paddle::Tensor& gu_arg, const paddle::Tensor& dy_arg) {
  const paddle::Tensor gu = contig(gu_arg);
  const paddle::Tensor dy = contig(dy_arg);
  const int64_t two_i = last_dim(gu), inter = two_i / 2, rows = gu.numel() / two_i;
  auto dgu = paddle::empty(gu.shape(), gu.dtype(), gu.place());
  const float* in = gu.data<float>();
  const float* gp = dy.data<float>();
  float* dp = dgu.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = in + r * two_i;
    const float* u = g + inter;
    const float* d = gp + r * inter;
    float* dg = dp + r * two_i;
    float* du = dg + inter;
#pragma omp simd
    for (int64_t j = 0; j < inter; ++j) {
      const float sig = 1.f / (1.f + vexp(-g[j]));
      du[j] = d[j] * g[j] * sig;
      dg[j] = d[j] * u[j] * sig * (1.f + g[j] * (1.f - sig));
    }
  }
  return {dgu};
}

PD_BUILD_OP(pcl_swiglu).Inputs({"GU"}).Outputs({"Out"}).SetKernelFn(PD_KERNEL(SwigluForward));

PD_BUILD_GRAD_OP(pcl_swiglu)
    .Inputs({"GU", paddle::Grad("Out")})
    .Outputs({paddle::Grad("GU")})
    .SetKernelFn(PD_KERNEL(SwigluBackward));

// ------------------------------------------------------------------------------ RoPE
// x [b, s, h, d] -> y [b, h, s, d] = x*cos + rotate_half(x)*sin (HF layout, cos/sin [s, d]),
// written straight into the head-major layout attention's GEMMs read, so the rotation, the
// transpose and its copy are one pass.
std::vector<paddle::Tensor> RopeForward(const paddle::Tensor& x_arg, const paddle::Tensor& cos_arg,
                                        const paddle::Tensor& sin_arg) {
  const paddle::Tensor x = contig(x_arg);
  const paddle::Tensor cos = contig(cos_arg);
  const paddle::Tensor sin = contig(sin_arg);
  check_f32(x, "rope", "x");
  check_f32(cos, "rope", "cos");
  check_f32(sin, "rope", "sin");
  const auto& sh = x.shape();
  PD_CHECK(sh.size() == 4, "rope: x must be [bsz, seq_len, heads, head_dim]");
  const int64_t b = sh[0], s = sh[1], h = sh[2], d = sh[3], half = d / 2;
  PD_CHECK(cos.numel() == s * d && sin.numel() == s * d, "rope: cos/sin must be [seq_len, head_dim]");
  auto y = paddle::empty({b, h, s, d}, x.dtype(), x.place());
  const float* xp = x.data<float>();
  const float* cp = cos.data<float>();
  const float* snp = sin.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < h; ++hi) {
      for (int64_t p = 0; p < s; ++p) {
        const float* xr = xp + ((bi * s + p) * h + hi) * d;
        const float* c = cp + p * d;
        const float* sn = snp + p * d;
        float* yr = yp + ((bi * h + hi) * s + p) * d;
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) {
          yr[j] = xr[j] * c[j] - xr[j + half] * sn[j];
          yr[j + half] = xr[j + half] * c[j + half] + xr[j] * sn[j + half];
        }
      }
    }
  }
  return {y};
}

// dx[b, s, h, d] from dy[b, h, s, d]: the transpose of the rotation.
std::vector<paddle::Tensor> RopeBackward(const paddle::Tensor& x_arg, const paddle::Tensor& cos_arg, const paddle::Tensor& sin_arg,
                                         const paddle::Tensor& dy_arg) {
  const paddle::Tensor x = contig(x_arg);
  const paddle::Tensor cos = contig(cos_arg);
  const paddle::Tensor sin = contig(sin_arg);
  const paddle::Tensor dy = contig(dy_arg);
  const auto& sh = x.shape();
  const int64_t b = sh[0], s = sh[1], h = sh[2], d = sh[3], half = d / 2;
  auto dx = paddle::empty(sh, x.dtype(), x.place());
  const float* gp = dy.data<float>();
  const float* cp = cos.data<float>();
  const float* snp = sin.data<float>();
  float* dxp = dx.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < h; ++hi) {
      for (int64_t p = 0; p < s; ++p) {
        const float* g = gp + ((bi * h + hi) * s + p) * d;
        const float* c = cp + p * d;
        const float* sn = snp + p * d;
        float* o = dxp + ((bi * s + p) * h + hi) * d;
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) {
          o[j] = g[j] * c[j] + g[j + half] * sn[j + half];
          o[j + half] = g[j + half] * c[j + half] - g[j] * sn[j];
        }
      }
    }
  }
  return {dx};
}

std::vector<std::vector<int64_t>> RopeShape(const std::vector<int64_t>& x, const std::vector<int64_t>& c,
                                            const std::vector<int64_t>& s) {
  return {{x[0], x[2], x[1], x[3]}};
}

PD_BUILD_OP(pcl_rope)
    .Inputs({"X", "Cos", "Sin"})
    .Outputs({"Y"})
    .SetKernelFn(PD_KERNEL(RopeForward))
    .SetInferShapeFn(PD_INFER_SHAPE(RopeShape));

PD_BUILD_GRAD_OP(pcl_rope)
    .Inputs({"X", "Cos", "Sin", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X")})
    .SetKernelFn(PD_KERNEL(RopeBackward));

// ------------------------------------------------------------------------ swap axes 1, 2
// [A, B, C, D] -> [A, C, B, D] contiguous: attention's head split/merge. Paddle 3.3.1 copies strided
// views element by element (14 ms for 1M floats); this is a row memcpy per (a, b, c).
paddle::Tensor swap12(const paddle::Tensor& x) {
  const auto& sh = x.shape();
  PD_CHECK(sh.size() == 4, "swap12: x must be 4-D");
  const int64_t a = sh[0], b = sh[1], c = sh[2], d = sh[3];
  auto y = paddle::empty({a, c, b, d}, x.dtype(), x.place());
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t ai = 0; ai < a; ++ai)
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t bi = 0; bi < b; ++bi)
        std::memcpy(yp + ((ai * c + ci) * b + bi) * d, xp + ((ai * b + bi) * c + ci) * d, sizeof(float) * d);
  return y;
}

std::vector<paddle::Tensor> Swap12Forward(const paddle::Tensor& x_arg) {
  check_f32(x_arg, "swap12", "x");
  return {swap12(contig(x_arg))};
}

std::vector<paddle::Tensor> Swap12Backward(const paddle::Tensor& dy_arg) { return {swap12(contig(dy_arg))}; }

std::vector<std::vector<int64_t>> Swap12Shape(const std::vector<int64_t>& x) { return {{x[0], x[2], x[1], x[3]}}; }

PD_BUILD_OP(pcl_swap12)
    .Inputs({"X"})
    .Outputs({"Y"})
    .SetKernelFn(PD_KERNEL(Swap12Forward))
    .SetInferShapeFn(PD_INFER_SHAPE(Swap12Shape));

PD_BUILD_GRAD_OP(pcl_swap12)
    .Inputs({paddle::Grad("Y")})
    .Outputs({paddle::Grad("X")})
    .SetKernelFn(PD_KERNEL(Swap12Backward));

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
