// Block-causal and document-masked attention (see common.h for why these kernels exist).
#include "causal_tiles.h"  // includes common.h

#if defined(__AVX512F__)
#include <immintrin.h>  // the probability rows' non-temporal stores
#endif

using pcl::check_f32;
using pcl::contig;
using pcl::exp_from_max;

// ------------------------------------------------------------------- block-causal attention
// q [B, H, S, D], k [B, G, SK, D] (GQA: head h reads KV head h / (H/G)) and v token-major [B, SK, G, D] -> out
// token-major [B, S, H, D] and the probabilities kept for the backward, [B, H, T]: each head's query blocks one
// after another, a block's [m, w] probabilities contiguous (row stride w, the keys the block multiplies), so the
// buffer holds the blocks' keys only (T = probs_per_head(S, SK): ~S²/2 + 64·S when S == SK, about half of
// [S, SK] for long sequences; with a KV cache, S << SK, nearly all of it) and the backward reads each block as one
// run of memory (0.5 % of bench's step against rows SK apart, docs/PERFORMANCE.md §3.3). v and out keep the
// projections' layout (the GEMMs read and write them with row strides G·D and H·D): no transposing copy of
// either, forward or backward (docs/PERFORMANCE.md §3.3). Query i sees keys j <= SK - S + i (bottom-right, as
// kernels._causal_bool_mask). Queries go in blocks of kBlock rows and each block multiplies only the keys
// its last row can see, so the GEMMs skip the masked upper triangle (~40% of attention FLOPs at S = 512,
// approaching 50% for long sequences). Blocks call MKL's single-threaded sgemm inside the OpenMP loop. Where
// head_dim allows (causal_tiles.h), a block's last m keys, the m x m square whose upper triangle is masked, go
// through triangle tiles instead, and the sgemm covers the keys before them (docs/PERFORMANCE.md §3.16).
//
// Document masking (pcl_document_attention, packed samples, S == SK): start[b, i] is the first key of query
// i's document, so query i sees keys start[i] <= j <= i. Row blocks are also cut at document starts, so all
// rows of a block share one start k0 and its GEMMs begin at key k0: every key block before the document is
// skipped, forward and backward. On short documents most of the causal triangle is skipped.
namespace {
using pcl::kNoTrans;
using pcl::kRowMajor;
using pcl::kTrans;
constexpr int64_t kBlock = 64;  // cpu_ops.ATTENTION_BLOCK, which the planner's memory model reads


// The probabilities one head keeps: a bound on the sum of its blocks' m·w over every causal and document
// blocking. A row i sits in a block of at most kBlock rows that starts at or before it, and the block multiplies
// keys up to its last row's, so its w is at most min(SK, SK - S + i + kBlock). (Mirrored by
// cpu_ops.attention_probs_per_head; tests/unit/test_cpu_attention.py checks the two agree.)
int64_t probs_per_head(int64_t S, int64_t SK) {
  if (S < 0 || SK < 0) return -1;  // a length not known yet (shape inference under to_static): unknown too
  int64_t t = 0;
  for (int64_t i = 0; i < S; ++i) t += std::min(SK, SK - S + i + kBlock);
  return t;
}

void check_attention_shapes(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v) {
  PD_CHECK(q.shape().size() == 4 && k.shape().size() == 4 && v.shape().size() == 4 && v.shape()[0] == k.shape()[0] &&
               v.shape()[1] == k.shape()[2] && v.shape()[2] == k.shape()[1] && v.shape()[3] == k.shape()[3],
           "causal_attention: q [B, H, S, D], k [B, G, SK, D], v [B, SK, G, D]");
  PD_CHECK(q.shape()[0] == k.shape()[0] && q.shape()[3] == k.shape()[3] && q.shape()[1] % k.shape()[1] == 0 &&
               q.shape()[2] <= k.shape()[2],
           "causal_attention: mismatched q/k shapes");
  PD_CHECK(q.shape()[3] > 0 && q.shape()[2] > 0, "causal_attention: empty head_dim or sequence");
}

// Documents are contiguous runs: row 0 starts one (at 0) and every later row continues its predecessor's
// document or starts a new one at itself. Anything else would make the kernel read a wrong key range.
void check_starts(const paddle::Tensor& start, int64_t B, int64_t S) {
  PD_CHECK(start.is_cpu() && start.dtype() == paddle::DataType::INT64, "document_attention: doc_start must be a CPU int64 tensor");
  PD_CHECK(start.numel() == B * S, "document_attention: doc_start must be [bsz, seq_len]");
  const int64_t* st = start.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* r = st + b * S;
    PD_CHECK(r[0] == 0, "document_attention: doc_start[", b, ", 0] must be 0, got ", r[0]);
    for (int64_t i = 1; i < S; ++i)
      PD_CHECK(r[i] == r[i - 1] || r[i] == i, "document_attention: doc_start[", b, ", ", i, "] = ", r[i],
               " neither continues the previous document nor starts one there");
  }
}

// Rows [i0, i0 + m) of one block: all of one document when `st` (its row of starts) is given, whose first
// key k0 is where the block's GEMMs begin; without `st`, a plain kBlock-row block that starts at key 0.
inline void block_rows(const int64_t* st, int64_t i0, int64_t S, int64_t* m, int64_t* k0) {
  if (st == nullptr) {
    *m = std::min(kBlock, S - i0);
    *k0 = 0;
    return;
  }
  int64_t n = 1;
  while (n < kBlock && i0 + n < S && st[i0 + n] == st[i0]) ++n;
  *m = n;
  *k0 = st[i0];
}

// Copies one probability row into the buffer the backward reads. From the row's first 64-byte boundary on, the
// whole 16-float pieces go with non-temporal stores: the buffer (~12 MiB per layer at bench's shape) is not read
// again until the backward, so a normal store would first read every line into the cache only to evict it
// (ordinary stores made the bench step 0.5 % slower: docs/PERFORMANCE.md §6). The values are the same.
inline void store_probs(float* dst, const float* src, int64_t w) {
  int64_t j = 0;
#if defined(__AVX512F__)
  // up to dst's first 64-byte boundary as plain stores (a row can start anywhere: heads are T floats apart and
  // blocks m·w), the whole 16-float pieces from there streamed
  j = std::min<int64_t>(w, static_cast<int64_t>((64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64 / sizeof(float)));
  std::memcpy(dst, src, sizeof(float) * j);
  for (; j + 16 <= w; j += 16) _mm512_stream_ps(dst + j, _mm512_loadu_ps(src + j));
#endif
  std::memcpy(dst + j, src + j, sizeof(float) * (w - j));
}

std::vector<paddle::Tensor> attention_forward(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v,
                                              const int64_t* start, float scale) {
  const int64_t B = q.shape()[0], H = q.shape()[1], S = q.shape()[2], D = q.shape()[3];
  const int64_t G = k.shape()[1], SK = k.shape()[2], rep = H / G, shift = SK - S;
  const int64_t ldv = G * D, ldo = H * D;  // row strides of the token-major v and out
  auto out = paddle::empty({B, S, H, D}, q.dtype(), q.place());
  const int64_t T = probs_per_head(S, SK);
  auto probs = paddle::empty({B, H, T}, q.dtype(), q.place());
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  float* op = out.data<float>();
  float* pp = probs.data<float>();
  const bool tiles = pcl::square_tiles_fit(D);
#pragma omp parallel
  {
    // one block's scores [m, w] in this thread's cache; the softmax and the P·V GEMM read them from here
    std::vector<float> scratch(static_cast<size_t>(kBlock) * SK), bt(tiles ? static_cast<size_t>(kBlock * D) : 0);
    float* Sc = scratch.data();
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / rep;
        const int64_t* st = start ? start + b * S : nullptr;
        const float* Q = qp + (b * H + h) * S * D;
        const float* K = kp + (b * G + g) * SK * D;
        const float* V = vp + b * SK * ldv + g * D;  // [SK, D] at row stride ldv
        float* P = pp + (b * H + h) * T;  // this head's blocks, one after another
        float* O = op + b * S * ldo + h * D;  // [S, D] at row stride ldo
        for (int64_t i0 = 0, m = 0, k0 = 0; i0 < S; i0 += m) {
          block_rows(st, i0, S, &m, &k0);
          const int64_t n = shift + i0 + m, w = n - k0;  // the block's keys: [k0, n), what its last row sees
          const int64_t off = w - m;  // the keys before the block's diagonal square [n - m, n)
          if (!tiles) {
            cblas_sgemm(kRowMajor, kNoTrans, kTrans, m, w, D, scale, Q + i0 * D, D, K + k0 * D, D, 0.f, Sc, w);
          } else {
            if (off > 0)
              cblas_sgemm(kRowMajor, kNoTrans, kTrans, m, off, D, scale, Q + i0 * D, D, K + k0 * D, D, 0.f, Sc, w);
            pcl::square_scores(Q + i0 * D, D, K + (n - m) * D, D, Sc, w, off, m, D, scale, bt.data());
          }
          for (int64_t r = 0; r < m; ++r) {
            float* row = Sc + r * w;
            const int64_t vis = shift + i0 + r + 1 - k0;  // keys [k0, k0 + vis) are visible
            float mx;
            const float inv = 1.f / exp_from_max(row, vis, &mx);
#pragma omp simd
            for (int64_t j = 0; j < vis; ++j) row[j] *= inv;
            // The backward multiplies each row over its block's keys [k0, n), where the causally hidden ones must
            // be exact zeros; keys before k0 (other documents) are not stored at all.
            std::fill(row + vis, row + w, 0.f);
            store_probs(P + r * w, row, w);
          }
          if (!tiles) {
            cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, m, D, w, 1.f, Sc, w, V + k0 * ldv, ldv, 0.f, O + i0 * ldo, ldo);
          } else {
            if (off > 0)
              cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, m, D, off, 1.f, Sc, w, V + k0 * ldv, ldv, 0.f, O + i0 * ldo,
                          ldo);
            pcl::square_weighted(Sc, w, off, V + (n - m) * ldv, ldv, O + i0 * ldo, ldo, m, D, off > 0);
          }
          P += m * w;  // the next block's
        }
      }
    }
#if defined(__AVX512F__)
    _mm_sfence();  // this thread's streamed rows are visible before the backward (maybe on another thread) reads
#endif
  }
  return {out, probs};
}

// Query blocks are dealt round-robin (block j to slice j % ns) into `ns` slices per (batch, KV head), so even
// batch 1 with one KV head keeps every thread busy; the causal triangle makes late blocks dearer, and dealing
// them out evens the slices. `ns` depends on the shapes only, never on the thread count: with several slices
// each accumulates its own dK/dV and the slices are added in order, so the bits are the same on any number
// of threads. With B * G >= kMinTasks, ns = 1 and dK/dV accumulate in place, as before slicing existed.
constexpr int64_t kMinTasks = 16;

int64_t query_slices(int64_t B, int64_t G, int64_t S) {
  const int64_t items = B * G, blocks = (S + kBlock - 1) / kBlock;
  return items >= kMinTasks ? 1 : std::max<int64_t>(1, std::min(blocks, (kMinTasks + items - 1) / items));
}

struct BackwardArgs {
  const float *q, *k, *v, *p, *dout;  // v [B, SK, G, D] and dout [B, S, H, D] token-major, the rest head-major
  float* dq;
  const int64_t* start;
  int64_t B, H, S, D, G, SK, rep, shift, T;  // T: probs_per_head
  float scale;
};

// One slice of (b, g): dP = dO V^T, dS = scale * P * (dP - rowsum(P * dP)), dQ = dS K, dK += dS^T Q,
// dV += P^T dO over the slice's query blocks of every query head of KV head g, each over the block's keys
// [k0, n) only. `ds` is this thread's [kBlock, SK] scratch; dV's rows are `lddv` apart (the token-major dv, or a
// slice's own [SK, D]).
void backward_slice(const BackwardArgs& a, int64_t b, int64_t g, int64_t slice, int64_t ns, float* dK, float* dV,
                    int64_t lddv, float* ds, bool tiles, float* bt) {
  const int64_t S = a.S, D = a.D, SK = a.SK, ldv = a.G * D, ldo = a.H * D;
  const int64_t* st = a.start ? a.start + b * S : nullptr;
  const float* K = a.k + (b * a.G + g) * SK * D;
  const float* V = a.v + b * SK * ldv + g * D;  // [SK, D] at row stride ldv
  for (int64_t h = g * a.rep; h < (g + 1) * a.rep; ++h) {
    const float* Q = a.q + (b * a.H + h) * S * D;
    const float* P = a.p + (b * a.H + h) * a.T;  // the head's blocks: each [m, w], one after another
    const float* dO = a.dout + b * S * ldo + h * D;  // [S, D] at row stride ldo
    float* dQ = a.dq + (b * a.H + h) * S * D;
    for (int64_t i0 = 0, m = 0, k0 = 0, ordinal = 0, w = 0; i0 < S; i0 += m, ++ordinal, P += m * w) {
      block_rows(st, i0, S, &m, &k0);
      w = a.shift + i0 + m - k0;  // the block's keys [k0, shift + i0 + m)
      if (ordinal % ns != slice) continue;
      float* dS = ds;  // [m, w]
      const int64_t off = w - m, sq = a.shift + i0;  // the keys before the diagonal square; its first key
      if (!tiles) {
        cblas_sgemm(kRowMajor, kNoTrans, kTrans, m, w, D, 1.f, dO + i0 * ldo, ldo, V + k0 * ldv, ldv, 0.f, dS, w);
      } else {
        if (off > 0)
          cblas_sgemm(kRowMajor, kNoTrans, kTrans, m, off, D, 1.f, dO + i0 * ldo, ldo, V + k0 * ldv, ldv, 0.f, dS, w);
        pcl::square_scores(dO + i0 * ldo, ldo, V + sq * ldv, ldv, dS, w, off, m, D, 1.f, bt);
      }
      for (int64_t r = 0; r < m; ++r) {
        const float* pr = P + r * w;
        float* dr = dS + r * w;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < w; ++j) dot += pr[j] * dr[j];
#pragma omp simd
        for (int64_t j = 0; j < w; ++j) dr[j] = a.scale * pr[j] * (dr[j] - dot);
      }
      if (!tiles) {
        cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, m, D, w, 1.f, dS, w, K + k0 * D, D, 0.f, dQ + i0 * D, D);
        cblas_sgemm(kRowMajor, kTrans, kNoTrans, w, D, m, 1.f, dS, w, Q + i0 * D, D, 1.f, dK + k0 * D, D);
        cblas_sgemm(kRowMajor, kTrans, kNoTrans, w, D, m, 1.f, P, w, dO + i0 * ldo, ldo, 1.f, dV + k0 * lddv, lddv);
        continue;
      }
      if (off > 0) {
        cblas_sgemm(kRowMajor, kNoTrans, kNoTrans, m, D, off, 1.f, dS, w, K + k0 * D, D, 0.f, dQ + i0 * D, D);
        cblas_sgemm(kRowMajor, kTrans, kNoTrans, off, D, m, 1.f, dS, w, Q + i0 * D, D, 1.f, dK + k0 * D, D);
        cblas_sgemm(kRowMajor, kTrans, kNoTrans, off, D, m, 1.f, P, w, dO + i0 * ldo, ldo, 1.f, dV + k0 * lddv, lddv);
      }
      pcl::square_weighted(dS, w, off, K + sq * D, D, dQ + i0 * D, D, m, D, off > 0);
      pcl::square_transposed(dS, w, off, Q + i0 * D, D, dK + sq * D, D, m, D);
      pcl::square_transposed(P, w, off, dO + i0 * ldo, ldo, dV + sq * lddv, lddv, m, D);
    }
  }
}

std::vector<paddle::Tensor> attention_backward(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v,
                                               const paddle::Tensor& p, const paddle::Tensor& dout,
                                               const int64_t* start, float scale) {
  const int64_t B = q.shape()[0], H = q.shape()[1], S = q.shape()[2], D = q.shape()[3];
  const int64_t G = k.shape()[1], SK = k.shape()[2], T = probs_per_head(S, SK);
  PD_CHECK(p.numel() == B * H * T, "causal_attention: the probabilities are not this op's");
  auto dq = paddle::empty(q.shape(), q.dtype(), q.place());
  auto dk = paddle::empty(k.shape(), k.dtype(), k.place());
  auto dv = paddle::empty(v.shape(), v.dtype(), v.place());  // token-major, as v
  const BackwardArgs a{q.data<float>(), k.data<float>(), v.data<float>(), p.data<float>(), dout.data<float>(),
                       dq.data<float>(), start, B, H, S, D, G, SK, H / G, SK - S, T, scale};
  float* dkp = dk.data<float>();
  float* dvp = dv.data<float>();
  const int64_t ns = query_slices(B, G, S), head = SK * D, ldv = G * D;
  std::vector<float> partial(ns > 1 ? static_cast<size_t>(B * G * ns * 2 * head) : 0);  // [B*G, ns, dK|dV, SK, D]
  const bool tiles = pcl::square_tiles_fit(D);
#pragma omp parallel
  {
    std::vector<float> ds(static_cast<size_t>(kBlock) * SK), bt(tiles ? static_cast<size_t>(kBlock * D) : 0);
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t s = 0; s < ns; ++s) {
          const int64_t bg = b * G + g;
          float* dK = ns == 1 ? dkp + bg * head : partial.data() + ((bg * ns + s) * 2) * head;
          float* dV = ns == 1 ? dvp + b * SK * ldv + g * D : partial.data() + ((bg * ns + s) * 2 + 1) * head;
          const int64_t lddv = ns == 1 ? ldv : D;
          std::fill(dK, dK + head, 0.f);
          for (int64_t r = 0; r < SK; ++r) std::fill(dV + r * lddv, dV + r * lddv + D, 0.f);
          backward_slice(a, b, g, s, ns, dK, dV, lddv, ds.data(), tiles, bt.data());
        }
      }
    }
    if (ns > 1) {  // after the loop's barrier: every slice is complete; add them in slice order
      const int64_t rows = std::max<int64_t>(1, 4096 / D), pieces = (SK + rows - 1) / rows;
#pragma omp for collapse(2) schedule(static)
      for (int64_t bg = 0; bg < B * G; ++bg) {
        for (int64_t c = 0; c < pieces; ++c) {
          const int64_t lo = c * rows, hi = std::min(SK, lo + rows);
          for (int64_t which = 0; which < 2; ++which) {
            // dK [B, G, SK, D] head-major, dV [B, SK, G, D] token-major
            float* out = which == 0 ? dkp + bg * head : dvp + (bg / G) * SK * ldv + (bg % G) * D;
            const int64_t ld = which == 0 ? D : ldv;
            for (int64_t r = lo; r < hi; ++r) {
              float* o = out + r * ld;
              const float* first = partial.data() + (bg * ns * 2 + which) * head + r * D;
              std::copy(first, first + D, o);
              for (int64_t s = 1; s < ns; ++s) {
                const float* part = partial.data() + ((bg * ns + s) * 2 + which) * head + r * D;
#pragma omp simd
                for (int64_t j = 0; j < D; ++j) o[j] += part[j];
              }
            }
          }
        }
      }
    }
  }
  return {dq, dk, dv};
}
}  // namespace

std::vector<paddle::Tensor> CausalAttentionForward(const paddle::Tensor& q_arg, const paddle::Tensor& k_arg,
                                                   const paddle::Tensor& v_arg, float scale) {
  const paddle::Tensor q = contig(q_arg), k = contig(k_arg), v = contig(v_arg);
  check_f32(q, "causal_attention", "q");
  check_f32(k, "causal_attention", "k");
  check_f32(v, "causal_attention", "v");
  check_attention_shapes(q, k, v);
  return attention_forward(q, k, v, nullptr, scale);
}

std::vector<paddle::Tensor> CausalAttentionBackward(const paddle::Tensor& q_arg, const paddle::Tensor& k_arg,
                                                    const paddle::Tensor& v_arg, const paddle::Tensor& p_arg,
                                                    const paddle::Tensor& dout_arg, float scale) {
  return attention_backward(contig(q_arg), contig(k_arg), contig(v_arg), contig(p_arg), contig(dout_arg), nullptr,
                            scale);
}

std::vector<paddle::Tensor> DocumentAttentionForward(const paddle::Tensor& q_arg, const paddle::Tensor& k_arg,
                                                     const paddle::Tensor& v_arg, const paddle::Tensor& start_arg,
                                                     float scale) {
  const paddle::Tensor q = contig(q_arg), k = contig(k_arg), v = contig(v_arg), start = contig(start_arg);
  check_f32(q, "document_attention", "q");
  check_f32(k, "document_attention", "k");
  check_f32(v, "document_attention", "v");
  check_attention_shapes(q, k, v);
  PD_CHECK(q.shape()[2] == k.shape()[2], "document_attention: q and k must have the same length (no KV cache)");
  check_starts(start, q.shape()[0], q.shape()[2]);
  return attention_forward(q, k, v, start.data<int64_t>(), scale);
}

std::vector<paddle::Tensor> DocumentAttentionBackward(const paddle::Tensor& q_arg, const paddle::Tensor& k_arg,
                                                      const paddle::Tensor& v_arg, const paddle::Tensor& start_arg,
                                                      const paddle::Tensor& p_arg, const paddle::Tensor& dout_arg,
                                                      float scale) {
  const paddle::Tensor start = contig(start_arg);  // checked by the forward
  return attention_backward(contig(q_arg), contig(k_arg), contig(v_arg), contig(p_arg), contig(dout_arg),
                            start.data<int64_t>(), scale);
}

std::vector<std::vector<int64_t>> CausalAttentionShape(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                                                       const std::vector<int64_t>& v, const float& scale) {
  return {{q[0], q[2], q[1], q[3]}, {q[0], q[1], probs_per_head(q[2], k[2])}};
}

std::vector<paddle::DataType> CausalAttentionDtype(const paddle::DataType& q, const paddle::DataType& k,
                                                   const paddle::DataType& v) {
  return {q, q};
}

std::vector<std::vector<int64_t>> DocumentAttentionShape(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                                                         const std::vector<int64_t>& v, const std::vector<int64_t>& st,
                                                         const float& scale) {
  return {{q[0], q[2], q[1], q[3]}, {q[0], q[1], probs_per_head(q[2], k[2])}};
}

std::vector<paddle::DataType> DocumentAttentionDtype(const paddle::DataType& q, const paddle::DataType& k,
                                                     const paddle::DataType& v, const paddle::DataType& st) {
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

PD_BUILD_OP(pcl_document_attention)
    .Inputs({"Q", "K", "V", "Start"})
    .Outputs({"Out", "Probs"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(DocumentAttentionForward))
    .SetInferShapeFn(PD_INFER_SHAPE(DocumentAttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DocumentAttentionDtype));

PD_BUILD_GRAD_OP(pcl_document_attention)
    .Inputs({"Q", "K", "V", "Start", "Probs", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Q"), paddle::Grad("K"), paddle::Grad("V")})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(DocumentAttentionBackward));
