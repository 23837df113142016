/* offloadd._store_front: the per-tensor records of the torch hooks' store and the front of its
 * pack, as a CPython extension module (stable ABI, CPython 3.10+), for
 * client/python/offloadd/torch/_store.py.
 *
 * A pack made in Python created and touched several Python objects per saved tensor (the
 * handle, a Meta with two tuples, weak references, de-duplication entries, queue entries), and
 * between model work each of them is a cache miss: that, more than the number of calls, is what
 * the store's bookkeeping cost. Here a handle is one C object whose fields are C integers and
 * object pointers, and the step's tables (prefetch order, the handles waiting for keep_last_n,
 * de-duplication by tensor address) are C arrays pointing at handles without owning them.
 * The store's policy (offload, fallback, reload, strictness, statistics) stays in Python and
 * reads and writes a handle's fields as attributes, as it did those of the Python class.
 *
 *   Saved(store, seq, t)  a handle of tensor ``t`` (a torch.Tensor): the fields below, filed in
 *          no table (tests). Its attributes: store; seq, offset, step (ints: its number in the
 *          store, its position in its step, its step's index); version (t._version at the
 *          pack); state (int, SavedState); tensor (t), src (weakref to t), ep, op, block_id,
 *          reload, result, counts, modified, sent_version, reloading, pin (objects, None when
 *          unset);
 *          unpacked, dead, served, prefetch_kept (bools); and t's layout as Meta had it: shape
 *          (torch.Size), stride (tuple of ints), dtype, device, numel, nbytes (ints, bytes),
 *          checksum (None, or what a simulated device set); meta (the handle itself).
 *          When it dies (no reference left; or cleared by the cycle collector), it leaves the
 *          tables and, unless ``dead`` is True, calls store._on_death(unpacked, offset, state,
 *          ep, op, reload, block_id, prefetch_kept) once; what that raises is dropped. The
 *          usual end is done here instead, when the store has a set ``_unused_offsets``: a
 *          handle unpacked, with no offload in flight (state OFFLOADING with an op) and no block
 *          to free (state OFFLOADED with a block id) only discards its offset from that set,
 *          which is all _on_death would do for it.
 *   Front(tensor_type, parameter_type, strided_layout)  one per store:
 *     pack(t, threshold_bytes, pin, store, counts) -> a str category ("params", "leaves", "other",
 *          "small", "views": left in place, by the rules of _store.py's module doc), or a
 *          Saved: this step's handle of t (de-duplicated), or a new handle filed in the order, the
 *          waiting queue and the de-duplication table, its pin and counts set before any
 *          other thread can take it from the queue. ValueError when t has more than 64
 *          dimensions longer than 1; whatever torch's getters raise. Counts (threshold_bytes
 *          here, keep_last_n and prefetch below) are ints, or floats taken as the comparisons
 *          with them would (a threshold rounded up, keep_last_n down; inf: no limit).
 *     pop_due(keep_last_n) -> list of the handles past the newest keep_last_n waiting ones that
 *          are still KEPT and not unpacked (to offload now), or None.
 *     entry(seq) -> the live handle numbered seq, or None.
 *     prefetch_candidates(seq, previous_seq, prefetch, unused_offsets) -> list of handles to
 *          prefetch around handle seq, as Store._prefetch_before describes (previous_seq: the
 *          handle unpacked before, or None; unused_offsets: a set of step positions to skip).
 *     end_step()  empties the de-duplication table; the next handle starts a new step.
 *     forget()  empties every table (a forked child: the parent's handles are not its own).
 *     live() -> handles alive in the order; handles() -> list of them; seen_entries() -> the
 *          de-duplication table's entries; step_index, next_seq (ints).
 *   bind_answers(...), take_answers(answers, ops, confirmed)  the request ring's usual answers
 *          applied to the ops and records in C, for offloadd.client.Client.pump
 *          (store_answers.c documents them).
 *   OffloadLane(...)  one endpoint's usual offload and reload of a handle in C
 *          (store_lane.c documents it).
 *   pump(client, batch, take)  Client.pump(0.0) at a hook call, its usual case in C, and
 *          pump_all(endpoints, batch, client_module), the hooks' pump of every endpoint
 *          (store_pump.c documents them).
 *   Hooks(store, store_globals)  a store's pack hook, its usual path in one C call
 *          (store_hooks.c documents it; its unpack's reload is store_unpack.c's).
 *   TensorCounts()  the per-tensor statistics that the answers and the unpack add to in C
 *          (store_counts.c documents it; offloadd.torch.OffloadStats subclasses it).
 * The module keeps no state between stores; every call of a Saved or a Front runs under the
 * GIL and releases it nowhere, so a table is never seen half changed (a lane calls the device's
 * Python methods, which may release it: it touches no table). */
#include "client/core/store_front.h"

#include <limits.h>
#include <string.h>
#include <structmember.h>

#define MAX_DIMS 64

typedef struct {
  uint64_t key; /* a tensor's address; 0: empty */
  Saved* saved; /* borrowed: the handle removes its entries when it dies */
  int is_base;  /* the entry is the saved tensor's base (identity: saved->base_src) */
} SeenEntry;

typedef struct {
  PyObject_HEAD
  PyObject *tensor_type, *param_type, *strided;
  Saved** order; /* borrowed; order[head + i] is handle base_seq + i (NULL once dead) */
  Py_ssize_t head, len, cap;
  long long base_seq, next_seq, step_first_seq, step_index;
  long long* pending; /* seqs of handles waiting for keep_last_n, oldest first (a ring) */
  Py_ssize_t pending_head, pending_len, pending_cap;
  SeenEntry* seen;
  Py_ssize_t seen_count, seen_cap; /* seen_cap a power of two */
} Front;

PyTypeObject* SavedType;
static PyTypeObject* FrontType;
static PyObject *s_params, *s_leaves, *s_other, *s_small, *s_views; /* categories */
static PyObject *a_base, *a_is_param, *a_requires_grad, *a_is_leaf, *a_layout, *a_is_quantized,
    *a_is_nested, *a_is_cuda, *a_is_cpu, *a_nbytes, *a_version, *a_shape, *a_stride, *a_dtype,
    *a_device, *a_on_death, *a_unused_offsets;

/* ---- the de-duplication table: open addressing, linear probing ---------------------------- */
static Py_ssize_t seen_slot(const Front* f, uint64_t key) {
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  return (Py_ssize_t)((h >> 17) & (uint64_t)(f->seen_cap - 1));
}

static SeenEntry* seen_find(Front* f, uint64_t key) {
  if (f->seen_cap == 0) return NULL;
  for (Py_ssize_t i = seen_slot(f, key);; i = (i + 1) & (f->seen_cap - 1)) {
    if (f->seen[i].key == key) return &f->seen[i];
    if (f->seen[i].key == 0) return NULL;
  }
}

static int seen_grow(Front* f) {
  Py_ssize_t old_cap = f->seen_cap, cap = old_cap ? old_cap * 2 : 64;
  SeenEntry *old = f->seen, *fresh = PyMem_Calloc((size_t)cap, sizeof(SeenEntry));
  if (fresh == NULL) {
    PyErr_NoMemory();
    return 0;
  }
  f->seen = fresh;
  f->seen_cap = cap;
  for (Py_ssize_t i = 0; i < old_cap; i++) {
    if (old[i].key == 0) continue;
    Py_ssize_t j = seen_slot(f, old[i].key);
    while (fresh[j].key != 0) j = (j + 1) & (cap - 1);
    fresh[j] = old[i];
  }
  PyMem_Free(old);
  return 1;
}

/* Files (key -> saved) over any entry of that key; 0 with MemoryError. */
static int seen_put(Front* f, uint64_t key, Saved* saved, int is_base) {
  if ((f->seen_count + 1) * 2 > f->seen_cap && !seen_grow(f)) return 0;
  SeenEntry* e = seen_find(f, key);
  if (e == NULL) {
    Py_ssize_t i = seen_slot(f, key);
    while (f->seen[i].key != 0) i = (i + 1) & (f->seen_cap - 1);
    e = &f->seen[i];
    e->key = key;
    f->seen_count++;
  }
  e->saved = saved;
  e->is_base = is_base;
  return 1;
}

/* Removes key's entry when it is saved's (backward-shift deletion keeps probes unbroken). */
static void seen_remove(Front* f, uint64_t key, const Saved* saved) {
  SeenEntry* e = seen_find(f, key);
  if (e == NULL || e->saved != saved) return;
  Py_ssize_t mask = f->seen_cap - 1, i = e - f->seen, j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (f->seen[j].key == 0) break;
    Py_ssize_t home = seen_slot(f, f->seen[j].key);
    /* entry j may move to the hole at i when its home is not within (i, j] cyclically */
    if ((i <= j) ? (home <= i || home > j) : (home <= i && home > j)) {
      f->seen[i] = f->seen[j];
      i = j;
    }
  }
  f->seen[i].key = 0;
  f->seen[i].saved = NULL;
  f->seen_count--;
}

static void seen_clear(Front* f) {
  if (f->seen_cap) memset(f->seen, 0, (size_t)f->seen_cap * sizeof(SeenEntry));
  f->seen_count = 0;
}

/* ---- the order and the waiting queue -------------------------------------------------------- */
static Saved* order_entry(const Front* f, long long seq) {
  long long i = seq - f->base_seq;
  return (i >= 0 && i < f->len) ? f->order[f->head + i] : NULL;
}

static int order_append(Front* f, Saved* s) {
  while (f->len > 0 && f->order[f->head] == NULL) { /* dead handles at the front */
    f->head++;
    f->len--;
    f->base_seq++;
  }
  if (f->len == 0) {
    f->head = 0;
    f->base_seq = s->seq;
  }
  if (f->head + f->len == f->cap) {
    if (f->head > f->cap / 2) {
      memmove(f->order, f->order + f->head, (size_t)f->len * sizeof(Saved*));
      f->head = 0;
    } else {
      Py_ssize_t cap = f->cap ? f->cap * 2 : 64;
      Saved** grown = PyMem_Realloc(f->order, (size_t)cap * sizeof(Saved*));
      if (grown == NULL) {
        PyErr_NoMemory();
        return 0;
      }
      f->order = grown;
      f->cap = cap;
    }
  }
  f->order[f->head + f->len++] = s;
  return 1;
}

static int pending_push(Front* f, long long seq) {
  if (f->pending_len == f->pending_cap) {
    Py_ssize_t cap = f->pending_cap ? f->pending_cap * 2 : 16;
    long long* grown = PyMem_Malloc((size_t)cap * sizeof(long long));
    if (grown == NULL) {
      PyErr_NoMemory();
      return 0;
    }
    for (Py_ssize_t i = 0; i < f->pending_len; i++)
      grown[i] = f->pending[(f->pending_head + i) % f->pending_cap];
    PyMem_Free(f->pending);
    f->pending = grown;
    f->pending_cap = cap;
    f->pending_head = 0;
  }
  f->pending[(f->pending_head + f->pending_len++) % f->pending_cap] = seq;
  return 1;
}

/* ---- Saved ----------------------------------------------------------------------------------- */
#define SAVED_OBJECTS(X)                                                                        \
  X(store) X(front) X(tensor) X(src) X(base_src) X(ep) X(op) X(block_id) X(reload) X(result)    \
  X(counts) X(modified) X(sent_version) X(reloading) X(pin) X(shape) X(stride) X(dtype)         \
  X(device) X(checksum)

static void saved_leave_tables(Saved* s) {
  Front* f = (Front*)s->front;
  if (f == NULL) return;
  long long i = s->seq - f->base_seq;
  if (i >= 0 && i < f->len && f->order[f->head + i] == s) f->order[f->head + i] = NULL;
  if (s->seen_key) seen_remove(f, s->seen_key, s);
  if (s->base_key) seen_remove(f, s->base_key, s);
  s->seen_key = s->base_key = 0;
}

static PyObject* or_none(PyObject* o) { return o ? o : Py_None; }

/* The usual end of an unpacked handle that holds nothing to free, without a call of the
 * store's _on_death: its offset out of store._unused_offsets. 1 when done here, 0 when
 * _on_death must be called (an error is cleared). */
static int saved_usual_end(Saved* s, PyObject* offset) {
  if (!s->unpacked || (s->state == OFFLOADING && s->op != NULL && s->op != Py_None) ||
      (s->state == OFFLOADED && s->block_id != NULL && s->block_id != Py_None))
    return 0;
  PyObject* unused = PyObject_GetAttr(s->store, a_unused_offsets);
  int done = unused != NULL && PySet_Check(unused) && PySet_Discard(unused, offset) >= 0;
  Py_XDECREF(unused);
  PyErr_Clear();
  return done;
}

/* The handle's end, once: out of the tables, then store._on_death(...) unless marked dead. */
static void saved_finalize(Saved* s) {
  if (s->finalized) return;
  s->finalized = 1;
  saved_leave_tables(s);
  if (s->dead || s->store == NULL) return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject* at = PyLong_FromLongLong(s->offset);
  int usual = at != NULL && saved_usual_end(s, at);
  Py_XDECREF(at);
  PyErr_Clear(); /* a failed allocation: _on_death decides, with no error set */
  if (usual) {
    PyErr_Restore(type, value, tb);
    return;
  }
  PyObject *unpacked = PyBool_FromLong(s->unpacked), *offset = PyLong_FromLongLong(s->offset),
           *state = PyLong_FromLong(s->state), *kept = PyBool_FromLong(s->prefetch_kept);
  PyObject* r = NULL;
  if (offset && state)
    r = PyObject_CallMethodObjArgs(s->store, a_on_death, unpacked, offset, state,
                                   or_none(s->ep), or_none(s->op), or_none(s->reload),
                                   or_none(s->block_id), kept, NULL);
  Py_XDECREF(r);
  Py_XDECREF(unpacked);
  Py_XDECREF(offset);
  Py_XDECREF(state);
  Py_XDECREF(kept);
  PyErr_Clear(); /* as a __del__: the daemon frees a session's blocks at its end anyway */
  PyErr_Restore(type, value, tb);
}

static int saved_traverse(Saved* s, visitproc visit, void* arg) {
#define VISIT(name) Py_VISIT(s->name);
  SAVED_OBJECTS(VISIT)
#undef VISIT
  Py_VISIT(Py_TYPE(s));
  return 0;
}

static int saved_clear(Saved* s) {
  saved_finalize(s);
#define CLEAR(name) Py_CLEAR(s->name);
  SAVED_OBJECTS(CLEAR)
#undef CLEAR
  return 0;
}

static void saved_dealloc(Saved* s) {
  PyTypeObject* type = Py_TYPE(s);
  PyObject_GC_UnTrack(s);
  /* Out of the tables before any Python code runs (a weak reference's callback may pack the
   * same tensor, or look the handle up, on this thread or another): no call finds it again. */
  saved_leave_tables(s);
  if (s->weakreflist != NULL) PyObject_ClearWeakRefs((PyObject*)s);
  saved_clear(s);
  freefunc free_fn = (freefunc)PyType_GetSlot(type, Py_tp_free);
  free_fn(s);
  Py_DECREF(type);
}

/* Reads what a handle keeps of tensor t (its layout and version) into s; shape and stride:
 * t.shape and t.stride() when read already (references taken over), else NULL. */
static int saved_describe(Saved* s, PyObject* t, PyObject* nbytes, PyObject* shape,
                          PyObject* stride) {
  /* one getter at a time: none runs with an error pending */
  if ((s->shape = shape ? shape : PyObject_GetAttr(t, a_shape)) == NULL) return 0;
  if ((s->stride = stride ? stride : PyObject_CallMethodObjArgs(t, a_stride, NULL)) == NULL)
    return 0;
  if ((s->dtype = PyObject_GetAttr(t, a_dtype)) == NULL) return 0;
  if ((s->device = PyObject_GetAttr(t, a_device)) == NULL) return 0;
  PyObject* version = PyObject_GetAttr(t, a_version);
  if (version == NULL) return 0;
  s->version = PyLong_AsLongLong(version);
  Py_DECREF(version);
  if (s->version == -1 && PyErr_Occurred()) return 0;
  s->nbytes = PyLong_AsLongLong(nbytes);
  if (s->nbytes == -1 && PyErr_Occurred()) return 0;
  Py_ssize_t n = PyTuple_Size(s->shape);
  if (n < 0) return 0;
  long long numel = 1;
  for (Py_ssize_t i = 0; i < n; i++) {
    long long size = PyLong_AsLongLong(PyTuple_GetItem(s->shape, i));
    if (size == -1 && PyErr_Occurred()) return 0;
    numel *= size;
  }
  s->numel = numel;
  s->src = PyWeakref_NewRef(t, NULL);
  if (s->src == NULL) return 0;
  Py_INCREF(Py_False);
  s->pin = Py_False;
  return 1;
}

static Saved* saved_alloc(PyObject* store) {
  allocfunc alloc = (allocfunc)PyType_GetSlot(SavedType, Py_tp_alloc);
  Saved* s = (Saved*)alloc(SavedType, 0);
  if (s == NULL) return NULL;
  Py_XINCREF(store);
  s->store = store;
  return s;
}

static PyObject* saved_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *store, *t;
  long long seq;
  if (!PyArg_ParseTuple(args, "OLO:Saved", &store, &seq, &t)) return NULL;
  PyObject* nbytes = PyObject_GetAttr(t, a_nbytes);
  if (nbytes == NULL) return NULL;
  Saved* s = saved_alloc(store);
  if (s != NULL) {
    s->seq = seq;
    Py_INCREF(t);
    s->tensor = t;
    if (!saved_describe(s, t, nbytes, NULL, NULL)) {
      s->dead = 1; /* never handed out: its end tells the store nothing */
      Py_CLEAR(s);
    }
  }
  Py_DECREF(nbytes);
  return (PyObject*)s;
}

static PyObject* saved_meta(PyObject* self, void* closure) {
  Py_INCREF(self);
  return self;
}

#define OBJ(name) {#name, T_OBJECT, offsetof(Saved, name), 0, NULL},
#define RO(name, kind) {#name, kind, offsetof(Saved, name), READONLY, NULL},
#define RW(name, kind) {#name, kind, offsetof(Saved, name), 0, NULL},
static PyMemberDef saved_members[] = {
    RO(store, T_OBJECT) OBJ(tensor) OBJ(src) OBJ(ep) OBJ(op) OBJ(block_id) OBJ(reload)
    OBJ(result) OBJ(counts) OBJ(modified) OBJ(sent_version) OBJ(reloading) OBJ(pin)
    OBJ(checksum) RO(shape, T_OBJECT) RO(stride, T_OBJECT) RO(dtype, T_OBJECT)
    RO(device, T_OBJECT) RO(numel, T_LONGLONG) RO(nbytes, T_LONGLONG) RO(seq, T_LONGLONG)
    RW(offset, T_LONGLONG) RW(step, T_LONGLONG) RW(version, T_LONGLONG) RW(state, T_INT)
    RW(unpacked, T_BOOL) RW(dead, T_BOOL) RW(served, T_BOOL) RW(prefetch_kept, T_BOOL)
    {"__weaklistoffset__", T_PYSSIZET, offsetof(Saved, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef saved_getset[] = {
    {"meta", saved_meta, NULL, "the handle itself: its shape, stride, dtype, device, numel, "
                               "nbytes and checksum are the saved tensor's layout", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot saved_slots[] = {
    {Py_tp_new, saved_new},
    {Py_tp_dealloc, saved_dealloc},
    {Py_tp_traverse, saved_traverse},
    {Py_tp_clear, saved_clear},
    {Py_tp_members, saved_members},
    {Py_tp_getset, saved_getset},
    {Py_tp_doc, "What the store's pack returns for a tensor it may offload (opaque to autograd)."},
    {0, NULL},
};

static PyType_Spec saved_spec = {"offloadd._store_front.Saved", sizeof(Saved), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, saved_slots};

/* ---- classification ------------------------------------------------------------------------ */
/* 1 when attribute `name` of o is true, 0 when false, -1 with an error set. */
static int attr_true(PyObject* o, PyObject* name) {
  PyObject* v = PyObject_GetAttr(o, name);
  if (v == NULL) return -1;
  int r = PyObject_IsTrue(v);
  Py_DECREF(v);
  return r;
}

/* getattr(o, "_is_param", False) as a truth value; -1 with an error set. */
static int is_param_marked(PyObject* o) {
  PyObject* v = PyObject_GetAttr(o, a_is_param);
  if (v == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    return 0;
  }
  int r = PyObject_IsTrue(v);
  Py_DECREF(v);
  return r;
}

/* The weak reference's referent is exactly t. */
static int refers_to(PyObject* ref, PyObject* t) {
  return ref != NULL && ref != Py_None && PyWeakref_GetObject(ref) == t;
}

/* Whether t's elements fill exactly numel consecutive elements (what a transport copies as one
 * span; test_store_front checks it against a Python rule): the strides of the dimensions longer
 * than 1, in increasing order, each the product of the sizes before it. 1 yes, 0 no, -1 with an
 * error set. */
static int dense_span(PyObject* shape, PyObject* stride) {
  long long st[MAX_DIMS], sz[MAX_DIMS];
  Py_ssize_t n = PyTuple_Size(shape), k = 0;
  if (n < 0) return -1;
  for (Py_ssize_t i = 0; i < n; i++) {
    long long size = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
    if (size == -1 && PyErr_Occurred()) return -1;
    if (size == 1) continue;
    long long step = PyLong_AsLongLong(PyTuple_GetItem(stride, i));
    if (step == -1 && PyErr_Occurred()) return -1;
    if (k == MAX_DIMS) {
      PyErr_Format(PyExc_ValueError, "offloadd: a saved tensor with more than %d dimensions "
                   "longer than 1", MAX_DIMS);
      return -1;
    }
    Py_ssize_t j = k++; /* insertion by (stride, size), as sorted() orders the pairs */
    while (j > 0 && (st[j - 1] > step || (st[j - 1] == step && sz[j - 1] > size))) {
      st[j] = st[j - 1];
      sz[j] = sz[j - 1];
      j--;
    }
    st[j] = step;
    sz[j] = size;
  }
  long long expected = 1;
  for (Py_ssize_t i = 0; i < k; i++) {
    if (st[i] != expected) return 0;
    expected *= sz[i];
  }
  return 1;
}

/* The first rules of what stays in place, those any tensor is left in place for: a category
 * (borrowed), NULL for none, or NULL with an error set. *base is t._base (a new reference, or
 * NULL for None). */
static PyObject* category_of(Front* f, PyObject* t, PyObject** base) {
  PyTypeObject* kind = Py_TYPE(t);
  *base = NULL;
  if ((PyObject*)kind != f->tensor_type && (PyObject*)kind != f->param_type) return s_other;
  PyObject* b = PyObject_GetAttr(t, a_base);
  if (b == NULL) return NULL;
  if (b == Py_None)
    Py_DECREF(b);
  else
    *base = b;
  int marked = (PyObject*)kind == f->param_type ? 1 : is_param_marked(t);
  if (marked == 0 && *base != NULL) {
    int sub = PyObject_IsSubclass((PyObject*)Py_TYPE(*base), f->param_type);
    marked = sub != 0 ? sub : is_param_marked(*base);
  }
  if (marked) return marked < 0 ? NULL : s_params;
  int grad = attr_true(t, a_requires_grad);
  if (grad < 0) return NULL;
  if (grad) {
    int leaf = attr_true(t, a_is_leaf);
    if (leaf) return leaf < 0 ? NULL : s_leaves;
  }
  PyObject* layout = PyObject_GetAttr(t, a_layout);
  if (layout == NULL) return NULL;
  int strided = layout == f->strided;
  Py_DECREF(layout);
  if (!strided) return s_other;
  int q = attr_true(t, a_is_quantized);
  int nested = q == 0 ? attr_true(t, a_is_nested) : q;
  if (nested) return nested < 0 ? NULL : s_other;
  int on = attr_true(t, a_is_cuda);
  if (on == 0) on = attr_true(t, a_is_cpu);
  if (on <= 0) return on < 0 ? NULL : s_other;
  return NULL;
}

/* Records on s that t (its saved tensor) was seen at another version than the pack's. */
static int note_version(Saved* s, PyObject* t) {
  if (s->modified != NULL && s->modified != Py_None) return 1;
  PyObject* v = PyObject_GetAttr(t, a_version);
  if (v == NULL) return 0;
  long long version = PyLong_AsLongLong(v);
  if (version != s->version) {
    Py_XDECREF(s->modified);
    s->modified = v; /* s.version + version - s.version */
  } else {
    Py_DECREF(v);
  }
  return !PyErr_Occurred();
}

/* De-duplication within the step: NULL (none), s_views (borrowed), or this step's
 * handle of t (a new reference); NULL with an error set on failure. */
static PyObject* seen_match(Front* f, PyObject* t, PyObject* base) {
  SeenEntry* e = seen_find(f, (uint64_t)(uintptr_t)t);
  if (e != NULL && refers_to(e->is_base ? e->saved->base_src : e->saved->src, t)) {
    Saved* s = e->saved;
    if (s->step == f->step_index && s->state != LOST) {
      if (!refers_to(s->src, t)) return s_views;
      Py_INCREF(s); /* held across the getter below, whatever other threads drop meanwhile */
      PyObject* v = PyObject_GetAttr(t, a_version);
      long long version = v ? PyLong_AsLongLong(v) : -1;
      Py_XDECREF(v);
      if (v != NULL && version == s->version) return (PyObject*)s;
      int noted = v != NULL && note_version(s, t); /* saved again after an in-place change */
      Py_DECREF(s);
      if (!noted) return NULL;
    }
  }
  if (base != NULL) {
    e = seen_find(f, (uint64_t)(uintptr_t)base);
    if (e != NULL && refers_to(e->is_base ? e->saved->base_src : e->saved->src, base))
      return s_views;
  }
  return NULL;
}

/* A new handle of t, numbered and filed in the order, the waiting queue and the table. */
static PyObject* file_new(Front* f, PyObject* t, PyObject* base, PyObject* nbytes,
                          PyObject* shape, PyObject* stride, PyObject* pin, PyObject* store,
                          PyObject* counts) {
  Saved* s = saved_alloc(store);
  if (s == NULL) {
    Py_DECREF(shape);
    Py_DECREF(stride);
    return NULL;
  }
  Py_INCREF(t);
  s->tensor = t;
  if (!saved_describe(s, t, nbytes, shape, stride)) goto fail;
  if (base != NULL && (s->base_src = PyWeakref_NewRef(base, NULL)) == NULL) goto fail;
  Py_INCREF(pin);
  Py_DECREF(s->pin);
  s->pin = pin;
  Py_INCREF(counts);
  s->counts = counts;
  s->seq = f->next_seq;
  s->offset = s->seq - f->step_first_seq;
  s->step = f->step_index;
  Py_INCREF(f);
  s->front = (PyObject*)f;
  if (!order_append(f, s)) goto fail;
  f->next_seq++; /* the order's slot is this number's, even if filing fails below */
  if (!pending_push(f, s->seq) || !seen_put(f, (uint64_t)(uintptr_t)t, s, 0)) goto fail;
  s->seen_key = (uint64_t)(uintptr_t)t;
  if (base != NULL) {
    if (!seen_put(f, (uint64_t)(uintptr_t)base, s, 1)) goto fail;
    s->base_key = (uint64_t)(uintptr_t)base;
  }
  return (PyObject*)s;
fail:
  s->dead = 1; /* leaves the tables; tells the store nothing (it never saw it) */
  Py_DECREF(s);
  return NULL;
}

/* ---- Front ------------------------------------------------------------------------------- */
/* A count the store was configured with: an int, or a float as the store's comparisons take it
 * (round_up: a threshold or bound compared with <, else rounded down; inf: no limit). 0 with
 * an error set (TypeError, ValueError for NaN). */
static int as_count(PyObject* o, int round_up, long long* out) {
  if (PyFloat_Check(o)) {
    double v = PyFloat_AsDouble(o);
    if (v != v) {
      PyErr_SetString(PyExc_ValueError, "offloadd: a count or size setting is NaN");
      return 0;
    }
    if (v >= 9.2e18 || v <= -9.2e18) {
      *out = v > 0 ? LLONG_MAX : LLONG_MIN;
      return 1;
    }
    long long i = (long long)v; /* toward zero; then up or down (no libm: glibc's libc alone) */
    if (round_up && (double)i < v) i++;
    if (!round_up && (double)i > v) i--;
    *out = i;
    return 1;
  }
  *out = PyLong_AsLongLong(o);
  return !(*out == -1 && PyErr_Occurred());
}

/* What stays in place, de-duplication, and the filing of a new handle (the module's doc). */
static PyObject* front_pack(Front* f, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "pack(t, threshold_bytes, pin, store, counts)");
    return NULL;
  }
  PyObject *t = args[0], *base, *nbytes = NULL, *shape = NULL, *stride = NULL, *r = NULL;
  long long threshold;
  if (!as_count(args[1], 1, &threshold)) return NULL;
  PyObject* category = category_of(f, t, &base);
  if (category != NULL || PyErr_Occurred()) {
    Py_XINCREF(category);
    r = category;
    goto done;
  }
  if ((nbytes = PyObject_GetAttr(t, a_nbytes)) == NULL) goto done;
  long long n = PyLong_AsLongLong(nbytes);
  if (n == -1 && PyErr_Occurred()) goto done;
  if (n < (threshold > 1 ? threshold : 1)) {
    Py_INCREF(s_small);
    r = s_small;
    goto done;
  }
  r = seen_match(f, t, base);
  if (r != NULL || PyErr_Occurred()) {
    if (r == s_views) Py_INCREF(r);
    goto done;
  }
  shape = PyObject_GetAttr(t, a_shape);
  stride = shape ? PyObject_CallMethodObjArgs(t, a_stride, NULL) : NULL;
  if (stride == NULL) goto done;
  int dense = dense_span(shape, stride);
  if (dense <= 0) {
    if (dense == 0) {
      Py_INCREF(s_other);
      r = s_other;
    }
    goto done;
  }
  r = file_new(f, t, base, nbytes, shape, stride, args[2], args[3], args[4]);
  shape = stride = NULL; /* taken over */
done:
  Py_XDECREF(shape);
  Py_XDECREF(stride);
  Py_XDECREF(nbytes);
  Py_XDECREF(base);
  return r;
}

static PyObject* front_pop_due(Front* f, PyObject* arg) {
  long long keep;
  if (!as_count(arg, 0, &keep)) return NULL;
  PyObject* due = NULL;
  while (f->pending_len > keep) {
    long long seq = f->pending[f->pending_head];
    f->pending_head = (f->pending_head + 1) % f->pending_cap;
    f->pending_len--;
    Saved* o = order_entry(f, seq);
    if (o == NULL || o->state != KEPT || o->unpacked) continue; /* in backward already */
    /* Held before anything is allocated: an allocation may run the cycle collector, which may
     * free a handle only the tables point at. */
    Py_INCREF(o);
    if (due == NULL) due = PyList_New(0);
    int ok = due != NULL && PyList_Append(due, (PyObject*)o) == 0;
    Py_DECREF(o);
    if (!ok) {
      Py_XDECREF(due);
      return NULL;
    }
  }
  if (due == NULL) Py_RETURN_NONE;
  return due;
}

static PyObject* front_entry(Front* f, PyObject* arg) {
  long long seq = PyLong_AsLongLong(arg);
  if (seq == -1 && PyErr_Occurred()) return NULL;
  PyObject* o = (PyObject*)order_entry(f, seq);
  o = o ? o : Py_None;
  Py_INCREF(o);
  return o;
}

/* Store._worth_prefetching: awaiting its unpack, and its step position not left unused. */
static int worth_prefetching(Saved* o, PyObject* unused) {
  if (o == NULL || o->unpacked || (o->state != OFFLOADING && o->state != OFFLOADED)) return 0;
  if (PySet_Size(unused) <= 0) return 1;
  PyObject* offset = PyLong_FromLongLong(o->offset);
  if (offset == NULL) return -1;
  int in = PySet_Contains(unused, offset);
  Py_DECREF(offset);
  return in < 0 ? -1 : !in;
}

static int no_reload(const Saved* o) { return o->reload == NULL || o->reload == Py_None; }

/* 1 when handle o (borrowed from the order) is worth prefetching, appended to todo unless its
 * reload is under way; 0 when not worth it; -1 with an error set. o is held while the set test
 * allocates (the cycle collector may run then and free a handle only the order points at). */
static int take_if_worth(Saved* o, PyObject* unused, PyObject* todo) {
  if (o == NULL) return 0;
  Py_INCREF(o);
  int w = worth_prefetching(o, unused);
  if (w > 0 && no_reload(o) && PyList_Append(todo, (PyObject*)o) < 0) w = -1;
  Py_DECREF(o);
  return w;
}

static PyObject* front_prefetch_candidates(Front* f, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyAnySet_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError,
                    "prefetch_candidates(seq, previous_seq, prefetch, unused_offsets: set)");
    return NULL;
  }
  long long seq, prefetch, previous;
  if (!as_count(args[0], 0, &seq) || !as_count(args[2], 1, &prefetch)) return NULL;
  if (args[1] == Py_None)
    previous = seq - 1;
  else if (!as_count(args[1], 0, &previous))
    return NULL;
  PyObject *unused = args[3], *todo = PyList_New(0);
  if (todo == NULL) goto fail;
  Saved* before = order_entry(f, seq - 1);
  Py_XINCREF(before);
  int w = worth_prefetching(before, unused);
  Py_XDECREF(before);
  if (w < 0) goto fail;
  int forward = previous == seq - 1 || !w;
  for (long long k = seq + 1; forward && PyList_Size(todo) < prefetch; k++) {
    if ((w = take_if_worth(order_entry(f, k), unused, todo)) <= 0) {
      if (w < 0) goto fail;
      break;
    }
  }
  long long active = 0, scanned = 0;
  for (long long k = seq - 1; k >= f->base_seq && active < prefetch &&
                              scanned < 4 * prefetch + 16; k--, scanned++) {
    if ((w = take_if_worth(order_entry(f, k), unused, todo)) < 0) goto fail;
    active += w;
  }
  return todo;
fail:
  Py_XDECREF(todo);
  return NULL;
}

static PyObject* front_end_step(Front* f, PyObject* unused) {
  seen_clear(f);
  f->step_first_seq = f->next_seq;
  f->step_index++;
  Py_RETURN_NONE;
}

static PyObject* front_forget(Front* f, PyObject* unused) {
  seen_clear(f);
  f->head = f->len = 0;
  f->base_seq = f->next_seq;
  f->pending_head = f->pending_len = 0;
  Py_RETURN_NONE;
}

static PyObject* front_handles(Front* f, PyObject* unused) {
  PyObject* out = PyList_New(0);
  for (Py_ssize_t i = 0; out != NULL && i < f->len; i++) {
    PyObject* o = (PyObject*)f->order[f->head + i];
    if (o != NULL && PyList_Append(out, o) < 0) Py_CLEAR(out);
  }
  return out;
}

static PyObject* front_live(Front* f, PyObject* unused) {
  Py_ssize_t n = 0;
  for (Py_ssize_t i = 0; i < f->len; i++) n += f->order[f->head + i] != NULL;
  return PyLong_FromSsize_t(n);
}

static PyObject* front_seen_entries(Front* f, PyObject* unused) {
  return PyLong_FromSsize_t(f->seen_count);
}

static PyObject* front_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *tensor_type, *param_type, *strided;
  if (!PyArg_ParseTuple(args, "OOO:Front", &tensor_type, &param_type, &strided)) return NULL;
  allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
  Front* f = (Front*)alloc(type, 0);
  if (f == NULL) return NULL;
  Py_INCREF(tensor_type);
  Py_INCREF(param_type);
  Py_INCREF(strided);
  f->tensor_type = tensor_type;
  f->param_type = param_type;
  f->strided = strided;
  return (PyObject*)f;
}

static void front_dealloc(Front* f) {
  PyTypeObject* type = Py_TYPE(f);
  Py_XDECREF(f->tensor_type);
  Py_XDECREF(f->param_type);
  Py_XDECREF(f->strided);
  PyMem_Free(f->order);
  PyMem_Free(f->pending);
  PyMem_Free(f->seen);
  freefunc free_fn = (freefunc)PyType_GetSlot(type, Py_tp_free);
  free_fn(f);
  Py_DECREF(type);
}

static PyObject* front_step_index(Front* f, void* c) { return PyLong_FromLongLong(f->step_index); }
static PyObject* front_next_seq(Front* f, void* c) { return PyLong_FromLongLong(f->next_seq); }

static PyMethodDef front_methods[] = {
    {"pack", (PyCFunction)(void (*)(void))front_pack, METH_FASTCALL,
     "pack(t, threshold_bytes, pin, store) -> category str or Saved"},
    {"pop_due", (PyCFunction)front_pop_due, METH_O,
     "pop_due(keep_last_n) -> list of handles to offload now, or None"},
    {"entry", (PyCFunction)front_entry, METH_O, "entry(seq) -> the live handle, or None"},
    {"prefetch_candidates", (PyCFunction)(void (*)(void))front_prefetch_candidates,
     METH_FASTCALL, "prefetch_candidates(seq, previous_seq, prefetch, unused_offsets) -> list"},
    {"end_step", (PyCFunction)front_end_step, METH_NOARGS, "a new step begins"},
    {"forget", (PyCFunction)front_forget, METH_NOARGS, "empties every table (forked child)"},
    {"handles", (PyCFunction)front_handles, METH_NOARGS, "the live handles, oldest first"},
    {"live", (PyCFunction)front_live, METH_NOARGS, "the number of live handles"},
    {"seen_entries", (PyCFunction)front_seen_entries, METH_NOARGS,
     "entries of the de-duplication table"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef front_getset[] = {
    {"step_index", (getter)front_step_index, NULL, "steps ended so far", NULL},
    {"next_seq", (getter)front_next_seq, NULL, "the number of the next handle", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot front_slots[] = {
    {Py_tp_new, front_new},
    {Py_tp_dealloc, front_dealloc},
    {Py_tp_methods, front_methods},
    {Py_tp_getset, front_getset},
    {Py_tp_doc, "A store's step tables: order, waiting handles, de-duplication."},
    {0, NULL},
};

static PyType_Spec front_spec = {"offloadd._store_front.Front", sizeof(Front), 0,
                                 Py_TPFLAGS_DEFAULT, front_slots};

int front_check(PyObject* o) { return Py_TYPE(o) == FrontType; }

PyObject* front_pack_of(PyObject* front, PyObject* const* args, Py_ssize_t nargs) {
  return front_pack((Front*)front, args, nargs);
}

PyObject* front_pop_due_of(PyObject* front, PyObject* keep_last_n) {
  return front_pop_due((Front*)front, keep_last_n);
}

PyObject* front_prefetch_candidates_of(PyObject* front, PyObject* const* args, Py_ssize_t nargs) {
  return front_prefetch_candidates((Front*)front, args, nargs);
}

static PyMethodDef module_methods[] = {
    {"bind_answers", (PyCFunction)(void (*)(void))store_answers_bind, METH_FASTCALL,
     "bind_answers(kinds, flags, answer_types, outcome_lock): once, by offloadd.client"},
    {"take_answers", (PyCFunction)(void (*)(void))store_answers_take, METH_FASTCALL,
     "take_answers(answers, ops, confirmed) -> the answers left to the caller"},
    {"pump", (PyCFunction)(void (*)(void))store_pump, METH_FASTCALL,
     "pump(client, batch, take) -> the answers taken: Client.pump(0.0), its usual case in C"},
    {"pump_all", (PyCFunction)(void (*)(void))store_pump_all, METH_FASTCALL,
     "pump_all(endpoints, batch, client_module): pump() of every endpoint this process made"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_store_front",
    "The torch hooks' per-tensor records and the front of their pack (see Saved, Front), and "
    "the request ring's usual answers applied to them (take_answers).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

int front_intern(PyObject** out, const char* s) {
  *out = PyUnicode_InternFromString(s);
  return *out != NULL;
}

PyMODINIT_FUNC PyInit__store_front(void) {
  if (!front_intern(&s_params, "params") || !front_intern(&s_leaves, "leaves") ||
      !front_intern(&s_other, "other") || !front_intern(&s_small, "small") ||
      !front_intern(&s_views, "views") || !front_intern(&a_base, "_base") ||
      !front_intern(&a_is_param, "_is_param") || !front_intern(&a_requires_grad, "requires_grad") ||
      !front_intern(&a_is_leaf, "is_leaf") || !front_intern(&a_layout, "layout") ||
      !front_intern(&a_is_quantized, "is_quantized") || !front_intern(&a_is_nested, "is_nested") ||
      !front_intern(&a_is_cuda, "is_cuda") || !front_intern(&a_is_cpu, "is_cpu") ||
      !front_intern(&a_nbytes, "nbytes") || !front_intern(&a_version, "_version") ||
      !front_intern(&a_shape, "shape") || !front_intern(&a_stride, "stride") ||
      !front_intern(&a_dtype, "dtype") || !front_intern(&a_device, "device") ||
      !front_intern(&a_on_death, "_on_death") ||
      !front_intern(&a_unused_offsets, "_unused_offsets") || !store_answers_init() ||
      !store_lane_init() || !store_pump_init() || !store_hooks_init() ||
      !store_unpack_init())
    return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  SavedType = (PyTypeObject*)PyType_FromSpec(&saved_spec);
  FrontType = (PyTypeObject*)PyType_FromSpec(&front_spec);
  PyObject* lane_type = PyType_FromSpec(&store_lane_spec);
  if (lane_type != NULL && PyModule_AddObject(m, "OffloadLane", lane_type) < 0) {
    Py_DECREF(lane_type);
    lane_type = NULL;
  }
  LaneType = (PyTypeObject*)lane_type;
  Py_XINCREF(LaneType); /* ours: the module's was taken by AddObject */
  PyObject* hooks_type = PyType_FromSpec(&store_hooks_spec);
  if (hooks_type != NULL && PyModule_AddObject(m, "Hooks", hooks_type) < 0) {
    Py_DECREF(hooks_type);
    hooks_type = NULL;
  }
  if (SavedType == NULL || FrontType == NULL || lane_type == NULL || hooks_type == NULL ||
      !store_counts_add_type(m) || PyModule_AddObject(m, "Saved", (PyObject*)SavedType) < 0 ||
      PyModule_AddObject(m, "Front", (PyObject*)FrontType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  Py_INCREF(SavedType); /* the module's reference was taken by AddObject; keep ours */
  Py_INCREF(FrontType);
  return m;
}
