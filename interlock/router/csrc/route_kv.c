/* The kv routing decision in one pass over the workers (route_kernel.py): the cost of
 * cost.ttft_costs, then cost.cheapest and cost.choose at temperature 0.
 *
 * Bit-identical to the numpy path: every operation is the numpy one, on doubles, in the same
 * order (built with -O2 -ffp-contract=off and without -ffast-math, so no fused multiply-add and
 * no reassociation). Terms that numpy adds only when some worker needs them (the KV penalty,
 * the wait for room) are decided the same way, over every worker, in a second pass.
 *
 * Returns the chosen index, or -1 where the numpy choice must decide over `cost` (no eligible
 * worker with a finite cost, or a NaN cost). Optional vectors are NULL when absent. A worker's
 * time to release its blocks (drain_s) is decode_step * drain_scale, as the router prices it.
 * With `backlog` (CostParams.backlog_charge) a miss is charged `behind` = 1 + mean(queued) /
 * chunk times instead of once, the mean summed as numpy sums (pairwise_sum below) and divided
 * by `fleet`, the workers registered (ttft_costs' backlog_workers; the slots without one hold 0).
 * With `idle_replicas` (cost._idle_replicas) and `waiting` and `decoding` given, where two or more
 * workers share the least uncached count and some have more (no NaN), a worker with nothing
 * decoding, queued or waiting is charged its miss once fewer: (behind + waiting) - 1.0, the
 * others (behind + waiting) - 0.0, which is the same double.
 */
#include <math.h>
#include <stdint.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ceil(x) as libm computes it, without the call (baseline x86-64 has no rounding instruction):
 * below 2^52 a double truncates exactly through int64; past it, or for NaN, libm. */
static inline double ceil_exact(double x) {
  if (!(x > -4503599627370496.0 && x < 4503599627370496.0)) return ceil(x);
  double t = (double)(int64_t)x;
  if (t < x) t += 1.0;
  else if (t == 0.0 && signbit(x)) t = -0.0; /* ceil(-0.5) is -0.0 */
  return t;
}

/* numpy's sum of a contiguous float64 vector (np.add.reduce: 0.0 + DOUBLE_pairwise_sum, numpy's
 * loops_utils.h): below 8 values one after another; up to 128 eight running sums, then the
 * rest; past that the two halves (the first a multiple of 8). The same additions in the same
 * order, so the same double for any values (the router's queues are whole token counts, which
 * any order sums exactly, but the reference takes any double); tests/router checks it against
 * numpy at lengths across the three cases. */
static double pairwise_sum(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.0;
    for (int64_t i = 0; i < n; i++) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; j++) r[j] = a[j];
    int64_t i;
    for (i = 8; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; j++) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; i++) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* 1/d where dividing by d is exactly multiplying by it (d a power of two: x / 2^k and
 * x * 2^-k are the same double, short of subnormals, which no token count reaches), else 0. */
static inline double exact_reciprocal(double d) {
  int e;
  return d > 0 && frexp(d, &e) == 0.5 ? 1.0 / d : 0.0;
}

/* The decode step of each worker, as its terms: v[i] * mul, then + add where has_add (numpy's
 * two roundings: np.multiply(v, mul), then += add; LoadTracker.decode_step_terms). A vector
 * of steps is mul 1 and no add (v * 1.0 is v, to the bit). Read where it is used instead of
 * written to a vector first: one 8 KB vector less through the cache at 1,024 workers. */
typedef struct {
  const double* v;
  double mul, add;
  int has_add;
} DecodeTerms;

static inline double decode_at(const DecodeTerms* t, int64_t i) {
  double x = t->v[i] * t->mul;
  return t->has_add ? x + t->add : x;
}

/* The first pass for the router's usual terms (queue depth, decode time, the stall of the
 * worker's decodes, the wait for room; no lower tiers, no KV penalty, chunk and block size
 * powers of two), built for AVX2 where the CPU has it: the same operations as route_kv's loop,
 * in the same order, four workers at a time (ceil is one exact instruction there; for work in
 * (0, chunk] it is the loop's 1.0). `stall` a constant, so each caller gets its own loop.
 * Returns bit 0: some worker lacks room; bit 1: a shortfall is NaN. */
__attribute__((target("avx2"), always_inline)) static inline int first_pass_avx2_body(
    int64_t n, const double* restrict uncached, const double* restrict queued, const double* restrict per_token,
    const double* restrict overhead, double inv_chunk, double miss_weight, double behind, const double* restrict waiting,
    const double* restrict decode_v, double decode_mul, const int has_add, double decode_add, double decode_scale,
    const int stall, const double* restrict decoding, double stall_weight, int stall_one_step, int idle,
    const double* restrict free_blocks, double inv_block, double* restrict cost, double* restrict scratch) {
  int lack = 0, nan_short = 0;
  for (int64_t i = 0; i < n; i++) {
    double u = uncached[i];
    double work = queued[i] + u;
    double a = behind + waiting[i];
    if (idle) a -= decoding[i] == 0.0 && queued[i] == 0.0 && waiting[i] == 0.0 ? 1.0 : 0.0;
    double c = miss_weight * a;
    c *= u;
    c += work;
    c *= per_token[i];
    c += __builtin_ceil(work * inv_chunk) * overhead[i];
    if (stall) {
      double st = stall_one_step ? overhead[i] : __builtin_ceil(u * inv_chunk) * overhead[i];
      st *= decoding[i];
      st *= stall_weight;
      c += st;
    }
    double step = decode_v[i] * decode_mul;
    if (has_add) step += decode_add;
    c += step * decode_scale;
    cost[i] = c;
    double s = work * inv_block;
    s -= free_blocks[i];
    scratch[i] = s;
    lack |= s > 0;
    nan_short |= s != s;
  }
  return lack | nan_short << 1;
}

#define FIRST_PASS_ARGS                                                                                           \
  int64_t n, const double* restrict uncached, const double* restrict queued, const double* restrict per_token,   \
      const double* restrict overhead, double inv_chunk, double miss_weight, double behind,                      \
      const double* restrict waiting, const double* restrict decode_v, double decode_mul, double decode_add,     \
      double decode_scale, const double* restrict decoding, double stall_weight, int stall_one_step, int idle,   \
      const double* restrict free_blocks, double inv_block, double* restrict cost, double* restrict scratch
/* one loop per (stall, add) pair: each a straight loop the compiler vectorises */
#define FIRST_PASS(name, stall, has_add)                                                                       \
  __attribute__((target("avx2"))) static int name(FIRST_PASS_ARGS) {                                           \
    return first_pass_avx2_body(n, uncached, queued, per_token, overhead, inv_chunk, miss_weight, behind,       \
                                waiting, decode_v, decode_mul, has_add, decode_add, decode_scale, stall,        \
                                decoding, stall_weight, stall_one_step, idle, free_blocks, inv_block, cost,     \
                                scratch);                                                                       \
  }
FIRST_PASS(first_pass_avx2, 0, 0)
FIRST_PASS(first_pass_avx2_add, 0, 1)
FIRST_PASS(first_pass_avx2_stall, 1, 0)
FIRST_PASS(first_pass_avx2_stall_add, 1, 1)
#undef FIRST_PASS
#undef FIRST_PASS_ARGS

static int has_avx2(void) {
  static int known = -1;
  if (known < 0) {
    __builtin_cpu_init();
    known = __builtin_cpu_supports("avx2") ? 1 : 0;
  }
  return known;
}

/* cheapest's step for worker i of cost c: the k lowest so far in ranked/best (m of them), equal
 * costs by index (a later index goes after its equals); a NaN cost noted in *nan. */
static inline void rank_one(int64_t i, double c, const uint8_t* eligible, int64_t k, int64_t* ranked, double* best,
                            int64_t* m, int* nan) {
  if (c != c) *nan = 1;
  if ((eligible && !eligible[i]) || c == INFINITY) return;
  if (*m == k && !(c < best[k - 1])) return;
  int64_t j = *m < k ? *m : k;
  while (j > 0 && best[j - 1] > c) {
    if (j < k) {
      ranked[j] = ranked[j - 1];
      best[j] = best[j - 1];
    }
    j--;
  }
  if (j < k) {
    ranked[j] = i;
    best[j] = c;
    if (*m < k) (*m)++;
  }
}

#if defined(__x86_64__)
/* The second pass (KV penalty, wait for room, weight) and cheapest over the first n - n % 4
 * workers, four at a time with AVX2: the same operations as route_kv's scalar loop, in the same
 * order (max(0, x) is the loop's `x < 0 ? 0 : x`, NaN kept, as maxpd returns its second operand
 * for NaN and equals). Four workers go to rank_one only when one of them is cheaper than the
 * k-th best so far, or NaN: most are turned away by one compare. Returns the workers done. */
__attribute__((target("avx2"))) static int64_t second_pass_avx2(
    int64_t n, double* restrict cost, int penalise, const double* restrict kv_usage, double watermark,
    double watermark_span, double kv_penalty, int wait, const double* restrict scratch,
    const DecodeTerms* decode, double drain_scale, const double* restrict used_blocks,
    const double* restrict weight, const uint8_t* eligible, int64_t k, int64_t* ranked, double* best, int64_t* m,
    int* nan) {
  const __m256d zero = _mm256_setzero_pd(), one = _mm256_set1_pd(1.0), wm = _mm256_set1_pd(watermark),
                span = _mm256_set1_pd(watermark_span), pen = _mm256_set1_pd(kv_penalty),
                drain = _mm256_set1_pd(drain_scale), dmul = _mm256_set1_pd(decode->mul),
                dadd = _mm256_set1_pd(decode->add);
  const double* restrict decode_v = decode->v;
  const int has_add = decode->has_add;
  __m256d limit = _mm256_set1_pd(INFINITY);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m256d c = _mm256_loadu_pd(cost + i);
    if (penalise) {
      __m256d over = _mm256_sub_pd(_mm256_loadu_pd(kv_usage + i), wm);
      over = _mm256_max_pd(zero, over);
      over = _mm256_div_pd(over, span);
      c = _mm256_mul_pd(c, _mm256_add_pd(one, _mm256_mul_pd(pen, over)));
    }
    if (wait) {
      __m256d d = _mm256_max_pd(zero, _mm256_loadu_pd(scratch + i));
      __m256d step = _mm256_mul_pd(_mm256_loadu_pd(decode_v + i), dmul);
      if (has_add) step = _mm256_add_pd(step, dadd);
      d = _mm256_mul_pd(d, _mm256_mul_pd(step, drain));
      d = _mm256_div_pd(d, _mm256_max_pd(one, _mm256_loadu_pd(used_blocks + i)));
      c = _mm256_add_pd(c, d);
    }
    if (weight) c = _mm256_div_pd(c, _mm256_loadu_pd(weight + i));
    _mm256_storeu_pd(cost + i, c);
    if (_mm256_movemask_pd(_mm256_cmp_pd(c, limit, _CMP_NGE_UQ))) { /* below the k-th, or NaN */
      for (int64_t j = i; j < i + 4; j++) rank_one(j, cost[j], eligible, k, ranked, best, m, nan);
      if (*m == k) limit = _mm256_set1_pd(best[k - 1]);
    }
  }
  return i;
}
#endif

int64_t route_kv(
    int64_t n,
    const double* uncached, const double* queued, const double* per_token, const double* overhead,
    double chunk, double miss_weight, int backlog, int64_t fleet, const double* waiting,
    const DecodeTerms* decode, double decode_scale, const double* decoding, double stall_weight,
    int idle_replicas, const double* lower, const double* load_s,
    const double* kv_usage, double kv_penalty, double watermark, double watermark_span,
    const double* free_blocks, const double* used_blocks, double drain_scale, double block_size,
    const double* weight, const uint8_t* eligible, const double* busy,
    double tolerance, int64_t rotation, int64_t k,
    double* cost, double* scratch, int64_t* ranked, int64_t* num_ranked) {
  /* numpy's kv_usage.max() > watermark and short[short.argmax()] > 0: some value over, and no
   * NaN (numpy's max is then NaN, its argmax finds the NaN) */
  int over = 0, nan_kv = 0, lack = 0, nan_short = 0;
  int room = free_blocks && used_blocks;
  const double inv_chunk = exact_reciprocal(chunk), inv_block = exact_reciprocal(block_size);
  int64_t first = 0; /* workers the first pass has done */
  /* cost.py: behind = 1.0, += float(queued.sum()) / fleet / chunk_tokens */
  double behind = 1.0;
  if (backlog && n > 0) behind += pairwise_sum(queued, n) / (double)fleet / chunk;
  const double miss_behind = miss_weight * behind; /* without waiting: (miss_weight * behind) * u */
  /* the stall: numpy takes one prefill step everywhere (no ceil) when uncached[argmax] <= chunk,
   * i.e. every value is (NaN is not); elsewhere ceil(u / chunk) is 1 for u in (0, chunk] too */
  const int stall = decoding && stall_weight != 0.0;
  int stall_one_step = 1;
  if (stall)
    for (int64_t i = 0; i < n; i++) stall_one_step &= uncached[i] <= chunk;
  /* cost._idle_replicas: the least uncached count held by two or more, some holding more */
  int idle = 0;
  if (idle_replicas && waiting && decoding && n > 0) {
    double lo = uncached[0], hi = uncached[0];
    int64_t at_lo = 0;
    int nan_u = 0;
    for (int64_t i = 0; i < n; i++) {
      double u = uncached[i];
      nan_u |= u != u;
      if (u < lo) {
        lo = u;
        at_lo = 0;
      }
      if (u > hi) hi = u;
      at_lo += u == lo;
    }
    idle = !nan_u && lo < hi && at_lo >= 2;
  }
  if (waiting && decode_scale != 0.0 && !lower && kv_penalty == 0.0 && room && inv_chunk != 0.0 &&
      inv_block != 0.0 && has_avx2()) {
    int f = (stall ? (decode->has_add ? first_pass_avx2_stall_add : first_pass_avx2_stall)
                   : (decode->has_add ? first_pass_avx2_add : first_pass_avx2))(
        n, uncached, queued, per_token, overhead, inv_chunk, miss_weight, behind, waiting, decode->v, decode->mul,
        decode->add, decode_scale, decoding, stall_weight, stall_one_step, idle, free_blocks, inv_block, cost, scratch);
    lack = f & 1;
    nan_short = f >> 1;
    first = n;
  }
  for (int64_t i = first; i < n; i++) {
    double u = uncached[i];
    double work = queued[i] + u;
    double c;
    if (waiting) {
      double a = behind + waiting[i];
      if (idle) a -= decoding[i] == 0.0 && queued[i] == 0.0 && waiting[i] == 0.0 ? 1.0 : 0.0;
      c = miss_weight * a;
      c *= u;
      c += work;
    } else {
      c = work + miss_behind * u;
    }
    c *= per_token[i];
    /* ceil(work / chunk) is 1 for work in (0, chunk]: the common case, without the division */
    double steps = work > 0.0 && work <= chunk ? 1.0 : ceil_exact(inv_chunk != 0.0 ? work * inv_chunk : work / chunk);
    c += steps * overhead[i];
    if (stall) {
      double st = overhead[i];
      if (!stall_one_step && !(u > 0.0 && u <= chunk))
        st = ceil_exact(inv_chunk != 0.0 ? u * inv_chunk : u / chunk) * st;
      st *= decoding[i];
      st *= stall_weight;
      c += st;
    }
    if (decode_scale != 0.0) c += decode_at(decode, i) * decode_scale;
    if (lower) c += lower[i] * load_s[i];
    cost[i] = c;
    if (kv_penalty != 0.0) {
      over |= kv_usage[i] > watermark;
      nan_kv |= kv_usage[i] != kv_usage[i];
    }
    if (room) {
      double s = inv_block != 0.0 ? work * inv_block : work / block_size;
      s -= free_blocks[i];
      scratch[i] = s;
      lack |= s > 0;
      nan_short |= s != s;
    }
  }
  int penalise = over && !nan_kv;
  int wait = lack && !nan_short;
  int64_t m = 0;
  int nan = 0;
  double best[64];
  int64_t done = 0;
#if defined(__x86_64__)
  if (has_avx2())
    done = second_pass_avx2(n, cost, penalise, kv_usage, watermark, watermark_span, kv_penalty, wait, scratch,
                            decode, drain_scale, used_blocks, weight, eligible, k, ranked, best, &m, &nan);
#endif
  for (int64_t i = done; i < n; i++) {
    double c = cost[i];
    if (penalise) {
      double over = kv_usage[i] - watermark;
      if (over < 0.0) over = 0.0;
      over /= watermark_span;
      c *= 1.0 + kv_penalty * over;
    }
    if (wait) {
      double d = scratch[i];
      if (d < 0.0) d = 0.0;
      d *= decode_at(decode, i) * drain_scale; /* drain_s = decode_step * drain_tokens */
      double u = used_blocks[i];
      d /= u < 1.0 ? 1.0 : u;
      c += d;
    }
    if (weight) c /= weight[i];
    cost[i] = c;
    rank_one(i, c, eligible, k, ranked, best, &m, &nan);
  }
  *num_ranked = m;
  if (nan || m == 0) return -1;
  double limit = cost[ranked[0]] + tolerance;
  if (m == 1 || cost[ranked[1]] > limit) return ranked[0];
  double least = INFINITY;
  int64_t count = 0;
  if (cost[ranked[m - 1]] > limit) { /* the ties are all ranked: the fewest busy, by index */
    int64_t near[64];
    int64_t t = 0;
    for (int64_t j = 0; j < m && t < 64; j++)
      if (cost[ranked[j]] <= limit) near[t++] = ranked[j];
    for (int64_t a = 1; a < t; a++) { /* by index */
      int64_t v = near[a], b = a;
      while (b > 0 && near[b - 1] > v) { near[b] = near[b - 1]; b--; }
      near[b] = v;
    }
    for (int64_t j = 0; j < t; j++) if (busy[near[j]] < least) least = busy[near[j]];
    for (int64_t j = 0; j < t; j++) count += busy[near[j]] == least;
    int64_t pick = rotation % count;
    for (int64_t j = 0; j < t; j++)
      if (busy[near[j]] == least && pick-- == 0) return near[j];
    return -1;
  }
  /* ties beyond the ranked: every eligible worker within the tolerance */
  for (int64_t i = 0; i < n; i++)
    if ((!eligible || eligible[i]) && cost[i] <= limit && busy[i] < least) least = busy[i];
  for (int64_t i = 0; i < n; i++)
    count += (!eligible || eligible[i]) && cost[i] <= limit && busy[i] == least;
  int64_t pick = rotation % count;
  for (int64_t i = 0; i < n; i++)
    if ((!eligible || eligible[i]) && cost[i] <= limit && busy[i] == least && pick-- == 0) return i;
  return -1;
}

/* The same with its arguments packed (one ctypes call converts 3 arguments, not 30): the
 * addresses in `ptrs`, the doubles in `reals`, the integers in `ints`, each in the order of
 * route_kv's parameters (route_kernel.py fills them), but for those added since, at the end:
 * ints[3] backlog, ptrs[18] decoding, reals[9] stall_weight, ints[4] fleet, ints[5] idle_replicas. */
int64_t route_kv_packed(const int64_t* ptrs, const double* reals, const int64_t* ints) {
#define P(i) ((const double*)(intptr_t)ptrs[i])
  const DecodeTerms decode = {P(5), 1.0, 0.0, 0};
  return route_kv(ints[0], P(0), P(1), P(2), P(3), reals[0], reals[1], (int)ints[3], ints[4], P(4), &decode, reals[2], P(18),
                  reals[9], (int)ints[5], P(6), P(7), P(8), reals[3], reals[4], reals[5], P(9), P(10), reals[6], reals[7], P(11),
                  (const uint8_t*)(intptr_t)ptrs[12], P(13), reals[8], ints[1], ints[2],
                  (double*)(intptr_t)ptrs[14], (double*)(intptr_t)ptrs[15],
                  (int64_t*)(intptr_t)ptrs[16], (int64_t*)(intptr_t)ptrs[17]);
#undef P
}
