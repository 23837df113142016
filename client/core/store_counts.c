/* offloadd._store_front, part nine: the per-tensor statistics in C (the type TensorCounts).
 *
 * Every offload the daemon answers and every reload an unpack takes is counted in its
 * context's statistics (offloadd.torch.OffloadStats). Those counts were a Python method call
 * each, the last Python frames of offloadd's code on the hooks' usual path per tensor. Here
 * they are C fields that the answers (store_answers.c) and the unpack (store_unpack.c) add to
 * directly; OffloadStats subclasses this type and keeps its other fields in Python.
 *
 *   TensorCounts()  all zero. Its fields, readable and writable attributes: offloaded,
 *          offloaded_bytes, reloaded, reloaded_bytes, prefetched_in_time,
 *          prefetched_in_time_bytes, waited, waited_bytes (ints: tensors, bytes; 64-bit
 *          signed), waited_seconds (float, seconds). FIELDS (class attribute) is the tuple of
 *          their names, in that order.
 *     add_offloaded(nbytes)  one tensor of nbytes (int >= 0) stored by the daemon.
 *     add_reloaded(nbytes, in_time, waited_seconds)  one tensor of nbytes (int >= 0)
 *          reloaded: prefetched in time when in_time is true, else waited for, waited_seconds
 *          (float >= 0) on the training thread.
 *          Both: TypeError for arguments of other types, ValueError for negative or NaN ones,
 *          OverflowError when a field would pass 2**63 - 1; nothing is counted then.
 *     counts() -> tuple of the fields' values, in FIELDS' order, read at one instant.
 *     reset_counts()  every field zero at one instant.
 * The arguments are converted first (which may call their __index__ or __bool__); the adds
 * themselves run under the GIL without releasing it or calling Python code, so each add is
 * seen whole or not at all by every other thread and by counts(); no lock is needed.
 *
 * The C callers count through counts_add_offloaded / counts_add_reloaded, which add to the
 * fields directly when the statistics object is a TensorCounts whose type did not replace the
 * method and whose instances have no __dict__. Otherwise they call the object's method, so a
 * subclass's override, a replacement patched on the class or on an instance, and any other
 * object's method run as they would from Python. */
#include "client/core/store_front.h"

#include "structmember.h"

enum {
  C_OFFLOADED, C_OFFLOADED_BYTES, C_RELOADED, C_RELOADED_BYTES, C_PREFETCHED_IN_TIME,
  C_PREFETCHED_IN_TIME_BYTES, C_WAITED, C_WAITED_BYTES, C_N_COUNTS
};

typedef struct {
  PyObject_HEAD
  long long n[C_N_COUNTS]; /* by the enum above */
  double waited_seconds;
} Counts;

PyTypeObject* CountsType;
static PyObject *c_add_offloaded, *c_add_reloaded;          /* the names */
static PyObject *c_offloaded_method, *c_reloaded_method;    /* TensorCounts' own methods */

/* Adds one tensor of nbytes to the fields `count` and `bytes`, all or nothing: 1, or 0 with
 * OverflowError set. */
static int add_one(Counts* c, int count, int bytes, long long nbytes) {
  long long n, b;
  if (__builtin_add_overflow(c->n[count], 1, &n) ||
      __builtin_add_overflow(c->n[bytes], nbytes, &b)) {
    PyErr_SetString(PyExc_OverflowError, "offloadd statistics: a count passed 2**63 - 1; "
                                         "reset() the statistics");
    return 0;
  }
  c->n[count] = n;
  c->n[bytes] = b;
  return 1;
}

static int add_offloaded(Counts* c, long long nbytes) {
  return add_one(c, C_OFFLOADED, C_OFFLOADED_BYTES, nbytes);
}

static int add_reloaded(Counts* c, long long nbytes, int in_time, double waited_seconds) {
  long long was[2] = {c->n[C_RELOADED], c->n[C_RELOADED_BYTES]}; /* undone on an overflow */
  if (!add_one(c, C_RELOADED, C_RELOADED_BYTES, nbytes)) return 0;
  int ok = in_time ? add_one(c, C_PREFETCHED_IN_TIME, C_PREFETCHED_IN_TIME_BYTES, nbytes)
                   : add_one(c, C_WAITED, C_WAITED_BYTES, nbytes);
  if (!ok) {
    c->n[C_RELOADED] = was[0];
    c->n[C_RELOADED_BYTES] = was[1];
    return 0;
  }
  if (!in_time) c->waited_seconds += waited_seconds;
  return 1;
}

/* nbytes (an int >= 0), else -1 with an error set. */
static long long nbytes_of(PyObject* o) {
  long long n = PyLong_AsLongLong(o);
  if (n < 0 && !PyErr_Occurred())
    PyErr_SetString(PyExc_ValueError, "offloadd statistics: nbytes must be >= 0");
  return n < 0 ? -1 : n;
}

static PyObject* counts_add_offloaded_method(PyObject* self, PyObject* const* args,
                                             Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_SetString(PyExc_TypeError, "add_offloaded(nbytes) takes one int");
    return NULL;
  }
  long long nbytes = nbytes_of(args[0]);
  if (nbytes < 0 || !add_offloaded((Counts*)self, nbytes)) return NULL;
  Py_RETURN_NONE;
}

static PyObject* counts_add_reloaded_method(PyObject* self, PyObject* const* args,
                                            Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError,
                    "add_reloaded(nbytes, in_time, waited_seconds) takes three arguments");
    return NULL;
  }
  long long nbytes = nbytes_of(args[0]);
  if (nbytes < 0) return NULL;
  int in_time = PyObject_IsTrue(args[1]);
  if (in_time < 0) return NULL;
  double waited = PyFloat_AsDouble(args[2]);
  if (waited == -1.0 && PyErr_Occurred()) return NULL;
  if (!(waited >= 0.0)) { /* NaN too */
    PyErr_SetString(PyExc_ValueError, "offloadd statistics: waited_seconds must be >= 0");
    return NULL;
  }
  if (!add_reloaded((Counts*)self, nbytes, in_time, waited)) return NULL;
  Py_RETURN_NONE;
}

static PyObject* counts_counts(PyObject* self, PyObject* unused) {
  Counts* c = (Counts*)self;
  PyObject* t = PyTuple_New(C_N_COUNTS + 1);
  if (t == NULL) return NULL;
  for (int i = 0; i < C_N_COUNTS; i++) {
    PyObject* v = PyLong_FromLongLong(c->n[i]);
    if (v == NULL || PyTuple_SetItem(t, i, v) < 0) {
      Py_DECREF(t);
      return NULL;
    }
  }
  PyObject* secs = PyFloat_FromDouble(c->waited_seconds);
  if (secs == NULL || PyTuple_SetItem(t, C_N_COUNTS, secs) < 0) {
    Py_DECREF(t);
    return NULL;
  }
  return t;
}

static PyObject* counts_reset(PyObject* self, PyObject* unused) {
  Counts* c = (Counts*)self;
  for (int i = 0; i < C_N_COUNTS; i++) c->n[i] = 0;
  c->waited_seconds = 0.0;
  Py_RETURN_NONE;
}

/* The last type seen whose instances have no __dict__ (held, so that its address is not
 * reused by another type while it is compared with). */
static PyObject* dictless_type;

/* Whether instances of `type` have no __dict__ (where an instance could replace a method). */
static int without_dict(PyObject* type) {
  if (type == dictless_type) return 1;
  PyObject* offset = PyObject_GetAttrString(type, "__dictoffset__");
  long long at = offset ? PyLong_AsLongLong(offset) : -1;
  Py_XDECREF(offset);
  if (at != 0) {
    PyErr_Clear();
    return 0;
  }
  PyObject* old = dictless_type;
  Py_INCREF(type);
  dictless_type = type;
  Py_XDECREF(old);
  return 1;
}

/* Whether `stats` counts here: a TensorCounts without an instance __dict__ whose type's method
 * `name` is still `own`. */
static int counted_here(PyObject* stats, PyObject* name, PyObject* own) {
  PyObject* type = (PyObject*)Py_TYPE(stats);
  if (!PyObject_TypeCheck(stats, CountsType) || !without_dict(type)) return 0;
  PyObject* found = PyObject_GetAttr(type, name);
  Py_XDECREF(found); /* compared by identity only: the type holds it */
  if (found == NULL) PyErr_Clear();
  return found == own;
}

int counts_add_offloaded(PyObject* stats, long long nbytes) {
  if (counted_here(stats, c_add_offloaded, c_offloaded_method))
    return add_offloaded((Counts*)stats, nbytes);
  PyObject* n = PyLong_FromLongLong(nbytes);
  PyObject* r = n ? PyObject_CallMethodObjArgs(stats, c_add_offloaded, n, NULL) : NULL;
  Py_XDECREF(n);
  Py_XDECREF(r);
  return r != NULL;
}

int counts_add_reloaded(PyObject* stats, long long nbytes, int in_time, double waited_seconds) {
  if (counted_here(stats, c_add_reloaded, c_reloaded_method))
    return add_reloaded((Counts*)stats, nbytes, in_time, waited_seconds);
  PyObject* n = PyLong_FromLongLong(nbytes);
  PyObject* secs = n ? PyFloat_FromDouble(waited_seconds) : NULL;
  PyObject* r = secs ? PyObject_CallMethodObjArgs(stats, c_add_reloaded, n,
                                                  in_time ? Py_True : Py_False, secs, NULL)
                     : NULL;
  Py_XDECREF(secs);
  Py_XDECREF(n);
  Py_XDECREF(r);
  return r != NULL;
}

static PyMethodDef counts_methods[] = {
    {"add_offloaded", (PyCFunction)(void (*)(void))counts_add_offloaded_method, METH_FASTCALL,
     "add_offloaded(nbytes): one tensor of nbytes stored by the daemon."},
    {"add_reloaded", (PyCFunction)(void (*)(void))counts_add_reloaded_method, METH_FASTCALL,
     "add_reloaded(nbytes, in_time, waited_seconds): one tensor reloaded, prefetched in time or "
     "waited for (waited_seconds on the training thread)."},
    {"counts", counts_counts, METH_NOARGS,
     "counts() -> the fields' values in FIELDS' order, read at one instant."},
    {"reset_counts", counts_reset, METH_NOARGS, "reset_counts(): every field zero."},
    {NULL, NULL, 0, NULL},
};

#define COUNT_MEMBER(name, i) \
  { name, T_LONGLONG, offsetof(Counts, n) + (i) * sizeof(long long), 0, NULL }
static PyMemberDef counts_members[] = {
    COUNT_MEMBER("offloaded", C_OFFLOADED),
    COUNT_MEMBER("offloaded_bytes", C_OFFLOADED_BYTES),
    COUNT_MEMBER("reloaded", C_RELOADED),
    COUNT_MEMBER("reloaded_bytes", C_RELOADED_BYTES),
    COUNT_MEMBER("prefetched_in_time", C_PREFETCHED_IN_TIME),
    COUNT_MEMBER("prefetched_in_time_bytes", C_PREFETCHED_IN_TIME_BYTES),
    COUNT_MEMBER("waited", C_WAITED),
    COUNT_MEMBER("waited_bytes", C_WAITED_BYTES),
    {"waited_seconds", T_DOUBLE, offsetof(Counts, waited_seconds), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot counts_slots[] = {
    {Py_tp_doc, "TensorCounts(): an offload context's per-tensor statistics, counted in C "
                "(offloadd.torch.OffloadStats subclasses it)."},
    {Py_tp_methods, counts_methods},
    {Py_tp_members, counts_members},
    {0, NULL},
};

static PyType_Spec counts_spec = {
    "offloadd._store_front.TensorCounts", sizeof(Counts), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, counts_slots,
};

static int add_field_names(PyObject* type) {
  PyObject* names = PyTuple_New(C_N_COUNTS + 1);
  for (int i = 0; names != NULL && i <= C_N_COUNTS; i++) {
    PyObject* n = PyUnicode_FromString(counts_members[i].name);
    if (n == NULL || PyTuple_SetItem(names, i, n) < 0) {
      Py_CLEAR(names);
    }
  }
  int ok = names != NULL && PyObject_SetAttrString(type, "FIELDS", names) == 0;
  Py_XDECREF(names);
  return ok;
}

int store_counts_add_type(PyObject* module) {
  if (!front_intern(&c_add_offloaded, "add_offloaded") ||
      !front_intern(&c_add_reloaded, "add_reloaded"))
    return 0;
  PyObject* type = PyType_FromSpec(&counts_spec);
  if (type == NULL) return 0;
  c_offloaded_method = PyObject_GetAttr(type, c_add_offloaded);
  c_reloaded_method = c_offloaded_method ? PyObject_GetAttr(type, c_add_reloaded) : NULL;
  if (c_reloaded_method == NULL || !add_field_names(type) ||
      PyModule_AddObject(module, "TensorCounts", type) < 0) {
    Py_DECREF(type);
    return 0;
  }
  CountsType = (PyTypeObject*)type;
  Py_INCREF(type); /* ours: the module's reference was taken by AddObject */
  return 1;
}
