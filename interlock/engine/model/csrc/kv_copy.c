/* Block copies between the paged KV cache and block-major buffers (kv_cache.py, cpu_ops.py).
 *
 * The cache is [layers, 2, kv_heads, blocks, block_size, head_dim]: piece r (one (layer, k/v,
 * head)) of block b lies at cache + r * run_stride + b * piece, so one block is `runs` pieces
 * of `piece` bytes (SmolLM2: 180 pieces of 2 KiB), with run_stride = num_blocks * piece. A
 * block-major buffer (`flat`) holds the call's blocks one after another, each block's pieces
 * back to back.
 *
 * Why a kernel: measured on the AMD EPYC VM, a copy of scattered 2 KiB pieces with ordinary
 * stores runs at half the speed of one large memcpy (5.4 against 11.6 GB/s), whatever does it
 * (numpy strided views, memcpy per piece): each destination line is first read for ownership.
 * glibc's large memcpy avoids that with non-temporal stores; so does this kernel, which then
 * writes scattered pieces at 14-18 GB/s (import). Reads of scattered pieces (export) are
 * helped along by prefetching two pieces ahead into L2: 8.5 GB/s.
 *
 * Plain C with SSE2 intrinsics only (every x86-64) and POSIX threads (the one copy, copy_by_run's
 * note), built with the system compiler and loaded with ctypes (which releases the GIL for the
 * call); elsewhere the same code uses memcpy.
 * Pieces are copied in call order: with a block id given twice, the later copy wins (as numpy).
 */
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define KV_SSE2 1
#endif

static void copy_stream(char* d, const char* s, int64_t n) {
#ifdef KV_SSE2
  int64_t head = (int64_t)((16 - ((uintptr_t)d & 15)) & 15);
  if (head > n) head = n;
  memcpy(d, s, (size_t)head);
  d += head;
  s += head;
  n -= head;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i*)(s + i));
    __m128i b = _mm_loadu_si128((const __m128i*)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i*)(s + i + 32));
    __m128i e = _mm_loadu_si128((const __m128i*)(s + i + 48));
    _mm_stream_si128((__m128i*)(d + i), a);
    _mm_stream_si128((__m128i*)(d + i + 16), b);
    _mm_stream_si128((__m128i*)(d + i + 32), c);
    _mm_stream_si128((__m128i*)(d + i + 48), e);
  }
  for (; i + 16 <= n; i += 16) _mm_stream_si128((__m128i*)(d + i), _mm_loadu_si128((const __m128i*)(s + i)));
  memcpy(d + i, s + i, (size_t)(n - i));
#else
  memcpy(d, s, (size_t)n);
#endif
}

/* Prefetch a piece into L2 (prefetcht1): measured 2 pieces ahead, export went from 5 to 8.5 GB/s;
   into L1 (t0) or around the caches (nta) it did not help. */
static void prefetch(const char* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 64) __builtin_prefetch(p + i, 0, 2);
}

/* Touch the first line of a destination piece AHEAD pieces before its streaming stores, so its
   page walk is done by then. Measured on the AMD EPYC VM, import of 64 MiB of scattered SmolLM2
   blocks, paired against one memcpy (kv_cache.py's import_blocks, BENCHMARKS.md "Onboarding
   bandwidth"): 1 GiB cache 147-157% (was 90-92%), 3 GiB 76-104% (48-75%), 128 MiB 167% (130%). */
static void prefetch_write(char* p) { __builtin_prefetch(p, 1, 3); }

static void fence(void) {
#ifdef KV_SSE2
  _mm_sfence(); /* streaming stores are weakly ordered: make them visible before returning */
#endif
}

#define AHEAD 2

/* The position of the first id outside [0, num_blocks), or -1: nothing is copied then. */
static int64_t bad_id(const int64_t* ids, int64_t n, int64_t num_blocks) {
  for (int64_t k = 0; k < n; k++)
    if (ids[k] < 0 || ids[k] >= num_blocks) return k;
  return -1;
}

/* Scattered blocks -> anywhere: piece r of block sids[k] (at src + r * src_stride + sids[k] *
   piece) to d_k + r * dst_stride, where d_k = dst + dids[k] * piece (another cache) or, without
   dids, dst + k * dst_block (a block-major buffer); prefetching AHEAD pieces ahead. */
static void gather(const char* src, int64_t src_stride, const int64_t* sids, char* dst, int64_t dst_stride,
                   const int64_t* dids, int64_t dst_block, int64_t piece, int64_t runs, int64_t n) {
  for (int64_t k = 0; k < n; k++) {
    const char* s = src + sids[k] * piece;
    char* d = dst + (dids ? dids[k] * piece : k * dst_block);
    for (int64_t r = 0; r < runs; r++) {
      int64_t ra = r + AHEAD, ka = k;
      if (ra >= runs) {
        ra -= runs;
        ka += 1;
      }
      if (ka < n && ra < runs) prefetch(src + sids[ka] * piece + ra * src_stride, piece);
      copy_stream(d + r * dst_stride, s + r * src_stride, piece);
    }
  }
  fence();
}

/* The run-at-a-time order of the reads from a cache (export, and kv_copy_between): the call's
   blocks sorted by source address, then copied one run (layer, k/v, head) at a time, so
   consecutive reads go up through neighbouring pages instead of jumping a run stride
   (num_blocks * piece) per piece; pieces adjacent on both sides merge into one copy. Why: a
   block's 180 pieces lie a run stride apart, so in a cache of 1 GiB (a worker's default) block
   after block every piece is on another page. Measured on the AMD EPYC VM, 182 scattered
   SmolLM2 blocks (64 MiB) in one call, paired against one memcpy (BENCHMARKS.md, "Onboarding
   bandwidth"): kv_copy_between from a 4,096-block memfd source 48-57% (was 26-32% block by
   block); export from a 1 GiB cache 66-134% (was 58-89%), from 3 GiB 92-96% (was 61-77%).
   Not for import (writes into the cache): there it scatters the reads from the block-major
   buffer instead and measured no better at 1-3 GiB and worse at 128 MiB (90% against 156%).
   Only where the destination addresses are distinct (else call order decides which copy wins:
   the block-by-block paths keep it); returns 0 then, or without memory for the order.

   Latency hiding, for a source on 4 KiB pages (a memfd cache where shmem gets no huge pages, as
   on the AMD EPYC VM, a KVM guest: each scattered piece is a fresh two-dimensional page walk).
   Two mechanisms, neither a constant fitted to one CPU:
   * the first line of the piece PAGE_AHEAD bytes of copying ahead is prefetched, so its page
     walk has run by the time the whole-piece prefetch (AHEAD pieces ahead) and the copy reach
     it. PAGE_AHEAD = 16 KiB is a latency x bandwidth product (about a microsecond of walk at
     10-20 GB/s), not a tuned figure: on the VM, 6-32 KiB measured alike. A probe (182 blocks
     from a 1 GiB memfd source into a private huge-page cache, one thread, 9 calls of 20 runs,
     paired against one memcpy; BENCHMARKS.md, "Transfer bandwidth"): 90% against 82% without
     it quiet, 74-81% against 69-75% at load 1.3, alike at load 2; 3 GiB 53-62% against 43-51%;
   * up to `threads` threads (the caller's and detached helpers started here) claim runs one
     at a time from a shared counter: each thread's walks overlap the others', and the caller
     waits only for runs a helper claimed (a helper that starts late, on a busy machine, finds
     nothing left and is not waited for). Measured (same probe, 2 threads): 93-95% at 1 GiB and
     88-90% at 3 GiB at load 0.9, 91% at load 1.9 against one thread's 68%; but a helper
     preempted in the middle of its run makes the call wait a time slice, and with a helper at
     every step on the busy machine the engine's path gave 47-70% where one thread gave 71-87%.
     So the caller (kv_cache.py, copy_threads) asks for a helper only where a core is idle. */
#define PAGE_AHEAD 16384
#define MAX_THREADS 8

typedef struct {
  const char* s; /* run 0's piece of the item's source block */
  char* d;       /* run 0's piece of its destination */
} Item;

typedef struct {
  int64_t n, s_stride, d_stride, piece, runs, ahead;
  int64_t next; /* the next run to claim (atomic) */
  int64_t done; /* runs copied (atomic; the lock and all_done to sleep on it) */
  int64_t refs; /* threads yet to leave (atomic): the caller and each helper started */
  pthread_mutex_t lock;
  pthread_cond_t all_done;
  Item items[]; /* the call's blocks, sorted by source address */
} Runs;

static int by_source(const void* a, const void* b) {
  const Item *x = a, *y = b;
  return (x->s > y->s) - (x->s < y->s);
}

static int by_dest(const void* a, const void* b) {
  const Item *x = a, *y = b;
  return (x->d > y->d) - (x->d < y->d);
}

/* Item k's source piece in run r, or, past the run's end, the piece that many items into the
   next runs (0 past the last run). */
static const char* source_at(const Runs* j, int64_t k, int64_t r) {
  r += k / j->n;
  k %= j->n;
  return r < j->runs ? j->items[k].s + r * j->s_stride : 0;
}

static void copy_run(const Runs* j, int64_t r) {
  const Item* items = j->items;
  const int64_t n = j->n, piece = j->piece;
  for (int64_t k = 0; k < n;) {
    const char* s = items[k].s + r * j->s_stride;
    char* d = items[k].d + r * j->d_stride;
    int64_t len = 1;
    while (k + len < n && items[k + len].s == items[k].s + len * piece && items[k + len].d == items[k].d + len * piece)
      len++;
    const char* next = source_at(j, k + len + AHEAD - 1, r); /* the piece AHEAD copies on */
    if (next) prefetch(next, piece);
    const char* walk = source_at(j, k + len + j->ahead - 1, r);
    if (walk) __builtin_prefetch(walk, 0, 2);
    copy_stream(d, s, len * piece);
    k += len;
  }
}

/* Copy runs while there are runs to claim, then count them done (after a fence: each thread's
   streaming stores are visible before the count is); returns the runs copied. */
static int64_t claim_runs(Runs* j) {
  int64_t copied = 0;
  for (int64_t r; (r = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->runs; copied++) copy_run(j, r);
  if (!copied) return 0;
  fence();
  if (__atomic_add_fetch(&j->done, copied, __ATOMIC_RELEASE) == j->runs) {
    pthread_mutex_lock(&j->lock);
    pthread_cond_signal(&j->all_done);
    pthread_mutex_unlock(&j->lock);
  }
  return copied;
}

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The caller, its runs copied, waits for the runs a helper still copies: spinning for about
   twice the time a run took it (a helper's last run should end by then), then asleep (a helper
   preempted on a busy machine: the core is better given up). Sleeping at once cost a wake-up
   per call, on a busy machine often a time slice. */
static void wait_done(Runs* j, double per_run) {
  double until = seconds() + 2 * per_run;
  while (__atomic_load_n(&j->done, __ATOMIC_ACQUIRE) < j->runs) {
    if (seconds() < until) {
#ifdef KV_SSE2
      _mm_pause();
#endif
      continue;
    }
    pthread_mutex_lock(&j->lock);
    while (__atomic_load_n(&j->done, __ATOMIC_ACQUIRE) < j->runs) pthread_cond_wait(&j->all_done, &j->lock);
    pthread_mutex_unlock(&j->lock);
  }
}

/* The last thread out frees the job: a helper that starts after every run was claimed (a busy
   machine) finds nothing to do and is not waited for; the caller waits only for runs claimed. */
static void leave(Runs* j) {
  if (__atomic_sub_fetch(&j->refs, 1, __ATOMIC_ACQ_REL)) return;
  pthread_cond_destroy(&j->all_done);
  pthread_mutex_destroy(&j->lock);
  free(j);
}

static void* helper(void* arg) {
  claim_runs(arg);
  leave(arg);
  return 0;
}

/* Start up to threads - 1 detached helpers (fewer where one cannot be started: the others
   claim its runs). */
static void start_helpers(Runs* j, int64_t threads) {
  pthread_attr_t attr;
  if (threads < 2 || pthread_attr_init(&attr)) return;
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (int64_t t = 1; t < threads; t++) {
    pthread_t id;
    __atomic_add_fetch(&j->refs, 1, __ATOMIC_RELAXED);
    if (pthread_create(&id, &attr, helper, j)) {
      __atomic_sub_fetch(&j->refs, 1, __ATOMIC_RELAXED);
      break;
    }
  }
  pthread_attr_destroy(&attr);
}

/* The run-at-a-time copy (the note above) of the call's blocks: block k from src + sids[k] * piece to dst + (dids ? dids[k] *
   piece : k * dst_block), on up to `threads` threads; 0 where it did not copy (see the
   note: fewer than two blocks, repeated destinations, no memory). */
static int copy_by_run(const char* src, const int64_t* sids, int64_t s_stride, char* dst, const int64_t* dids,
                       int64_t dst_block, int64_t d_stride, int64_t piece, int64_t runs, int64_t n, int64_t threads) {
  if (n < 2) return 0;
  Runs* j = malloc(sizeof(Runs) + (size_t)n * sizeof(Item));
  if (!j) return 0;
  for (int64_t k = 0; k < n; k++) {
    j->items[k].s = src + sids[k] * piece;
    j->items[k].d = dst + (dids ? dids[k] * piece : k * dst_block);
  }
  qsort(j->items, (size_t)n, sizeof(Item), by_dest);
  for (int64_t k = 1; k < n; k++)
    if (j->items[k].d == j->items[k - 1].d) {
      free(j);
      return 0;
    }
  if (pthread_mutex_init(&j->lock, 0)) {
    free(j);
    return 0;
  }
  if (pthread_cond_init(&j->all_done, 0)) {
    pthread_mutex_destroy(&j->lock);
    free(j);
    return 0;
  }
  qsort(j->items, (size_t)n, sizeof(Item), by_source);
  int64_t ahead = PAGE_AHEAD / piece;
  j->n = n;
  j->s_stride = s_stride;
  j->d_stride = d_stride;
  j->piece = piece;
  j->runs = runs;
  j->ahead = ahead > AHEAD ? ahead : AHEAD + 1;
  j->next = j->done = 0;
  j->refs = 1;
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  start_helpers(j, threads < runs ? threads : runs);
  double t0 = seconds();
  int64_t mine = claim_runs(j);
  wait_done(j, mine ? (seconds() - t0) / (double)mine : 1e-4);
  leave(j);
  return 1;
}

/* cache -> flat: block ids[k] into flat + k * runs * piece, for k < n. */
int64_t kv_export(const char* cache, int64_t num_blocks, int64_t piece, int64_t runs, const int64_t* ids,
                  int64_t n, char* flat) {
  int64_t bad = bad_id(ids, n, num_blocks);
  if (bad >= 0) return bad;
  const int64_t run_stride = num_blocks * piece, block = runs * piece;
  if (!copy_by_run(cache, ids, run_stride, flat, 0, block, piece, piece, runs, n, 1))
    gather(cache, run_stride, ids, flat, piece, 0, block, piece, runs, n);
  return -1;
}

/* Into the cache: block k of the call (at src[k], or flat + k * runs * piece) into block ids[k]. */
static int64_t import_impl(char* cache, int64_t num_blocks, int64_t piece, int64_t runs, const int64_t* ids,
                           int64_t n, const char* flat, const int64_t* src) {
  int64_t bad = bad_id(ids, n, num_blocks);
  if (bad >= 0) return bad;
  const int64_t run_stride = num_blocks * piece, block = runs * piece;
  for (int64_t k = 0; k < n; k++) {
    char* d = cache + ids[k] * piece;
    const char* s = src ? (const char*)(intptr_t)src[k] : flat + k * block;
    for (int64_t r = 0; r < runs; r++) {
      int64_t ra = r + AHEAD, ka = k;
      if (ra >= runs) {
        ra -= runs;
        ka += 1;
      }
      if (ka < n) prefetch_write(cache + ids[ka] * piece + ra * run_stride);
      copy_stream(d + r * run_stride, s + r * piece, piece);
    }
  }
  fence();
  return -1;
}

/* flat -> cache: flat + k * runs * piece into block ids[k], for k < n. */
int64_t kv_import(char* cache, int64_t num_blocks, int64_t piece, int64_t runs, const int64_t* ids, int64_t n,
                  const char* flat) {
  return import_impl(cache, num_blocks, piece, runs, ids, n, flat, 0);
}

/* Blocks anywhere -> cache: the block at address src[k] into block ids[k], for k < n (host-tier
   slots onboarded in one call). */
int64_t kv_import_each(char* cache, int64_t num_blocks, int64_t piece, int64_t runs, const int64_t* ids,
                       int64_t n, const int64_t* src) {
  return import_impl(cache, num_blocks, piece, runs, ids, n, 0, src);
}

/* One cache -> another of the same piece and runs (the source's mapped from another process's
   memfd: the one-copy disaggregated transfer, PagedKVCache.copy_from_shared): runs r0..r1-1 of
   block src_ids[k] of src (src_blocks blocks) into the same runs of block ids[k] of cache, in
   copy_by_run's order, on up to `threads` threads (copy_by_run's note). The engine copies a
   transfer in steps of a slice of runs of every block, not some blocks whole: each step keeps
   the one-call order (each run's pieces in ascending source order, on neighbouring pages),
   where steps of a few blocks read each run's pieces a run stride / blocks apart, each on a
   page of its own. On the AMD EPYC VM, 64 MiB from a 1 GiB cache in 8 MiB steps (BENCHMARKS.md,
   "Transfer bandwidth", a loaded machine): 60-67% of one memcpy in parts, 41-46% in 22-block
   steps. process_vm_readv of the same pieces (iovecs built in C, batches of 1024) gave 27% of
   one memcpy from a 128 MiB cache. Ids and the run range are checked first, nothing copied
   then. Returns -1; k for a bad ids[k]; n + k for a bad src_ids[k]; 2n for a bad run range. */
int64_t kv_copy_between(const char* src, int64_t src_blocks, const int64_t* src_ids, char* cache,
                        int64_t num_blocks, int64_t piece, int64_t runs, const int64_t* ids, int64_t n, int64_t r0,
                        int64_t r1, int64_t threads) {
  int64_t bad = bad_id(ids, n, num_blocks);
  if (bad >= 0) return bad;
  bad = bad_id(src_ids, n, src_blocks);
  if (bad >= 0) return n + bad;
  if (r0 < 0 || r1 > runs || r0 > r1) return 2 * n;
  const int64_t s_stride = src_blocks * piece, d_stride = num_blocks * piece;
  src += r0 * s_stride; /* piece r of a block lies r run strides in: the slice starts r0 in */
  cache += r0 * d_stride;
  if (!copy_by_run(src, src_ids, s_stride, cache, ids, 0, d_stride, piece, r1 - r0, n, threads))
    gather(src, s_stride, src_ids, cache, d_stride, ids, 0, piece, r1 - r0, n);
  return -1;
}
