/* The pooled-cache bound's walk (sim/bounds.py, pooled_cache_hit_ratio) in C: one LRU cache of
 * `capacity` block keys shared by every request, in arrival order. For each request: count its
 * leading keys already cached, then touch its first `capacity` keys tail first (each becomes the
 * most recent; a new one is inserted), then evict the least recent keys past `capacity` (after
 * the request's touches, as the Python: up to 2 x capacity keys are held in between).
 *
 * The cache is an open-addressing table (linear probing, backward-shift deletion) of key ->
 * node, and the nodes a doubly linked list, most recent at the head. Python's OrderedDict does
 * the same per key in about 0.5 us; this in about 30 ns.
 *
 * Returns 0, or -1 when memory runs out (nothing is written then).
 */
#include <stdint.h>
#include <stdlib.h>

typedef struct {
  uint64_t key;
  int64_t prev, next; /* node ids, -1: none */
} Node;

typedef struct {
  int64_t* slots; /* node id + 1; 0: empty */
  uint64_t mask;
  int shift;
  Node* nodes;
  int64_t head, tail, count;
  int64_t* free_ids;
  int64_t nfree;
} Lru;

static uint64_t slot_of(const Lru* c, uint64_t key) { return (key * 0x9E3779B97F4A7C15ULL) >> c->shift; }

static int64_t find(const Lru* c, uint64_t key, uint64_t* at) {
  uint64_t i = slot_of(c, key);
  for (;;) {
    int64_t v = c->slots[i];
    if (v == 0) {
      *at = i;
      return -1;
    }
    if (c->nodes[v - 1].key == key) {
      *at = i;
      return v - 1;
    }
    i = (i + 1) & c->mask;
  }
}

static void unlink_node(Lru* c, int64_t id) {
  Node* n = &c->nodes[id];
  if (n->prev >= 0) c->nodes[n->prev].next = n->next; else c->head = n->next;
  if (n->next >= 0) c->nodes[n->next].prev = n->prev; else c->tail = n->prev;
}

static void push_front(Lru* c, int64_t id) {
  Node* n = &c->nodes[id];
  n->prev = -1;
  n->next = c->head;
  if (c->head >= 0) c->nodes[c->head].prev = id;
  c->head = id;
  if (c->tail < 0) c->tail = id;
}

static void erase_slot(Lru* c, uint64_t i) {
  /* backward-shift deletion: pull later entries of the probe run into the hole */
  uint64_t j = i;
  for (;;) {
    c->slots[i] = 0;
    for (;;) {
      j = (j + 1) & c->mask;
      int64_t v = c->slots[j];
      if (v == 0) return;
      uint64_t home = slot_of(c, c->nodes[v - 1].key);
      /* move v into i unless its home lies cyclically in (i, j] */
      if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
        c->slots[i] = v;
        i = j;
        break;
      }
    }
  }
}

int64_t pooled_lru_leading(const uint64_t* keys, const int64_t* offsets, int64_t num_requests,
                           int64_t capacity, int64_t* leading) {
  if (capacity <= 0) {
    for (int64_t r = 0; r < num_requests; r++) leading[r] = 0;
    return 0;
  }
  Lru c;
  uint64_t size = 16;
  int bits = 4;
  int64_t total = offsets[num_requests] - offsets[0];
  int64_t room = capacity < total ? capacity : total; /* never more keys than there are */
  int64_t most = 2 * room + 1;
  while (size < (uint64_t)most * 2 + 16) {
    size <<= 1;
    bits++;
  }
  c.slots = calloc(size, sizeof(int64_t));
  c.nodes = malloc((size_t)most * sizeof(Node));
  c.free_ids = malloc((size_t)most * sizeof(int64_t));
  if (!c.slots || !c.nodes || !c.free_ids) {
    free(c.slots);
    free(c.nodes);
    free(c.free_ids);
    return -1;
  }
  c.mask = size - 1;
  c.shift = 64 - bits;
  c.head = c.tail = -1;
  c.count = 0;
  c.nfree = most;
  for (int64_t k = 0; k < most; k++) c.free_ids[k] = most - 1 - k;
  for (int64_t r = 0; r < num_requests; r++) {
    const uint64_t* ks = keys + offsets[r];
    int64_t n = offsets[r + 1] - offsets[r];
    uint64_t at;
    int64_t hit = 0;
    while (hit < n && find(&c, ks[hit], &at) >= 0) hit++;
    leading[r] = hit;
    int64_t touch = n < capacity ? n : capacity;
    for (int64_t k = touch - 1; k >= 0; k--) {
      int64_t id = find(&c, ks[k], &at);
      if (id >= 0) {
        unlink_node(&c, id);
      } else {
        id = c.free_ids[--c.nfree];
        c.nodes[id].key = ks[k];
        c.slots[at] = id + 1;
        c.count++;
      }
      push_front(&c, id);
    }
    while (c.count > capacity) { /* the least recent go */
      int64_t old = c.tail;
      uint64_t oat;
      find(&c, c.nodes[old].key, &oat);
      unlink_node(&c, old);
      erase_slot(&c, oat);
      c.free_ids[c.nfree++] = old;
      c.count--;
    }
  }
  free(c.slots);
  free(c.nodes);
  free(c.free_ids);
  return 0;
}
