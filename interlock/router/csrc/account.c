/* LoadTracker's dispatch accounting for one worker slot (load.py: on_route, on_first_token,
 * on_finish, then _derive), in one call where Python makes about thirty numpy scalar reads and
 * writes (2-3 µs of a routing decision's 50 µs budget at 1,024 workers); and the part of a load
 * report that writes the slot's reported figures and derives it (apply_report then _refresh:
 * a report arrives many times a second from every worker, once per step in a replay).
 *
 * The same doubles as the Python: each delta added as `v[s] = v.item(s) + delta` adds it (a
 * subtraction is the addition of the negated value, to the bit), then every derived value of
 * the slot recomputed with _derive's operations in its order. load.py's Python path stays the
 * reference and the fallback; tests/router/test_load.py drives both and compares every vector.
 */
#include <math.h>
#include <stdint.h>

enum {
  /* state the deltas apply to, in ACCOUNT_VECTORS' order (load.py) */
  A_DISPATCHED_PREFILL, A_FRESH_PREFILL, A_FRESH_COUNT, A_DISPATCHED_KV, A_INFLIGHT, A_DECODING,
  /* read */
  A_REPORTED_WAITING, A_REPORTED_RUNNING, A_INV_KV_TOKENS, A_KV_USED_FRAC, A_REPORTED_PREFILL, A_QUEUE_LIMIT,
  A_KV_TOKENS_TOTAL, A_BLOCK_SIZE,
  /* derived (written) */
  A_QUEUED, A_DEPTH, A_BUSY_N, A_USAGE, A_CONTEXT, A_PRIOR, A_USED, A_FREE,
  A_NUM_DOUBLE, /* then _busy, a bool vector */
  A_NUM_DELTAS = A_DECODING + 1,
};

typedef struct {
  double busy_kv_usage, busy_kv_footprint, max_inflight, max_context, context_slope;
} AccountLimits;

/* Apply the deltas (NULL `has[i]` false: that vector untouched) to slot s, then derive its
 * values; returns the change in the number of busy slots (-1, 0 or 1). */
static int account_slot(double* const* v, uint8_t* busy_v, int64_t s, const double* delta, const int* has,
                        const AccountLimits* lim) {
  for (int i = 0; i < A_NUM_DELTAS; i++)
    if (has[i]) v[i][s] += delta[i];
  /* _derive: max/min as its spelled-out comparisons */
  const double fresh_count = v[A_FRESH_COUNT][s], inflight = v[A_INFLIGHT][s];
  const double depth = v[A_REPORTED_WAITING][s] + fresh_count;
  const double running = v[A_REPORTED_RUNNING][s];
  const double n = running > inflight ? running : inflight;
  const double footprint = v[A_DISPATCHED_KV][s] * v[A_INV_KV_TOKENS][s];
  const double used_frac = v[A_KV_USED_FRAC][s];
  const double usage = footprint > used_frac ? footprint : used_frac;
  v[A_QUEUED][s] = v[A_REPORTED_PREFILL][s] + v[A_FRESH_PREFILL][s];
  v[A_DEPTH][s] = depth;
  v[A_BUSY_N][s] = n;
  v[A_USAGE][s] = usage;
  const double context = lim->max_context < footprint ? lim->max_context : footprint;
  v[A_CONTEXT][s] = context;
  v[A_PRIOR][s] = 1.0 + lim->context_slope * context;
  const uint8_t busy = used_frac >= lim->busy_kv_usage || usage >= lim->busy_kv_footprint ||
                       (lim->max_inflight != 0.0 && n >= lim->max_inflight) || depth > v[A_QUEUE_LIMIT][s];
  if (busy == busy_v[s]) return 0;
  busy_v[s] = busy;
  return busy ? 1 : -1;
}

/* A load report's figures for slot s (rep: queued prefill tokens, running + waiting, waiting,
 * KV used fraction, written only when has_frac), then _refresh: the blocks in use and free as
 * its operations, and the derived values as account_slot with no deltas. Returns the change in
 * the number of busy slots. */
static int report_slot(double* const* v, uint8_t* busy_v, int64_t s, const double* rep, int has_frac,
                       const AccountLimits* lim) {
  v[A_REPORTED_PREFILL][s] = rep[0];
  v[A_REPORTED_RUNNING][s] = rep[1];
  v[A_REPORTED_WAITING][s] = rep[2];
  if (has_frac) v[A_KV_USED_FRAC][s] = rep[3];
  const double total = v[A_KV_TOKENS_TOTAL][s] / v[A_BLOCK_SIZE][s];
  const double used = v[A_KV_USED_FRAC][s] * total;
  v[A_USED][s] = used;
  v[A_FREE][s] = total > 0 ? total - used : HUGE_VAL;
  static const double no_delta[A_NUM_DELTAS];
  static const int no_has[A_NUM_DELTAS];
  return account_slot(v, busy_v, s, no_delta, no_has, lim);
}
