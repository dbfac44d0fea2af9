// RoPE, writing q and k head-major: the layout attention reads (see common.h for why these kernels exist).
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

paddle::Tensor rope_forward(const paddle::Tensor& x, const paddle::Tensor& cos, const paddle::Tensor& sin,
                            const int64_t* pos) {
  const auto& sh = x.shape();
  const int64_t b = sh[0], s = sh[1], h = sh[2], d = sh[3], half = d / 2;
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
  return y;
}

// dx[b, s, h, d] from dy[b, h, s, d]: the transpose of the rotation.
paddle::Tensor rope_backward(const paddle::Tensor& x, const paddle::Tensor& cos, const paddle::Tensor& sin,
                             const paddle::Tensor& dy, const int64_t* pos) {
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
