/* native_floor_hooks: the floor of a native hook pair, for bench/hook_overhead.py.
 *
 * A saved-tensor hook pair written in C (CPython stable ABI, 3.10+) that does the least a native
 * client store must do per tensor and nothing else, against a real daemon through a session's
 * request ring (client/core/offloadd_core.h):
 *   pack(t)     reads t.data_ptr() and t.nbytes (int bytes), submits an offload of those bytes
 *               of the one registered shm region (tagged with a running number), keeps t and
 *               takes whatever answers arrived (no wait); returns the tag (int).
 *   unpack(tag) submits the tagged block's reload into the same bytes (urgent, release_after:
 *               the daemon frees the block), the previous tag's as a prefetch (the prefetch
 *               depth of offloadd's hooks, 1), waits for its own reload's answer with the GIL
 *               released (futex sleep in the core), and returns t.
 * No classification, no fallback, no resume, no views or dedup: what it costs is the floor
 * under any native store on this machine, not a store. The reload names the block by its tag,
 * so it never waits for the offload's answer (the core's offloadd_ring_reload: block_id 0).
 *
 *   pack_described(t)  the same after reading, through the Python C API, what a store's pack
 *               must know of a saved tensor besides its address and size to decide whether to
 *               offload it and to rebuild it later (its base, requires_grad, is_leaf, layout,
 *               is_cuda, shape, strides, dtype and device: what offloadd's store classification and
 *               Meta read, less what follows from the rest: whether its elements fill a dense
 *               span is computed from shape and strides here), kept in the table as a native
 *               store would keep them (dims and strides as C integers, up to 8 dims; the dtype
 *               and device objects referenced). ValueError for more than 8 dims.
 *               What it costs above pack is what torch's attribute getters cost a native
 *               store that does not link libtorch.
 * attach(ring, offload_fn, reload_fn, drain_fn, region_id, base_address, size_bytes) binds
 * the module to a ring a Python offloadd.Client attached (the ring pointer and the three
 * functions' addresses from the loaded liboffloadd_core.so: one core in the process) and the
 * region the tensors lie in. counts() returns (offloads, reloads, answers, errors) so far.
 * Errors: pack raises ValueError for a tensor outside the region, RuntimeError when the ring
 * refuses a submission or more than SLOTS tensors are alive; unpack raises RuntimeError with
 * the daemon's message on an error answer, TimeoutError after 20 s without its answer. */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030A0000
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "client/core/offloadd_core.h"

#define SLOTS 256
#define URGENT 1
#define PREFETCH 2
#define ANSWER_BATCH 16
#define WAIT_SECONDS 20.0


#define MAX_DIMS 8

typedef struct {
  int ndim, requires_grad, is_leaf, is_cuda, dense;
  int64_t dims[MAX_DIMS], strides[MAX_DIMS];
  PyObject *dtype, *device; /* owned while saved (NULL: not read) */
} described;

typedef struct {
  PyObject* tensor; /* owned while saved */
  described about;
  uint64_t tag, offset_bytes, size_bytes, offload_request, reload_request;
  int reloaded, failed;
  char message[200];
} saved;

static struct {
  offloadd_ring* ring;
  offloadd_ring_offload_fn offload;
  offloadd_ring_reload_fn reload;
  offloadd_ring_drain_fn drain;
  uint64_t region_id, base, size_bytes, next_tag, oldest_tag;
  uint64_t offloads, reloads, answers, errors;
} g;
static PyObject *s_data_ptr, *s_nbytes; /* interned attribute names */
static PyObject *s_base, *s_requires_grad, *s_is_leaf, *s_layout, *s_is_cuda, *s_shape,
    *s_stride, *s_dtype, *s_device;
static saved table[SLOTS];

static saved* live(uint64_t tag) {
  saved* s = &table[tag % SLOTS];
  return (tag != 0 && s->tag == tag && s->tensor != NULL) ? s : NULL;
}

/* Marks the saved tensor an answer belongs to: its reload's answer, or an error of its offload
 * or reload (an offload's success needs nothing: the reload names the block by its tag). */
static void take_answer(const offloadd_completion* c) {
  g.answers++;
  for (uint64_t tag = g.oldest_tag; tag < g.next_tag; tag++) {
    saved* s = live(tag);
    if (s == NULL) continue;
    if (c->kind == 4 /* error */ &&
        (c->request_id == s->offload_request || c->request_id == s->reload_request)) {
      size_t n = c->message_bytes < sizeof(s->message) ? c->message_bytes
                                                       : sizeof(s->message) - 1;
      memcpy(s->message, c->message, n);
      s->message[n] = 0;
      s->failed = 1;
      g.errors++;
      return;
    }
    if (c->kind != 4 && c->request_id == s->reload_request) {
      s->reloaded = 1;
      return;
    }
  }
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int take_answers(double timeout_seconds) {
  offloadd_completion out[ANSWER_BATCH];
  int n;
  if (timeout_seconds > 0) {
    Py_BEGIN_ALLOW_THREADS n = g.drain(g.ring, out, ANSWER_BATCH, timeout_seconds);
    Py_END_ALLOW_THREADS
  } else {
    n = g.drain(g.ring, out, ANSWER_BATCH, 0.0);
  }
  for (int i = 0; i < n; i++) take_answer(&out[i]);
  return n;
}

static PyObject* attach(PyObject* self, PyObject* args) {
  unsigned long long ring, off, rel, dr, region, base, size;
  if (!PyArg_ParseTuple(args, "KKKKKKK", &ring, &off, &rel, &dr, &region, &base, &size))
    return NULL;
  memset(&g, 0, sizeof(g));
  g.ring = (offloadd_ring*)(uintptr_t)ring;
  g.offload = (offloadd_ring_offload_fn)(uintptr_t)off;
  g.reload = (offloadd_ring_reload_fn)(uintptr_t)rel;
  g.drain = (offloadd_ring_drain_fn)(uintptr_t)dr;
  g.region_id = region, g.base = base, g.size_bytes = size;
  g.next_tag = g.oldest_tag = 1;
  Py_RETURN_NONE;
}

static int read_u64(PyObject* t, PyObject* name, int call, uint64_t* out) {
  PyObject* v = call ? PyObject_CallMethodObjArgs(t, name, NULL) : PyObject_GetAttr(t, name);
  if (v == NULL) return -1;
  *out = PyLong_AsUnsignedLongLong(v);
  Py_DECREF(v);
  return PyErr_Occurred() ? -1 : 0;
}

/* A truth value of attribute (call 0) or method (call 1) ``name`` of ``t``: 0/1, -1 on error. */
static int read_bool(PyObject* t, PyObject* name, int call) {
  PyObject* v = call ? PyObject_CallMethodObjArgs(t, name, NULL) : PyObject_GetAttr(t, name);
  if (v == NULL) return -1;
  int r = PyObject_IsTrue(v);
  Py_DECREF(v);
  return r;
}

/* A sequence of ints (a torch.Size, a strides tuple) into out[MAX_DIMS]; its length, -1 on
 * error. */
static int read_ints(PyObject* t, PyObject* name, int call, int64_t* out) {
  PyObject* v = call ? PyObject_CallMethodObjArgs(t, name, NULL) : PyObject_GetAttr(t, name);
  if (v == NULL) return -1;
  Py_ssize_t n = PySequence_Size(v);
  if (n > MAX_DIMS) PyErr_Format(PyExc_ValueError, "more than %d dims", MAX_DIMS);
  for (Py_ssize_t i = 0; i < n && !PyErr_Occurred(); i++) {
    PyObject* x = PySequence_GetItem(v, i);
    if (x != NULL) out[i] = PyLong_AsLongLong(x);
    Py_XDECREF(x);
  }
  Py_DECREF(v);
  return PyErr_Occurred() ? -1 : (int)n;
}

static void forget(described* d) {
  Py_CLEAR(d->dtype);
  Py_CLEAR(d->device);
}

/* Whether the elements fill exactly numel consecutive elements (offloadd's dense_span): the
 * strides of the dims longer than 1, in increasing order, are the running products. */
static int dense_span(const described* d) {
  int64_t expected = 1;
  int used[MAX_DIMS] = {0};
  for (int k = 0; k < d->ndim; k++) {
    int best = -1;
    for (int i = 0; i < d->ndim; i++)
      if (!used[i] && d->dims[i] != 1 && (best < 0 || d->strides[i] < d->strides[best])) best = i;
    if (best < 0) break;
    used[best] = 1;
    if (d->strides[best] != expected) return 0;
    expected *= d->dims[best];
  }
  return 1;
}

/* What the store's classification and Meta read, less what follows from the rest, kept as a
 * native store would keep it. */
static int read_some(PyObject* t, PyObject* name) {
  PyObject* v = PyObject_GetAttr(t, name);
  Py_XDECREF(v);
  return v == NULL ? -1 : 0;
}

static int describe(PyObject* t, described* d) {
  if (read_some(t, s_base) < 0 || read_some(t, s_layout) < 0) return -1;
  if ((d->requires_grad = read_bool(t, s_requires_grad, 0)) < 0 ||
      (d->is_leaf = read_bool(t, s_is_leaf, 0)) < 0 ||
      (d->is_cuda = read_bool(t, s_is_cuda, 0)) < 0 ||
      (d->ndim = read_ints(t, s_shape, 0, d->dims)) < 0 ||
      read_ints(t, s_stride, 1, d->strides) < 0)
    return -1;
  d->dense = dense_span(d);
  if ((d->dtype = PyObject_GetAttr(t, s_dtype)) == NULL) return -1;
  return (d->device = PyObject_GetAttr(t, s_device)) == NULL ? -1 : 0;
}

static PyObject* pack(PyObject* self, PyObject* t) {
  uint64_t ptr, nbytes;
  if (g.ring == NULL) return PyErr_Format(PyExc_RuntimeError, "attach() a ring first");
  if (read_u64(t, s_data_ptr, 1, &ptr) || read_u64(t, s_nbytes, 0, &nbytes)) return NULL;
  if (ptr < g.base || ptr + nbytes > g.base + g.size_bytes)
    return PyErr_Format(PyExc_ValueError, "the tensor lies outside the registered region");
  uint64_t tag = g.next_tag;
  saved* s = &table[tag % SLOTS];
  if (s->tensor != NULL)
    return PyErr_Format(PyExc_RuntimeError, "more than %d saved tensors alive", SLOTS);
  uint64_t id = g.offload(g.ring, g.region_id, ptr - g.base, nbytes, tag, NULL, 0, 0, 0, 5.0);
  if (id == 0) return PyErr_Format(PyExc_RuntimeError, "the ring refused an offload");
  g.offloads++, g.next_tag++;
  forget(&s->about);
  memset(s, 0, sizeof(*s));
  s->tag = tag, s->offset_bytes = ptr - g.base, s->size_bytes = nbytes, s->offload_request = id;
  Py_INCREF(t);
  s->tensor = t;
  take_answers(0.0);
  return PyLong_FromUnsignedLongLong(tag);
}

static PyObject* pack_described(PyObject* self, PyObject* t) {
  described d;
  memset(&d, 0, sizeof(d));
  if (describe(t, &d) < 0) {
    forget(&d);
    return NULL;
  }
  PyObject* tag = pack(self, t);
  if (tag == NULL) {
    forget(&d);
    return NULL;
  }
  table[PyLong_AsUnsignedLongLong(tag) % SLOTS].about = d;  /* the table owns the refs now */
  return tag;
}

static int start_reload(saved* s, uint32_t priority) {
  s->reload_request = g.reload(g.ring, 0, s->tag, g.region_id, s->offset_bytes, priority, 1,
                               0.0, NULL, NULL, 5.0);
  if (s->reload_request == 0) {
    PyErr_Format(PyExc_RuntimeError, "the ring refused a reload");
    return -1;
  }
  g.reloads++;
  return 0;
}

static PyObject* unpack(PyObject* self, PyObject* h) {
  uint64_t tag = PyLong_AsUnsignedLongLong(h);
  saved* s = live(tag);
  if (s == NULL) return PyErr_Format(PyExc_ValueError, "no saved tensor with this tag");
  if (s->reload_request == 0 && start_reload(s, URGENT)) return NULL;
  saved* prev = live(tag - 1);
  if (prev != NULL && prev->reload_request == 0 && start_reload(prev, PREFETCH)) return NULL;
  const double deadline = now_seconds() + WAIT_SECONDS;
  while (!s->reloaded && !s->failed) {
    const double left = deadline - now_seconds();
    if (left <= 0)
      return PyErr_Format(PyExc_TimeoutError, "no reload answer within %d s", (int)WAIT_SECONDS);
    if (take_answers(left < 1.0 ? left : 1.0) < 0)
      return PyErr_Format(PyExc_RuntimeError, "the ring closed (the session ended)");
  }
  PyObject* t = s->tensor;
  s->tensor = NULL;
  forget(&s->about);
  while (g.oldest_tag < g.next_tag && live(g.oldest_tag) == NULL) g.oldest_tag++;
  if (s->failed) {
    Py_DECREF(t);
    return PyErr_Format(PyExc_RuntimeError, "offloadd: %s", s->message);
  }
  return t; /* the table's reference goes to the caller */
}

static PyObject* counts(PyObject* self, PyObject* unused) {
  return Py_BuildValue("KKKK", (unsigned long long)g.offloads, (unsigned long long)g.reloads,
                       (unsigned long long)g.answers, (unsigned long long)g.errors);
}

static PyMethodDef methods[] = {
    {"attach", attach, METH_VARARGS, "attach(ring, offload_fn, reload_fn, drain_fn, region_id, "
                                     "base_address, size_bytes)"},
    {"pack", pack, METH_O, "pack(tensor) -> tag"},
    {"pack_described", pack_described, METH_O, "pack_described(tensor) -> tag"},
    {"unpack", unpack, METH_O, "unpack(tag) -> tensor"},
    {"counts", counts, METH_NOARGS, "(offloads, reloads, answers, errors)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_floor_hooks",
                                    "The floor of a native hook pair (bench).", -1, methods};

PyMODINIT_FUNC PyInit_native_floor_hooks(void) {
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  s_nbytes = PyUnicode_InternFromString("nbytes");
  s_base = PyUnicode_InternFromString("_base");
  s_requires_grad = PyUnicode_InternFromString("requires_grad");
  s_is_leaf = PyUnicode_InternFromString("is_leaf");
  s_layout = PyUnicode_InternFromString("layout");
  s_is_cuda = PyUnicode_InternFromString("is_cuda");
  s_shape = PyUnicode_InternFromString("shape");
  s_stride = PyUnicode_InternFromString("stride");
  s_dtype = PyUnicode_InternFromString("dtype");
  s_device = PyUnicode_InternFromString("device");
  return PyModule_Create(&module);
}
