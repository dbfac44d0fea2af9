// RoPE, head transposes and block-causal attention (see common.h for why these kernels exist).
#include "common.h"

using pcl::check_f32;
using pcl::contig;
using pcl::last_dim;
using pcl::vexp;

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
  PD_CHECK(d > 0 && d % 2 == 0, "rope: head_dim must be even, got ", d);
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

// ------------------------------------------------------------------- block-causal attention
// q [B, H, S, D], k/v [B, G, SK, D] (GQA: head h reads KV head h / (H/G)) -> out [B, H, S, D] and the
// probabilities [B, H, S, SK] kept for the backward. Query i sees keys j <= SK - S + i (bottom-right, as
// kernels._causal_bool_mask). Queries go in blocks of kBlock rows and each block multiplies only the keys
// its last row can see, so the GEMMs skip the masked upper triangle (~40% of attention FLOPs at S = 512,
// approaching 50% for long sequences). Blocks call MKL's single-threaded sgemm inside the OpenMP loop.
extern "C" void cblas_sgemm(int layout, int transa, int transb, int m, int n, int k, float alpha, const float* a,
                            int lda, const float* b, int ldb, float beta, float* c, int ldc);

namespace {
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
constexpr int64_t kBlock = 64;

void check_attention_shapes(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v) {
  PD_CHECK(q.shape().size() == 4 && k.shape().size() == 4 && v.shape() == k.shape(),
           "causal_attention: q [B, H, S, D], k and v [B, G, SK, D]");
  PD_CHECK(q.shape()[0] == k.shape()[0] && q.shape()[3] == k.shape()[3] && q.shape()[1] % k.shape()[1] == 0 &&
               q.shape()[2] <= k.shape()[2],
           "causal_attention: mismatched q/k shapes");
  PD_CHECK(q.shape()[3] > 0 && q.shape()[2] > 0, "causal_attention: empty head_dim or sequence");
}
}  // namespace

std::vector<paddle::Tensor> CausalAttentionForward(const paddle::Tensor& q_arg, const paddle::Tensor& k_arg,
                                                   const paddle::Tensor& v_arg, float scale) {
  const paddle::Tensor q = contig(q_arg);
  const paddle::Tensor k = contig(k_arg);
  const paddle::Tensor v = contig(v_arg);
  check_f32(q, "causal_attention", "q");
  check_f32(k, "causal_attention", "k");
  check_f32(v, "causal_attention", "v");
  check_attention_shapes(q, k, v);
  const int64_t B = q.shape()[0], H = q.shape()[1], S = q.shape()[2], D = q.shape()[3];
  const int64_t G = k.shape()[1], SK = k.shape()[2], rep = H / G, shift = SK - S;
  auto out = paddle::empty({B, H, S, D}, q.dtype(), q.place());
  auto probs = paddle::empty({B, H, S, SK}, q.dtype(), q.place());
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  float* op = out.data<float>();
  float* pp = probs.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / rep;
      const float* Q = qp + (b * H + h) * S * D;
      const float* K = kp + (b * G + g) * SK * D;
      const float* V = vp + (b * G + g) * SK * D;
      float* P = pp + (b * H + h) * S * SK;
      float* O = op + (b * H + h) * S * D;
      for (int64_t i0 = 0; i0 < S; i0 += kBlock) {
        const int64_t m = std::min(kBlock, S - i0), n = shift + i0 + m;  // keys the block's last row sees
        cblas_sgemm(kRowMajor, kNoTrans, kTrans, m, n, D, scale, Q + i0 * D, D, K, D, 0.f, P + i0 * SK, SK);
        for (int64_t r = 0; r < m; ++r) {
          float* row = P + (i0 + r) * SK;
          const int64_t vis = shift + i0 + r + 1;
          float mx = row[0];
#pragma omp simd reduction(max : mx)
          for (int64_t j = 1; j < vis; ++j) mx = row[j] > mx ? row[j] : mx;
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < vis; ++j) {
            const float e = vexp(row[j] - mx);
            row[j] = e;
            sum += e;
          }
          const float inv = 1.f / sum;
#pragma omp simd
          for (int64_t j = 0; j < vis; ++j) row[j] *= inv;
          for (int64_t j = vis; j < SK; ++j) row[j] = 0.f;  // the backward and any reader see exact zeros
        }
        cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, m, D, n, 1.f, P + i0 * SK, SK, V, D, 0.f, O + i0 * D, D);
      }
    }
  }
  return {out, probs};
}

// Per KV head (so dK/dV accumulate without races): dP = dO V^T, dS = scale * P * (dP - rowsum(P * dP)),
// dQ = dS K, dK += dS^T Q, dV += P^T dO, each over the block's visible keys only.
std::vector<paddle::Tensor> CausalAttentionBackward(const paddle::Tensor& q_arg, const paddle::Tensor& k_arg,
                                                    const paddle::Tensor& v_arg, const paddle::Tensor& p_arg,
                                                    const paddle::Tensor& dout_arg, float scale) {
  const paddle::Tensor q = contig(q_arg);
  const paddle::Tensor k = contig(k_arg);
  const paddle::Tensor v = contig(v_arg);
  const paddle::Tensor p = contig(p_arg);
  const paddle::Tensor dout = contig(dout_arg);
  const int64_t B = q.shape()[0], H = q.shape()[1], S = q.shape()[2], D = q.shape()[3];
  const int64_t G = k.shape()[1], SK = k.shape()[2], rep = H / G, shift = SK - S;
  auto dq = paddle::empty(q.shape(), q.dtype(), q.place());
  auto dk = paddle::empty(k.shape(), k.dtype(), k.place());
  auto dv = paddle::empty(v.shape(), v.dtype(), v.place());
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const float* pp = p.data<float>();
  const float* gp = dout.data<float>();
  float* dqp = dq.data<float>();
  float* dkp = dk.data<float>();
  float* dvp = dv.data<float>();
#pragma omp parallel
  {
    std::vector<float> ds(static_cast<size_t>(kBlock) * SK);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t g = 0; g < G; ++g) {
        const float* K = kp + (b * G + g) * SK * D;
        const float* V = vp + (b * G + g) * SK * D;
        float* dK = dkp + (b * G + g) * SK * D;
        float* dV = dvp + (b * G + g) * SK * D;
        std::fill(dK, dK + SK * D, 0.f);
        std::fill(dV, dV + SK * D, 0.f);
        for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
          const float* Q = qp + (b * H + h) * S * D;
          const float* P = pp + (b * H + h) * S * SK;
          const float* dO = gp + (b * H + h) * S * D;
          float* dQ = dqp + (b * H + h) * S * D;
          for (int64_t i0 = 0; i0 < S; i0 += kBlock) {
            const int64_t m = std::min(kBlock, S - i0), n = shift + i0 + m;
            float* dS = ds.data();  // [m, n]
            cblas_sgemm(kRowMajor, kNoTrans, kTrans, m, n, D, 1.f, dO + i0 * D, D, V, D, 0.f, dS, n);
            for (int64_t r = 0; r < m; ++r) {
              const float* pr = P + (i0 + r) * SK;
              float* dr = dS + r * n;
              float dot = 0.f;
#pragma omp simd reduction(+ : dot)
              for (int64_t j = 0; j < n; ++j) dot += pr[j] * dr[j];
#pragma omp simd
              for (int64_t j = 0; j < n; ++j) dr[j] = scale * pr[j] * (dr[j] - dot);
            }
            cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, m, D, n, 1.f, dS, n, K, D, 0.f, dQ + i0 * D, D);
            cblas_sgemm(kRowMajor, kTrans, kNoTrans, n, D, m, 1.f, dS, n, Q + i0 * D, D, 1.f, dK, D);
            cblas_sgemm(kRowMajor, kTrans, kNoTrans, n, D, m, 1.f, P + i0 * SK, SK, dO + i0 * D, D, 1.f, dV, D);
          }
        }
      }
    }
  }
  return {dq, dk, dv};
}

std::vector<std::vector<int64_t>> CausalAttentionShape(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                                                       const std::vector<int64_t>& v, const float& scale) {
  return {q, {q[0], q[1], q[2], k[2]}};
}

std::vector<paddle::DataType> CausalAttentionDtype(const paddle::DataType& q, const paddle::DataType& k,
                                                   const paddle::DataType& v) {
  return {q, q};
}

PD_BUILD_OP(pcl_causal_attention)
    .Inputs({"Q", "K", "V"})
    .Outputs({"Out", "Probs"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(CausalAttentionForward))
    .SetInferShapeFn(PD_INFER_SHAPE(CausalAttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(CausalAttentionDtype));

PD_BUILD_GRAD_OP(pcl_causal_attention)
    .Inputs({"Q", "K", "V", "Probs", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Q"), paddle::Grad("K"), paddle::Grad("V")})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(CausalAttentionBackward));
