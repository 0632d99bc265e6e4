/* The router's prefix index in C (a CPython extension module, loaded by router/native.py):
 * the map "block hash -> workers holding it" of indexer.KvIndexer, and the whole kv decision
 * (lookup, uncached tokens per worker, route_kv's cost, candidates and choice) in one call.
 *
 * Idea, as in the Python index: block hashes are chained, so a flat map from a hash to the set
 * of workers holding it is a radix tree in disguise; a lookup walks the request's chain AND-ing
 * the sets. Here the map is an open-addressing table (linear probing, backward-shift deletion,
 * Fibonacci hashing of the 64-bit key) of 16-byte entries: hash -> mask id. A mask is a bitset
 * over worker slots (`words` 64-bit words) in a pool, reference counted: the blocks a worker
 * stored together share one mask, as the Python index shares one int object, so a lookup skips
 * the AND for a block whose mask id is the previous block's. The lookup converts the request's
 * hashes as its walk reaches them and prefetches the table lines (and the int objects) ahead of
 * it: a cold million-entry table costs about one cache miss per block, overlapped, and the walk
 * stops at the first block nobody holds.
 *
 * The result is a function of the mask values only, never of how they are shared, so this index
 * gives exactly the runs of the Python one (tests/router/test_native.py checks it).
 *
 * Growth is incremental (as Redis rehashes): past 3/4 full, a table of twice the size becomes the
 * one inserted into, and every store or remove moves MIGRATE_STEP of the old table's slots per
 * block into it, so no call pays for a whole rehash (at 9 M entries that was one 280 ms call, a
 * stall of every request in flight). Until the old table is empty, a key is in exactly one of
 * the two; a lookup probes the new one, then the old. A slot moved out of the old table, or a
 * key deleted from it, is marked MOVED rather than emptied: its probe chains stay whole.
 *
 * Invariants (kvi_check): an entry's mask is non-zero; a key is in one table at most; a mask's
 * refcount is the number of entries holding it (plus one while a store or remove pins it); free
 * ids have refcount 0.
 *
 * The module also carries LoadTracker's accounting of one slot (account.c: a dispatch,
 * ``account``; a load report's figures, ``report``), the other per-decision piece of the router
 * worth a compiled call, and the per-report one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>

#include "route_kv.c"
#include "account.c"

typedef struct {
  uint64_t key;
  uint32_t mask; /* 0: empty */
  uint32_t _pad;
} Entry;

/* The blocks one worker slot holds: an open-addressing set of keys (0 marks an empty slot; the
 * key 0 itself is `zero`), 8 bytes a key where a Python dict of ints took about 90. */
typedef struct {
  uint64_t* keys;
  uint64_t cap; /* power of two, or 0 */
  uint64_t used; /* keys in `keys` */
  int zero;      /* the key 0 is held */
} SlotSet;

typedef struct {
  Entry* tab;
  uint64_t cap; /* power of two */
  int shift;    /* 64 - log2(cap) */
  uint64_t used;
  size_t tab_map;  /* bytes mapped for tab (huge-page aligned), 0: it came from calloc */
  Entry* old; /* the table being moved out of while growing; NULL when none */
  size_t old_map;
  Entry* next; /* the next table, being prepared by next_thread while next_state is 1 */
  uint64_t next_cap;
  size_t next_map;
  pthread_t next_thread;
  int next_state;
  uint64_t old_cap, old_live, mig; /* its slots, its live entries, the next slot to move */
  int old_shift;
  uint64_t* bits; /* masks_cap * words */
  uint32_t* refs;
  uint32_t* free_ids;
  uint32_t nfree, nmasks, masks_cap; /* ids 1..nmasks-1 allocated at some point; 0 unused */
  int64_t words;
  SlotSet* sets; /* words * 64: each slot's blocks */
  /* scratch of a lookup */
  uint64_t* keys;
  int64_t keys_cap;
  uint64_t* runs; /* run masks, runs_cap * words */
  int64_t* run_len;
  int64_t runs_cap;
  double* table;  /* runs_cap + 1: a decision's uncached tokens per depth */
  int64_t* held;  /* runs_cap + 1: its blocks held per depth */
  uint64_t* cur; /* words: the AND so far */
  uint64_t* tmp; /* words */
} Index;

static const char* CAPSULE = "interlock.kvindex";

#define MOVED UINT32_MAX /* an old table's slot whose entry moved or was deleted (not a mask id) */
#define MIGRATE_STEP 4   /* old slots moved per block stored or removed while growing */

static inline uint64_t home_of(int shift, uint64_t key) { return (key * 0x9E3779B97F4A7C15ull) >> shift; }

static inline uint64_t home(const Index* ix, uint64_t key) { return home_of(ix->shift, key); }

/* The live entry for key in the old table, NULL if none (or no old table). */
static inline Entry* find_old(const Index* ix, uint64_t key) {
  if (!ix->old) return NULL;
  uint64_t m = ix->old_cap - 1;
  for (uint64_t i = home_of(ix->old_shift, key);; i = (i + 1) & m) {
    Entry* e = &ix->old[i];
    if (!e->mask) return NULL;
    if (e->key == key && e->mask != MOVED) return e;
  }
}

/* Slot i of the new table then the old one (i < cap + old_cap) if it holds a live entry. */
static inline const Entry* slot_at(const Index* ix, uint64_t i) {
  const Entry* e = i < ix->cap ? &ix->tab[i] : &ix->old[i - ix->cap];
  return e->mask && e->mask != MOVED ? e : NULL;
}

static inline Entry* find(const Index* ix, uint64_t key) {
  uint64_t m = ix->cap - 1;
  for (uint64_t i = home(ix, key);; i = (i + 1) & m) {
    Entry* e = &ix->tab[i];
    if (!e->mask) return find_old(ix, key);
    if (e->key == key) return e;
  }
}

static inline uint64_t* mask_at(const Index* ix, uint32_t id) { return ix->bits + (uint64_t)id * ix->words; }

#define MAPPED_TABLE ((size_t)2 << 20) /* tables of this many bytes or more are mmap'ed */

/* A zeroed table of cap entries; *mapped: the bytes mapped (0: calloc). `populate`: its pages
 * faulted in now, one at a time (a table that large is otherwise faulted in by the inserts that
 * first touch each page: 65,536 faults at 16 M entries, 30-80 ms in the first stores after a
 * growth). Not MAP_POPULATE: that holds the process's memory-map lock for the whole table, and
 * any mmap of the serving thread (a large list) waits for it. */
static Entry* table_alloc(uint64_t cap, size_t* mapped, int populate) {
  size_t bytes = cap * sizeof(Entry);
  *mapped = 0;
  if (bytes < MAPPED_TABLE) return calloc(cap, sizeof(Entry));
  char* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  if (populate)
    for (size_t at = 0; at < bytes; at += 4096) ((volatile char*)p)[at] = 0;
  *mapped = bytes;
  return (Entry*)p;
}

static void table_free(Entry* tab, size_t mapped) {
  if (mapped) munmap(tab, mapped);
  else free(tab);
}

typedef struct {
  Entry* tab;
  size_t mapped;
} Unmap;

static void* unmap_later(void* arg) {
  Unmap* u = arg;
  /* Its pages dropped a few MiB at a time first (under the memory-map lock shared, as page
   * faults take it): the unmap itself, under the lock held alone, then has nothing to free. */
  for (size_t at = 0; at < u->mapped; at += MAPPED_TABLE)
    madvise((char*)u->tab + at, u->mapped - at < MAPPED_TABLE ? u->mapped - at : MAPPED_TABLE, MADV_DONTNEED);
  munmap(u->tab, u->mapped);
  free(u);
  return NULL;
}

/* A table no longer used, given back by a thread of its own where it was mapped (unmapping 128
 * MiB of faulted pages takes 5 ms, a stall of every request in flight if done here). */
static void table_retire(Entry* tab, size_t mapped) {
  Unmap* u = mapped ? malloc(sizeof(Unmap)) : NULL;
  pthread_t t;
  pthread_attr_t attr;
  if (u && pthread_attr_init(&attr) == 0) {
    u->tab = tab;
    u->mapped = mapped;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int started = pthread_create(&t, &attr, unmap_later, u) == 0;
    pthread_attr_destroy(&attr);
    if (started) return;
  }
  free(u);
  table_free(tab, mapped);
}

/* The next table, made ready beside the caller: once the table is 5/8 full, a thread maps the
 * one of twice its size and faults its pages in, so that the growth at 3/4 (table_grow) finds
 * it ready instead of faulting it in on the serving thread. */
static void* prepare_next(void* arg) {
  Index* ix = arg;
  ix->next = table_alloc(ix->next_cap, &ix->next_map, 1);
  return NULL;
}

static void next_start(Index* ix) {
  if (ix->next_state || ix->old || ix->cap * sizeof(Entry) * 2 < MAPPED_TABLE) return;
  ix->next_cap = ix->cap * 2;
  ix->next = NULL;
  ix->next_state = pthread_create(&ix->next_thread, NULL, prepare_next, ix) == 0 ? 1 : 0;
}

/* The prepared table if there is one of `cap` entries (waiting for its thread), else NULL. */
static Entry* next_take(Index* ix, uint64_t cap, size_t* mapped) {
  if (!ix->next_state) return NULL;
  pthread_join(ix->next_thread, NULL);
  ix->next_state = 0;
  Entry* t = ix->next;
  ix->next = NULL;
  if (t && ix->next_cap == cap) {
    *mapped = ix->next_map;
    return t;
  }
  if (t) table_free(t, ix->next_map);
  return NULL;
}

static int table_init(Index* ix, uint64_t cap) {
  Entry* tab = next_take(ix, cap, &ix->tab_map);
  if (!tab) tab = table_alloc(cap, &ix->tab_map, 0);
  if (!tab) return -1;
  ix->tab = tab;
  ix->cap = cap;
  ix->shift = 64 - __builtin_ctzll(cap);
  ix->used = 0;
  return 0;
}

/* An empty slot of the new table for key (not in it), probing from its home. */
static inline Entry* free_slot(Index* ix, uint64_t key) {
  uint64_t m = ix->cap - 1, i = home(ix, key);
  while (ix->tab[i].mask) i = (i + 1) & m;
  return &ix->tab[i];
}

/* Up to `steps` slots of the old table moved into the new one; the old table freed once empty. */
static void migrate(Index* ix, uint64_t steps) {
  for (; ix->old && steps; steps--) {
    if (ix->mig == ix->old_cap) {
      table_retire(ix->old, ix->old_map);
      ix->old = NULL;
      ix->old_cap = ix->old_live = ix->mig = 0;
      return;
    }
    Entry* e = &ix->old[ix->mig++];
    if (!e->mask || e->mask == MOVED) continue;
    *free_slot(ix, e->key) = *e;
    ix->used++;
    ix->old_live--;
    e->mask = MOVED;
  }
}

/* Start growing: the table becomes the old one (a growth still running is finished first). */
static int table_grow(Index* ix) {
  migrate(ix, UINT64_MAX);
  Entry* old = ix->tab;
  uint64_t old_cap = ix->cap, used = ix->used;
  int old_shift = ix->shift;
  size_t old_map = ix->tab_map;
  if (table_init(ix, old_cap * 2) < 0) {
    ix->tab = old;
    ix->cap = old_cap;
    ix->shift = old_shift;
    ix->used = used;
    ix->tab_map = old_map;
    return -1;
  }
  ix->old = old;
  ix->old_map = old_map;
  ix->old_cap = old_cap;
  ix->old_shift = old_shift;
  ix->old_live = used;
  ix->mig = 0;
  return 0;
}

/* The entry for key, inserted empty-masked if absent (the caller sets its mask). One in the old
 * table is moved into the new one first. */
static Entry* find_or_insert(Index* ix, uint64_t key) {
  migrate(ix, MIGRATE_STEP);
  uint64_t live = ix->used + ix->old_live + 1;
  if (live * 8 > ix->cap * 5) next_start(ix);
  if (live * 4 > ix->cap * 3 && table_grow(ix) < 0) return NULL;
  uint64_t m = ix->cap - 1;
  for (uint64_t i = home(ix, key);; i = (i + 1) & m) {
    Entry* e = &ix->tab[i];
    if (!e->mask) {
      Entry* o = find_old(ix, key);
      e->key = key;
      ix->used++;
      if (o) {
        e->mask = o->mask;
        o->mask = MOVED;
        ix->old_live--;
      }
      return e;
    }
    if (e->key == key) return e;
  }
}

static void table_delete(Index* ix, Entry* e) {
  if (ix->old && e >= ix->old && e < ix->old + ix->old_cap) { /* its chain stays whole */
    e->mask = MOVED;
    ix->old_live--;
    return;
  }
  uint64_t m = ix->cap - 1;
  uint64_t i = (uint64_t)(e - ix->tab);
  uint64_t j = i;
  for (;;) { /* backward shift: move later entries of the cluster into the hole */
    j = (j + 1) & m;
    if (!ix->tab[j].mask) break;
    uint64_t h = home(ix, ix->tab[j].key);
    /* j's entry may move to i iff its home is not in (i, j] (cyclically) */
    if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
      ix->tab[i] = ix->tab[j];
      i = j;
    }
  }
  ix->tab[i].mask = 0;
  ix->tab[i].key = 0;
  ix->used--;
}

static uint32_t mask_alloc(Index* ix) {
  uint32_t id;
  if (ix->nfree) {
    id = ix->free_ids[--ix->nfree];
  } else {
    if (ix->nmasks == MOVED) return 0; /* 2^32 - 1 ids: the last is the MOVED mark */
    if (ix->nmasks == ix->masks_cap) {
      uint32_t cap = ix->masks_cap * 2;
      uint64_t* bits = realloc(ix->bits, (size_t)cap * ix->words * 8);
      if (!bits) return 0;
      ix->bits = bits;
      uint32_t* refs = realloc(ix->refs, (size_t)cap * 4);
      if (!refs) return 0;
      ix->refs = refs;
      uint32_t* fr = realloc(ix->free_ids, (size_t)cap * 4);
      if (!fr) return 0;
      ix->free_ids = fr;
      ix->masks_cap = cap;
    }
    id = ix->nmasks++;
  }
  ix->refs[id] = 0;
  return id;
}

/* An id just allocated and never used, given back. */
static inline void mask_free(Index* ix, uint32_t id) { ix->free_ids[ix->nfree++] = id; }

static inline void mask_decref(Index* ix, uint32_t id) {
  if (id && --ix->refs[id] == 0) ix->free_ids[ix->nfree++] = id;
}

static inline void mask_incref(Index* ix, uint32_t id) {
  if (id) ix->refs[id]++;
}

/* A set's home is the product's low bits, the big table's its high bits (home_of). A set walked
 * in slot order (blocks(): a replica's copy) then comes in sweeps over the low bits, which fill
 * another set of any size evenly; with high bits it came sorted by home, and a smaller set being
 * filled (a new replica's, growing) piled it into one run probed end to end: 8x the time of the
 * same blocks in a worker's order (60 x 30,000 blocks: 2.4 s against 0.3). */
static inline uint64_t set_home(const SlotSet* st, uint64_t key) {
  return (key * 0x9E3779B97F4A7C15ull) & (st->cap - 1);
}

static int set_has(const SlotSet* st, uint64_t key) {
  if (!key) return st->zero;
  if (!st->cap) return 0;
  uint64_t m = st->cap - 1;
  for (uint64_t i = set_home(st, key);; i = (i + 1) & m) {
    if (!st->keys[i]) return 0;
    if (st->keys[i] == key) return 1;
  }
}

static uint64_t set_size(const SlotSet* st) { return st->used + (st->zero ? 1 : 0); }

/* key added (it is not in the set); -1 out of memory, the set unchanged. */
static int set_add(SlotSet* st, uint64_t key) {
  if (!key) {
    st->zero = 1;
    return 0;
  }
  if ((st->used + 1) * 4 > st->cap * 3) {
    uint64_t cap = st->cap ? st->cap * 2 : 64;
    uint64_t* keys = calloc(cap, 8);
    if (!keys) return -1;
    SlotSet grown = {keys, cap, 0, st->zero};
    for (uint64_t j = 0; j < st->cap; j++)
      if (st->keys[j]) {
        uint64_t i = set_home(&grown, st->keys[j]);
        while (keys[i]) i = (i + 1) & (cap - 1);
        keys[i] = st->keys[j];
        grown.used++;
      }
    free(st->keys);
    *st = grown;
  }
  uint64_t m = st->cap - 1, i = set_home(st, key);
  while (st->keys[i]) i = (i + 1) & m;
  st->keys[i] = key;
  st->used++;
  return 0;
}

/* key taken out of the set (a key it does not hold: nothing changes). */
static void set_del(SlotSet* st, uint64_t key) {
  if (!key) {
    st->zero = 0;
    return;
  }
  if (!st->cap) return;
  uint64_t m = st->cap - 1, i = set_home(st, key);
  for (; st->keys[i] != key; i = (i + 1) & m)
    if (!st->keys[i]) return;
  for (uint64_t j = i;;) { /* backward shift, as table_delete */
    j = (j + 1) & m;
    if (!st->keys[j]) break;
    uint64_t h = set_home(st, st->keys[j]);
    if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
      st->keys[i] = st->keys[j];
      i = j;
    }
  }
  st->keys[i] = 0;
  st->used--;
}

static void set_free(SlotSet* st) {
  free(st->keys);
  memset(st, 0, sizeof(*st));
}

static void index_free(Index* ix) {
  if (ix->sets)
    for (int64_t s = 0; s < ix->words * 64; s++) free(ix->sets[s].keys);
  free(ix->sets);
  size_t mapped;
  Entry* next = next_take(ix, ix->next_cap, &mapped);
  if (next) table_free(next, mapped);
  if (ix->tab) table_free(ix->tab, ix->tab_map);
  if (ix->old) table_free(ix->old, ix->old_map);
  free(ix->bits);
  free(ix->refs);
  free(ix->free_ids);
  free(ix->keys);
  free(ix->runs);
  free(ix->run_len);
  free(ix->cur);
  free(ix->tmp);
  free(ix->table);
  free(ix->held);
  free(ix);
}

static void capsule_free(PyObject* cap) {
  Index* ix = PyCapsule_GetPointer(cap, CAPSULE);
  if (ix) index_free(ix);
}

static Index* get_index(PyObject* cap) { return PyCapsule_GetPointer(cap, CAPSULE); }

/* ---- argument helpers ---- */

/* A block hash as a 64-bit key: 0, or -1 (no exception left set) where `o` is not an int in
 * [0, 2^64). An exact int of up to three 30-bit digits (every hash kvhash makes) is read from
 * its digits: PyLong_AsUnsignedLongLong goes through _PyLong_AsByteArray there, about 15 ns a
 * hash, a quarter of a 256-block lookup. Any other int (a subclass, Python 3.12's layout, 15-bit
 * digits) takes the API, with the same result. */
static inline int key_of(PyObject* o, uint64_t* out) {
#if PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
  if (PyLong_CheckExact(o)) {
    const Py_ssize_t size = Py_SIZE(o);
    const digit* d = ((PyLongObject*)o)->ob_digit;
    if (size >= 0 && size <= 3) {
      if (size == 3 && d[2] >> 4) return -1; /* 2^64 or more */
      uint64_t v = 0;
      if (size == 3) v = (uint64_t)d[2] << 60;
      if (size >= 2) v |= (uint64_t)d[1] << 30;
      if (size >= 1) v |= d[0];
      *out = v;
      return 0;
    }
    if (size < 0) return -1;
  }
#endif
  unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    return -1;
  }
  *out = v;
  return 0;
}

/* ix->keys with room for `len` keys; -1 (MemoryError set) out of memory. */
static int keys_room(Index* ix, int64_t len) {
  if (len <= ix->keys_cap) return 0;
  int64_t cap = len * 2 + 64;
  uint64_t* k = realloc(ix->keys, (size_t)cap * 8);
  if (!k) {
    PyErr_NoMemory();
    return -1;
  }
  ix->keys = k;
  ix->keys_cap = cap;
  return 0;
}

/* The hashes of a sequence of ints into ix->keys, *n the count; -1 with an exception if one is
 * not a 64-bit unsigned int (nothing of the index changes). */
static int load_keys(Index* ix, PyObject* seq, int64_t* n) {
  if (PyObject_CheckBuffer(seq) && !PyBytes_Check(seq) && !PyByteArray_Check(seq)) {
    /* an array('Q') (a pulled state: unsigned 64-bit by its type): copied, no int read */
    Py_buffer view;
    if (PyObject_GetBuffer(seq, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return -1;
    int ok = view.itemsize == 8 && view.format && strcmp(view.format, "Q") == 0;
    if (ok) {
      Py_ssize_t len = view.len / 8;
      if (keys_room(ix, len) < 0) {
        PyBuffer_Release(&view);
        return -1;
      }
      memcpy(ix->keys, view.buf, (size_t)len * 8);
      *n = len;
    }
    PyBuffer_Release(&view);
    if (ok) return 0;
    PyErr_SetString(PyExc_TypeError, "block hashes in a buffer must be unsigned 64-bit ints (array 'Q')");
    return -1;
  }
  PyObject* fast = PySequence_Fast(seq, "block hashes must be a sequence of ints");
  if (!fast) return -1;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
  if (keys_room(ix, len) < 0) {
    Py_DECREF(fast);
    return -1;
  }
  PyObject** items = PySequence_Fast_ITEMS(fast);
  for (Py_ssize_t i = 0; i < len; i++) {
    if (key_of(items[i], &ix->keys[i]) < 0) {
      PyErr_Format(PyExc_OverflowError, "block hash %R is not a 64-bit unsigned int", items[i]);
      Py_DECREF(fast);
      return -1;
    }
  }
  Py_DECREF(fast);
  *n = len;
  return 0;
}

static int check_nargs(Py_ssize_t nargs, Py_ssize_t want, const char* name) {
  if (nargs != want) {
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, want, nargs);
    return -1;
  }
  return 0;
}

/* (index, int, ...) arguments: the index, and the int in `*value`; NULL with an exception set. */
static Index* index_and_int(PyObject* const* args, Py_ssize_t nargs, Py_ssize_t want, const char* name,
                            int64_t* value) {
  if (check_nargs(nargs, want, name) < 0) return NULL;
  Index* ix = get_index(args[0]);
  if (!ix) return NULL;
  *value = PyLong_AsLongLong(args[1]);
  return PyErr_Occurred() ? NULL : ix;
}

/* ---- module functions ---- */

static PyObject* kvi_new(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_nargs(nargs, 1, "new") < 0) return NULL;
  int64_t words = PyLong_AsLongLong(args[0]);
  if (words < 1 && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "words must be >= 1");
  if (PyErr_Occurred()) return NULL;
  Index* ix = calloc(1, sizeof(Index));
  if (!ix) return PyErr_NoMemory();
  ix->words = words;
  ix->masks_cap = 64;
  ix->nmasks = 1;
  ix->bits = calloc((size_t)ix->masks_cap * words, 8);
  ix->refs = calloc(ix->masks_cap, 4);
  ix->free_ids = calloc(ix->masks_cap, 4);
  ix->cur = calloc(words, 8);
  ix->tmp = calloc(words, 8);
  ix->sets = calloc(words * 64, sizeof(SlotSet));
  if (!ix->bits || !ix->refs || !ix->free_ids || !ix->cur || !ix->tmp || !ix->sets || table_init(ix, 1024) < 0) {
    index_free(ix);
    return PyErr_NoMemory();
  }
  PyObject* cap = PyCapsule_New(ix, CAPSULE, capsule_free);
  if (!cap) index_free(ix);
  return cap;
}

/* grow(index, words): masks widened to `words` words (more worker slots). */
static PyObject* kvi_grow(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  int64_t words;
  Index* ix = index_and_int(args, nargs, 2, "grow", &words);
  if (!ix) return NULL;
  if (words <= ix->words) Py_RETURN_NONE;
  uint64_t* bits = calloc((size_t)ix->masks_cap * words, 8);
  uint64_t* cur = calloc(words, 8);
  uint64_t* tmp = calloc(words, 8);
  SlotSet* sets = calloc(words * 64, sizeof(SlotSet));
  if (!bits || !cur || !tmp || !sets) {
    free(bits);
    free(cur);
    free(tmp);
    free(sets);
    return PyErr_NoMemory();
  }
  memcpy(sets, ix->sets, ix->words * 64 * sizeof(SlotSet));
  free(ix->sets);
  ix->sets = sets;
  free(ix->cur);
  free(ix->tmp);
  ix->cur = cur;
  ix->tmp = tmp;
  for (uint32_t id = 0; id < ix->nmasks; id++)
    memcpy(bits + (uint64_t)id * words, ix->bits + (uint64_t)id * ix->words, ix->words * 8);
  free(ix->bits);
  ix->bits = bits;
  ix->words = words;
  free(ix->runs);
  ix->runs = NULL;
  ix->runs_cap = 0;
  Py_RETURN_NONE;
}

/* The arguments of store/remove (index, slot, hashes): the index, the hashes loaded into
 * ix->keys (n of them), the slot's mask word and bit; NULL with an exception set. */
static Index* slot_call(PyObject* const* args, Py_ssize_t nargs, const char* name, int64_t* n, int64_t* w,
                        uint64_t* bit) {
  int64_t slot;
  Index* ix = index_and_int(args, nargs, 3, name, &slot);
  if (!ix) return NULL;
  if (slot < 0 || slot >= ix->words * 64) {
    PyErr_Format(PyExc_ValueError, "slot %lld out of range", (long long)slot);
    return NULL;
  }
  if (load_keys(ix, args[2], n) < 0) return NULL;
  *w = slot >> 6;
  *bit = 1ull << (slot & 63);
  return ix;
}

/* A run of blocks with one mask shares one new mask: the memo (`old_of` -> `new_id`, each
 * pinned while the memo holds it) moves on to `old` -> `id`. */
static void memo_move(Index* ix, uint32_t* old_of, uint32_t* new_id, uint32_t old, uint32_t id) {
  mask_incref(ix, old);
  if (*old_of != UINT32_MAX) mask_decref(ix, *old_of);
  mask_decref(ix, *new_id);
  *old_of = old;
  *new_id = id;
}

static void memo_release(Index* ix, uint32_t old_of, uint32_t new_id) {
  if (old_of != UINT32_MAX) mask_decref(ix, old_of);
  mask_decref(ix, new_id);
}

#define STORE_AHEAD 16

/* The table lines a store or remove (rw 1) or a lookup (rw 0) of key will probe, asked of memory
 * ahead (both tables while growing): a table of hundreds of MB costs a cache miss per block,
 * overlapped this way (300 stores of 30,000 blocks into up to 9 M: 2.7 -> 1.8-2.0 s). */
#define PREFETCH_SLOT(ix, key, rw)                                                   \
  do {                                                                               \
    __builtin_prefetch(&(ix)->tab[home((ix), (key))], (rw));                         \
    if ((ix)->old) __builtin_prefetch(&(ix)->old[home_of((ix)->old_shift, (key))], (rw)); \
  } while (0)

/* ix->keys[0..n) held by the slot (w, bit) from now on; `added` (if not NULL, n bytes): 1 where
 * a key was not held before. -1 out of memory (MemoryError set), the keys before the failing
 * one stored. */
static int store_keys(Index* ix, int64_t n, int64_t w, uint64_t bit, uint8_t* added) {
  SlotSet* set = &ix->sets[w * 64 + __builtin_ctzll(bit)];
  uint32_t old_of = UINT32_MAX, new_id = 0;
  for (int64_t i = 0; i < n && i < STORE_AHEAD; i++) PREFETCH_SLOT(ix, ix->keys[i], 1);
  for (int64_t i = 0; i < n; i++) {
    if (i + STORE_AHEAD < n) PREFETCH_SLOT(ix, ix->keys[i + STORE_AHEAD], 1);
    Entry* e = find_or_insert(ix, ix->keys[i]);
    if (!e) goto nomem;
    uint32_t old = e->mask;
    if (added) added[i] = 0;
    if (old && (mask_at(ix, old)[w] & bit)) continue; /* held already */
    if (added) added[i] = 1;
    uint32_t id = 0;
    if ((old != old_of && !(id = mask_alloc(ix))) || set_add(set, ix->keys[i]) < 0) {
      if (id) mask_free(ix, id);
      if (!old) { /* the entry just inserted: take it out again */
        e->key = 0;
        ix->used--;
      }
      goto nomem;
    }
    if (old != old_of) { /* else: the previous block's mask, so the same new one */
      if (old) memcpy(mask_at(ix, id), mask_at(ix, old), ix->words * 8);
      else memset(mask_at(ix, id), 0, ix->words * 8);
      mask_at(ix, id)[w] |= bit;
      mask_incref(ix, id); /* pinned while it is the run's new mask */
      memo_move(ix, &old_of, &new_id, old, id);
    }
    mask_incref(ix, new_id);
    e->mask = new_id;
    mask_decref(ix, old);
  }
  memo_release(ix, old_of, new_id);
  return 0;
nomem:
  /* an entry inserted without a mask would read as empty: the table stays consistent */
  memo_release(ix, old_of, new_id);
  PyErr_NoMemory();
  return -1;
}

/* store(index, slot, hashes): the worker at `slot` holds these blocks. */
static PyObject* kvi_store(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  int64_t n, w;
  uint64_t bit;
  Index* ix = slot_call(args, nargs, "store", &n, &w, &bit);
  if (!ix || store_keys(ix, n, w, bit, NULL) < 0) return NULL;
  Py_RETURN_NONE;
}

/* store_new(index, slot, hashes) -> [hash]: store, and the hashes the worker at `slot` did not
 * hold before (in the order given; a repeated one once). */
static PyObject* kvi_store_new(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  int64_t n, w;
  uint64_t bit;
  Index* ix = slot_call(args, nargs, "store_new", &n, &w, &bit);
  if (!ix) return NULL;
  uint8_t* added = malloc(n ? (size_t)n : 1);
  if (!added) return PyErr_NoMemory();
  if (store_keys(ix, n, w, bit, added) < 0) {
    free(added);
    return NULL;
  }
  PyObject* out = PyList_New(0);
  for (int64_t i = 0; out && i < n; i++) {
    if (!added[i]) continue;
    PyObject* k = PyLong_FromUnsignedLongLong(ix->keys[i]);
    if (!k || PyList_Append(out, k) < 0) Py_CLEAR(out);
    Py_XDECREF(k);
  }
  free(added);
  return out;
}

/* remove(index, slot, hashes): the worker at `slot` no longer holds these blocks (those it
 * does not hold are skipped). */
/* ix->keys[0..n) no longer held by the slot (w, bit) (those it does not hold are skipped);
 * -1 out of memory (MemoryError set), the keys before the failing one removed. */
static int remove_keys(Index* ix, int64_t n, int64_t w, uint64_t bit) {
  SlotSet* set = &ix->sets[w * 64 + __builtin_ctzll(bit)];
  uint32_t old_of = UINT32_MAX, new_id = 0;
  for (int64_t i = 0; i < n && i < STORE_AHEAD; i++) PREFETCH_SLOT(ix, ix->keys[i], 1);
  for (int64_t i = 0; i < n; i++) {
    if (i + STORE_AHEAD < n) PREFETCH_SLOT(ix, ix->keys[i + STORE_AHEAD], 1);
    migrate(ix, MIGRATE_STEP);
    Entry* e = find(ix, ix->keys[i]);
    if (!e || !(mask_at(ix, e->mask)[w] & bit)) continue;
    uint32_t old = e->mask;
    if (old != old_of) {
      uint64_t* om = mask_at(ix, old);
      int any = 0;
      for (int64_t k = 0; k < ix->words; k++)
        if (k == w ? (om[k] & ~bit) : om[k]) { any = 1; break; }
      uint32_t id = 0;
      if (any) {
        id = mask_alloc(ix);
        if (!id) {
          memo_release(ix, old_of, new_id);
          PyErr_NoMemory();
          return -1;
        }
        memcpy(mask_at(ix, id), mask_at(ix, old), ix->words * 8);
        mask_at(ix, id)[w] &= ~bit;
        mask_incref(ix, id);
      }
      memo_move(ix, &old_of, &new_id, old, id);
    }
    if (new_id) {
      mask_incref(ix, new_id);
      e->mask = new_id;
    } else {
      table_delete(ix, e);
    }
    mask_decref(ix, old);
    set_del(set, ix->keys[i]);
  }
  memo_release(ix, old_of, new_id);
  return 0;
}

/* remove(index, slot, hashes): the worker at `slot` no longer holds these blocks (those it
 * does not hold are skipped). */
static PyObject* kvi_remove(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  int64_t n, w;
  uint64_t bit;
  Index* ix = slot_call(args, nargs, "remove", &n, &w, &bit);
  if (!ix || remove_keys(ix, n, w, bit) < 0) return NULL;
  Py_RETURN_NONE;
}

/* The slot argument of a per-slot call: its set, NULL with an exception set. */
static SlotSet* slot_set(Index* ix, int64_t slot) {
  if (slot < 0 || slot >= ix->words * 64) {
    PyErr_Format(PyExc_ValueError, "slot %lld out of range", (long long)slot);
    return NULL;
  }
  return &ix->sets[slot];
}

/* clear(index, slot): the worker at `slot` holds nothing (as remove of all it holds). */
static PyObject* kvi_clear(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  int64_t slot;
  Index* ix = index_and_int(args, nargs, 2, "clear", &slot);
  SlotSet* set = ix ? slot_set(ix, slot) : NULL;
  if (!set) return NULL;
  int64_t n = 0;
  if (keys_room(ix, (int64_t)set_size(set)) < 0) return NULL;
  for (uint64_t j = 0; j < set->cap; j++)
    if (set->keys[j]) ix->keys[n++] = set->keys[j];
  if (set->zero) ix->keys[n++] = 0;
  if (remove_keys(ix, n, slot >> 6, 1ull << (slot & 63)) < 0) return NULL;
  set_free(set);
  Py_RETURN_NONE;
}

/* count(index, slot) -> the blocks the worker at `slot` holds. */
static PyObject* kvi_count(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  int64_t slot;
  Index* ix = index_and_int(args, nargs, 2, "count", &slot);
  SlotSet* set = ix ? slot_set(ix, slot) : NULL;
  return set ? PyLong_FromUnsignedLongLong(set_size(set)) : NULL;
}

/* blocks(index, slot) -> [hash]: the blocks the worker at `slot` holds (in no order). */
static PyObject* kvi_blocks(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  int64_t slot;
  Index* ix = index_and_int(args, nargs, 2, "blocks", &slot);
  SlotSet* set = ix ? slot_set(ix, slot) : NULL;
  if (!set) return NULL;
  PyObject* out = PyList_New((Py_ssize_t)set_size(set));
  Py_ssize_t at = 0;
  for (uint64_t j = 0; out && j <= set->cap; j++) {
    uint64_t key;
    if (j < set->cap) {
      if (!(key = set->keys[j])) continue;
    } else if (set->zero) {
      key = 0;
    } else {
      break;
    }
    PyObject* k = PyLong_FromUnsignedLongLong(key);
    if (!k) {
      Py_CLEAR(out);
      break;
    }
    PyList_SET_ITEM(out, at++, k);
  }
  return out;
}

static int ensure_runs(Index* ix, int64_t want) {
  if (want <= ix->runs_cap) return 0;
  int64_t cap = want * 2 + 16;
  uint64_t* runs = realloc(ix->runs, (size_t)cap * ix->words * 8);
  if (!runs) return -1;
  ix->runs = runs;
  int64_t* len = realloc(ix->run_len, (size_t)cap * 8);
  if (!len) return -1;
  ix->run_len = len;
  double* table = realloc(ix->table, (size_t)(cap + 1) * 8);
  if (!table) return -1;
  ix->table = table;
  int64_t* held = realloc(ix->held, (size_t)(cap + 1) * 8);
  if (!held) return -1;
  ix->held = held;
  ix->runs_cap = cap;
  return 0;
}

#define PREFETCH_AHEAD 16
#define OBJECT_AHEAD 32

/* The nested runs of the request's hashes `items[0..n)`: run r's mask (ix->runs + r * words)
 * holds the first blocks for run_len[r] more positions; returns the number of runs, -1 out of
 * memory (MemoryError set). Python's KvIndexer.overlap_masks, step for step (a mask id equal to
 * the previous block's is the previous block's mask, so the same AND). The walk ends at the
 * first block nobody holds, or before a hash that is no 64-bit int (no index holds one).
 *
 * The hashes are converted as the walk reaches them, PREFETCH_AHEAD blocks ahead (their table
 * lines prefetched), their int objects OBJECT_AHEAD ahead: a prompt nobody holds converts
 * PREFETCH_AHEAD + 1 hashes, not all of them, and a list built long before the request (cold
 * objects) costs overlapped misses, not one after another. */
static int64_t lookup_runs(Index* ix, PyObject* const* items, int64_t n) {
  const int64_t W = ix->words;
  const uint64_t m = ix->cap - 1;
  if (keys_room(ix, n) < 0) return -1;
  if (ensure_runs(ix, n + 1) < 0) {
    PyErr_NoMemory();
    return -1;
  }
  uint64_t* keys = ix->keys;
  for (int64_t i = 0; i < n && i < OBJECT_AHEAD; i++) __builtin_prefetch(items[i]);
  int64_t conv = 0; /* keys[0..conv) converted */
  for (; conv < n && conv < PREFETCH_AHEAD; conv++) {
    if (key_of(items[conv], &keys[conv]) < 0) {
      n = conv;
      break;
    }
    PREFETCH_SLOT(ix, keys[conv], 0);
  }
  int64_t nruns = 0, count = 0;
  uint32_t last = UINT32_MAX;
  uint64_t *cur = ix->cur, *tmp = ix->tmp;
  int started = 0;
  for (int64_t i = 0; i < n; i++) {
    if (conv < n) { /* conv == i + PREFETCH_AHEAD: n stays past i */
      if (conv + OBJECT_AHEAD - PREFETCH_AHEAD < n) __builtin_prefetch(items[conv + OBJECT_AHEAD - PREFETCH_AHEAD]);
      if (key_of(items[conv], &keys[conv]) < 0) n = conv;
      else {
        PREFETCH_SLOT(ix, keys[conv], 0);
        conv++;
      }
    }
    uint64_t key = keys[i];
    uint32_t held = 0;
    for (uint64_t j = home(ix, key);; j = (j + 1) & m) {
      const Entry* e = &ix->tab[j];
      if (!e->mask) {
        const Entry* o = find_old(ix, key); /* growing: not moved yet */
        if (o) held = o->mask;
        break;
      }
      if (e->key == key) {
        held = e->mask;
        break;
      }
    }
    if (held == last) {
      count++;
      continue;
    }
    if (!held) break;
    last = held;
    const uint64_t* hm = mask_at(ix, held);
    if (!started) { /* every worker AND a non-zero mask: the mask */
      memcpy(cur, hm, W * 8);
      started = 1;
      count = 1;
      continue;
    }
    uint64_t changed = 0, nonzero = 0;
    for (int64_t k = 0; k < W; k++) {
      uint64_t v = hm[k] & cur[k];
      tmp[k] = v;
      changed |= v ^ cur[k];
      nonzero |= v;
    }
    if (changed) {
      memcpy(ix->runs + nruns * W, cur, W * 8);
      ix->run_len[nruns++] = count;
      if (!nonzero) return nruns;
      uint64_t* t = cur;
      cur = tmp;
      tmp = t;
      count = 0;
    }
    count++;
  }
  if (count) {
    memcpy(ix->runs + nruns * W, cur, W * 8);
    ix->run_len[nruns++] = count;
  }
  return nruns;
}

static PyObject* runs_to_list(Index* ix, int64_t nruns) {
  PyObject* out = PyList_New(nruns);
  if (!out) return NULL;
  for (int64_t r = 0; r < nruns; r++) {
    PyObject* mask = _PyLong_FromByteArray((const unsigned char*)(ix->runs + r * ix->words), ix->words * 8, 1, 0);
    PyObject* t = mask ? Py_BuildValue("(NL)", mask, (long long)ix->run_len[r]) : NULL;
    if (!t) {
      Py_DECREF(out);
      return NULL;
    }
    PyList_SET_ITEM(out, r, t);
  }
  return out;
}

/* runs(index, hashes) -> [(mask int, n), ...]: KvIndexer.overlap_masks. */
static PyObject* kvi_runs(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_nargs(nargs, 2, "runs") < 0) return NULL;
  Index* ix = get_index(args[0]);
  if (!ix) return NULL;
  PyObject* fast = PySequence_Fast(args[1], "block hashes must be a sequence of ints");
  if (!fast) return NULL;
  int64_t nruns = lookup_runs(ix, PySequence_Fast_ITEMS(fast), PySequence_Fast_GET_SIZE(fast));
  Py_DECREF(fast);
  return nruns < 0 ? NULL : runs_to_list(ix, nruns);
}

/* bad_hash(hashes) -> the first item that is not an int in [0, 2^64), or None: a KV event
 * batch is checked whole before any of it is applied (KvIndexer._check_range, in one loop). */
static PyObject* kvi_bad_hash(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_nargs(nargs, 1, "bad_hash") < 0) return NULL;
  PyObject* fast = PySequence_Fast(args[0], "block hashes must be a sequence of ints");
  if (!fast) return NULL;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  for (Py_ssize_t i = 0; i < len; i++) {
    uint64_t key;
    if (key_of(items[i], &key) < 0) {
      PyObject* bad = Py_NewRef(items[i]);
      Py_DECREF(fast);
      return bad;
    }
  }
  Py_DECREF(fast);
  Py_RETURN_NONE;
}

/* settle(pending, hashes): pending.pop(h, None) for each hash (a dict: KvIndexer._settle). */
static PyObject* kvi_settle(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_nargs(nargs, 2, "settle") < 0) return NULL;
  PyObject* pending = args[0];
  if (!PyDict_CheckExact(pending)) {
    PyErr_SetString(PyExc_TypeError, "settle: pending must be a dict");
    return NULL;
  }
  PyObject* fast = PySequence_Fast(args[1], "block hashes must be a sequence of ints");
  if (!fast) return NULL;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  for (Py_ssize_t i = 0; i < len && PyDict_GET_SIZE(pending); i++) {
    PyObject* h = items[i];
    PyObject* held = PyDict_GetItemWithError(pending, h); /* borrowed; NULL: absent or error */
    if ((held && PyDict_DelItem(pending, h) < 0) || (!held && PyErr_Occurred())) {
      Py_DECREF(fast);
      return NULL;
    }
  }
  Py_DECREF(fast);
  Py_RETURN_NONE;
}

/* mask(index, hash) -> int: the workers holding the block (0: none). */
static PyObject* kvi_mask(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_nargs(nargs, 2, "mask") < 0) return NULL;
  Index* ix = get_index(args[0]);
  if (!ix) return NULL;
  unsigned long long key = PyLong_AsUnsignedLongLong(args[1]);
  if (key == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    return PyLong_FromLong(0);
  }
  Entry* e = find(ix, key);
  if (!e) return PyLong_FromLong(0);
  return _PyLong_FromByteArray((const unsigned char*)mask_at(ix, e->mask), ix->words * 8, 1, 0);
}

/* items(index) -> {hash: mask int} (tests, integrity checks). */
static PyObject* kvi_items(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_nargs(nargs, 1, "items") < 0) return NULL;
  Index* ix = get_index(args[0]);
  if (!ix) return NULL;
  PyObject* out = PyDict_New();
  if (!out) return NULL;
  for (uint64_t i = 0; i < ix->cap + ix->old_cap; i++) {
    const Entry* e = slot_at(ix, i);
    if (!e) continue;
    PyObject* k = PyLong_FromUnsignedLongLong(e->key);
    PyObject* v = _PyLong_FromByteArray((const unsigned char*)mask_at(ix, e->mask), ix->words * 8, 1, 0);
    if (!k || !v || PyDict_SetItem(out, k, v) < 0) {
      Py_XDECREF(k);
      Py_XDECREF(v);
      Py_DECREF(out);
      return NULL;
    }
    Py_DECREF(k);
    Py_DECREF(v);
  }
  return out;
}

/* unique_counts(index, slots) -> [blocks only that slot holds, per slot]. */
static PyObject* kvi_unique_counts(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  int64_t slots;
  Index* ix = index_and_int(args, nargs, 2, "unique_counts", &slots);
  if (!ix) return NULL;
  int64_t* counts = calloc(slots > 0 ? slots : 1, 8);
  if (!counts) return PyErr_NoMemory();
  for (uint64_t i = 0; i < ix->cap + ix->old_cap; i++) {
    const Entry* e = slot_at(ix, i);
    if (!e) continue;
    const uint64_t* mk = mask_at(ix, e->mask);
    int64_t bits = 0, at = -1;
    for (int64_t k = 0; k < ix->words && bits < 2; k++)
      if (mk[k]) {
        bits += __builtin_popcountll(mk[k]);
        at = k * 64 + __builtin_ctzll(mk[k]);
      }
    if (bits == 1 && at < slots) counts[at]++;
  }
  PyObject* out = PyList_New(slots);
  for (int64_t s = 0; out && s < slots; s++) PyList_SET_ITEM(out, s, PyLong_FromLongLong(counts[s]));
  free(counts);
  return out;
}

/* check(index) -> None, or a string naming the broken invariant. */
static PyObject* kvi_check(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_nargs(nargs, 1, "check") < 0) return NULL;
  Index* ix = get_index(args[0]);
  if (!ix) return NULL;
  uint32_t* seen = calloc(ix->nmasks, 4);
  if (!seen) return PyErr_NoMemory();
  const char* err = NULL;
  uint64_t used = 0, held = 0;
  for (uint64_t i = 0; i < ix->cap + ix->old_cap && !err; i++) {
    const Entry* e = slot_at(ix, i);
    if (!e) continue;
    used++;
    if (e->mask >= ix->nmasks) err = "entry with a mask id out of range";
    else if (find(ix, e->key) != e) err = "entry not found from its key";
    else {
      seen[e->mask]++;
      uint64_t any = 0;
      for (int64_t k = 0; k < ix->words; k++) {
        uint64_t word = mask_at(ix, e->mask)[k];
        any |= word;
        held += __builtin_popcountll(word);
        for (; word && !err; word &= word - 1)
          if (!set_has(&ix->sets[k * 64 + __builtin_ctzll(word)], e->key)) err = "a slot's set misses a block it holds";
      }
      if (!any) err = "entry with an empty mask";
    }
  }
  if (!err && used != ix->used + ix->old_live) err = "entry count out of step";
  uint64_t in_sets = 0;
  for (int64_t sl = 0; sl < ix->words * 64; sl++) in_sets += set_size(&ix->sets[sl]);
  if (!err && in_sets != held) err = "the slots' sets hold blocks their masks do not";
  for (uint32_t id = 1; id < ix->nmasks && !err; id++)
    if (seen[id] != ix->refs[id]) err = "mask refcount out of step with the entries";
  free(seen);
  if (err) return PyUnicode_FromString(err);
  Py_RETURN_NONE;
}

/* migrate(index, slots) -> bool: up to `slots` of a growing map's old table moved (the router's
 * tick: a growth then ends in a few seconds whatever the rate of stores); True while growing. */
static PyObject* kvi_migrate(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  int64_t slots;
  Index* ix = index_and_int(args, nargs, 2, "migrate", &slots);
  if (!ix) return NULL;
  if (slots > 0) migrate(ix, (uint64_t)slots);
  return PyBool_FromLong(ix->old != NULL);
}

/* size(index) -> (entries, masks in use, bytes held). */
static PyObject* kvi_size(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_nargs(nargs, 1, "size") < 0) return NULL;
  Index* ix = get_index(args[0]);
  if (!ix) return NULL;
  uint64_t bytes = (ix->cap + ix->old_cap) * sizeof(Entry) + (uint64_t)ix->masks_cap * (ix->words * 8 + 8) +
                   ix->keys_cap * 8 + ix->runs_cap * (ix->words * 8 + 8);
  return Py_BuildValue("(KKK)", (unsigned long long)(ix->used + ix->old_live),
                       (unsigned long long)(ix->nmasks - 1 - ix->nfree), (unsigned long long)bytes);
}

/* A float64 (or, `boolean`, bool) vector of at least n values, contiguous: its data; NULL for
 * None where `optional`. -1 with a TypeError naming the argument otherwise. */
static int vec(PyObject* o, const char* name, int64_t n, int boolean, int optional, void** out) {
  if (o == Py_None && optional) {
    *out = NULL;
    return 0;
  }
  if (!PyArray_Check(o) || PyArray_NDIM((PyArrayObject*)o) != 1 ||
      PyArray_TYPE((PyArrayObject*)o) != (boolean ? NPY_BOOL : NPY_DOUBLE) ||
      !PyArray_IS_C_CONTIGUOUS((PyArrayObject*)o) || PyArray_DIM((PyArrayObject*)o, 0) < n) {
    PyErr_Format(PyExc_TypeError, "decide: %s must be a contiguous %s vector of at least %lld values", name,
                 boolean ? "bool" : "float64", (long long)n);
    return -1;
  }
  *out = PyArray_DATA((PyArrayObject*)o);
  return 0;
}

/* The request's runs scattered over the first n slots: overlap_w = the blocks of the runs
 * holding w, uncached_w = max(prompt - overlap_w * block_size, 1) as a double (the router's
 * _fill_uncached: its table of Python ints, converted exactly). The runs are nested, so every
 * holder is in the first run's mask: every slot gets the prompt, then only those holders their
 * depth (how many runs hold them) and its values. */
static void scatter_runs(Index* ix, int64_t nruns, int64_t n, int64_t prompt, int64_t bs, double* uncached,
                        int64_t* overlap) {
  /* per depth: tokens left to compute and blocks held, in buffers ensure_runs sized for one
   * more than the runs (heap, not stack: a prompt may have any number of blocks) */
  double* table = ix->table;
  int64_t* held = ix->held;
  held[0] = 0;
  for (int64_t r = 0; r <= nruns; r++) {
    if (r) held[r] = held[r - 1] + ix->run_len[r - 1];
    int64_t u = prompt - held[r] * bs;
    table[r] = (double)(u > 1 ? u : 1);
  }
  const double none = table[0];
  for (int64_t s = 0; s < n; s++) uncached[s] = none;
  memset(overlap, 0, (size_t)n * 8);
  if (!nruns) return;
  const int64_t W = ix->words;
  const uint64_t* first = ix->runs;
  for (int64_t k = 0; k < W && k * 64 < n; k++)
    for (uint64_t b = first[k]; b; b &= b - 1) {
      int64_t s = k * 64 + __builtin_ctzll(b);
      if (s >= n) break;
      int64_t d = 1;
      while (d < nruns && (ix->runs[d * W + k] >> (s & 63) & 1)) d++;
      uncached[s] = table[d];
      overlap[s] = held[d];
    }
}

/* The decode step per worker: a vector as it is (mul 1, no add), or (vector, mul, add or None),
 * read by route_kv as it needs each worker's step (DecodeTerms). */
static int decode_terms(PyObject* o, int64_t n, DecodeTerms* out) {
  void* data;
  if (!PyTuple_Check(o)) {
    if (vec(o, "decode_step", n, 0, 0, &data)) return -1;
    *out = (DecodeTerms){data, 1.0, 0.0, 0};
    return 0;
  }
  if (PyTuple_GET_SIZE(o) != 3) {
    PyErr_SetString(PyExc_TypeError, "decide: decode_step terms must be (vector, mul, add or None)");
    return -1;
  }
  if (vec(PyTuple_GET_ITEM(o, 0), "decode_step vector", n, 0, 0, &data)) return -1;
  double mul = PyFloat_AsDouble(PyTuple_GET_ITEM(o, 1));
  PyObject* add_o = PyTuple_GET_ITEM(o, 2);
  double add = add_o == Py_None ? 0.0 : PyFloat_AsDouble(add_o);
  if (PyErr_Occurred()) return -1;
  *out = (DecodeTerms){data, mul, add, add_o != Py_None};
  return 0;
}

#define DECIDE_ARGS 14

/* decide(index, hashes, consts, n, prompt_tokens, rotation, k, decode_tokens, drain_tokens,
 *        vectors, weight, eligible, outs, fleet) -> (slot, ranked)
 * The whole kv decision: the lookup of `hashes`, the uncached tokens and overlap of every
 * slot (scatter_runs), then route_kv over the first n slots.
 *   consts  = (chunk_tokens, miss_weight, decode_weight, kv_penalty, kv_watermark, block_size,
 *              tie_tolerance_s, backlog_charge, stall_weight, idle_replicas) of CostParams;
 *   vectors = (queued, per_token, overhead, waiting, decode_step, kv_usage, free, used, busy,
 *             decoding) (LoadTracker.cost_vectors; waiting, free, used and decoding may be None:
 *             free and used None, no wait for room; decoding None, no stall); decode_step a
 *             vector, or (vector, mul, add or None), each worker's step read as numpy computes
 *             it: vector * mul, then + add (route_kv's DecodeTerms);
 *   weight, eligible: None or vectors; outs = (cost, scratch, uncached, int64 overlap);
 *   fleet: the workers the backlog's mean is over (1..n; route_kv).
 * slot -1: numpy must choose. */
static PyObject* kvi_decide(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_nargs(nargs, DECIDE_ARGS, "decide") < 0) return NULL;
  Index* ix = get_index(args[0]);
  if (!ix) return NULL;
  PyObject *consts = args[2], *vectors = args[9], *outs = args[12];
  if (!PyTuple_Check(consts) || PyTuple_GET_SIZE(consts) != 10)
    return PyErr_Format(PyExc_TypeError, "decide: consts must be a tuple of 10 numbers");
  if (!PyTuple_Check(vectors) || PyTuple_GET_SIZE(vectors) != 10)
    return PyErr_Format(PyExc_TypeError, "decide: vectors must be a tuple of 10");
  if (!PyTuple_Check(outs) || PyTuple_GET_SIZE(outs) != 4)
    return PyErr_Format(PyExc_TypeError, "decide: outs must be a tuple of 4 vectors");
  double chunk = PyFloat_AsDouble(PyTuple_GET_ITEM(consts, 0));
  double miss_weight = PyFloat_AsDouble(PyTuple_GET_ITEM(consts, 1));
  double decode_weight = PyFloat_AsDouble(PyTuple_GET_ITEM(consts, 2));
  double kv_penalty = PyFloat_AsDouble(PyTuple_GET_ITEM(consts, 3));
  double watermark = PyFloat_AsDouble(PyTuple_GET_ITEM(consts, 4));
  int64_t bs = PyLong_AsLongLong(PyTuple_GET_ITEM(consts, 5));
  double tolerance = PyFloat_AsDouble(PyTuple_GET_ITEM(consts, 6));
  int backlog = PyObject_IsTrue(PyTuple_GET_ITEM(consts, 7));
  if (backlog < 0) return NULL;
  double stall_weight = PyFloat_AsDouble(PyTuple_GET_ITEM(consts, 8));
  int idle_replicas = PyObject_IsTrue(PyTuple_GET_ITEM(consts, 9));
  if (idle_replicas < 0) return NULL;
  int64_t n = PyLong_AsLongLong(args[3]);
  int64_t prompt = PyLong_AsLongLong(args[4]);
  int64_t rotation = PyLong_AsLongLong(args[5]);
  int64_t k = PyLong_AsLongLong(args[6]);
  int64_t decode_tokens = PyLong_AsLongLong(args[7]);
  int64_t drain_tokens = PyLong_AsLongLong(args[8]);
  int64_t fleet = PyLong_AsLongLong(args[13]);
  if (PyErr_Occurred()) return NULL;
  if (n < 0 || n > ix->words * 64)
    return PyErr_Format(PyExc_ValueError, "decide: %lld slots, the index has room for %lld", (long long)n,
                        (long long)(ix->words * 64));
  if (n > 0 && (fleet < 1 || fleet > n))
    return PyErr_Format(PyExc_ValueError, "decide: fleet must be in 1..%lld workers, got %lld", (long long)n,
                        (long long)fleet);
  if (k < 1 || k > 64) return PyErr_Format(PyExc_ValueError, "decide: k must be in 1..64, got %lld", (long long)k);
  void *queued, *per_token, *overhead, *waiting, *kv_usage, *free_b, *used_b, *weight, *eligible, *busy, *decoding,
      *cost, *scratch, *uncached, *overlap;
  DecodeTerms decode;
#define V(i) PyTuple_GET_ITEM(vectors, i)
#define O(i) PyTuple_GET_ITEM(outs, i)
  if (vec(V(0), "queued", n, 0, 0, &queued) || vec(V(1), "per_token", n, 0, 0, &per_token) ||
      vec(V(2), "overhead", n, 0, 0, &overhead) || vec(V(3), "waiting", n, 0, 1, &waiting) ||
      decode_terms(V(4), n, &decode) || vec(V(5), "kv_usage", n, 0, 0, &kv_usage) ||
      vec(V(6), "free", n, 0, 1, &free_b) || vec(V(7), "used", n, 0, 1, &used_b) ||
      vec(V(8), "busy", n, 0, 0, &busy) || vec(V(9), "decoding", n, 0, 1, &decoding) || vec(args[10], "weight", n, 0, 1, &weight) ||
      vec(args[11], "eligible", n, 1, 1, &eligible) || vec(O(0), "out cost", n, 0, 0, &cost) ||
      vec(O(1), "out scratch", n, 0, 0, &scratch) || vec(O(2), "out uncached", n, 0, 0, &uncached))
    return NULL;
  PyObject* ov = O(3);
#undef V
#undef O
  if (!PyArray_Check(ov) || PyArray_NDIM((PyArrayObject*)ov) != 1 || PyArray_TYPE((PyArrayObject*)ov) != NPY_INT64 ||
      !PyArray_IS_C_CONTIGUOUS((PyArrayObject*)ov) || PyArray_DIM((PyArrayObject*)ov, 0) < n)
    return PyErr_Format(PyExc_TypeError, "decide: out overlap must be a contiguous int64 vector of at least %lld values",
                        (long long)n);
  overlap = PyArray_DATA((PyArrayObject*)ov);
  PyObject* fast = PySequence_Fast(args[1], "block hashes must be a sequence of ints");
  if (!fast) return NULL;
  int64_t nruns = lookup_runs(ix, PySequence_Fast_ITEMS(fast), PySequence_Fast_GET_SIZE(fast));
  Py_DECREF(fast);
  if (nruns < 0) return NULL;
  scatter_runs(ix, nruns, n, prompt, bs, uncached, overlap);
  /* CostParams -> route_kv's scalars, as route_kernel.RouteKernel._pack derives them */
  double decode_scale = decode_weight != 0.0 && decode_tokens ? decode_weight * (double)decode_tokens : 0.0;
  double span = 1.0 - watermark;
  if (span < 1e-9) span = 1e-9;
  int room = free_b && used_b;
  int64_t ranked[64], m = 0;
  int64_t slot = route_kv(n, uncached, queued, per_token, overhead, chunk, miss_weight, backlog, fleet, waiting,
                          &decode, decode_scale, decoding, stall_weight, idle_replicas, NULL, NULL, kv_usage, kv_penalty, watermark, span, room ? free_b : NULL,
                          room ? used_b : NULL, (double)(drain_tokens > 1 ? drain_tokens : 1), (double)bs, weight,
                          eligible, busy, tolerance, rotation, k, cost, scratch, ranked, &m);
  PyObject* list = PyList_New(slot >= 0 ? m : 0);
  if (!list) return NULL;
  for (int64_t j = 0; slot >= 0 && j < m; j++) {
    PyObject* v = PyLong_FromLongLong(ranked[j]);
    if (!v) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SET_ITEM(list, j, v);
  }
  return Py_BuildValue("(LN)", (long long)slot, list);
}

/* The arguments account and report share: vectors = the float64 vectors of
 * load.ACCOUNT_VECTORS then the bool busy vector; slot; limits = (busy_kv_usage,
 * busy_kv_footprint, max_inflight, max context, context slope). 0, or -1 with an error set. */
static int account_args(PyObject* const* args, const char* name, double** v, uint8_t** busy, int64_t* slot,
                        AccountLimits* lim) {
  PyObject *vectors = args[0], *limits = args[3];
  if (!PyTuple_Check(vectors) || PyTuple_GET_SIZE(vectors) != A_NUM_DOUBLE + 1) {
    PyErr_Format(PyExc_TypeError, "%s: vectors must be a tuple of %d", name, A_NUM_DOUBLE + 1);
    return -1;
  }
  if (!PyTuple_Check(limits) || PyTuple_GET_SIZE(limits) != 5) {
    PyErr_Format(PyExc_TypeError, "%s: limits must be a tuple of 5 numbers", name);
    return -1;
  }
  int64_t s = PyLong_AsLongLong(args[1]);
  if (s == -1 && PyErr_Occurred()) return -1;
  if (s < 0) {
    PyErr_Format(PyExc_ValueError, "%s: slot %lld out of range", name, (long long)s);
    return -1;
  }
  for (int i = 0; i <= A_NUM_DOUBLE; i++) {
    PyArrayObject* a = (PyArrayObject*)PyTuple_GET_ITEM(vectors, i);
    if (!PyArray_Check(a) || PyArray_NDIM(a) != 1 || PyArray_TYPE(a) != (i < A_NUM_DOUBLE ? NPY_DOUBLE : NPY_BOOL) ||
        !PyArray_IS_C_CONTIGUOUS(a) || PyArray_DIM(a, 0) <= s) {
      PyErr_Format(PyExc_TypeError, "%s: vector %d must be a contiguous %s vector of more than %lld values", name,
                   i, i < A_NUM_DOUBLE ? "float64" : "bool", (long long)s);
      return -1;
    }
    if (i < A_NUM_DOUBLE)
      v[i] = PyArray_DATA(a);
    else
      *busy = PyArray_DATA(a);
  }
  *lim = (AccountLimits){
      PyFloat_AsDouble(PyTuple_GET_ITEM(limits, 0)), PyFloat_AsDouble(PyTuple_GET_ITEM(limits, 1)),
      PyFloat_AsDouble(PyTuple_GET_ITEM(limits, 2)), PyFloat_AsDouble(PyTuple_GET_ITEM(limits, 3)),
      PyFloat_AsDouble(PyTuple_GET_ITEM(limits, 4)),
  };
  *slot = s;
  return PyErr_Occurred() ? -1 : 0;
}

/* account(vectors, slot, deltas, limits) -> change in busy slots (-1, 0, 1)
 * LoadTracker's accounting of slot `slot` (csrc/account.c); deltas = 6 floats or None
 * (untouched), for the first six vectors; the rest as account_args. */
static PyObject* kvi_account(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_nargs(nargs, 4, "account") < 0) return NULL;
  PyObject* deltas = args[2];
  if (!PyTuple_Check(deltas) || PyTuple_GET_SIZE(deltas) != A_NUM_DELTAS)
    return PyErr_Format(PyExc_TypeError, "account: deltas must be a tuple of %d", A_NUM_DELTAS);
  double* v[A_NUM_DOUBLE];
  uint8_t* busy = NULL;
  int64_t s;
  AccountLimits lim;
  if (account_args(args, "account", v, &busy, &s, &lim) < 0) return NULL;
  double delta[A_NUM_DELTAS];
  int has[A_NUM_DELTAS];
  for (int i = 0; i < A_NUM_DELTAS; i++) {
    PyObject* d = PyTuple_GET_ITEM(deltas, i);
    has[i] = d != Py_None;
    delta[i] = has[i] ? PyFloat_AsDouble(d) : 0.0;
  }
  if (PyErr_Occurred()) return NULL;
  return PyLong_FromLong(account_slot(v, busy, s, delta, has, &lim));
}

/* report(vectors, slot, figures, limits) -> change in busy slots (-1, 0, 1)
 * A load report's figures for slot `slot` (csrc/account.c, report_slot): figures = (queued
 * prefill tokens, running + waiting, waiting, KV used fraction or None: unchanged); the rest as
 * account_args. */
static PyObject* kvi_report(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_nargs(nargs, 4, "report") < 0) return NULL;
  PyObject* figures = args[2];
  if (!PyTuple_Check(figures) || PyTuple_GET_SIZE(figures) != 4)
    return PyErr_Format(PyExc_TypeError, "report: figures must be a tuple of 4");
  double* v[A_NUM_DOUBLE];
  uint8_t* busy = NULL;
  int64_t s;
  AccountLimits lim;
  if (account_args(args, "report", v, &busy, &s, &lim) < 0) return NULL;
  PyObject* frac = PyTuple_GET_ITEM(figures, 3);
  const double rep[4] = {
      PyFloat_AsDouble(PyTuple_GET_ITEM(figures, 0)),
      PyFloat_AsDouble(PyTuple_GET_ITEM(figures, 1)),
      PyFloat_AsDouble(PyTuple_GET_ITEM(figures, 2)),
      frac == Py_None ? 0.0 : PyFloat_AsDouble(frac),
  };
  if (PyErr_Occurred()) return NULL;
  return PyLong_FromLong(report_slot(v, busy, s, rep, frac != Py_None, &lim));
}

static PyMethodDef methods[] = {
    {"new", (PyCFunction)(void (*)(void))kvi_new, METH_FASTCALL, "new(words) -> index"},
    {"grow", (PyCFunction)(void (*)(void))kvi_grow, METH_FASTCALL, "grow(index, words)"},
    {"store", (PyCFunction)(void (*)(void))kvi_store, METH_FASTCALL, "store(index, slot, hashes)"},
    {"store_new", (PyCFunction)(void (*)(void))kvi_store_new, METH_FASTCALL, "store_new(index, slot, hashes) -> [hash]"},
    {"remove", (PyCFunction)(void (*)(void))kvi_remove, METH_FASTCALL, "remove(index, slot, hashes)"},
    {"runs", (PyCFunction)(void (*)(void))kvi_runs, METH_FASTCALL, "runs(index, hashes) -> [(mask, n)]"},
    {"mask", (PyCFunction)(void (*)(void))kvi_mask, METH_FASTCALL, "mask(index, hash) -> int"},
    {"bad_hash", (PyCFunction)(void (*)(void))kvi_bad_hash, METH_FASTCALL, "bad_hash(hashes) -> first non-hash or None"},
    {"settle", (PyCFunction)(void (*)(void))kvi_settle, METH_FASTCALL, "settle(pending, hashes): pop each"},
    {"items", (PyCFunction)(void (*)(void))kvi_items, METH_FASTCALL, "items(index) -> {hash: mask}"},
    {"unique_counts", (PyCFunction)(void (*)(void))kvi_unique_counts, METH_FASTCALL, "unique_counts(index, slots)"},
    {"check", (PyCFunction)(void (*)(void))kvi_check, METH_FASTCALL, "check(index) -> None or error"},
    {"size", (PyCFunction)(void (*)(void))kvi_size, METH_FASTCALL, "size(index) -> (entries, masks, bytes)"},
    {"migrate", (PyCFunction)(void (*)(void))kvi_migrate, METH_FASTCALL, "migrate(index, slots) -> growing"},
    {"clear", (PyCFunction)(void (*)(void))kvi_clear, METH_FASTCALL, "clear(index, slot)"},
    {"count", (PyCFunction)(void (*)(void))kvi_count, METH_FASTCALL, "count(index, slot) -> blocks held"},
    {"blocks", (PyCFunction)(void (*)(void))kvi_blocks, METH_FASTCALL, "blocks(index, slot) -> [hash]"},
    {"account", (PyCFunction)(void (*)(void))kvi_account, METH_FASTCALL, "account(vectors, slot, deltas, limits) -> busy change"},
    {"report", (PyCFunction)(void (*)(void))kvi_report, METH_FASTCALL, "report(vectors, slot, figures, limits) -> busy change"},
    {"decide", (PyCFunction)(void (*)(void))kvi_decide, METH_FASTCALL, "decide(index, hashes, consts, ...) -> (slot, ranked)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "interlock_kvindex", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_interlock_kvindex(void) {
  import_array();
  return PyModule_Create(&module);
}
