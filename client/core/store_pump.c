/* offloadd._store_front, part six: a client's pump at a hook call in C (pump, pump_all).
 *
 * The torch hooks take the request ring's answers at every pack and unpack (Client.pump with
 * timeout 0): four Python calls (the pump, the ring's drain and its guard) and a dozen lines
 * around one drain and one take_answers, per hook call. This is the same in one C call.
 *
 *   pump_all(endpoints, batch, client_module) -> None: offloadd.torch._endpoint.pump in one
 *          call: pump(ep.client, batch, client_module._take_answers) for each value ``ep`` of
 *          the dict ``endpoints`` (a tuple of them taken first: a completion may change the
 *          dict) whose ``pid`` is this process's (an endpoint inherited through fork is the
 *          parent's: left alone). What a pump raises propagates, the endpoints after it not
 *          pumped (as from the Python loop). TypeError for arguments of other types.
 *
 *   pump(client, batch, take) -> int: the answers taken, as Client.pump(0.0) returns it, for an
 *          offloadd.client.Client. The usual case here: the ring in use through the
 *          offloadd._ring_fast binding, in the process that owns the client; each drain of at
 *          most ``batch`` answers (offloadd._native.DRAIN_BATCH), never sleeping; the daemon
 *          heard (Client._last_heard) and the answers counted (counters.ring_answers_received)
 *          as Client.pump does; under the client's lock (waited for, as there) the usual
 *          answers applied by ``take`` (offloadd.client._take_answers: take_answers, or None
 *          to leave every answer to Python) and the others made outcomes by
 *          Client._ring_outcomes_locked, those completed after the lock is let go
 *          (op._finish(value, exc)); again while a drain came back full. Anything else --
 *          another process, the ctypes binding, a ring closed by close() -- is Client.pump's:
 *          it is called and its result returned. Each drain names the ring's ``_carry``
 *          (answers an interrupted drain kept: returned first). A Python step that applies or
 *          completes the batch and raises (an interrupt at its start) is called once more and
 *          the batch finished before the first error propagates; what a second call, a drain
 *          or the lock raises propagates, as from Client.pump. */
#include <time.h>

#include "client/core/store_lane.h"

static PyObject *n_ring_native, *n_ring_ops, *n_owner_pid, *n_ring, *n_released, *n_fast,
    *n_drain, *n_last_heard, *n_counters, *n_received, *n_confirmed, *n_outcomes_locked,
    *n_finish, *n_pump, *n_client, *n_take_answers, *n_carry;

int store_pump_init(void) {
  return front_intern(&n_ring_native, "_ring_native") && front_intern(&n_ring_ops, "_ring_ops") &&
         front_intern(&n_owner_pid, "_owner_pid") && front_intern(&n_ring, "_ring") &&
         front_intern(&n_released, "_released") && front_intern(&n_fast, "_fast") &&
         front_intern(&n_drain, "drain") && front_intern(&n_last_heard, "_last_heard") &&
         front_intern(&n_counters, "counters") &&
         front_intern(&n_received, "ring_answers_received") &&
         front_intern(&n_confirmed, "_confirmed") &&
         front_intern(&n_outcomes_locked, "_ring_outcomes_locked") &&
         front_intern(&n_finish, "_finish") && front_intern(&n_pump, "pump") &&
         front_intern(&n_client, "client") &&
         front_intern(&n_take_answers, "_take_answers") && front_intern(&n_carry, "_carry");
}

/* The ring's drain function and pointer when the usual case applies: 1; 0 when Client.pump
 * must decide (or nothing is in flight: *idle set); -1 with an error set. */
static int usual(PyObject* client, PyObject** ring, PyObject** drain, PyObject** ptr,
                 int* idle) {
  *ring = PyObject_GetAttr(client, n_ring_native);
  PyObject* ops = *ring ? PyObject_GetAttr(client, n_ring_ops) : NULL;
  if (ops == NULL) return -1;
  *idle = *ring == Py_None || !PyDict_Check(ops) || PyDict_Size(ops) == 0;
  Py_DECREF(ops);
  if (*idle) return 0;
  PyObject* owner = PyObject_GetAttr(client, n_owner_pid);
  long long pid = owner ? PyLong_AsLongLong(owner) : -1;
  Py_XDECREF(owner);
  if (pid == -1 && PyErr_Occurred()) return -1;
  if (pid != lane_process_pid) return 0; /* Client.pump says what a forked child may do */
  int r = lane_attr_true(*ring, n_released);
  if (r != 0) return r < 0 ? -1 : 0;
  PyObject* fast = PyObject_GetAttr(*ring, n_fast);
  if (fast == NULL) return -1;
  if (fast != Py_None) *drain = PyObject_GetAttr(fast, n_drain);
  Py_DECREF(fast);
  if (*drain == NULL) return PyErr_Occurred() ? -1 : 0;
  if ((*ptr = PyObject_GetAttr(*ring, n_ring)) == NULL) return -1;
  return *ptr != Py_None;
}

/* client._last_heard = time.monotonic() (the same clock, CLOCK_MONOTONIC). */
static int heard(PyObject* client) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  PyObject* now = PyFloat_FromDouble((double)ts.tv_sec + ts.tv_nsec * 1e-9);
  int ok = now != NULL && PyObject_SetAttr(client, n_last_heard, now) == 0;
  Py_XDECREF(now);
  return ok;
}

static int count_received(PyObject* client, Py_ssize_t n) {
  PyObject* counters = PyObject_GetAttr(client, n_counters);
  int ok = counters != NULL && lane_attr_add(counters, n_received, n);
  Py_XDECREF(counters);
  return ok;
}

/* client._ring_outcomes_locked(left, ops), called once more when it raised (a signal
 * handler's exception at its first line, typically): the answers the first call applied
 * already have no op (counted as unknown then), the others are applied. The first error is
 * kept in `first`. NULL with an error set when the second call raises too. */
static PyObject* outcomes_of(PyObject* client, PyObject* left, PyObject* ops, PyObject* first[3]) {
  PyObject* r = PyObject_CallMethodObjArgs(client, n_outcomes_locked, left, ops, NULL);
  if (r != NULL) return r;
  lane_keep_first(first);
  return PyObject_CallMethodObjArgs(client, n_outcomes_locked, left, ops, NULL);
}

/* Under the client's lock: the batch counted and applied; the outcomes of the answers left
 * to Python (a new list, possibly empty), or NULL with an error set. An error of the Python
 * step is kept in `first` when a second call applied the batch. */
static PyObject* apply_locked(PyObject* client, PyObject* ring, PyObject* answers,
                              PyObject* take, PyObject* first[3]) {
  if (!count_received(client, PyList_Size(answers))) return NULL;
  PyObject* now = PyObject_GetAttr(client, n_ring_native);
  if (now == NULL) return NULL;
  Py_DECREF(now); /* compared by identity only: the client holds it */
  /* answers of a ring replaced meanwhile (a resume) name none of the new ring's ops */
  PyObject* ops = now == ring ? PyObject_GetAttr(client, n_ring_ops) : PyDict_New();
  PyObject* confirmed = ops ? PyObject_GetAttr(client, n_confirmed) : NULL;
  PyObject* left = NULL;
  if (confirmed != NULL) {
    if (take != Py_None && PyDict_Check(ops) && PyDict_Size(ops) > 0) {
      left = PyObject_CallFunctionObjArgs(take, answers, ops, confirmed, NULL);
    } else {
      left = answers;
      Py_INCREF(left);
    }
  }
  PyObject* outcomes = NULL;
  if (left != NULL)
    outcomes = PyList_Size(left) == 0 ? PyList_New(0) : outcomes_of(client, left, ops, first);
  Py_XDECREF(left);
  Py_XDECREF(confirmed);
  Py_XDECREF(ops);
  return outcomes;
}

/* The outcomes completed, outside the lock: (op, (value, exc)) -> op._finish(value, exc),
 * every one: an op whose _finish raised is finished once more (a second outcome of an op
 * already done is ignored), the first error kept in `first`. 0 with an error set when an
 * outcome is malformed or a second _finish raised too. */
static int finish(PyObject* outcomes, PyObject* first[3]) {
  Py_ssize_t n = PyList_Size(outcomes);
  int ok = 1;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* pair = PyList_GetItem(outcomes, i);
    PyObject *op, *value, *exc;
    if (!PyArg_ParseTuple(pair, "O(OO)", &op, &value, &exc)) return 0;
    PyObject* r = PyObject_CallMethodObjArgs(op, n_finish, value, exc, NULL);
    if (r == NULL) {
      lane_keep_first(first);
      r = PyObject_CallMethodObjArgs(op, n_finish, value, exc, NULL);
    }
    if (r == NULL) { /* kept too if no error came before: the others are finished first */
      lane_keep_first(first);
      ok = 0;
    }
    Py_XDECREF(r);
  }
  if (!ok) {
    PyErr_Restore(first[0], first[1], first[2]);
    first[0] = first[1] = first[2] = NULL;
  }
  return ok;
}

static void drop3(PyObject* e[3]) {
  for (int i = 0; i < 3; i++) Py_CLEAR(e[i]);
}

/* One drained batch handled: 1, or 0 with an error set. The answers are off the ring: an
 * interrupt while waiting for the client's lock (another thread may hold it long), or one at
 * the start of the Python steps that apply and complete them, is raised only after the batch
 * was applied and its outcomes completed, or they would never be. */
static int take_batch(PyObject* client, PyObject* ring, PyObject* answers, PyObject* take) {
  if (!heard(client)) return 0;
  PyObject* interrupt[3] = {NULL, NULL, NULL};
  PyObject* lock = lane_lock_surely(client, interrupt);
  if (lock == NULL) {
    drop3(interrupt);
    return 0;
  }
  PyObject* outcomes = apply_locked(client, ring, answers, take, interrupt);
  int ok = lane_unlock(lock); /* let go whatever the batch raised */
  ok = ok && outcomes != NULL && finish(outcomes, interrupt);
  Py_XDECREF(outcomes);
  if (ok && interrupt[0] != NULL) {
    PyErr_Restore(interrupt[0], interrupt[1], interrupt[2]);
    return 0;
  }
  drop3(interrupt);
  return ok;
}

static PyObject* drain_all(PyObject* client, PyObject* ring, PyObject* drain, PyObject* ptr,
                           PyObject* batch, PyObject* take) {
  Py_ssize_t full = PyLong_AsSsize_t(batch);
  if (full == -1 && PyErr_Occurred()) return NULL;
  PyObject* carry = PyObject_GetAttr(ring, n_carry); /* what an interrupted drain kept */
  PyObject* zero = carry ? PyFloat_FromDouble(0.0) : NULL;
  if (zero == NULL) {
    Py_XDECREF(carry);
    return NULL;
  }
  Py_ssize_t taken = 0;
  int more = 1, ok = 1;
  while (ok && more) {
    PyObject* answers = PyObject_CallFunctionObjArgs(drain, ptr, batch, zero, carry, NULL);
    if (answers == NULL) {
      ok = 0;
    } else if (!PyList_Check(answers) || PyList_Size(answers) == 0) {
      more = 0; /* nothing there, or None: the ring closed */
    } else {
      Py_ssize_t n = PyList_Size(answers);
      taken += n;
      ok = take_batch(client, ring, answers, take);
      more = n >= full;
    }
    Py_XDECREF(answers);
  }
  Py_DECREF(zero);
  Py_DECREF(carry);
  return ok ? PyLong_FromSsize_t(taken) : NULL;
}

static PyObject* pump_one(PyObject* client, PyObject* batch, PyObject* take) {
  PyObject *ring = NULL, *drain = NULL, *ptr = NULL;
  int idle = 0;
  int r = usual(client, &ring, &drain, &ptr, &idle);
  PyObject* result = NULL;
  if (r == 1)
    result = drain_all(client, ring, drain, ptr, batch, take);
  else if (r == 0 && idle)
    result = PyLong_FromLong(0);
  else if (r == 0)
    result = PyObject_CallMethodObjArgs(client, n_pump, NULL);
  Py_XDECREF(ring);
  Py_XDECREF(drain);
  Py_XDECREF(ptr);
  return result;
}

PyObject* store_pump(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyLong_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "pump(client, batch: int, take)");
    return NULL;
  }
  return pump_one(args[0], args[1], args[2]);
}

PyObject* store_pump_all(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyDict_Check(args[0]) || !PyLong_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "pump_all(endpoints: dict, batch: int, client_module)");
    return NULL;
  }
  PyObject* values = PyDict_Values(args[0]);
  PyObject* take = values ? PyObject_GetAttr(args[2], n_take_answers) : NULL;
  int ok = take != NULL;
  Py_ssize_t n = ok ? PyList_Size(values) : 0;
  for (Py_ssize_t i = 0; ok && i < n; i++) {
    PyObject* ep = PyList_GetItem(values, i); /* the list is ours: no one changes it */
    int own = lane_own_endpoint(ep);
    PyObject* client = own == 1 ? PyObject_GetAttr(ep, n_client) : NULL;
    PyObject* taken = client ? pump_one(client, args[1], take) : NULL;
    ok = own == 0 || taken != NULL;
    Py_XDECREF(taken);
    Py_XDECREF(client);
  }
  Py_XDECREF(take);
  Py_XDECREF(values);
  if (!ok) return NULL;
  Py_RETURN_NONE;
}
