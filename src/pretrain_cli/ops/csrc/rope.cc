// RoPE, writing q and k head-major: the layout attention reads; and the attention's q/k/v projections with RoPE
// as one op (see common.h for why these kernels exist).
#include "common.h"

using pcl::check_f32;
using pcl::contig;

// ------------------------------------------------------------------------------ RoPE
// x [b, s, h, d] -> y [b, h, s, d] = x*cos + rotate_half(x)*sin (HF layout), written straight into the
// head-major layout attention's GEMMs read, so the rotation, the transpose and its copy are one pass.
// cos/sin are a table [T, d]: row p of it rotates position p (pcl_rope, T = s), or row pos[b, p]
// (pcl_rope_pos: positions that restart at each packed document).
namespace {
// The table row of token (bi, p): p itself, or its position id (checked against the table by the caller).
inline int64_t table_row(const int64_t* pos, int64_t bi, int64_t s, int64_t p) { return pos ? pos[bi * s + p] : p; }

void check_positions(const paddle::Tensor& pos, int64_t b, int64_t s, int64_t rows) {
  PD_CHECK(pos.is_cpu() && pos.dtype() == paddle::DataType::INT64, "rope: position_ids must be a CPU int64 tensor");
  PD_CHECK(pos.numel() == b * s, "rope: position_ids must be [bsz, seq_len]");
  const int64_t* pp = pos.data<int64_t>();
  for (int64_t i = 0; i < b * s; ++i)
    PD_CHECK(pp[i] >= 0 && pp[i] < rows, "rope: position id ", pp[i], " outside the cos/sin table of ", rows, " rows");
}

// The rotation over raw buffers: x token-major [b, s, h, d] -> y head-major [b, h, s, d].
void rotate_heads_first(const float* xp, float* yp, int64_t b, int64_t s, int64_t h, int64_t d, const float* cp,
                        const float* snp, const int64_t* pos) {
  const int64_t half = d / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < h; ++hi) {
      for (int64_t p = 0; p < s; ++p) {
        const float* xr = xp + ((bi * s + p) * h + hi) * d;
        const float* c = cp + table_row(pos, bi, s, p) * d;
        const float* sn = snp + table_row(pos, bi, s, p) * d;
        float* yr = yp + ((bi * h + hi) * s + p) * d;
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) {
          yr[j] = xr[j] * c[j] - xr[j + half] * sn[j];
          yr[j + half] = xr[j + half] * c[j + half] + xr[j] * sn[j + half];
        }
      }
    }
  }
}

// Its transpose: dy head-major [b, h, s, d] -> dx token-major [b, s, h, d].
void unrotate_tokens_first(const float* gp, float* dxp, int64_t b, int64_t s, int64_t h, int64_t d, const float* cp,
                           const float* snp, const int64_t* pos) {
  const int64_t half = d / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < h; ++hi) {
      for (int64_t p = 0; p < s; ++p) {
        const float* g = gp + ((bi * h + hi) * s + p) * d;
        const float* c = cp + table_row(pos, bi, s, p) * d;
        const float* sn = snp + table_row(pos, bi, s, p) * d;
        float* o = dxp + ((bi * s + p) * h + hi) * d;
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) {
          o[j] = g[j] * c[j] + g[j + half] * sn[j + half];
          o[j + half] = g[j + half] * c[j + half] - g[j] * sn[j];
        }
      }
    }
  }
}

paddle::Tensor rope_forward(const paddle::Tensor& x, const paddle::Tensor& cos, const paddle::Tensor& sin,
                            const int64_t* pos) {
  const auto& sh = x.shape();
  auto y = paddle::empty({sh[0], sh[2], sh[1], sh[3]}, x.dtype(), x.place());
  rotate_heads_first(x.data<float>(), y.data<float>(), sh[0], sh[1], sh[2], sh[3], cos.data<float>(),
                     sin.data<float>(), pos);
  return y;
}

// dx[b, s, h, d] from dy[b, h, s, d]: the transpose of the rotation.
paddle::Tensor rope_backward(const paddle::Tensor& x, const paddle::Tensor& cos, const paddle::Tensor& sin,
                             const paddle::Tensor& dy, const int64_t* pos) {
  const auto& sh = x.shape();
  auto dx = paddle::empty(sh, x.dtype(), x.place());
  unrotate_tokens_first(dy.data<float>(), dx.data<float>(), sh[0], sh[1], sh[2], sh[3], cos.data<float>(),
                        sin.data<float>(), pos);
  return dx;
}

// Shapes and dtypes of x and the table; returns the table's rows.
int64_t check_rope(const paddle::Tensor& x, const paddle::Tensor& cos, const paddle::Tensor& sin, bool table) {
  check_f32(x, "rope", "x");
  check_f32(cos, "rope", "cos");
  check_f32(sin, "rope", "sin");
  const auto& sh = x.shape();
  PD_CHECK(sh.size() == 4, "rope: x must be [bsz, seq_len, heads, head_dim]");
  const int64_t s = sh[1], d = sh[3];
  PD_CHECK(d > 0 && d % 2 == 0, "rope: head_dim must be even, got ", d);
  if (!table) {
    PD_CHECK(cos.numel() == s * d && sin.numel() == s * d, "rope: cos/sin must be [seq_len, head_dim]");
    return s;
  }
  PD_CHECK(cos.numel() % d == 0 && sin.numel() == cos.numel(), "rope: cos/sin must be [rows, head_dim]");
  return cos.numel() / d;
}
}  // namespace

std::vector<paddle::Tensor> RopeForward(const paddle::Tensor& x_arg, const paddle::Tensor& cos_arg,
                                        const paddle::Tensor& sin_arg) {
  const paddle::Tensor x = contig(x_arg), cos = contig(cos_arg), sin = contig(sin_arg);
  check_rope(x, cos, sin, false);
  return {rope_forward(x, cos, sin, nullptr)};
}

std::vector<paddle::Tensor> RopeBackward(const paddle::Tensor& x_arg, const paddle::Tensor& cos_arg,
                                         const paddle::Tensor& sin_arg, const paddle::Tensor& dy_arg) {
  return {rope_backward(contig(x_arg), contig(cos_arg), contig(sin_arg), contig(dy_arg), nullptr)};
}

std::vector<paddle::Tensor> RopePosForward(const paddle::Tensor& x_arg, const paddle::Tensor& cos_arg,
                                           const paddle::Tensor& sin_arg, const paddle::Tensor& pos_arg) {
  const paddle::Tensor x = contig(x_arg), cos = contig(cos_arg), sin = contig(sin_arg), pos = contig(pos_arg);
  const int64_t rows = check_rope(x, cos, sin, true);
  check_positions(pos, x.shape()[0], x.shape()[1], rows);
  return {rope_forward(x, cos, sin, pos.data<int64_t>())};
}

std::vector<paddle::Tensor> RopePosBackward(const paddle::Tensor& x_arg, const paddle::Tensor& cos_arg,
                                            const paddle::Tensor& sin_arg, const paddle::Tensor& pos_arg,
                                            const paddle::Tensor& dy_arg) {
  const paddle::Tensor pos = contig(pos_arg);  // checked by the forward
  return {rope_backward(contig(x_arg), contig(cos_arg), contig(sin_arg), contig(dy_arg), pos.data<int64_t>())};
}

std::vector<std::vector<int64_t>> RopeShape(const std::vector<int64_t>& x, const std::vector<int64_t>& c,
                                            const std::vector<int64_t>& s) {
  return {{x[0], x[2], x[1], x[3]}};
}

std::vector<std::vector<int64_t>> RopePosShape(const std::vector<int64_t>& x, const std::vector<int64_t>& c,
                                               const std::vector<int64_t>& s, const std::vector<int64_t>& p) {
  return {{x[0], x[2], x[1], x[3]}};
}

std::vector<paddle::DataType> RopePosDtype(const paddle::DataType& x, const paddle::DataType& c,
                                           const paddle::DataType& s, const paddle::DataType& p) {
  return {x};
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

PD_BUILD_OP(pcl_rope_pos)
    .Inputs({"X", "Cos", "Sin", "Pos"})
    .Outputs({"Y"})
    .SetKernelFn(PD_KERNEL(RopePosForward))
    .SetInferShapeFn(PD_INFER_SHAPE(RopePosShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RopePosDtype));

PD_BUILD_GRAD_OP(pcl_rope_pos)
    .Inputs({"X", "Cos", "Sin", "Pos", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X")})
    .SetKernelFn(PD_KERNEL(RopePosBackward));

// ------------------------------------------------- the attention's input projections and RoPE, one op
// q = rope(x·Wq) and k = rope(x·Wk) head-major (what attention's GEMMs read), v = x·Wv token-major (as attention
// reads it), from x [b, s, hidden] and the Linear weights [hidden, heads·d]. One op instead of Paddle's three
// matmuls, three reshapes and two RoPE ops, and in the backward instead of their gradients plus the sum of x's three
// gradients: dx is one GEMM accumulating into the next (beta = 1). The rotation runs on a projection just written
// (still in cache) and the unrotated q and k are never tensors the autograd graph keeps (docs/PERFORMANCE.md §3.13).
// `Pos` int64 [b, s] picks each token's table row (packed documents), or is empty: row p for position p.
namespace {
using pcl::kNoTrans;
using pcl::kRowMajor;
using pcl::kTrans;

struct AttnIn {
  int64_t b, s, hidden, heads, kv_heads, d;
  const int64_t* pos;
};

AttnIn check_attn_in(const paddle::Tensor& x, const paddle::Tensor& wq, const paddle::Tensor& wk,
                     const paddle::Tensor& wv, const paddle::Tensor& cos, const paddle::Tensor& sin,
                     const paddle::Tensor& pos, int64_t d) {
  check_f32(x, "attn_in", "x");
  check_f32(wq, "attn_in", "q weight");
  check_f32(wk, "attn_in", "k weight");
  check_f32(wv, "attn_in", "v weight");
  check_f32(cos, "attn_in", "cos");
  check_f32(sin, "attn_in", "sin");
  PD_CHECK(x.shape().size() == 3, "attn_in: x must be [bsz, seq_len, hidden]");
  PD_CHECK(d > 0 && d % 2 == 0, "attn_in: head_dim must be even, got ", d);
  const int64_t b = x.shape()[0], s = x.shape()[1], hidden = x.shape()[2];
  PD_CHECK(wq.shape().size() == 2 && wk.shape().size() == 2 && wk.shape() == wv.shape() && wq.shape()[0] == hidden &&
               wk.shape()[0] == hidden,
           "attn_in: the q/k/v weights must be [hidden, heads * head_dim] (k and v alike)");
  PD_CHECK(wq.shape()[1] % d == 0 && wk.shape()[1] % d == 0, "attn_in: weight widths are not whole heads of ", d);
  PD_CHECK(cos.numel() % d == 0 && sin.numel() == cos.numel(), "attn_in: cos/sin must be [rows, head_dim]");
  if (pos.numel() == 0) {
    PD_CHECK(cos.numel() == s * d, "attn_in: cos/sin must be [seq_len, head_dim]");
  } else {
    check_positions(pos, b, s, cos.numel() / d);
  }
  return {b, s, hidden, wq.shape()[1] / d, wk.shape()[1] / d, d, pos.numel() == 0 ? nullptr : pos.data<int64_t>()};
}
}  // namespace

std::vector<paddle::Tensor> AttnInForward(const paddle::Tensor& x_arg, const paddle::Tensor& wq_arg,
                                          const paddle::Tensor& wk_arg, const paddle::Tensor& wv_arg,
                                          const paddle::Tensor& cos_arg, const paddle::Tensor& sin_arg,
                                          const paddle::Tensor& pos_arg, int64_t head_dim) {
  const paddle::Tensor x = contig(x_arg), wq = contig(wq_arg), wk = contig(wk_arg), wv = contig(wv_arg),
                       cos = contig(cos_arg), sin = contig(sin_arg), pos = contig(pos_arg);
  const AttnIn a = check_attn_in(x, wq, wk, wv, cos, sin, pos, head_dim);
  const int64_t n = a.b * a.s, qw = a.heads * a.d, kw = a.kv_heads * a.d;
  auto q = paddle::empty({a.b, a.heads, a.s, a.d}, x.dtype(), x.place());
  auto k = paddle::empty({a.b, a.kv_heads, a.s, a.d}, x.dtype(), x.place());
  auto v = paddle::empty({a.b, a.s, a.kv_heads, a.d}, x.dtype(), x.place());
  auto tmp = paddle::empty({std::max<int64_t>(n * std::max(qw, kw), 1)}, x.dtype(), x.place());  // x·W, unrotated
  float* t = tmp.data<float>();
  const float* xp = x.data<float>();
  if (n > 0 && a.hidden > 0) {
    cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, n, qw, a.hidden, 1.f, xp, a.hidden, wq.data<float>(), qw, 0.f, t, qw);
    rotate_heads_first(t, q.data<float>(), a.b, a.s, a.heads, a.d, cos.data<float>(), sin.data<float>(), a.pos);
    cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, n, kw, a.hidden, 1.f, xp, a.hidden, wk.data<float>(), kw, 0.f, t, kw);
    rotate_heads_first(t, k.data<float>(), a.b, a.s, a.kv_heads, a.d, cos.data<float>(), sin.data<float>(), a.pos);
    cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, n, kw, a.hidden, 1.f, xp, a.hidden, wv.data<float>(), kw, 0.f,
                v.data<float>(), kw);
  } else {  // no rows (nothing to write) or hidden 0 (every projection is 0)
    for (auto* out : {&q, &k, &v}) std::fill(out->data<float>(), out->data<float>() + out->numel(), 0.f);
  }
  return {q, k, v};
}

std::vector<paddle::Tensor> AttnInBackward(const paddle::Tensor& x_arg, const paddle::Tensor& wq_arg,
                                           const paddle::Tensor& wk_arg, const paddle::Tensor& wv_arg,
                                           const paddle::Tensor& cos_arg, const paddle::Tensor& sin_arg,
                                           const paddle::Tensor& pos_arg, const paddle::Tensor& dq_arg,
                                           const paddle::Tensor& dk_arg, const paddle::Tensor& dv_arg,
                                           int64_t head_dim) {
  const paddle::Tensor x = contig(x_arg), wq = contig(wq_arg), wk = contig(wk_arg), wv = contig(wv_arg),
                       cos = contig(cos_arg), sin = contig(sin_arg), pos = contig(pos_arg);
  const AttnIn a = check_attn_in(x, wq, wk, wv, cos, sin, pos, head_dim);
  const int64_t n = a.b * a.s, h = a.hidden;
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  auto dwq = paddle::empty(wq.shape(), wq.dtype(), wq.place());
  auto dwk = paddle::empty(wk.shape(), wk.dtype(), wk.place());
  auto dwv = paddle::empty(wv.shape(), wv.dtype(), wv.place());
  const int64_t widest = std::max(wq.shape()[1], wk.shape()[1]);
  auto tmp = paddle::empty({std::max<int64_t>(n * widest, 1)}, x.dtype(), x.place());  // d(x·W), unrotated
  float* t = tmp.data<float>();
  const float* xp = x.data<float>();
  float* dxp = dx.data<float>();
  float beta = 0.f;  // the first product writes dx, the others add to it
  // each projection: its gradient token-major (q and k unrotated into `t`), dx += d·Wᵀ, dW = xᵀ·d
  struct Part {
    const paddle::Tensor& w;
    const paddle::Tensor& grad;
    paddle::Tensor& dw;
    int64_t heads;
    bool rotated;
  };
  for (const Part& p : {Part{wq, dq_arg, dwq, a.heads, true}, Part{wk, dk_arg, dwk, a.kv_heads, true},
                        Part{wv, dv_arg, dwv, a.kv_heads, false}}) {
    const int64_t width = p.heads * a.d;
    float* dw = p.dw.data<float>();
    if (!p.grad.initialized() || n == 0 || h == 0) {  // no gradient reached this output, or nothing to multiply
      std::fill(dw, dw + p.dw.numel(), 0.f);
      continue;
    }
    const paddle::Tensor g = contig(p.grad);
    const float* gd = g.data<float>();
    if (p.rotated) {
      unrotate_tokens_first(gd, t, a.b, a.s, p.heads, a.d, cos.data<float>(), sin.data<float>(), a.pos);
      gd = t;
    }
    cblas_sgemm(kRowMajor, kNoTrans, kTrans, n, h, width, 1.f, gd, width, p.w.data<float>(), width, beta, dxp, h);
    cblas_sgemm(kRowMajor, kTrans, kNoTrans, h, width, n, 1.f, xp, h, gd, width, 0.f, dw, width);
    beta = 1.f;
  }
  if (beta == 0.f) std::fill(dxp, dxp + dx.numel(), 0.f);  // no product ran
  return {dx, dwq, dwk, dwv};
}

std::vector<std::vector<int64_t>> AttnInShape(const std::vector<int64_t>& x, const std::vector<int64_t>& wq,
                                              const std::vector<int64_t>& wk, const std::vector<int64_t>& wv,
                                              const std::vector<int64_t>& c, const std::vector<int64_t>& sn,
                                              const std::vector<int64_t>& p, const int64_t& head_dim) {
  const int64_t heads = head_dim > 0 ? wq[1] / head_dim : -1, kv = head_dim > 0 ? wk[1] / head_dim : -1;
  return {{x[0], heads, x[1], head_dim}, {x[0], kv, x[1], head_dim}, {x[0], x[1], kv, head_dim}};
}

std::vector<paddle::DataType> AttnInDtype(const paddle::DataType& x, const paddle::DataType& wq,
                                          const paddle::DataType& wk, const paddle::DataType& wv,
                                          const paddle::DataType& c, const paddle::DataType& sn,
                                          const paddle::DataType& p) {
  return {x, x, x};
}

PD_BUILD_OP(pcl_attn_in)
    .Inputs({"X", "Wq", "Wk", "Wv", "Cos", "Sin", "Pos"})
    .Outputs({"Q", "K", "V"})
    .Attrs({"head_dim: int64_t"})
    .SetKernelFn(PD_KERNEL(AttnInForward))
    .SetInferShapeFn(PD_INFER_SHAPE(AttnInShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AttnInDtype));

PD_BUILD_GRAD_OP(pcl_attn_in)
    .Inputs({"X", "Wq", "Wk", "Wv", "Cos", "Sin", "Pos", paddle::Grad("Q"), paddle::Grad("K"), paddle::Grad("V")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Wq"), paddle::Grad("Wk"), paddle::Grad("Wv")})
    .Attrs({"head_dim: int64_t"})
    .SetKernelFn(PD_KERNEL(AttnInBackward));
