/* The simulated worker's block map (sim/pool.py, SimPool's `ref` and `lru`) in C: a CPython
 * extension module, `interlock_simpool`, loaded by sim/native.py.
 *
 * A key is a block's hash (0 .. 2**64-1) or a key unique to one request's output block (negative,
 * above -2**63); the two ranges overlap as 64-bit patterns, so a key is kept as its magnitude and
 * a sign. Each key held is a node: its reference count (0: cached-free, then it is in the LRU
 * list, least recently freed at the head) and its links. An open-addressing table (linear
 * probing, backward-shift deletion) finds a key's node. At most `capacity` keys are held (a key
 * is a physical block), so nodes come from one array of that size.
 *
 * The operations are SimPool's, over Python sequences of int keys, one call per request or step
 * instead of one dict operation per block: prefix, revived, touch, evict, store_run, release.
 * The Python dicts stay the reference (tests/sim/test_pool.py runs both on the same operations).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
  uint64_t mag;
  int32_t neg; /* 1: the key is -mag */
  int32_t ref; /* references; 0: cached-free, in the LRU list */
  int64_t prev, next;
} Node;

typedef struct {
  PyObject_HEAD
  int64_t* slots; /* node id + 1; 0: empty */
  uint64_t mask;
  int shift;
  Node* nodes;
  int64_t capacity;
  int64_t* free_ids;
  int64_t nfree;
  int64_t head, tail; /* LRU list of cached-free nodes: head = least recently freed */
  int64_t num_ref, num_lru;
} Pool;

static int key_of(PyObject* o, uint64_t* mag, int32_t* neg) {
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow > 0) {
    unsigned long long u = PyLong_AsUnsignedLongLong(o);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *mag = u;
    *neg = 0;
    return 0;
  }
  if (overflow < 0 || (v == -1 && PyErr_Occurred())) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_OverflowError, "a block key below -2**63");
    return -1;
  }
  if (v < 0) {
    *mag = (uint64_t)(-(v + 1)) + 1;
    *neg = 1;
  } else {
    *mag = (uint64_t)v;
    *neg = 0;
  }
  return 0;
}

static PyObject* key_obj(const Node* n) {
  if (n->neg) return PyLong_FromLongLong(-(long long)(n->mag - 1) - 1);
  return PyLong_FromUnsignedLongLong(n->mag);
}

static uint64_t home_of(const Pool* p, uint64_t mag, int32_t neg) {
  return ((mag ^ ((uint64_t)neg << 63)) * 0x9E3779B97F4A7C15ULL) >> p->shift;
}

/* The node holding the key, or -1; *at: its slot, or the empty slot ending its probe run. */
static int64_t find(const Pool* p, uint64_t mag, int32_t neg, uint64_t* at) {
  uint64_t i = home_of(p, mag, neg);
  for (;;) {
    int64_t v = p->slots[i];
    if (v == 0) {
      *at = i;
      return -1;
    }
    const Node* n = &p->nodes[v - 1];
    if (n->mag == mag && n->neg == neg) {
      *at = i;
      return v - 1;
    }
    i = (i + 1) & p->mask;
  }
}

static void erase_slot(Pool* p, uint64_t i) {
  uint64_t j = i;
  for (;;) {
    p->slots[i] = 0;
    for (;;) {
      j = (j + 1) & p->mask;
      int64_t v = p->slots[j];
      if (v == 0) return;
      const Node* n = &p->nodes[v - 1];
      uint64_t home = home_of(p, n->mag, n->neg);
      if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
        p->slots[i] = v;
        i = j;
        break;
      }
    }
  }
}

static void lru_unlink(Pool* p, int64_t id) {
  Node* n = &p->nodes[id];
  if (n->prev >= 0) p->nodes[n->prev].next = n->next; else p->head = n->next;
  if (n->next >= 0) p->nodes[n->next].prev = n->prev; else p->tail = n->prev;
  p->num_lru--;
}

static void lru_push_tail(Pool* p, int64_t id) {
  Node* n = &p->nodes[id];
  n->next = -1;
  n->prev = p->tail;
  if (p->tail >= 0) p->nodes[p->tail].next = id; else p->head = id;
  p->tail = id;
  p->num_lru++;
}

static void Pool_dealloc(Pool* p) {
  free(p->slots);
  free(p->nodes);
  free(p->free_ids);
  Py_TYPE(p)->tp_free((PyObject*)p);
}

static int Pool_init(Pool* p, PyObject* args, PyObject* kw) {
  Py_ssize_t capacity;
  static char* names[] = {"capacity", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kw, "n", names, &capacity)) return -1;
  if (capacity < 0) {
    PyErr_SetString(PyExc_ValueError, "capacity must be >= 0");
    return -1;
  }
  uint64_t size = 16;
  int bits = 4;
  while (size < (uint64_t)capacity * 2 + 16) {
    size <<= 1;
    bits++;
  }
  p->slots = calloc(size, sizeof(int64_t));
  p->nodes = malloc((size_t)(capacity + 1) * sizeof(Node));
  p->free_ids = malloc((size_t)(capacity + 1) * sizeof(int64_t));
  if (!p->slots || !p->nodes || !p->free_ids) {
    PyErr_NoMemory();
    return -1;
  }
  p->mask = size - 1;
  p->shift = 64 - bits;
  p->capacity = capacity;
  p->nfree = capacity;
  for (int64_t k = 0; k < capacity; k++) p->free_ids[k] = capacity - 1 - k;
  p->head = p->tail = -1;
  p->num_ref = p->num_lru = 0;
  return 0;
}

/* A sequence of keys as a fast sequence (a list or tuple is used as it is). */
#define SEQ_BEGIN(obj, fast, n, items)                                         \
  PyObject* fast = PySequence_Fast(obj, "keys must be a sequence of ints");    \
  if (fast == NULL) return NULL;                                               \
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);                               \
  PyObject** items = PySequence_Fast_ITEMS(fast);

static PyObject* Pool_contains_key(Pool* p, PyObject* key) {
  uint64_t mag, at;
  int32_t neg;
  if (key_of(key, &mag, &neg)) return NULL;
  return PyBool_FromLong(find(p, mag, neg, &at) >= 0);
}

static PyObject* Pool_prefix(Pool* p, PyObject* keys) {
  SEQ_BEGIN(keys, fast, n, items)
  Py_ssize_t k = 0;
  for (; k < n; k++) {
    uint64_t mag, at;
    int32_t neg;
    if (key_of(items[k], &mag, &neg)) {
      Py_DECREF(fast);
      return NULL;
    }
    if (find(p, mag, neg, &at) < 0) break;
  }
  Py_DECREF(fast);
  return PyLong_FromSsize_t(k);
}

static PyObject* Pool_revived(Pool* p, PyObject* keys) {
  SEQ_BEGIN(keys, fast, n, items)
  Py_ssize_t count = 0;
  for (Py_ssize_t k = 0; k < n; k++) {
    uint64_t mag, at;
    int32_t neg;
    if (key_of(items[k], &mag, &neg)) {
      Py_DECREF(fast);
      return NULL;
    }
    int64_t id = find(p, mag, neg, &at);
    if (id >= 0 && p->nodes[id].ref == 0) count++;
  }
  Py_DECREF(fast);
  return PyLong_FromSsize_t(count);
}

/* A reference more on each key (all held); returns how many were cached-free. */
static PyObject* Pool_touch(Pool* p, PyObject* keys) {
  SEQ_BEGIN(keys, fast, n, items)
  Py_ssize_t revived = 0;
  for (Py_ssize_t k = 0; k < n; k++) {
    uint64_t mag, at;
    int32_t neg;
    if (key_of(items[k], &mag, &neg)) {
      Py_DECREF(fast);
      return NULL;
    }
    int64_t id = find(p, mag, neg, &at);
    if (id < 0) {
      Py_DECREF(fast);
      PyErr_SetString(PyExc_KeyError, "touch: a key not held");
      return NULL;
    }
    Node* node = &p->nodes[id];
    if (node->ref == 0) {
      lru_unlink(p, id);
      p->num_ref++;
      revived++;
    }
    node->ref++;
  }
  Py_DECREF(fast);
  return PyLong_FromSsize_t(revived);
}

/* The n least recently freed keys leave; returns the non-negative ones, in that order. */
static PyObject* Pool_evict(Pool* p, PyObject* arg) {
  Py_ssize_t n = PyLong_AsSsize_t(arg);
  if (n == -1 && PyErr_Occurred()) return NULL;
  if (n < 0 || n > p->num_lru) {
    PyErr_SetString(PyExc_ValueError, "evict: more keys than are cached-free");
    return NULL;
  }
  PyObject* out = PyList_New(0);
  if (out == NULL) return NULL;
  for (Py_ssize_t k = 0; k < n; k++) {
    int64_t id = p->head;
    Node* node = &p->nodes[id];
    uint64_t at;
    find(p, node->mag, node->neg, &at);
    lru_unlink(p, id);
    erase_slot(p, at);
    p->free_ids[p->nfree++] = id;
    if (!node->neg) {
      PyObject* key = key_obj(node);
      if (key == NULL || PyList_Append(out, key)) {
        Py_XDECREF(key);
        Py_DECREF(out);
        return NULL;
      }
      Py_DECREF(key);
    }
  }
  return out;
}

/* Each key not held is stored with one reference: returns (stored, stored and >= 0). */
static PyObject* Pool_store_run(Pool* p, PyObject* keys) {
  SEQ_BEGIN(keys, fast, n, items)
  PyObject* stored = PyList_New(0);
  PyObject* published = PyList_New(0);
  if (stored == NULL || published == NULL) goto fail;
  for (Py_ssize_t k = 0; k < n; k++) {
    uint64_t mag, at;
    int32_t neg;
    if (key_of(items[k], &mag, &neg)) goto fail;
    if (find(p, mag, neg, &at) >= 0) continue;
    if (p->nfree == 0) {
      PyErr_SetString(PyExc_RuntimeError, "store: more keys than blocks");
      goto fail;
    }
    int64_t id = p->free_ids[--p->nfree];
    Node* node = &p->nodes[id];
    node->mag = mag;
    node->neg = neg;
    node->ref = 1;
    node->prev = node->next = -1;
    p->slots[at] = id + 1;
    p->num_ref++;
    if (PyList_Append(stored, items[k])) goto fail;
    if (!neg && PyList_Append(published, items[k])) goto fail;
  }
  Py_DECREF(fast);
  PyObject* out = PyTuple_Pack(2, stored, published);
  Py_DECREF(stored);
  Py_DECREF(published);
  return out;
fail:
  Py_DECREF(fast);
  Py_XDECREF(stored);
  Py_XDECREF(published);
  return NULL;
}

/* A reference less on each key, last first; one left with none is cached-free (most recent).
 * Returns how many became cached-free. */
static PyObject* Pool_release(Pool* p, PyObject* keys) {
  SEQ_BEGIN(keys, fast, n, items)
  Py_ssize_t freed = 0;
  for (Py_ssize_t k = n - 1; k >= 0; k--) {
    uint64_t mag, at;
    int32_t neg;
    if (key_of(items[k], &mag, &neg)) {
      Py_DECREF(fast);
      return NULL;
    }
    int64_t id = find(p, mag, neg, &at);
    if (id < 0 || p->nodes[id].ref == 0) {
      Py_DECREF(fast);
      PyErr_SetString(PyExc_KeyError, "release: a key without a reference");
      return NULL;
    }
    if (--p->nodes[id].ref == 0) {
      p->num_ref--;
      lru_push_tail(p, id);
      freed++;
    }
  }
  Py_DECREF(fast);
  return PyLong_FromSsize_t(freed);
}

/* Every key held that is >= 0: referenced ones, then cached-free ones least recent first. */
static PyObject* Pool_keys(Pool* p, PyObject* Py_UNUSED(ignored)) {
  PyObject* out = PyList_New(0);
  if (out == NULL) return NULL;
  for (uint64_t i = 0; i <= p->mask; i++) {
    int64_t v = p->slots[i];
    if (v == 0) continue;
    const Node* node = &p->nodes[v - 1];
    if (node->neg || node->ref == 0) continue;
    PyObject* key = key_obj(node);
    if (key == NULL || PyList_Append(out, key)) {
      Py_XDECREF(key);
      Py_DECREF(out);
      return NULL;
    }
    Py_DECREF(key);
  }
  for (int64_t id = p->head; id >= 0; id = p->nodes[id].next) {
    const Node* node = &p->nodes[id];
    if (node->neg) continue;
    PyObject* key = key_obj(node);
    if (key == NULL || PyList_Append(out, key)) {
      Py_XDECREF(key);
      Py_DECREF(out);
      return NULL;
    }
    Py_DECREF(key);
  }
  return out;
}

/* (referenced keys, cached-free keys, references beyond one per referenced key). */
static PyObject* Pool_counts(Pool* p, PyObject* Py_UNUSED(ignored)) {
  int64_t extra = 0, refs = 0, lru = 0;
  for (uint64_t i = 0; i <= p->mask; i++) {
    int64_t v = p->slots[i];
    if (v == 0) continue;
    int32_t r = p->nodes[v - 1].ref;
    if (r > 0) {
      refs++;
      extra += r - 1;
    } else {
      lru++;
    }
  }
  int64_t walked = 0;
  for (int64_t id = p->head; id >= 0 && walked <= lru; id = p->nodes[id].next) walked++;
  if (refs != p->num_ref || lru != p->num_lru || walked != lru) {
    PyErr_SetString(PyExc_AssertionError, "simpool: counts and table disagree");
    return NULL;
  }
  return Py_BuildValue("LLL", (long long)refs, (long long)lru, (long long)extra);
}

static PyObject* Pool_get_num_lru(Pool* p, void* Py_UNUSED(c)) { return PyLong_FromLongLong(p->num_lru); }
static PyObject* Pool_get_num_ref(Pool* p, void* Py_UNUSED(c)) { return PyLong_FromLongLong(p->num_ref); }

static PyMethodDef Pool_methods[] = {
    {"contains", (PyCFunction)Pool_contains_key, METH_O, "key held (referenced or cached-free)"},
    {"prefix", (PyCFunction)Pool_prefix, METH_O, "leading keys held"},
    {"revived", (PyCFunction)Pool_revived, METH_O, "keys cached-free"},
    {"touch", (PyCFunction)Pool_touch, METH_O, "a reference more on each; returns those revived"},
    {"evict", (PyCFunction)Pool_evict, METH_O, "the n least recent cached-free keys leave"},
    {"store_run", (PyCFunction)Pool_store_run, METH_O, "store keys not held: (stored, >= 0)"},
    {"release", (PyCFunction)Pool_release, METH_O, "a reference less on each, last first"},
    {"keys", (PyCFunction)Pool_keys, METH_NOARGS, "keys held that are >= 0"},
    {"counts", (PyCFunction)Pool_counts, METH_NOARGS, "(referenced, cached-free, extra refs), checked"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Pool_getset[] = {
    {"num_lru", (getter)Pool_get_num_lru, NULL, "cached-free keys", NULL},
    {"num_ref", (getter)Pool_get_num_ref, NULL, "referenced keys", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "interlock_simpool.Pool",
    .tp_basicsize = sizeof(Pool),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pool_init,
    .tp_dealloc = (destructor)Pool_dealloc,
    .tp_methods = Pool_methods,
    .tp_getset = Pool_getset,
};

/* decode_ends(start, ctx0, n, k_from, k_to, kv_tokens, speedup, a, b, c): for k in
 * [k_from, k_to), start + SimWorker._decode_span(ctx0, n, k), the same doubles: Python's exact
 * integers are exact here while every one stays under 2**53 (then they convert to a double
 * exactly), and the doubles' operations come in Python's order (built with -ffp-contract=off).
 * Returns None where some integer would not stay under 2**53: the caller computes in Python. */
static PyObject* decode_ends(PyObject* Py_UNUSED(m), PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 10) {
    PyErr_SetString(PyExc_TypeError, "decode_ends takes 10 arguments");
    return NULL;
  }
  double start = PyFloat_AsDouble(args[0]);
  long long ctx0 = PyLong_AsLongLong(args[1]), n = PyLong_AsLongLong(args[2]);
  long long k_from = PyLong_AsLongLong(args[3]), k_to = PyLong_AsLongLong(args[4]);
  long long kt = PyLong_AsLongLong(args[5]);
  double speedup = PyFloat_AsDouble(args[6]), a = PyFloat_AsDouble(args[7]);
  double b = PyFloat_AsDouble(args[8]), c = PyFloat_AsDouble(args[9]);
  if (PyErr_Occurred()) return NULL;
  const __int128 limit = (__int128)1 << 53;
  if (ctx0 < 0 || n < 0 || k_from < 1 || k_to < k_from || kt <= 0 || (__int128)kt * kt >= limit)
    Py_RETURN_NONE;
  PyObject* out = PyList_New(k_to - k_from);
  if (out == NULL) return NULL;
  double kt_d = (double)kt, kt2_d = (double)(kt * kt);
  for (long long k = k_from; k < k_to; k++) {
    __int128 i1 = (__int128)k * ctx0, n1 = (__int128)n * k * (k - 1);
    __int128 i2 = (__int128)k * ctx0 * ctx0 + (__int128)ctx0 * n * k * (k - 1);
    __int128 t = (__int128)n * n * (k - 1) * k * (2 * k - 1);
    if (i1 >= limit || n1 >= limit || i2 >= limit || t >= limit) {
      Py_DECREF(out);
      Py_RETURN_NONE;
    }
    double s1 = (double)(long long)i1 + (double)(long long)n1 / 2.0;
    double s2 = (double)(long long)i2 + (double)(long long)t / 6.0;
    double ms = a * s2 / kt2_d + b * s1 / kt_d + c * (double)k;
    PyObject* x = PyFloat_FromDouble(start + ms / speedup / 1000.0);
    if (x == NULL) {
      Py_DECREF(out);
      return NULL;
    }
    PyList_SET_ITEM(out, k - k_from, x);
  }
  return out;
}

/* decode_steps(ctx, n, count, kv_tokens, speedup, a, b, c, ema, ema_weight): the times of
 * `count` decode steps from summed context `ctx` (each step adds `n`), as SimWorker._step_s,
 * and the decode-step EMA after them (as sim.worker._ema): (list of seconds, ema), the same
 * doubles as Python (int64 to double conversions round as Python's do). */
static PyObject* decode_steps(PyObject* Py_UNUSED(m), PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 10) {
    PyErr_SetString(PyExc_TypeError, "decode_steps takes 10 arguments");
    return NULL;
  }
  long long ctx = PyLong_AsLongLong(args[0]), n = PyLong_AsLongLong(args[1]);
  long long count = PyLong_AsLongLong(args[2]), kt = PyLong_AsLongLong(args[3]);
  double speedup = PyFloat_AsDouble(args[4]), a = PyFloat_AsDouble(args[5]);
  double b = PyFloat_AsDouble(args[6]), c = PyFloat_AsDouble(args[7]);
  double ema = PyFloat_AsDouble(args[8]), w = PyFloat_AsDouble(args[9]);
  if (PyErr_Occurred()) return NULL;
  if (ctx < 0 || n < 0 || count < 0 || kt <= 0 || kt > 3037000499LL ||
      (__int128)(ctx + (__int128)n * count) * (ctx + (__int128)n * count) >= ((__int128)1 << 62)) {
    PyErr_SetString(PyExc_ValueError, "decode_steps: context out of range");
    return NULL;
  }
  PyObject* out = PyList_New(count);
  if (out == NULL) return NULL;
  double kt_d = (double)kt, kt2_d = (double)(kt * kt);
  for (long long i = 0; i < count; i++, ctx += n) {
    double step = (a * (double)(ctx * ctx) / kt2_d + b * (double)ctx / kt_d + c) / speedup / 1000.0;
    ema = ema == 0.0 ? step : (1.0 - w) * ema + w * step;
    PyObject* x = PyFloat_FromDouble(step);
    if (x == NULL) {
      Py_DECREF(out);
      return NULL;
    }
    PyList_SET_ITEM(out, i, x);
  }
  PyObject* result = Py_BuildValue("(Nd)", out, ema);
  return result;
}

static PyMethodDef module_methods[] = {
    {"decode_ends", (PyCFunction)(void (*)(void))decode_ends, METH_FASTCALL, "a decode stretch's step ends"},
    {"decode_steps", (PyCFunction)(void (*)(void))decode_steps, METH_FASTCALL, "decode step times and the EMA"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "interlock_simpool", NULL, -1, module_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_interlock_simpool(void) {
  if (PyType_Ready(&PoolType) < 0) return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  Py_INCREF(&PoolType);
  if (PyModule_AddObject(m, "Pool", (PyObject*)&PoolType) < 0) {
    Py_DECREF(&PoolType);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
