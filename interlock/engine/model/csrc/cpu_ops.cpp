// Fused bf16 kernels for the CPU forward pass (AVX-512 with the BF16 extension).
//
// Why: on two cores the forward pass of a 135M model is dominated, after the linear layers,
// by many small element-wise kernels and by attention written as gather + matmul + softmax
// + matmul, each reading and writing the whole tensor again. These kernels do each of those
// in one pass:
//
// * rms_norm / add_rms_norm: the residual add and Hugging Face's RMSNorm recipe (fp32
//   statistics, round to bf16, then scale by the bf16 weight) in one read of the row;
// * rope_write_kv: rotary embedding of q and k in place, and the store of k and v into
//   their cache slots;
// * silu_mul: SwiGLU's silu(gate) * up;
// * paged_attention: one kernel for decode, prefill, chunked prefill and prefix hits. Each
//   query token attends to its sequence's keys in the paged cache up to its own position,
//   block by block with an online softmax (flash-attention style), so no gathered copy of
//   the KV and no score matrix is ever written to memory. Work items are (sequence, kv head,
//   tile of up to 16 query tokens); the query heads sharing a kv head form the rows of a
//   tile, so K and V are read once per tile. Dot products use AVX-512 BF16
//   (vdpbf16ps, fp32 accumulation): K is re-laid out per 16-key chunk into dword pairs
//   (two consecutive head dims) so one instruction yields 16 scores, and V into token
//   pairs so one instruction adds two tokens' weighted values into 16 head dims.
//   Scores, softmax and the running output are fp32; probabilities are rounded to bf16
//   for the value product (as Hugging Face's eager attention does).
//
// Registered as torch.ops.interlock.*; the Python side checks shapes and dtypes before
// calling, these kernels assume them.

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

using bf16 = uint16_t;

inline __m512 load_bf16(const bf16* p) {
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline void store_bf16(bf16* p, __m512 v) {
  __m256bh packed = _mm512_cvtneps_pbh(v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)packed);
}

inline float bf16_to_float(bf16 v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

// Round to nearest even, as torch does (inputs here are finite).
inline bf16 float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<bf16>(bits >> 16);
}

inline __m512 round_bf16(__m512 v) {
  __m256bh packed = _mm512_cvtneps_pbh(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)packed), 16));
}

// exp for x <= 0 (and -inf), relative error ~1e-7.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Rows per thread so that each gets at least ~64k elements: below that, waking the other
// OpenMP thread (asleep under OMP_WAIT_POLICY=PASSIVE) costs more than the work.
inline int64_t grain(int64_t row_elements) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, row_elements)); }

const bf16* cptr(const at::Tensor& t) { return reinterpret_cast<const bf16*>(t.data_ptr()); }
bf16* mptr(const at::Tensor& t) { return reinterpret_cast<bf16*>(t.data_ptr()); }

// ---------------------------------------------------------------- RMSNorm

// out = w * bf16(x * rsqrt(mean(x^2) + eps)), x already rounded to bf16 values.
inline void norm_row(const float* x, const bf16* w, bf16* out, int64_t d, float eps) {
  __m512 sq = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    sq = _mm512_fmadd_ps(v, v, sq);
  }
  float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(sq) / static_cast<float>(d) + eps);
  __m512 vinv = _mm512_set1_ps(inv);
  for (int64_t i = 0; i < d; i += 16) {
    __m512 y = round_bf16(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
    store_bf16(out + i, _mm512_mul_ps(y, load_bf16(w + i)));
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  const int64_t n = x.size(0), d = x.size(1);
  at::Tensor out = at::empty({n, d}, x.options());
  const bf16* px = cptr(x);
  const bf16* pw = cptr(w);
  bf16* po = mptr(out);
  at::parallel_for(0, n, grain(d), [&](int64_t begin, int64_t end) {
    std::vector<float> row(d);
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t i = 0; i < d; i += 16) _mm512_storeu_ps(row.data() + i, load_bf16(px + r * d + i));
      norm_row(row.data(), pw, po + r * d, d, static_cast<float>(eps));
    }
  });
  return out;
}

// h = bf16(h + delta) in place; returns the norm of the new h.
at::Tensor add_rms_norm(at::Tensor h, const at::Tensor& delta, const at::Tensor& w, double eps) {
  const int64_t n = h.size(0), d = h.size(1);
  at::Tensor out = at::empty({n, d}, h.options());
  bf16* ph = mptr(h);
  const bf16* pd = cptr(delta);
  const bf16* pw = cptr(w);
  bf16* po = mptr(out);
  at::parallel_for(0, n, grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      bf16* hr = ph + r * d;
      __m512 sq = _mm512_setzero_ps();
      for (int64_t i = 0; i < d; i += 16) {
        __m512 s = round_bf16(_mm512_add_ps(load_bf16(hr + i), load_bf16(pd + r * d + i)));
        store_bf16(hr + i, s);
        sq = _mm512_fmadd_ps(s, s, sq);
      }
      const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(sq) / static_cast<float>(d) + static_cast<float>(eps)));
      for (int64_t i = 0; i < d; i += 16) {
        __m512 y = round_bf16(_mm512_mul_ps(load_bf16(hr + i), inv));
        store_bf16(po + r * d + i, _mm512_mul_ps(y, load_bf16(pw + i)));
      }
    }
  });
  return out;
}

// ---------------------------------------------------------------- SwiGLU

at::Tensor silu_mul(const at::Tensor& x) {
  const int64_t n = x.size(0), d = x.size(1) / 2;
  at::Tensor out = at::empty({n, d}, x.options());
  const bf16* px = cptr(x);
  bf16* po = mptr(out);
  at::parallel_for(0, n, grain(2 * d), [&](int64_t begin, int64_t end) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t r = begin; r < end; ++r) {
      const bf16* g = px + r * 2 * d;
      const bf16* u = g + d;
      for (int64_t i = 0; i < d; i += 16) {
        __m512 gv = load_bf16(g + i);
        __m512 neg = _mm512_sub_ps(_mm512_setzero_ps(), gv);
        // silu(g) = g / (1 + exp(-g)); exp_ps takes x <= 0, so use exp(-|g|) and fold.
        __m512 e = exp_ps(_mm512_min_ps(neg, gv));          // exp(-|g|)
        __mmask16 pos = _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_GE_OQ);
        // g >= 0: g / (1 + e);  g < 0: g * e / (1 + e)
        __m512 den = _mm512_add_ps(one, e);
        __m512 num = _mm512_mask_blend_ps(pos, _mm512_mul_ps(gv, e), gv);
        __m512 silu = round_bf16(_mm512_div_ps(num, den));
        store_bf16(po + r * d + i, _mm512_mul_ps(silu, load_bf16(u + i)));
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
  bf16* pq = mptr(qkv);
  bf16* pkv = mptr(kv);
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
      bf16* row = pq + t * stride;
      for (int64_t h = 0; h < rotated; ++h) {
        bf16* x = row + h * dim;
        for (int64_t i = 0; i < half; i += 16) {
          __m512 lo = load_bf16(x + i), hi = load_bf16(x + half + i);
          __m512 new_lo = _mm512_fmadd_ps(hi, _mm512_loadu_ps(s + i), _mm512_mul_ps(lo, _mm512_loadu_ps(c + i)));
          __m512 new_hi = _mm512_fmadd_ps(lo, _mm512_loadu_ps(s + half + i), _mm512_mul_ps(hi, _mm512_loadu_ps(c + half + i)));
          store_bf16(x + i, new_lo);
          store_bf16(x + half + i, new_hi);
        }
      }
      const int64_t slot = pslot[t];
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        std::memcpy(pkv + (h * num_slots + slot) * dim, row + (num_heads + h) * dim, dim * 2);
        std::memcpy(pkv + ((num_kv_heads + h) * num_slots + slot) * dim,
                    row + (num_heads + num_kv_heads + h) * dim, dim * 2);
      }
    }
  });
}

// ---------------------------------------------------------------- small-batch linear

// Decode steps multiply a few rows by every weight of the model, so they stream all weights
// from memory each step; oneDNN reached 15-35 GB/s there. This kernel reads weights packed
// once at load time as [N/16][K/2][16] dwords: 16 output features side by side, each dword
// two consecutive input features. One vdpbf16ps then adds two inputs' products into 16
// outputs, the weights stream through contiguously, and up to kLinRows rows share each load.

constexpr int kLinRows = 8;

at::Tensor pack_linear_weight(const at::Tensor& w) {
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(n % 16 == 0 && k % 2 == 0, "weight shape must be [16a, 2b]");
  at::Tensor out = at::empty({n / 16, k / 2, 16}, w.options().dtype(at::kInt));
  const uint32_t* src = reinterpret_cast<const uint32_t*>(w.data_ptr());
  uint32_t* dst = reinterpret_cast<uint32_t*>(out.data_ptr());
  const int64_t pairs = k / 2;
  at::parallel_for(0, n / 16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t p = 0; p < pairs; ++p)
        for (int j = 0; j < 16; ++j) dst[(b * pairs + p) * 16 + j] = src[(b * 16 + j) * pairs + p];
  });
  return out;
}

template <int R>
inline void linear_tile(const uint32_t* x, int64_t x_pairs_stride, const uint32_t* w0, const uint32_t* w1,
                        int64_t pairs, float* out0, float* out1, int64_t out_stride) {
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    // 2 KB ahead in each weight stream (prefetches never fault past the end): +25% at 8 rows.
    _mm_prefetch(reinterpret_cast<const char*>(w0 + (p + 32) * 16), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w1 + (p + 32) * 16), _MM_HINT_T0);
    const __m512bh a = (__m512bh)_mm512_load_si512(w0 + p * 16);
    const __m512bh b = (__m512bh)_mm512_load_si512(w1 + p * 16);
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(x[r * x_pairs_stride + p]);
      acc0[r] = _mm512_dpbf16_ps(acc0[r], a, xv);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], b, xv);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out0 + r * out_stride, acc0[r]);
    _mm512_storeu_ps(out1 + r * out_stride, acc1[r]);
  }
}

// x: [M, K] bf16 contiguous; wp: pack_linear_weight(W) of W [N, K]; returns x @ W^T (+ bias).
at::Tensor linear_small(const at::Tensor& x, const at::Tensor& wp, const c10::optional<at::Tensor>& bias) {
  const int64_t m = x.size(0), k = x.size(1), blocks = wp.size(0), pairs = wp.size(1);
  TORCH_CHECK(pairs * 2 == k, "input features do not match the packed weight");
  const int64_t n = blocks * 16;
  at::Tensor out = at::empty({m, n}, x.options());
  const uint32_t* px = reinterpret_cast<const uint32_t*>(x.data_ptr());
  const uint32_t* pw = reinterpret_cast<const uint32_t*>(wp.data_ptr());
  const bf16* pb = bias.has_value() ? cptr(*bias) : nullptr;
  bf16* po = mptr(out);
  // Tasks are pairs of 16-feature blocks, handed out four at a time (a 150-400 KB run of the
  // weight) rather than split in halves up front: on two cores shared with the server's other
  // threads, a thread that loses its core for a while then does less instead of holding up
  // the whole call.
  const int64_t tasks = (blocks + 1) / 2;
  const int threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), std::max<int64_t>(1, tasks / 4)));
#pragma omp parallel num_threads(threads)
  {
    alignas(64) float tmp[kLinRows][32];
#pragma omp for schedule(dynamic, 4)
    for (int64_t bp = 0; bp < tasks; ++bp) {
      const int64_t b0 = 2 * bp, b1 = std::min(b0 + 1, blocks - 1);
      const uint32_t* w0 = pw + b0 * pairs * 16;
      const uint32_t* w1 = pw + b1 * pairs * 16;
      for (int64_t r0 = 0; r0 < m; r0 += kLinRows) {
        const int64_t rows = std::min<int64_t>(kLinRows, m - r0);
        const uint32_t* xr = px + r0 * pairs;
        switch (rows) {
          case 8: linear_tile<8>(xr, pairs, w0, w1, pairs, tmp[0], tmp[0] + 16, 32); break;
          case 7: linear_tile<7>(xr, pairs, w0, w1, pairs, tmp[0], tmp[0] + 16, 32); break;
          case 6: linear_tile<6>(xr, pairs, w0, w1, pairs, tmp[0], tmp[0] + 16, 32); break;
          case 5: linear_tile<5>(xr, pairs, w0, w1, pairs, tmp[0], tmp[0] + 16, 32); break;
          case 4: linear_tile<4>(xr, pairs, w0, w1, pairs, tmp[0], tmp[0] + 16, 32); break;
          case 3: linear_tile<3>(xr, pairs, w0, w1, pairs, tmp[0], tmp[0] + 16, 32); break;
          case 2: linear_tile<2>(xr, pairs, w0, w1, pairs, tmp[0], tmp[0] + 16, 32); break;
          default: linear_tile<1>(xr, pairs, w0, w1, pairs, tmp[0], tmp[0] + 16, 32); break;
        }
        const int width = b1 == b0 ? 16 : 32;
        for (int64_t r = 0; r < rows; ++r) {
          bf16* o = po + (r0 + r) * n + b0 * 16;
          for (int c = 0; c < width; c += 16) {
            __m512 v = _mm512_load_ps(tmp[r] + c);
            if (pb != nullptr) v = _mm512_add_ps(v, load_bf16(pb + b0 * 16 + c));
            store_bf16(o + c, v);
          }
        }
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------- paged attention

constexpr int kChunk = 16;     // keys per softmax step (one zmm of scores)
constexpr int kTileTokens = 16;  // query tokens per work item
constexpr int kPrefetchChunks = 2;  // chunks of keys and values requested ahead

// Transpose a 16x16 matrix of dwords: row j of src (stride in dwords) -> column j of dst.
inline void transpose16(const uint32_t* src, int64_t stride, uint32_t* dst) {
  __m512i r[16], a[16], b[16];
  for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(src + j * stride);
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // b[4i + k], 128-bit lane L: rows 4i..4i+3 at dword 4L + k.
  for (int i = 0; i < 4; ++i) {
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  // A 4x4 transpose of 128-bit lanes for each k.
  for (int k = 0; k < 4; ++k) {
    __m512i t0 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0x44);
    __m512i t1 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0xEE);
    __m512i t2 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0x44);
    __m512i t3 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0xEE);
    _mm512_store_si512(dst + (0 + k) * 16, _mm512_shuffle_i32x4(t0, t2, 0x88));
    _mm512_store_si512(dst + (4 + k) * 16, _mm512_shuffle_i32x4(t0, t2, 0xDD));
    _mm512_store_si512(dst + (8 + k) * 16, _mm512_shuffle_i32x4(t1, t3, 0x88));
    _mm512_store_si512(dst + (12 + k) * 16, _mm512_shuffle_i32x4(t1, t3, 0xDD));
  }
}

// K chunk [16 tokens][D] -> kt[D/2][16] dwords (dim pairs of each token).
template <int D>
inline void transpose_keys(const bf16* k, uint32_t* kt) {
  const uint32_t* src = reinterpret_cast<const uint32_t*>(k);
  for (int t = 0; t < D / 32; ++t) transpose16(src + 16 * t, D / 2, kt + 16 * t * kChunk);
}

// V chunk [16 tokens][D] -> vt[8 token pairs][D] dwords, with dims in the order
// unpacklo/unpackhi produce (restored when the output is written).
template <int D>
inline void interleave_values(const bf16* v, __m512i* vt) {
  constexpr int Z = D / 32;  // zmm of 32 bf16 per token row
  for (int jp = 0; jp < kChunk / 2; ++jp) {
    const bf16* a = v + (2 * jp) * D;
    const bf16* b = a + D;
    for (int z = 0; z < Z; ++z) {
      __m512i ra = _mm512_loadu_si512(a + 32 * z);
      __m512i rb = _mm512_loadu_si512(b + 32 * z);
      vt[jp * 2 * Z + 2 * z] = _mm512_unpacklo_epi16(ra, rb);
      vt[jp * 2 * Z + 2 * z + 1] = _mm512_unpackhi_epi16(ra, rb);
    }
  }
}

// Position in the output of accumulator lane l of accumulator a (see interleave_values).
inline int out_dim(int a, int l) {
  int z = a / 2, hi = a % 2, lane128 = l / 4, k = l % 4;
  return 32 * z + 8 * lane128 + 4 * hi + k;
}

// One kv head's keys and values of one sequence, in 16-key chunks (a chunk never spans blocks).
template <int D>
struct PagedKV {
  const bf16* k;
  const bf16* v;
  const int64_t* table;
  int64_t block_size;

  int64_t offset(int64_t key) const { return (table[key / block_size] * block_size + key % block_size) * D; }

  // Blocks are scattered in memory, which defeats the hardware prefetcher: while chunk key0 is
  // computed, ask for the one kPrefetchChunks ahead (and at the start for those before it).
  void prefetch_ahead(int64_t key0, int64_t last_pos) const {
    for (int ahead = key0 == 0 ? 1 : kPrefetchChunks; ahead <= kPrefetchChunks; ++ahead) {
      const int64_t next = key0 + ahead * kChunk;
      if (next > last_pos) return;
      const char* nk = reinterpret_cast<const char*>(k + offset(next));
      const char* nv = reinterpret_cast<const char*>(v + offset(next));
      for (int line = 0; line < kChunk * D * 2; line += 64) {
        _mm_prefetch(nk + line, _MM_HINT_T0);
        _mm_prefetch(nv + line, _MM_HINT_T0);
      }
    }
  }
};

// acc / l, in head-dim order, into each row's slot of the output.
template <int D>
void write_rows(const float (*acc)[D], const float* l, int rows, int group, int tok_begin, bf16* out_base,
                int64_t out_row_stride) {
  for (int r = 0; r < rows; ++r) {
    const int t = tok_begin + r / group, g = r % group;
    bf16* o = out_base + t * out_row_stride + g * D;
    const float inv = 1.0f / l[r];
    for (int a = 0; a < D / 16; ++a)
      for (int lane = 0; lane < 16; ++lane) o[out_dim(a, lane)] = float_to_bf16(acc[r][16 * a + lane] * inv);
  }
}

template <int D>
void attend_tile(const bf16* q_base, int64_t q_row_stride, int group, int tok_begin, int tok_end,
                 int64_t start_pos, const PagedKV<D>& kv, bf16* out_base, int64_t out_row_stride) {
  constexpr int P = D / 2;        // dword pairs per row
  constexpr int A = D / 16;       // fp32 accumulators per row
  const int tokens = tok_end - tok_begin;
  const int rows = tokens * group;
  alignas(64) uint32_t qd[kTileTokens * 8][P];
  alignas(64) float acc[kTileTokens * 8][D];
  alignas(64) float scores[kTileTokens * 8][kChunk];
  alignas(64) bf16 probs[kTileTokens * 8][kChunk];
  alignas(64) uint32_t kt[P * kChunk];
  alignas(64) __m512i vt[(kChunk / 2) * A];
  float m[kTileTokens * 8], l[kTileTokens * 8];
  int64_t qpos[kTileTokens * 8];
  for (int r = 0; r < rows; ++r) {
    int t = tok_begin + r / group, g = r % group;
    std::memcpy(qd[r], q_base + t * q_row_stride + g * D, D * 2);
    std::fill(acc[r], acc[r] + D, 0.0f);
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
    qpos[r] = start_pos + t;
  }
  const int64_t last_pos = start_pos + tok_end - 1;
  for (int64_t key0 = 0; key0 <= last_pos; key0 += kChunk) {
    const int64_t offset = kv.offset(key0);
    kv.prefetch_ahead(key0, last_pos);
    transpose_keys<D>(kv.k + offset, kt);
    interleave_values<D>(kv.v + offset, vt);
    // scores = q . k for every row (rows in fours share the loads of kt).
    for (int r0 = 0; r0 < rows; r0 += 4) {
      const int nr = std::min(4, rows - r0);
      __m512 s[4][2];
      for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = _mm512_setzero_ps();
      for (int p = 0; p < P; p += 2) {
        __m512i k0 = _mm512_load_si512(kt + p * kChunk);
        __m512i k1 = _mm512_load_si512(kt + (p + 1) * kChunk);
        for (int i = 0; i < nr; ++i) {
          s[i][0] = _mm512_dpbf16_ps(s[i][0], (__m512bh)k0, (__m512bh)_mm512_set1_epi32(qd[r0 + i][p]));
          s[i][1] = _mm512_dpbf16_ps(s[i][1], (__m512bh)k1, (__m512bh)_mm512_set1_epi32(qd[r0 + i][p + 1]));
        }
      }
      for (int i = 0; i < nr; ++i) _mm512_store_ps(scores[r0 + i], _mm512_add_ps(s[i][0], s[i][1]));
    }
    // Online softmax: running max m, running sum l, accumulators rescaled when m grows.
    for (int r = 0; r < rows; ++r) {
      const int64_t visible = qpos[r] - key0 + 1;  // keys of this chunk the row may see
      if (visible <= 0) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(probs[r]), _mm256_setzero_si256());
        continue;
      }
      const __mmask16 mask = visible >= kChunk ? 0xFFFF : static_cast<__mmask16>((1u << visible) - 1);
      __m512 sv = _mm512_load_ps(scores[r]);
      const float mx = _mm512_mask_reduce_max_ps(mask, sv);
      const float m_new = std::max(m[r], mx);
      __m512 p = _mm512_maskz_mov_ps(mask, exp_ps(_mm512_sub_ps(sv, _mm512_set1_ps(m_new))));
      __m256bh pb = _mm512_cvtneps_pbh(p);
      _mm256_store_si256(reinterpret_cast<__m256i*>(probs[r]), (__m256i)pb);
      if (m_new > m[r]) {
        const float alpha = std::exp(m[r] - m_new);  // 0 on the first chunk (m = -inf)
        const __m512 va = _mm512_set1_ps(alpha);
        for (int a = 0; a < A; ++a) _mm512_store_ps(acc[r] + 16 * a, _mm512_mul_ps(_mm512_load_ps(acc[r] + 16 * a), va));
        l[r] *= alpha;
        m[r] = m_new;
      }
      // Sum what the value product will use: the bf16-rounded probabilities.
      l[r] += _mm512_reduce_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)pb), 16)));
    }
    // acc += probs . V (two tokens per instruction).
    for (int r = 0; r < rows; ++r) {
      if (qpos[r] < key0) continue;
      const uint32_t* pp = reinterpret_cast<const uint32_t*>(probs[r]);
      __m512 va[A];
      for (int a = 0; a < A; ++a) va[a] = _mm512_load_ps(acc[r] + 16 * a);
      for (int jp = 0; jp < kChunk / 2; ++jp) {
        const __m512bh pj = (__m512bh)_mm512_set1_epi32(pp[jp]);
        for (int a = 0; a < A; ++a) va[a] = _mm512_dpbf16_ps(va[a], (__m512bh)vt[jp * A + a], pj);
      }
      for (int a = 0; a < A; ++a) _mm512_store_ps(acc[r] + 16 * a, va[a]);
    }
  }
  write_rows<D>(acc, l, rows, group, tok_begin, out_base, out_row_stride);
}

// The same attention for tiles of 16 rows and more (prompt tokens), with the scores of 16 rows
// held transposed: score vector j holds key j for 16 rows. Then the rows' queries are
// transposed once per work item instead of every key chunk, keys are read in their stored
// layout, and the online softmax is element-wise across 16 rows (no horizontal max or sum
// per row and chunk), which is where the row-wise version above spent most of its time on
// long prompts.
template <int D>
void attend_tile_wide(const bf16* q_base, int64_t q_row_stride, int group, int tok_begin, int tok_end,
                      int64_t start_pos, const PagedKV<D>& kv, bf16* out_base, int64_t out_row_stride) {
  constexpr int P = D / 2;
  constexpr int A = D / 16;
  constexpr int kMaxRows = kTileTokens * 8;
  const int rows = (tok_end - tok_begin) * group;
  const int groups = (rows + 15) / 16;
  alignas(64) uint32_t qt[kMaxRows / 16][P][16];
  alignas(64) float acc[kMaxRows][D];
  alignas(64) uint32_t pairs[kMaxRows / 16][kChunk / 2][16];
  alignas(64) float alpha_rows[16];
  alignas(64) int32_t qpos[kMaxRows];
  alignas(64) __m512i vt[(kChunk / 2) * A];
  __m512 m[kMaxRows / 16], l[kMaxRows / 16];
  // Rows past the last real one repeat it (their results are dropped), so every lane sees key 0.
  for (int r = 0; r < groups * 16; ++r) {
    const int real = std::min(r, rows - 1);
    const int t = tok_begin + real / group, g = real % group;
    const uint32_t* qrow = reinterpret_cast<const uint32_t*>(q_base + t * q_row_stride + g * D);
    for (int p = 0; p < P; ++p) qt[r / 16][p][r % 16] = qrow[p];
    qpos[r] = static_cast<int32_t>(start_pos + t);
    std::fill(acc[r], acc[r] + D, 0.0f);
  }
  for (int gi = 0; gi < groups; ++gi) {
    m[gi] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    l[gi] = _mm512_setzero_ps();
  }
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                               23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const int64_t last_pos = start_pos + tok_end - 1;
  for (int64_t key0 = 0; key0 <= last_pos; key0 += kChunk) {
    const int64_t offset = kv.offset(key0);
    kv.prefetch_ahead(key0, last_pos);
    const uint32_t* kd = reinterpret_cast<const uint32_t*>(kv.k + offset);
    interleave_values<D>(kv.v + offset, vt);
    for (int gi = 0; gi < groups; ++gi) {
      if (qpos[gi * 16 + 15] < key0) continue;  // no row of this group sees this chunk
      __m512 s[kChunk];
      for (int j = 0; j < kChunk; ++j) s[j] = _mm512_setzero_ps();
      for (int p = 0; p < P; ++p) {
        const __m512bh qv = (__m512bh)_mm512_load_si512(qt[gi][p]);
        for (int j = 0; j < kChunk; ++j)
          s[j] = _mm512_dpbf16_ps(s[j], qv, (__m512bh)_mm512_set1_epi32(kd[j * P + p]));
      }
      const __m512i posv = _mm512_load_si512(qpos + gi * 16);
      const bool diagonal = qpos[gi * 16] < key0 + kChunk - 1;  // some row cannot see every key
      __mmask16 visible[kChunk];
      __m512 mx = neg_inf;
      for (int j = 0; j < kChunk; ++j) {
        visible[j] = diagonal ? _mm512_cmp_epi32_mask(posv, _mm512_set1_epi32(static_cast<int32_t>(key0 + j)), _MM_CMPINT_NLT)
                              : static_cast<__mmask16>(0xFFFF);
        mx = _mm512_mask_max_ps(mx, visible[j], mx, s[j]);
      }
      const __m512 m_new = _mm512_max_ps(m[gi], mx);
      const __m512 alpha = exp_ps(_mm512_sub_ps(m[gi], m_new));  // 0 where m was -inf
      __m512 sum = _mm512_setzero_ps();
      for (int jp = 0; jp < kChunk / 2; ++jp) {
        __m512 p0 = _mm512_maskz_mov_ps(visible[2 * jp], exp_ps(_mm512_sub_ps(s[2 * jp], m_new)));
        __m512 p1 = _mm512_maskz_mov_ps(visible[2 * jp + 1], exp_ps(_mm512_sub_ps(s[2 * jp + 1], m_new)));
        const __m512i packed = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);  // words 0-15 p0, 16-31 p1
        _mm512_store_si512(pairs[gi][jp], _mm512_permutexvar_epi16(interleave, packed));
        // Sum what the value product uses: the bf16-rounded probabilities.
        sum = _mm512_add_ps(sum, _mm512_add_ps(round_bf16(p0), round_bf16(p1)));
      }
      l[gi] = _mm512_fmadd_ps(l[gi], alpha, sum);
      m[gi] = m_new;
      if (_mm512_cmp_ps_mask(alpha, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ)) {
        _mm512_store_ps(alpha_rows, alpha);
        for (int i = 0; i < 16; ++i) {
          if (alpha_rows[i] == 1.0f) continue;
          const __m512 va = _mm512_set1_ps(alpha_rows[i]);
          float* row = acc[gi * 16 + i];
          for (int a = 0; a < A; ++a) _mm512_store_ps(row + 16 * a, _mm512_mul_ps(_mm512_load_ps(row + 16 * a), va));
        }
      }
      for (int i = 0; i < 16; ++i) {
        float* row = acc[gi * 16 + i];
        __m512 va[A];
        for (int a = 0; a < A; ++a) va[a] = _mm512_load_ps(row + 16 * a);
        for (int jp = 0; jp < kChunk / 2; ++jp) {
          const __m512bh pj = (__m512bh)_mm512_set1_epi32(pairs[gi][jp][i]);
          for (int a = 0; a < A; ++a) va[a] = _mm512_dpbf16_ps(va[a], (__m512bh)vt[jp * A + a], pj);
        }
        for (int a = 0; a < A; ++a) _mm512_store_ps(row + 16 * a, va[a]);
      }
    }
  }
  alignas(64) float l_rows[kMaxRows];
  for (int gi = 0; gi < groups; ++gi) _mm512_store_ps(l_rows + gi * 16, l[gi]);
  write_rows<D>(acc, l_rows, rows, group, tok_begin, out_base, out_row_stride);
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
  const bf16* pq = cptr(q);
  const bf16* pkv = cptr(kv);
  bf16* po = mptr(out);
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
    const auto tile = (w.tok_end - w.tok_begin) * group >= 16 ? attend_tile_wide<D> : attend_tile<D>;
    tile(pq + first * q_stride + w.head * group * D, q_stride, static_cast<int>(group), w.tok_begin,
         w.tok_end, info[w.seq * 3 + 2], kv_head, po + first * o_stride + w.head * group * D, o_stride);
  }
}

void paged_attention(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& seq_info,
                     const at::Tensor& block_tables, int64_t num_heads, int64_t num_kv_heads,
                     at::Tensor out) {
  TORCH_CHECK(num_heads / num_kv_heads <= 8, "at most 8 query heads per kv head");
  TORCH_CHECK(kv.size(3) % kChunk == 0, "block size must be a multiple of 16");
  switch (kv.size(4)) {
    case 64: paged_attention_impl<64>(q, kv, seq_info, block_tables, num_heads, num_kv_heads, out); break;
    case 128: paged_attention_impl<128>(q, kv, seq_info, block_tables, num_heads, num_kv_heads, out); break;
    default: TORCH_CHECK(false, "head_dim must be 64 or 128");
  }
}

}  // namespace

TORCH_LIBRARY(interlock, m) {
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
