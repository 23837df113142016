/* offloadd._ring_fast: the hot calls of a session's request ring (offloadd_core.h) as a CPython
 * extension module (stable ABI, CPython 3.10+), for offloadd._native.NativeRing.
 *
 * A ctypes call converts each argument through its argtypes and builds a call frame at run time:
 * a ring submission through ctypes costs the calling thread several times what the core's work
 * does. This module makes the same calls with the arguments parsed in C. It links no copy of the
 * core: bind() takes the addresses of the functions of the liboffloadd_core.so that
 * offloadd._native loaded (one core in the process), and every call names the ring by its
 * pointer (an int), as the C ABI does.
 *
 *   bind(offload_fn, reload_fn, release_fn, drain_fn)      addresses (ints); None. Once per
 *          process: RuntimeError for other addresses than the first call's.
 *   offload(ring, region_id, offset_bytes, size_bytes, tag, ready_event, has_ordering,
 *           order_step, order_position, timeout_seconds)   -> request id (int; 0: refused)
 *   reload(ring, block_id, tag, region_id, offset_bytes, priority, release_after,
 *          deadline_seconds, ready_event, done_event, timeout_seconds)   -> request id
 *   release(ring, block_id, tag, timeout_seconds)          -> request id
 *   drain(ring, max, timeout_seconds)   -> list of (request_id, kind, status_code, block_id,
 *          bytes, queued_seconds, copy_seconds, flags, message) tuples (message a str decoded
 *          from UTF-8 with errors replaced for an error answer, else ""), or None when the core
 *          returns < 0 (nothing there and the ring closed). max: 1..64.
 *
 * Integers are taken modulo 2**64 as ctypes takes them (a float is a TypeError here, a
 * ctypes.ArgumentError through ctypes), times float seconds, events None or exactly 64 bytes
 * (bytes, or what bytes() makes 64 bytes of; an int or a str is a TypeError; ValueError for
 * another length: a cudaIpcEventHandle_t is 64 bytes), events with the exception types and
 * texts of offloadd._native's ctypes binding (_event). The GIL
 * is released around every submission (which may sleep for a free slot) and around a drain
 * with a timeout other than 0. Every function raises RuntimeError before bind(). */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030A0000
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "client/core/offloadd_core.h"

#define EVENT_BYTES 64
#define DRAIN_MAX 64
#define ERROR_KIND 4


static struct {
  offloadd_ring_offload_fn offload;
  offloadd_ring_reload_fn reload;
  offloadd_ring_release_fn release;
  offloadd_ring_drain_fn drain;
} g;

static int bound(void) {
  if (g.offload != NULL) return 1;
  PyErr_SetString(PyExc_RuntimeError,
                  "offloadd._ring_fast: bind() the loaded core's functions first");
  return 0;
}

static int check_args(const char* name, Py_ssize_t nargs, Py_ssize_t want) {
  if (nargs == want) return 1;
  PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, nargs);
  return 0;
}

/* Each parser returns 0 with a Python error set when the object does not fit. Integers convert
 * as ctypes converts them for a c_uint64 parameter (the binding this module stands in for):
 * anything with __index__, taken modulo 2**64; a float is a TypeError. */
static int get_u64(PyObject* o, uint64_t* out) {
  if (PyFloat_Check(o)) {
    PyErr_SetString(PyExc_TypeError, "offloadd._ring_fast: an integer is required, not a float");
    return 0;
  }
  unsigned long long v = PyLong_AsUnsignedLongLongMask(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) return 0;
  *out = v;
  return 1;
}

static int get_double(PyObject* o, double* out) {
  double v = PyFloat_AsDouble(o);
  if (v == -1.0 && PyErr_Occurred()) return 0;
  *out = v;
  return 1;
}

static int get_ring(PyObject* o, offloadd_ring** out) {
  uint64_t v;
  if (!get_u64(o, &v)) return 0;
  if (v == 0) {
    PyErr_SetString(PyExc_ValueError, "offloadd._ring_fast: the ring pointer is 0");
    return 0;
  }
  *out = (offloadd_ring*)(uintptr_t)v;
  return 1;
}

/* An event: None (no event) or exactly 64 bytes, copied into buf (the caller's stack) so the
 * GIL can be released while the core reads it. The rule and texts of _native._event (the ctypes
 * binding): the same exception for the same argument through either binding. */
static int get_event(PyObject* o, uint8_t buf[EVENT_BYTES], const uint8_t** out) {
  if (o == Py_None) {
    *out = NULL;
    return 1;
  }
  /* bytes as they are; an int or a str refused (bytes(64) would be 64 zero bytes); anything
   * else as bytes() makes it (bytearray, memoryview, a list of ints), raising what bytes()
   * raises. The stable ABI of 3.10 has no buffer protocol: hence the copy. */
  PyObject* copy = NULL;
  if (!PyBytes_Check(o)) {
    if (PyLong_Check(o) || PyUnicode_Check(o)) {
      PyErr_SetString(PyExc_TypeError, "an event handle is None or 64 bytes "
                                       "(cudaIpcEventHandle_t), not an int or a str");
      return 0;
    }
    copy = PyObject_CallFunctionObjArgs((PyObject*)&PyBytes_Type, o, NULL);
    if (copy == NULL) return 0;
    o = copy;
  }
  Py_ssize_t n = PyBytes_Size(o);
  int ok = n == EVENT_BYTES;
  if (ok) {
    memcpy(buf, PyBytes_AsString(o), EVENT_BYTES);
    *out = buf;
  } else {
    PyErr_Format(PyExc_ValueError,
                 "an event handle is 64 bytes (cudaIpcEventHandle_t), not %zd", n);
  }
  Py_XDECREF(copy);
  return ok;
}

static PyObject* bind(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  uint64_t a[4];
  if (!check_args("bind", nargs, 4)) return NULL;
  for (int i = 0; i < 4; i++) {
    if (!get_u64(args[i], &a[i])) return NULL;
    if (a[i] == 0) return PyErr_Format(PyExc_ValueError, "bind(): function address %d is 0", i);
  }
  /* One set of addresses per process: a second core (another copy of offloadd loaded the same
   * file) keeps ctypes rather than send its rings to the first core's functions. */
  if (g.offload != NULL && ((uintptr_t)g.offload != a[0] || (uintptr_t)g.reload != a[1] ||
                            (uintptr_t)g.release != a[2] || (uintptr_t)g.drain != a[3]))
    return PyErr_Format(PyExc_RuntimeError,
                        "offloadd._ring_fast is bound to another liboffloadd_core.so of this "
                        "process: this one is called through ctypes");
  g.offload = (offloadd_ring_offload_fn)(uintptr_t)a[0];
  g.reload = (offloadd_ring_reload_fn)(uintptr_t)a[1];
  g.release = (offloadd_ring_release_fn)(uintptr_t)a[2];
  g.drain = (offloadd_ring_drain_fn)(uintptr_t)a[3];
  Py_RETURN_NONE;
}

static PyObject* offload(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  offloadd_ring* ring;
  uint64_t region, offset, size, tag, has_ordering, step, position, id;
  double timeout;
  uint8_t event_buf[EVENT_BYTES];
  const uint8_t* event;
  if (!bound() || !check_args("offload", nargs, 10)) return NULL;
  if (!get_ring(args[0], &ring) || !get_u64(args[1], &region) || !get_u64(args[2], &offset) ||
      !get_u64(args[3], &size) || !get_u64(args[4], &tag) ||
      !get_event(args[5], event_buf, &event) || !get_u64(args[6], &has_ordering) ||
      !get_u64(args[7], &step) || !get_u64(args[8], &position) || !get_double(args[9], &timeout))
    return NULL;
  Py_BEGIN_ALLOW_THREADS id = g.offload(ring, region, offset, size, tag, event,
                                        has_ordering != 0, step, position, timeout);
  Py_END_ALLOW_THREADS
  return PyLong_FromUnsignedLongLong(id);
}

static PyObject* reload(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  offloadd_ring* ring;
  uint64_t block, tag, region, offset, priority, release_after, id;
  double deadline, timeout;
  uint8_t ready_buf[EVENT_BYTES], done_buf[EVENT_BYTES];
  const uint8_t *ready, *done;
  if (!bound() || !check_args("reload", nargs, 11)) return NULL;
  if (!get_ring(args[0], &ring) || !get_u64(args[1], &block) || !get_u64(args[2], &tag) ||
      !get_u64(args[3], &region) || !get_u64(args[4], &offset) ||
      !get_u64(args[5], &priority) || !get_u64(args[6], &release_after) ||
      !get_double(args[7], &deadline) || !get_event(args[8], ready_buf, &ready) ||
      !get_event(args[9], done_buf, &done) || !get_double(args[10], &timeout))
    return NULL;
  /* priority: its low 32 bits, as ctypes passes a c_uint32 */
  Py_BEGIN_ALLOW_THREADS id = g.reload(ring, block, tag, region, offset, (uint32_t)priority,
                                       release_after != 0, deadline, ready, done, timeout);
  Py_END_ALLOW_THREADS
  return PyLong_FromUnsignedLongLong(id);
}

static PyObject* release(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  offloadd_ring* ring;
  uint64_t block, tag, id;
  double timeout;
  if (!bound() || !check_args("release", nargs, 4)) return NULL;
  if (!get_ring(args[0], &ring) || !get_u64(args[1], &block) || !get_u64(args[2], &tag) ||
      !get_double(args[3], &timeout))
    return NULL;
  Py_BEGIN_ALLOW_THREADS id = g.release(ring, block, tag, timeout);
  Py_END_ALLOW_THREADS
  return PyLong_FromUnsignedLongLong(id);
}

/* One answer as the 9-tuple NativeRing.drain returns; NULL with an error set on failure. */
static PyObject* completion_tuple(const offloadd_completion* c) {
  PyObject* message;
  if (c->kind == ERROR_KIND) {
    size_t n = c->message_bytes < sizeof(c->message) ? c->message_bytes : sizeof(c->message);
    message = PyUnicode_DecodeUTF8(c->message, (Py_ssize_t)n, "replace");
  } else {
    message = PyUnicode_FromStringAndSize("", 0);
  }
  if (message == NULL) return NULL;
  PyObject* t = Py_BuildValue("(KIiKKddIN)", (unsigned long long)c->request_id, c->kind,
                              c->status_code, (unsigned long long)c->block_id,
                              (unsigned long long)c->bytes, c->queued_seconds, c->copy_seconds,
                              c->flags, message);
  return t;
}

static PyObject* drain(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  offloadd_ring* ring;
  uint64_t max;
  double timeout;
  offloadd_completion out[DRAIN_MAX];
  int n;
  if (!bound() || !check_args("drain", nargs, 3)) return NULL;
  if (!get_ring(args[0], &ring) || !get_u64(args[1], &max) || !get_double(args[2], &timeout))
    return NULL;
  if (max == 0 || max > DRAIN_MAX)
    return PyErr_Format(PyExc_ValueError, "drain(): max is 1 to %d, not %llu", DRAIN_MAX,
                        (unsigned long long)max);
  if (timeout != 0.0) {
    Py_BEGIN_ALLOW_THREADS n = g.drain(ring, out, (size_t)max, timeout);
    Py_END_ALLOW_THREADS
  } else {
    n = g.drain(ring, out, (size_t)max, 0.0);
  }
  if (n < 0) Py_RETURN_NONE;
  PyObject* list = PyList_New(n);
  if (list == NULL) return NULL;
  for (int i = 0; i < n; i++) {
    PyObject* t = completion_tuple(&out[i]);
    if (t == NULL) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SetItem(list, i, t); /* steals t */
  }
  return list;
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(offload_fn, reload_fn, release_fn, drain_fn): the loaded core's function addresses"},
    {"offload", (PyCFunction)(void (*)(void))offload, METH_FASTCALL,
     "offload(ring, region_id, offset_bytes, size_bytes, tag, ready_event, has_ordering, "
     "order_step, order_position, timeout_seconds) -> request id (0: refused)"},
    {"reload", (PyCFunction)(void (*)(void))reload, METH_FASTCALL,
     "reload(ring, block_id, tag, region_id, offset_bytes, priority, release_after, "
     "deadline_seconds, ready_event, done_event, timeout_seconds) -> request id (0: refused)"},
    {"release", (PyCFunction)(void (*)(void))release, METH_FASTCALL,
     "release(ring, block_id, tag, timeout_seconds) -> request id (0: refused)"},
    {"drain", (PyCFunction)(void (*)(void))drain, METH_FASTCALL,
     "drain(ring, max, timeout_seconds) -> list of 9-tuples, or None when the ring closed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ring_fast",
    "The hot calls of offloadd's request ring, bound to the loaded liboffloadd_core.so.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ring_fast(void) { return PyModule_Create(&module); }
