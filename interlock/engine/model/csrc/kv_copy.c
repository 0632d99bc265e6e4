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
 * Plain C with SSE2 intrinsics only (every x86-64), built with the system compiler and loaded
 * with ctypes (which releases the GIL for the call); elsewhere the same code uses memcpy.
 * Pieces are copied in call order: with a block id given twice, the later copy wins (as numpy).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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
   the block-by-block paths keep it); returns 0 then, or without memory for the order. */
typedef struct {
  const char* s; /* run 0's piece of the item's source block */
  char* d;       /* run 0's piece of its destination */
} Item;

static int by_source(const void* a, const void* b) {
  const Item *x = a, *y = b;
  return (x->s > y->s) - (x->s < y->s);
}

static int by_dest(const void* a, const void* b) {
  const Item *x = a, *y = b;
  return (x->d > y->d) - (x->d < y->d);
}

static int by_run(Item* items, int64_t n, int64_t s_stride, int64_t d_stride, int64_t piece, int64_t runs) {
  qsort(items, (size_t)n, sizeof(Item), by_dest);
  for (int64_t k = 1; k < n; k++)
    if (items[k].d == items[k - 1].d) return 0;
  qsort(items, (size_t)n, sizeof(Item), by_source);
  for (int64_t r = 0; r < runs; r++) {
    for (int64_t k = 0; k < n;) {
      const char* s = items[k].s + r * s_stride;
      char* d = items[k].d + r * d_stride;
      int64_t len = 1;
      while (k + len < n && items[k + len].s == items[k].s + len * piece && items[k + len].d == items[k].d + len * piece)
        len++;
      int64_t j = k + len + AHEAD - 1; /* the piece AHEAD copies on, into the next run at the end */
      if (j < n)
        prefetch(items[j].s + r * s_stride, piece);
      else if (r + 1 < runs && j - n < n)
        prefetch(items[j - n].s + (r + 1) * s_stride, piece);
      copy_stream(d, s, len * piece);
      k += len;
    }
  }
  fence();
  return 1;
}

/* by_run over the call's blocks: block k from src + sids[k] * piece to dst + (dids ? dids[k] *
   piece : k * dst_block), sorted by source address; 0 where it did not copy (see by_run). */
static int copy_by_run(const char* src, const int64_t* sids, int64_t s_stride, char* dst, const int64_t* dids,
                       int64_t dst_block, int64_t d_stride, int64_t piece, int64_t runs, int64_t n) {
  if (n < 2) return 0;
  Item* items = malloc((size_t)n * sizeof(Item));
  if (!items) return 0;
  for (int64_t k = 0; k < n; k++) {
    items[k].s = src + sids[k] * piece;
    items[k].d = dst + (dids ? dids[k] * piece : k * dst_block);
  }
  int done = by_run(items, n, s_stride, d_stride, piece, runs);
  free(items);
  return done;
}

/* cache -> flat: block ids[k] into flat + k * runs * piece, for k < n. */
int64_t kv_export(const char* cache, int64_t num_blocks, int64_t piece, int64_t runs, const int64_t* ids,
                  int64_t n, char* flat) {
  int64_t bad = bad_id(ids, n, num_blocks);
  if (bad >= 0) return bad;
  const int64_t run_stride = num_blocks * piece, block = runs * piece;
  if (!copy_by_run(cache, ids, run_stride, flat, 0, block, piece, piece, runs, n))
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
   memfd: the one-copy disaggregated transfer, PagedKVCache.copy_from_shared): block src_ids[k]
   of src (src_blocks blocks) into block ids[k] of cache, in by_run's order. Its speed falls with
   the source's size (4 KiB shared pages; by_run's note has the figures); process_vm_readv of the
   same pieces (iovecs built in C, batches of 1024) gave 27% of one memcpy on the AMD EPYC VM
   from a 128 MiB cache. Both id lists are checked first. Returns -1; k for a bad ids[k]; n + k for a
   bad src_ids[k]. */
int64_t kv_copy_between(const char* src, int64_t src_blocks, const int64_t* src_ids, char* cache,
                        int64_t num_blocks, int64_t piece, int64_t runs, const int64_t* ids, int64_t n) {
  int64_t bad = bad_id(ids, n, num_blocks);
  if (bad >= 0) return bad;
  bad = bad_id(src_ids, n, src_blocks);
  if (bad >= 0) return n + bad;
  if (!copy_by_run(src, src_ids, src_blocks * piece, cache, ids, 0, num_blocks * piece, piece, runs, n))
    gather(src, src_blocks * piece, src_ids, cache, num_blocks * piece, ids, 0, piece, runs, n);
  return -1;
}

