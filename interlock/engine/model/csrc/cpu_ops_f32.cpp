// Fused fp32 kernels for the CPU forward pass on AVX2 + FMA (every x86-64 CPU of the last
// decade; the fp32 twin of cpu_ops.cpp, which needs AVX-512 BF16).
//
// Why: on a CPU without fast bf16 (an AMD Zen 3, say) the model runs in fp32, and on two cores
// a decode step's time after the linear layers went to attention written as gather + matmul +
// softmax + matmul (the gather alone 18% at batch 32) and to small element-wise kernels that
// each read and write the whole tensor again. These kernels do each in one pass, with the same
// signatures as cpu_ops.cpp's (registered as torch.ops.interlock_f32.*):
//
// * rms_norm / add_rms_norm: the residual add and RMSNorm (x * rsqrt(mean(x^2) + eps) * w) in
//   one read of the row;
// * rope_write_kv: rotary embedding of q and k in place, and the store of k and v into their
//   cache slots;
// * silu_mul: SwiGLU's silu(gate) * up;
// * paged_attention: decode, prefill, chunked prefill and prefix hits in one kernel. Each query
//   row attends to its sequence's keys in the paged cache up to its own position, 8 keys at a
//   time with an online softmax (flash-attention style): no gathered copy of the KV and no
//   score matrix in memory. Work items are (sequence, kv head, tile of up to 16 query tokens);
//   the query heads sharing a kv head are rows of one tile, so a chunk of K and V is read from
//   memory once per tile and from L1 for its other rows.
//
// The Python side checks shapes and dtypes before calling; these kernels assume them.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "paged_work.h"

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane j of the result: the sum of the lanes of v[j] (eight dot products' partial sums -> eight
// scores).
inline __m256 hsum8(const __m256* v) {
  __m256 a = _mm256_hadd_ps(v[0], v[1]);
  __m256 b = _mm256_hadd_ps(v[2], v[3]);
  __m256 c = _mm256_hadd_ps(v[4], v[5]);
  __m256 d = _mm256_hadd_ps(v[6], v[7]);
  __m256 ab = _mm256_hadd_ps(a, b);  // lanes: 0 1 2 3 | 0 1 2 3 (low, high halves of each)
  __m256 cd = _mm256_hadd_ps(c, d);  // lanes: 4 5 6 7 | 4 5 6 7
  __m256 lo = _mm256_permute2f128_ps(ab, cd, 0x20);
  __m256 hi = _mm256_permute2f128_ps(ab, cd, 0x31);
  return _mm256_add_ps(lo, hi);
}

// exp for x <= 0, relative error ~1e-7; lanes below -87 give ~0 (callers mask what must be 0).
inline __m256 exp_ps(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // 2^n from its exponent bits (n >= -126 after the clamp above).
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Rows per thread so that each gets at least ~64k elements: below that, waking the other
// OpenMP thread (asleep under OMP_WAIT_POLICY=PASSIVE) costs more than the work.
inline int64_t grain(int64_t row_elements) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, row_elements)); }

// ---------------------------------------------------------------- RMSNorm

inline void norm_row(const float* x, const float* w, float* out, int64_t d, float eps) {
  __m256 sq0 = _mm256_setzero_ps(), sq1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    sq0 = _mm256_fmadd_ps(a, a, sq0);
    sq1 = _mm256_fmadd_ps(b, b, sq1);
  }
  for (; i < d; i += 8) {
    __m256 a = _mm256_loadu_ps(x + i);
    sq0 = _mm256_fmadd_ps(a, a, sq0);
  }
  const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(hsum(_mm256_add_ps(sq0, sq1)) / static_cast<float>(d) + eps));
  for (i = 0; i < d; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv), _mm256_loadu_ps(w + i)));
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  const int64_t n = x.size(0), d = x.size(1);
  at::Tensor out = at::empty({n, d}, x.options());
  const float* px = x.data_ptr<float>();
  const float* pw = w.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, n, grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) norm_row(px + r * d, pw, po + r * d, d, static_cast<float>(eps));
  });
  return out;
}

// h += delta in place; returns the norm of the new h.
at::Tensor add_rms_norm(at::Tensor h, const at::Tensor& delta, const at::Tensor& w, double eps) {
  const int64_t n = h.size(0), d = h.size(1);
  at::Tensor out = at::empty({n, d}, h.options());
  float* ph = h.data_ptr<float>();
  const float* pd = delta.data_ptr<float>();
  const float* pw = w.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, n, grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* hr = ph + r * d;
      const float* dr = pd + r * d;
      for (int64_t i = 0; i < d; i += 8)
        _mm256_storeu_ps(hr + i, _mm256_add_ps(_mm256_loadu_ps(hr + i), _mm256_loadu_ps(dr + i)));
      norm_row(hr, pw, po + r * d, d, static_cast<float>(eps));
    }
  });
  return out;
}

// ---------------------------------------------------------------- SwiGLU

at::Tensor silu_mul(const at::Tensor& x) {
  const int64_t n = x.size(0), d = x.size(1) / 2;
  at::Tensor out = at::empty({n, d}, x.options());
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, n, grain(2 * d), [&](int64_t begin, int64_t end) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (int64_t r = begin; r < end; ++r) {
      const float* g = px + r * 2 * d;
      const float* u = g + d;
      for (int64_t i = 0; i < d; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        // silu(g) = g / (1 + exp(-g)); exp_ps takes x <= 0, so use e = exp(-|g|) and fold:
        // g >= 0: g / (1 + e);  g < 0: g * e / (1 + e).
        __m256 e = exp_ps(_mm256_min_ps(_mm256_sub_ps(zero, gv), gv));
        __m256 pos = _mm256_cmp_ps(gv, zero, _CMP_GE_OQ);
        __m256 num = _mm256_blendv_ps(_mm256_mul_ps(gv, e), gv, pos);
        __m256 silu = _mm256_div_ps(num, _mm256_add_ps(one, e));
        _mm256_storeu_ps(po + r * d + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
      }
    }
  });
  return out;
}

// ---------------------------------------------------------------- RoPE + KV write

// qkv: [n, (heads + 2 * kv_heads) * D] rows (row stride given); q and k rotated in place,
// k and v stored at their slots of kv: [2, kv_heads, num_slots, D].
void rope_write_kv(at::Tensor qkv, const at::Tensor& positions, const at::Tensor& cos,
                   const at::Tensor& sin_signed, at::Tensor kv, const at::Tensor& slots,
                   int64_t num_heads, int64_t num_kv_heads) {
  const int64_t n = qkv.size(0), stride = qkv.stride(0);
  const int64_t dim = cos.size(1), half = dim / 2;
  const int64_t num_slots = kv.size(2);
  float* pq = qkv.data_ptr<float>();
  float* pkv = kv.data_ptr<float>();
  const int64_t* ppos = positions.data_ptr<int64_t>();
  const int64_t* pslot = slots.data_ptr<int64_t>();
  const float* pcos = cos.data_ptr<float>();
  const float* psin = sin_signed.data_ptr<float>();
  const int64_t rotated = num_heads + num_kv_heads;
  const int64_t max_pos = cos.size(0);
  for (int64_t t = 0; t < n; ++t) {
    TORCH_CHECK(ppos[t] >= 0 && ppos[t] < max_pos, "position ", ppos[t], " outside the rotary table");
    TORCH_CHECK(pslot[t] >= 0 && pslot[t] < num_slots, "slot ", pslot[t], " outside the cache");
  }
  at::parallel_for(0, n, grain(stride), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = pcos + ppos[t] * dim;
      const float* s = psin + ppos[t] * dim;
      float* row = pq + t * stride;
      for (int64_t h = 0; h < rotated; ++h) {
        float* x = row + h * dim;
        for (int64_t i = 0; i < half; i += 8) {
          __m256 lo = _mm256_loadu_ps(x + i), hi = _mm256_loadu_ps(x + half + i);
          __m256 new_lo = _mm256_fmadd_ps(hi, _mm256_loadu_ps(s + i), _mm256_mul_ps(lo, _mm256_loadu_ps(c + i)));
          __m256 new_hi =
              _mm256_fmadd_ps(lo, _mm256_loadu_ps(s + half + i), _mm256_mul_ps(hi, _mm256_loadu_ps(c + half + i)));
          _mm256_storeu_ps(x + i, new_lo);
          _mm256_storeu_ps(x + half + i, new_hi);
        }
      }
      const int64_t slot = pslot[t];
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        std::memcpy(pkv + (h * num_slots + slot) * dim, row + (num_heads + h) * dim, dim * 4);
        std::memcpy(pkv + ((num_kv_heads + h) * num_slots + slot) * dim,
                    row + (num_heads + num_kv_heads + h) * dim, dim * 4);
      }
    }
  });
}

// ---------------------------------------------------------------- small-batch linear

// Decode steps multiply a few rows by every weight of the model, so they stream all weights
// from memory each step, and fp32 weights are twice the bytes of the bf16 checkpoint they came
// from. Where every weight is a bf16 value (the Python side checks), this kernel keeps them as
// bf16, packed once at load as [N/8][K][8]: 8 output features side by side, so one 16-byte load
// widened to fp32 (exact) feeds 8 outputs, the weights stream through contiguously, and up to 6
// rows share each load. Products and sums are fp32: the function of F.linear on the fp32
// weights, summed in another order.

// w: [N, K] bf16 (N a multiple of 8) -> [N/8, K, 8].
at::Tensor pack_linear_weight(const at::Tensor& w) {
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(n % 8 == 0, "weight rows must be a multiple of 8");
  TORCH_CHECK(w.scalar_type() == at::kBFloat16, "the packed weight is bf16");
  at::Tensor out = at::empty({n / 8, k, 8}, w.options());
  const uint16_t* src = reinterpret_cast<const uint16_t*>(w.data_ptr());
  uint16_t* dst = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, n / 8, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t i = 0; i < k; ++i)
        for (int j = 0; j < 8; ++j) dst[(b * k + i) * 8 + j] = src[(b * 8 + j) * k + i];
  });
  return out;
}

inline __m256 load_bf16x8(const uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// R rows times B blocks of 8 outputs, over all K inputs. The accumulators live in registers
// (a flat array indexed by constants, unrolled: GCC kept an [R][B] array on the stack and
// stored it every step, at a third of the speed); the bias is added after.
template <int R, int B>
inline void linear_tile(const float* __restrict x, int64_t ldx, const uint16_t* __restrict w, int64_t k,
                        const float* bias, float* __restrict out, int64_t ldo) {
  __m256 acc[R * B];
#pragma GCC unroll 16
  for (int j = 0; j < R * B; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    if constexpr (R == 1) {  // one broadcast, then each block's weights straight into its FMA
      const __m256 xv = _mm256_broadcast_ss(x + i);
#pragma GCC unroll 8
      for (int b = 0; b < B; ++b) acc[b] = _mm256_fmadd_ps(xv, load_bf16x8(w + (b * k + i) * 8), acc[b]);
    } else {
      __m256 wv[B];
#pragma GCC unroll 8
      for (int b = 0; b < B; ++b) wv[b] = load_bf16x8(w + (b * k + i) * 8);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_broadcast_ss(x + r * ldx + i);
#pragma GCC unroll 8
        for (int b = 0; b < B; ++b) acc[r * B + b] = _mm256_fmadd_ps(xv, wv[b], acc[r * B + b]);
      }
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < R * B; ++j) _mm256_storeu_ps(out + (j / B) * ldo + 8 * (j % B), acc[j]);
  if (bias != nullptr)
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < B; ++b) {
        float* o = out + r * ldo + 8 * b;
        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), _mm256_loadu_ps(bias + 8 * b)));
      }
}

// Rows in sixes (the tail in a smaller tile) for the B blocks from b0.
template <int B>
inline void linear_blocks(const float* x, int64_t rows, int64_t k, const uint16_t* wp, const float* bias, float* out,
                          int64_t n, int64_t b0) {
  const uint16_t* w = wp + b0 * k * 8;
  const float* bb = bias != nullptr ? bias + b0 * 8 : nullptr;
  constexpr int B2 = B < 2 ? B : 2;
  int64_t r = 0;
  for (; r + 6 <= rows; r += 6) linear_tile<6, B2>(x + r * k, k, w, k, bb, out + r * n + b0 * 8, n);
  float* o = out + r * n + b0 * 8;
  switch (rows - r) {
    case 5: linear_tile<5, B2>(x + r * k, k, w, k, bb, o, n); break;
    case 4: linear_tile<4, B2>(x + r * k, k, w, k, bb, o, n); break;
    case 3: linear_tile<3, B2>(x + r * k, k, w, k, bb, o, n); break;
    case 2: linear_tile<2, (B < 4 ? B : 4)>(x + r * k, k, w, k, bb, o, n); break;
    case 1: linear_tile<1, B>(x + r * k, k, w, k, bb, o, n); break;
    default: break;
  }
}

at::Tensor linear_small(const at::Tensor& x, const at::Tensor& wp, const c10::optional<at::Tensor>& bias) {
  const int64_t rows = x.size(0), k = x.size(1), blocks = wp.size(0), n = blocks * 8;
  TORCH_CHECK(wp.size(1) == k, "input features ", k, " against the weight's ", wp.size(1));
  at::Tensor out = at::empty({rows, n}, x.options());
  const float* px = x.data_ptr<float>();
  const uint16_t* pw = reinterpret_cast<const uint16_t*>(wp.data_ptr());
  const float* pb = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* po = out.data_ptr<float>();
  // Threads take runs of 8-block groups (64 outputs); at least ~256 KB of weights each.
  const int64_t groups = (blocks + 7) / 8;
  const int64_t grain = std::max<int64_t>(1, (256 * 1024) / std::max<int64_t>(1, k * 8 * 8 * 2));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t b0 = g * 8, b1 = std::min(blocks, b0 + 8);
      // Tiles of 8 row-one blocks, 4 for two rows, 2 for more; within a group each tile's
      // weights stay in cache for the next rows.
      int64_t b = b0;
      if (rows == 1) {
        for (; b + 8 <= b1; b += 8) linear_blocks<8>(px, rows, k, pw, pb, po, n, b);
      } else if (rows == 2) {
        for (; b + 4 <= b1; b += 4) linear_blocks<4>(px, rows, k, pw, pb, po, n, b);
      } else {
        for (; b + 2 <= b1; b += 2) linear_blocks<2>(px, rows, k, pw, pb, po, n, b);
      }
      for (; b < b1; ++b) linear_blocks<1>(px, rows, k, pw, pb, po, n, b);
    }
  });
  return out;
}

// ---------------------------------------------------------------- paged attention

constexpr int kChunk = 8;        // keys per softmax step (one ymm of scores)
constexpr int kTileTokens = 16;  // query tokens per work item
constexpr int kMaxGroup = 8;     // query heads per kv head
constexpr int kMaxRows = kTileTokens * kMaxGroup;

// One kv head's keys and values of one sequence (a chunk of 8 keys never spans blocks: block
// sizes are multiples of 16).
template <int D>
struct PagedKV {
  const float* k;
  const float* v;
  const int64_t* table;
  int64_t block_size;

  int64_t offset(int64_t key) const { return (table[key / block_size] * block_size + key % block_size) * D; }

  // Blocks are scattered in memory, which defeats the hardware prefetcher: while one chunk is
  // computed, ask for the next one.
  void prefetch(int64_t key0, int64_t last_pos) const {
    if (key0 > last_pos) return;
    const char* nk = reinterpret_cast<const char*>(k + offset(key0));
    const char* nv = reinterpret_cast<const char*>(v + offset(key0));
    for (int line = 0; line < kChunk * D * 4; line += 64) {
      _mm_prefetch(nk + line, _MM_HINT_T0);
      _mm_prefetch(nv + line, _MM_HINT_T0);
    }
  }
};

// The 8 scores q . k_j of one row against a chunk of 8 keys ([8][D], contiguous).
template <int D>
inline __m256 chunk_scores(const float* q, const float* k) {
  __m256 acc[kChunk];
  for (int j = 0; j < kChunk; ++j) acc[j] = _mm256_setzero_ps();
  for (int d = 0; d < D; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    for (int j = 0; j < kChunk; ++j) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + j * D + d), acc[j]);
  }
  return hsum8(acc);
}

// acc[0..D) = acc * alpha + sum_j p[j] * v_j, 64 head dims at a time (8 registers).
template <int D>
inline void accumulate_values(float* acc, float alpha, const float* p, const float* v) {
  const __m256 va = _mm256_set1_ps(alpha);
  for (int d0 = 0; d0 < D; d0 += 64) {
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + d0 + 8 * i), va);
    for (int j = 0; j < kChunk; ++j) {
      if (p[j] == 0.0f) continue;
      const __m256 pj = _mm256_set1_ps(p[j]);
      const float* vj = v + j * D + d0;
      for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * i), a[i]);
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(acc + d0 + 8 * i, a[i]);
  }
}

template <int D>
void attend_tile(const float* q_base, int64_t q_row_stride, int group, int tok_begin, int tok_end,
                 int64_t start_pos, const PagedKV<D>& kv, float* out_base, int64_t out_row_stride) {
  const int rows = (tok_end - tok_begin) * group;
  alignas(32) float acc[kMaxRows][D];
  alignas(32) float p[kChunk];
  float m[kMaxRows], l[kMaxRows];
  int64_t qpos[kMaxRows];
  const float* qrow[kMaxRows];
  for (int r = 0; r < rows; ++r) {
    const int t = tok_begin + r / group, g = r % group;
    qrow[r] = q_base + t * q_row_stride + g * D;
    std::fill(acc[r], acc[r] + D, 0.0f);
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
    qpos[r] = start_pos + t;
  }
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int64_t last_pos = start_pos + tok_end - 1;
  for (int64_t key0 = 0; key0 <= last_pos; key0 += kChunk) {
    const int64_t offset = kv.offset(key0);
    kv.prefetch(key0 + kChunk, last_pos);
    const float* k = kv.k + offset;
    const float* v = kv.v + offset;
    for (int r = 0; r < rows; ++r) {
      const int64_t visible = qpos[r] - key0 + 1;  // keys of this chunk the row may see
      if (visible <= 0) continue;
      __m256 s = chunk_scores<D>(qrow[r], k);
      __m256 mask = _mm256_castsi256_ps(
          _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(std::min<int64_t>(visible, kChunk))), lanes));
      s = _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()), s, mask);
      const float m_new = std::max(m[r], hmax(s));
      const __m256 pv = _mm256_and_ps(mask, exp_ps(_mm256_sub_ps(s, _mm256_set1_ps(m_new))));
      _mm256_store_ps(p, pv);
      const float alpha = std::exp(m[r] - m_new);  // 0 on the first chunk (m = -inf)
      l[r] = l[r] * alpha + hsum(pv);
      m[r] = m_new;
      accumulate_values<D>(acc[r], alpha, p, v);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const int t = tok_begin + r / group, g = r % group;
    float* o = out_base + t * out_row_stride + g * D;
    const __m256 inv = _mm256_set1_ps(1.0f / l[r]);
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_load_ps(acc[r] + d), inv));
  }
}

// q: [n, >= heads * D] rows of the qkv tensor (q first); kv: [2, kv_heads, num_blocks, bs, D];
// seq_info: [S, 3] int64 (first row in q, query tokens, tokens already cached before them);
// block_tables: [S, max_blocks] int64; out: [n, heads * D].
template <int D>
void paged_attention_impl(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& seq_info,
                          const at::Tensor& block_tables, int64_t num_heads, int64_t num_kv_heads,
                          at::Tensor& out) {
  const int64_t num_blocks = kv.size(2), block_size = kv.size(3);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t max_blocks = block_tables.size(1);
  const int64_t* info = seq_info.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const std::vector<WorkItem> items = paged_work_items(q, kv, seq_info, block_tables, num_kv_heads, kTileTokens);
  const float* pq = q.data_ptr<float>();
  const float* pkv = kv.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const int64_t q_stride = q.stride(0), o_stride = out.stride(0);
  const int64_t head_stride = num_blocks * block_size * D;  // one kv head's blocks
  const int64_t count = static_cast<int64_t>(items.size());
  const int threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), count));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < count; ++i) {
    const WorkItem& w = items[i];
    const int64_t first = info[w.seq * 3];
    const PagedKV<D> kv_head{pkv + w.head * head_stride, pkv + (num_kv_heads + w.head) * head_stride,
                             tables + w.seq * max_blocks, block_size};
    attend_tile<D>(pq + first * q_stride + w.head * group * D, q_stride, static_cast<int>(group), w.tok_begin,
                   w.tok_end, info[w.seq * 3 + 2], kv_head, po + first * o_stride + w.head * group * D, o_stride);
  }
}

void paged_attention(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& seq_info,
                     const at::Tensor& block_tables, int64_t num_heads, int64_t num_kv_heads,
                     at::Tensor out) {
  TORCH_CHECK(num_heads / num_kv_heads <= kMaxGroup, "at most 8 query heads per kv head");
  TORCH_CHECK(kv.size(3) % 16 == 0, "block size must be a multiple of 16");
  switch (kv.size(4)) {
    case 64: paged_attention_impl<64>(q, kv, seq_info, block_tables, num_heads, num_kv_heads, out); break;
    case 128: paged_attention_impl<128>(q, kv, seq_info, block_tables, num_heads, num_kv_heads, out); break;
    default: TORCH_CHECK(false, "head_dim must be 64 or 128");
  }
}

}  // namespace

TORCH_LIBRARY(interlock_f32, m) {
  m.def("pack_linear_weight(Tensor w) -> Tensor", &pack_linear_weight);
  m.def("linear_small(Tensor x, Tensor wp, Tensor? bias) -> Tensor", &linear_small);
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor", &rms_norm);
  m.def("add_rms_norm(Tensor(a!) h, Tensor delta, Tensor w, float eps) -> Tensor", &add_rms_norm);
  m.def("silu_mul(Tensor x) -> Tensor", &silu_mul);
  m.def("rope_write_kv(Tensor(a!) qkv, Tensor positions, Tensor cos, Tensor sin_signed, Tensor(b!) kv, "
        "Tensor slots, int num_heads, int num_kv_heads) -> ()", &rope_write_kv);
  m.def("paged_attention(Tensor q, Tensor kv, Tensor seq_info, Tensor block_tables, int num_heads, "
        "int num_kv_heads, Tensor(a!) out) -> ()", &paged_attention);
}
