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
 *   drain(ring, max, timeout_seconds[, carry])   -> list of (request_id, kind, status_code,
 *          block_id, bytes, queued_seconds, copy_seconds, flags, message) tuples (message a
 *          str decoded from UTF-8 with errors replaced for an error answer, else ""), or None
 *          when the core returns < 0 (nothing there and the ring closed). max: 1..64.
 *          carry (a list, the ring's own: NativeRing keeps one) holds answers taken off the
 *          ring that no caller received: when it is not empty, drain returns up to max of them
 *          (the oldest first) without calling the core. Once answers are taken off the ring,
 *          the signal handlers that became due meanwhile run (PyErr_CheckSignals: a signal that
 *          came while the drain slept is handled here, not at the caller's next bytecode);
 *          when one raises, the answers go to carry and drain raises what it raised, so that
 *          the next drain returns them rather than them being lost with the interrupted call.
 *   bind_client(ring_op_type)   offloadd.client._RingOp, once per process (RuntimeError for
 *          another class later).
 *   submit(client, kind, args, op, target) -> op, or None
 *          Client._ring_submit's usual case in one call, for an offloadd.client.Client whose
 *          ring this module's binding serves: kind 0 offload, 1 reload, 2 release; args the
 *          _RingOp's args tuple (5, 8 or 1 items, as Client.offload / reload / release build
 *          it); op an unsubmitted _RingOp (Client.reload_outcome's) or None for a new one, made
 *          here as _RingOp.__init__ makes it with ``target``. Under the client's lock, tried and
 *          never waited for: when the session's ring is in use (Client._ring), no refusal is
 *          due (no _dead, not _closing, no lost block) and the ring takes the request at once
 *          (timeout 0, the GIL kept), the op gets its request id, joins Client._ring_ops and
 *          counts in counters.ring_requests_sent, and is returned. None, with nothing
 *          submitted, whenever Python's path must decide (another process than the client's
 *          owner, the lock held by another thread, no ring, a refusal, a full or closed ring).
 *          Arguments of another type than Client's own calls pass (an ordering that is not a
 *          tuple, a float flag, an event of another length) are not submitted here either:
 *          None, and the Python path takes them as it always did (and raises what it raises).
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
#include <unistd.h>

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

/* Up to max answers carried over from a drain that raised (the oldest first), taken out of
 * carry: a new list. */
static PyObject* carried(PyObject* carry, uint64_t max) {
  Py_ssize_t n = PyList_Size(carry);
  if ((uint64_t)n > max) n = (Py_ssize_t)max;
  PyObject* out = PyList_GetSlice(carry, 0, n);
  if (out != NULL && PyList_SetSlice(carry, 0, n, NULL) < 0) Py_CLEAR(out);
  return out;
}

/* The signal handlers due, run with the answers taken: the list, or NULL with what a handler
 * raised, the answers then kept in carry (when there is one). */
static PyObject* after_signals(PyObject* list, PyObject* carry) {
  if (PyList_Size(list) == 0 || PyErr_CheckSignals() == 0) return list;
  if (carry != NULL) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    Py_ssize_t end = PyList_Size(carry);
    if (PyList_SetSlice(carry, end, end, list) < 0) {
      PyErr_WriteUnraisable(carry); /* no memory: the answers are lost with the call */
    }
    PyErr_Restore(type, value, tb);
  }
  Py_DECREF(list);
  return NULL;
}

static PyObject* drain(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  offloadd_ring* ring;
  uint64_t max;
  double timeout;
  offloadd_completion out[DRAIN_MAX];
  int n;
  if (!bound()) return NULL;
  if (nargs != 3 && nargs != 4)
    return PyErr_Format(PyExc_TypeError, "drain() takes 3 or 4 arguments (%zd given)", nargs);
  if (!get_ring(args[0], &ring) || !get_u64(args[1], &max) || !get_double(args[2], &timeout))
    return NULL;
  if (max == 0 || max > DRAIN_MAX)
    return PyErr_Format(PyExc_ValueError, "drain(): max is 1 to %d, not %llu", DRAIN_MAX,
                        (unsigned long long)max);
  PyObject* carry = nargs == 4 && args[3] != Py_None ? args[3] : NULL;
  if (carry != NULL && !PyList_Check(carry))
    return PyErr_Format(PyExc_TypeError, "drain(): carry is a list or None");
  if (carry != NULL && PyList_Size(carry) > 0) return carried(carry, max);
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
  return after_signals(list, carry);
}

/* ---- submit: Client._ring_submit's usual case in one call ----------------------------------- */
enum { SUBMIT_OFFLOAD, SUBMIT_RELOAD, SUBMIT_RELEASE, SUBMIT_KINDS };
static const Py_ssize_t submit_args[SUBMIT_KINDS] = {5, 8, 1}; /* _RingOp.args' lengths */
static PyObject* ring_op_type; /* offloadd.client._RingOp, from bind_client */
static PyObject *k_kind[SUBMIT_KINDS], *n_owner_pid, *n_lock, *n_ring, *n_dead, *n_closing,
    *n_lost, *n_released, *n_daemon_region, *n_ring_ops, *n_counters, *n_sent, *n_acquire,
    *n_release, *n_done, *n_value, *n_exc, *n_callbacks, *n_event, *n_client, *n_args,
    *n_request_id, *n_target, *n_kind;

static int intern(PyObject** out, const char* s) {
  *out = PyUnicode_InternFromString(s);
  return *out != NULL;
}

static int submit_names(void) {
  return intern(&k_kind[SUBMIT_OFFLOAD], "offload") && intern(&k_kind[SUBMIT_RELOAD], "reload") &&
         intern(&k_kind[SUBMIT_RELEASE], "release") && intern(&n_owner_pid, "_owner_pid") &&
         intern(&n_lock, "_lock") && intern(&n_ring, "_ring") && intern(&n_dead, "_dead") &&
         intern(&n_closing, "_closing") && intern(&n_lost, "_lost") &&
         intern(&n_released, "_released") && intern(&n_daemon_region, "_daemon_region") &&
         intern(&n_ring_ops, "_ring_ops") && intern(&n_counters, "counters") &&
         intern(&n_sent, "ring_requests_sent") && intern(&n_acquire, "acquire") &&
         intern(&n_release, "release") && intern(&n_done, "_done") &&
         intern(&n_value, "_value") && intern(&n_exc, "_exc") &&
         intern(&n_callbacks, "_callbacks") && intern(&n_event, "_event") &&
         intern(&n_client, "client") && intern(&n_args, "args") &&
         intern(&n_request_id, "request_id") && intern(&n_target, "target") &&
         intern(&n_kind, "kind");
}

static PyObject* bind_client(PyObject* self, PyObject* type) {
  if (!PyType_Check(type)) return PyErr_Format(PyExc_TypeError, "bind_client(): a class");
  if (ring_op_type != NULL && ring_op_type != type)
    return PyErr_Format(PyExc_RuntimeError, "offloadd._ring_fast: bound to another _RingOp");
  if (ring_op_type == NULL && !submit_names()) return NULL;
  if (ring_op_type == NULL) {
    Py_INCREF(type);
    ring_op_type = type;
  }
  Py_RETURN_NONE;
}

/* A new, unsubmitted op as _RingOp.__init__ makes it (its __init__ is not run). */
static PyObject* new_op(PyObject* client, int kind, PyObject* args, PyObject* target) {
  PyObject* empty = PyTuple_New(0);
  if (empty == NULL) return NULL;
  PyObject* op = PyType_GenericNew((PyTypeObject*)ring_op_type, empty, NULL);
  Py_DECREF(empty);
  PyObject* zero = op ? PyLong_FromLong(0) : NULL;
  if (zero == NULL) {
    Py_XDECREF(op);
    return NULL;
  }
  PyObject* const fields[] = {n_done, n_value, n_exc, n_callbacks, n_event, n_client, n_args,
                              n_kind, n_request_id, n_target};
  PyObject* const values[] = {Py_False, Py_None, Py_None, Py_None, Py_None, client, args,
                              k_kind[kind], zero, target};
  for (int i = 0; op != NULL && i < 10; i++)
    if (PyObject_SetAttr(op, fields[i], values[i]) < 0) Py_CLEAR(op);
  Py_DECREF(zero);
  return op;
}

/* lock.acquire(False): 1 taken, 0 held by another thread, -1 with an error set. */
static int try_acquire(PyObject* lock) {
  PyObject* r = PyObject_CallMethodObjArgs(lock, n_acquire, Py_False, NULL);
  if (r == NULL) return -1;
  int taken = PyObject_IsTrue(r);
  Py_DECREF(r);
  return taken;
}

/* 1 when attribute `name` of o is true (is_none: is not None), 0 when not, -1 on error. */
static int attr_set(PyObject* o, PyObject* name, int is_none) {
  PyObject* v = PyObject_GetAttr(o, name);
  if (v == NULL) return -1;
  int r = is_none ? v != Py_None : PyObject_IsTrue(v);
  Py_DECREF(v);
  return r;
}

/* The client's ring pointer when a request may go on its ring now (under the client's lock):
 * 1 with *out set, 0 when the Python path decides (no ring, a refusal due, a closed ring),
 * -1 on error. */
static int usable_ring(PyObject* client, offloadd_ring** out) {
  PyObject* ring = PyObject_GetAttr(client, n_ring);
  if (ring == NULL) return -1;
  int r = ring != Py_None;
  if (r == 1) r = attr_set(client, n_dead, 1) == 0 ? 1 : -2;
  if (r == 1) r = attr_set(client, n_closing, 0) == 0 ? 1 : -2;
  if (r == 1) r = attr_set(client, n_lost, 0) == 0 ? 1 : -2;
  if (r == 1) r = attr_set(ring, n_released, 0) == 0 ? 1 : -2;
  PyObject* ptr = r == 1 ? PyObject_GetAttr(ring, n_ring) : NULL;
  if (r == 1) r = ptr == NULL ? -1 : ptr == Py_None ? 0 : get_ring(ptr, out) ? 1 : -1;
  Py_XDECREF(ptr);
  Py_DECREF(ring);
  if (r == -2) return PyErr_Occurred() ? -1 : 0;
  return r;
}

/* The daemon's region id of the client's region (Client._daemon_region, else the same id). */
static int daemon_region(PyObject* client, PyObject* region, uint64_t* out) {
  PyObject* map = PyObject_GetAttr(client, n_daemon_region);
  if (map == NULL) return 0;
  PyObject* mapped = PyDict_Check(map) ? PyDict_GetItemWithError(map, region) : NULL;
  int ok = !PyErr_Occurred() && get_u64(mapped ? mapped : region, out);
  Py_DECREF(map);
  return ok;
}

/* An ordering: None (0), or a (step, position) tuple (1); -1 with an error set. */
static int get_ordering(PyObject* o, uint64_t* step, uint64_t* position) {
  if (o == Py_None) return 0;
  if (!PyTuple_Check(o) || PyTuple_Size(o) != 2) {
    PyErr_SetString(PyExc_TypeError, "an ordering is None or a (step, position) tuple");
    return -1;
  }
  return get_u64(PyTuple_GetItem(o, 0), step) && get_u64(PyTuple_GetItem(o, 1), position)
             ? 1 : -1;
}

/* One submission of _RingOp args `a` on `ring`, with timeout 0 (it never sleeps, so the GIL is
 * kept): its request id, 0 when the ring took none (*error 0) or with an error set (*error 1).
 * The arguments are checked as NativeRing's calls check them. */
static uint64_t submit_one(PyObject* client, offloadd_ring* ring, int kind, PyObject* a,
                           int* error) {
  uint8_t ready_buf[EVENT_BYTES], done_buf[EVENT_BYTES];
  const uint8_t *ready = NULL, *done = NULL;
  uint64_t region, offset, size, step = 0, position = 0, block, priority, release_after;
  double deadline;
  *error = 1;
  if (kind == SUBMIT_OFFLOAD) {
    int ordering = get_ordering(PyTuple_GetItem(a, 4), &step, &position);
    if (ordering < 0 || !daemon_region(client, PyTuple_GetItem(a, 0), &region) ||
        !get_u64(PyTuple_GetItem(a, 1), &offset) || !get_u64(PyTuple_GetItem(a, 2), &size) ||
        !get_event(PyTuple_GetItem(a, 3), ready_buf, &ready))
      return 0;
    *error = 0;
    return g.offload(ring, region, offset, size, 0, ready, ordering, step, position, 0.0);
  }
  if (!get_u64(PyTuple_GetItem(a, 0), &block)) return 0;
  if (kind == SUBMIT_RELEASE) {
    *error = 0;
    return g.release(ring, block, 0, 0.0);
  }
  if (!daemon_region(client, PyTuple_GetItem(a, 1), &region) ||
      !get_u64(PyTuple_GetItem(a, 2), &offset) || !get_u64(PyTuple_GetItem(a, 3), &priority) ||
      !get_u64(PyTuple_GetItem(a, 4), &release_after) ||
      !get_double(PyTuple_GetItem(a, 5), &deadline) ||
      !get_event(PyTuple_GetItem(a, 6), ready_buf, &ready) ||
      !get_event(PyTuple_GetItem(a, 7), done_buf, &done))
    return 0;
  *error = 0;
  return g.reload(ring, block, 0, region, offset, (uint32_t)priority, release_after != 0,
                  deadline, ready, done, 0.0);
}

/* The submitted op filed as Client._ring_submit files it: its request id, the client's
 * unanswered ops, the ring's submission count. 1, or 0 with an error set. */
static int file_op(PyObject* client, PyObject* op, uint64_t id) {
  PyObject* rid = PyLong_FromUnsignedLongLong(id);
  PyObject* ops = rid ? PyObject_GetAttr(client, n_ring_ops) : NULL;
  int ok = ops != NULL && PyObject_SetAttr(op, n_request_id, rid) == 0 &&
           PyDict_SetItem(ops, rid, op) == 0;
  Py_XDECREF(ops);
  Py_XDECREF(rid);
  PyObject* counters = ok ? PyObject_GetAttr(client, n_counters) : NULL;
  PyObject* sent = counters ? PyObject_GetAttr(counters, n_sent) : NULL;
  PyObject* one = sent ? PyLong_FromLong(1) : NULL;
  PyObject* more = one ? PyNumber_Add(sent, one) : NULL;
  ok = more != NULL && PyObject_SetAttr(counters, n_sent, more) == 0;
  Py_XDECREF(more);
  Py_XDECREF(one);
  Py_XDECREF(sent);
  Py_XDECREF(counters);
  return ok;
}

/* The op for submit: `op` itself (its args set) or a new one; NULL with an error set. */
static PyObject* op_for(PyObject* client, int kind, PyObject* req, PyObject* op,
                        PyObject* target) {
  if (op == Py_None) return new_op(client, kind, req, target);
  if (PyObject_SetAttr(op, n_args, req) < 0) return NULL;
  Py_INCREF(op);
  return op;
}

/* submit(client, kind, args, op, target): see the module's doc. */
static PyObject* submit(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!bound() || !check_args("submit", nargs, 5)) return NULL;
  if (ring_op_type == NULL)
    return PyErr_Format(PyExc_RuntimeError, "offloadd._ring_fast: bind_client() first");
  PyObject *client = args[0], *req = args[2];
  long kind = PyLong_AsLong(args[1]);
  if (kind == -1 && PyErr_Occurred()) return NULL;
  if (kind < 0 || kind >= SUBMIT_KINDS || !PyTuple_Check(req) ||
      PyTuple_Size(req) != submit_args[kind])
    return PyErr_Format(PyExc_TypeError, "submit(): kind 0-2 and its args tuple");
  PyObject* owner = PyObject_GetAttr(client, n_owner_pid);
  if (owner == NULL) return NULL;
  long long pid = PyLong_AsLongLong(owner);
  Py_DECREF(owner);
  if (pid == -1 && PyErr_Occurred()) return NULL;
  if (pid != (long long)getpid()) Py_RETURN_NONE; /* Python's check says what to do */
  /* made before the lock is taken: an allocation may start a collection, and what a
   * collection frees may run code that takes the client's lock */
  PyObject* op = op_for(client, (int)kind, req, args[3], args[4]);
  PyObject* lock = op ? PyObject_GetAttr(client, n_lock) : NULL;
  int r = lock ? try_acquire(lock) : -1;
  if (r == 1) {
    offloadd_ring* ring = NULL;
    int error = 0;
    r = usable_ring(client, &ring);
    uint64_t id = r == 1 ? submit_one(client, ring, (int)kind, req, &error) : 0;
    if (r == 1 && error) { /* arguments not as expected: Python's path decides (and raises) */
      PyErr_Clear();
      r = 0;
    }
    if (r == 1) r = id == 0 ? 0 : file_op(client, op, id) ? 1 : -1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* the lock is let go whatever the submission raised */
    PyObject* done = PyObject_CallMethodObjArgs(lock, n_release, NULL);
    if (done == NULL) {
      r = -1;
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(tb);
    } else {
      PyErr_Restore(type, value, tb);
    }
    Py_XDECREF(done);
  }
  Py_XDECREF(lock);
  if (r == 1) return op;
  Py_XDECREF(op);
  if (r < 0) return NULL;
  Py_RETURN_NONE;
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
    {"bind_client", (PyCFunction)bind_client, METH_O,
     "bind_client(ring_op_type): offloadd.client._RingOp, once per process"},
    {"submit", (PyCFunction)(void (*)(void))submit, METH_FASTCALL,
     "submit(client, kind, args, op, target) -> the submitted op, or None: Python decides"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ring_fast",
    "The hot calls of offloadd's request ring, bound to the loaded liboffloadd_core.so.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ring_fast(void) { return PyModule_Create(&module); }
