/* offloadd._store_front, part eight: the unpack hook's reload of a claimed handle, in C.
 *
 * Once the unpack hook (store_hooks.c) holds a handle's reload claim, Store._reload_claimed
 * makes its reload urgent when none was sent, prefetches what backward unpacks next
 * (Store._prefetch_before), finishes the reload (the lane's finish, or the transport's wait for
 * the answer), clears the handle's reload under the store's lock and counts it
 * (stats.add_reloaded). Three Python frames and a dozen attribute look-ups around the C calls
 * that do the work (the front's prefetch_candidates, the lanes' reload and finish). Here the
 * usual path runs in C:
 *
 *   hooks_reload_claimed(store, front, store_dict, prefetch_priority, recoverable, saved)
 *          -> the tensor, or what store._reload_claimed(saved) returns (_AGAIN included).
 *          store_dict: the store's instance dict (a method replaced there by an instance
 *          attribute is what runs); prefetch_priority: offloadd.client.PREFETCH; recoverable:
 *          the store module's _RECOVERABLE (a tuple of exception classes).
 *
 * The usual path: the handle has no result yet, its reload was sent (``saved.reload``, by a
 * prefetch), its device's lane is an OffloadLane, and none of ``_reload_claimed``,
 * ``_prefetch_before``, ``_start_reload`` and ``_reload_finish`` is replaced in the store's
 * instance dict (a replacement on the class, or a subclass's method, is not looked for). Then,
 * as the Python does:
 *   - the prefetch: under the store's lock ``_last_unpacked_seq`` becomes the handle's seq and,
 *     unless ``prefetch`` <= 0 (compared as Python compares it: a float is a count too), the
 *     front's prefetch_candidates(seq, previous, prefetch,
 *     _unused_offsets) are taken; outside the lock each is reloaded PREFETCH by its lane
 *     (OffloadLane.reload), or by ``store._start_reload(o, PREFETCH)`` when there is no lane or
 *     it declines; an error of ``recoverable`` there is dropped (that handle's unpack will try
 *     URGENT and report);
 *   - the reload prefetched in time: its outcome done and its priority PREFETCH;
 *   - the lane's finish(reload, saved); when it declines (the answer has not come, or the reload
 *     failed), ``store._reload_finish(saved, reload, in_time, t0)`` waits in Python and does
 *     the rest; t0 from CLOCK_MONOTONIC, time.monotonic's clock;
 *   - under the store's lock the handle's reload cleared, its block too when the reload had
 *     ``release_after`` (the daemon freed it), and the tensor kept as its result (so that an
 *     unpack after a count that raised finds it); then its count, as
 *     ``stats.add_reloaded(nbytes, in_time, waited_seconds)`` would (store_counts.c: in C for
 *     the store's OffloadStats).
 * An error of ``recoverable`` from the prefetch or the finish goes to
 * ``store._reload_raised(saved, error)`` (a DATA_LOSS, or the daemon given up), as from the
 * Python's except clause; any other error propagates. Anything else is
 * ``store._reload_claimed(saved)``. */
#include <time.h>

#include "client/core/store_lane.h"

static PyObject* zero; /* the int 0, made at import */
static PyObject *u_reload_claimed, *u_prefetch_before, *u_last_unpacked_seq, *u_prefetch,
    *u_unused_offsets, *u_lanes, *u_start_reload, *u_reload_finish, *u_reload_raised,
    *u_release_after, *u_done_outcome, *u_priority, *u_stats;

int store_unpack_init(void) {
  return front_intern(&u_reload_claimed, "_reload_claimed") &&
         front_intern(&u_prefetch_before, "_prefetch_before") &&
         front_intern(&u_last_unpacked_seq, "_last_unpacked_seq") &&
         front_intern(&u_prefetch, "prefetch") &&
         front_intern(&u_unused_offsets, "_unused_offsets") && front_intern(&u_lanes, "_lanes") &&
         front_intern(&u_start_reload, "_start_reload") &&
         front_intern(&u_reload_finish, "_reload_finish") &&
         front_intern(&u_reload_raised, "_reload_raised") &&
         front_intern(&u_release_after, "release_after") &&
         front_intern(&u_done_outcome, "done") && front_intern(&u_priority, "priority") &&
         front_intern(&u_stats, "stats") &&
         (zero = PyLong_FromLong(0)) != NULL;
}

typedef struct {
  PyObject *store, *front, *dict, *prefetch_priority, *recoverable;
} Unpack;

static double monotonic_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 1 when the store's instance dict replaces method ``name``, 0 when not, -1 with an error. */
static int replaced(const Unpack* u, PyObject* name) {
  if (u->dict == NULL) return 0;
  PyObject* v = PyDict_GetItemWithError(u->dict, name); /* borrowed */
  return v != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
}

/* The OffloadLane of ``device`` (a new reference), or NULL: with an error set, or without one
 * when the store has no lane of that device. */
static PyObject* lane_of(const Unpack* u, PyObject* device) {
  PyObject* lanes = PyObject_GetAttr(u->store, u_lanes);
  if (lanes == NULL) return NULL;
  PyObject* lane = NULL;
  if (PyDict_Check(lanes) && PyDict_Size(lanes) > 0) {
    lane = PyDict_GetItemWithError(lanes, device ? device : Py_None); /* borrowed */
    if (lane != NULL && Py_TYPE(lane) == LaneType)
      Py_INCREF(lane);
    else
      lane = NULL;
  }
  Py_DECREF(lanes);
  return lane;
}

/* ---- the prefetch ---------------------------------------------------------------------------- */
/* Under the store's lock: the handles to prefetch (a new list; None when prefetch is off). */
static PyObject* candidates_locked(const Unpack* u, Saved* s) {
  PyObject* previous = PyObject_GetAttr(u->store, u_last_unpacked_seq);
  PyObject* seq = previous ? PyLong_FromLongLong(s->seq) : NULL;
  int ok = seq != NULL && PyObject_SetAttr(u->store, u_last_unpacked_seq, seq) == 0;
  PyObject* prefetch = ok ? PyObject_GetAttr(u->store, u_prefetch) : NULL;
  int off = prefetch ? PyObject_RichCompareBool(prefetch, zero, Py_LE) : -1; /* as <= 0 */
  PyObject* todo = NULL;
  if (off >= 0) {
    if (off) {
      todo = Py_None;
      Py_INCREF(todo);
    } else {
      PyObject* unused = PyObject_GetAttr(u->store, u_unused_offsets);
      PyObject* const args[] = {seq, previous, prefetch, unused};
      todo = unused ? front_prefetch_candidates_of(u->front, args, 4) : NULL;
      Py_XDECREF(unused);
    }
  }
  Py_XDECREF(prefetch);
  Py_XDECREF(seq);
  Py_XDECREF(previous); /* under the lock: an int or None, whose release runs no code */
  return todo;
}

/* Handle o reloaded PREFETCH (Store._start_reload's usual path: its lane first): 1, or 0 with
 * an error set. */
static int prefetch_one(const Unpack* u, PyObject* o) {
  PyObject* lane = Py_TYPE(o) == SavedType ? lane_of(u, ((Saved*)o)->device) : NULL;
  if (lane == NULL && PyErr_Occurred()) return 0;
  PyObject* rl = NULL;
  if (lane != NULL) {
    PyObject* const args[] = {o, u->prefetch_priority};
    rl = lane_reload(lane, args, 2);
    Py_DECREF(lane);
    if (rl == NULL) return 0;
  }
  if (rl == NULL || rl == Py_None) {
    Py_XDECREF(rl);
    rl = PyObject_CallMethodObjArgs(u->store, u_start_reload, o, u->prefetch_priority, NULL);
  }
  Py_XDECREF(rl);
  return rl != NULL;
}

/* Store._prefetch_before(s): 1, or 0 with an error set. */
static int prefetch_before(const Unpack* u, Saved* s) {
  PyObject* lock = lane_lock(u->store);
  if (lock == NULL) return 0;
  PyObject* todo = candidates_locked(u, s);
  int ok = lane_unlock(lock) && todo != NULL;
  Py_ssize_t n = ok && todo != Py_None ? PyList_Size(todo) : 0;
  for (Py_ssize_t i = 0; ok && i < n; i++) {
    if (!prefetch_one(u, PyList_GetItem(todo, i))) {
      ok = PyErr_ExceptionMatches(u->recoverable) > 0; /* that unpack tries URGENT */
      if (ok) PyErr_Clear();
    }
  }
  Py_XDECREF(todo);
  return ok;
}

/* ---- the reload's end ------------------------------------------------------------------------ */
/* The Python's tail, after the finish: the handle's reload (and block, when the daemon freed it)
 * cleared under the store's lock, the statistics counted, the result kept: t, or NULL. */
static PyObject* reloaded(const Unpack* u, Saved* s, PyObject* rl, PyObject* t, int in_time,
                          double t0) {
  double waited = monotonic_seconds() - t0;
  int freed = lane_attr_true(rl, u_release_after);
  PyObject* lock = freed >= 0 ? lane_lock(u->store) : NULL;
  if (lock == NULL) return NULL;
  PyObject *old_reload = s->reload, *old_block = NULL, *old_result = s->result;
  Py_INCREF(Py_None);
  s->reload = Py_None;
  if (freed) {
    old_block = s->block_id;
    Py_INCREF(Py_None);
    s->block_id = Py_None;
  }
  Py_INCREF(t);
  s->result = t; /* kept before the count: an unpack after a failed count finds it */
  int ok = lane_unlock(lock);
  Py_XDECREF(old_reload); /* after the lock: a last reference's release may run code */
  Py_XDECREF(old_block);
  Py_XDECREF(old_result);
  PyObject* stats = ok ? PyObject_GetAttr(u->store, u_stats) : NULL;
  ok = stats != NULL && counts_add_reloaded(stats, s->nbytes, in_time, waited);
  Py_XDECREF(stats);
  if (!ok) return NULL;
  Py_INCREF(t);
  return t;
}

/* The reload prefetched in time: its outcome done and its priority PREFETCH (1, 0, -1). */
static int in_time_of(const Unpack* u, PyObject* rl) {
  PyObject* outcome = PyObject_GetAttr(rl, u_done_outcome);
  int r = outcome ? lane_attr_true(outcome, n_done) : -1;
  Py_XDECREF(outcome);
  if (r != 1) return r;
  PyObject* priority = PyObject_GetAttr(rl, u_priority);
  r = priority ? PyObject_RichCompareBool(priority, u->prefetch_priority, Py_EQ) : -1;
  Py_XDECREF(priority);
  return r;
}

/* What the prefetch or the finish raised, as the Python's except clause takes it. */
static PyObject* raised(const Unpack* u, Saved* s) {
  if (PyErr_ExceptionMatches(u->recoverable) <= 0) return NULL;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  Py_XDECREF(type);
  Py_XDECREF(tb); /* the traceback keeps the frames of the reload: dropped, as there */
  if (value == NULL) return NULL;
  PyObject* r = PyObject_CallMethodObjArgs(u->store, u_reload_raised, (PyObject*)s, value, NULL);
  Py_DECREF(value);
  return r;
}

/* The prefetch, the finish and the tail of s's sent reload rl through lane (the usual path). */
static PyObject* reload_sent(const Unpack* u, Saved* s, PyObject* rl, PyObject* lane) {
  PyObject* t = NULL;
  int in_time = -1;
  double t0 = 0;
  if (prefetch_before(u, s) && (in_time = in_time_of(u, rl)) >= 0) {
    t0 = monotonic_seconds();
    PyObject* const args[] = {rl, (PyObject*)s};
    t = lane_finish(lane, args, 2);
  }
  if (t == NULL) return raised(u, s);
  if (t == Py_None) { /* not answered yet, or failed: Python waits and reports */
    Py_DECREF(t);
    PyObject* a = PyBool_FromLong(in_time);
    PyObject* b = PyFloat_FromDouble(t0);
    t = a && b ? PyObject_CallMethodObjArgs(u->store, u_reload_finish, (PyObject*)s, rl, a, b,
                                            NULL)
               : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    return t;
  }
  PyObject* r = reloaded(u, s, rl, t, in_time, t0);
  Py_DECREF(t);
  return r;
}

/* The usual path (a sent reload, a lane, nothing replaced): 1 with *rl and *lane set; 0 when
 * Python's; -1 with an error set. */
static int usual(const Unpack* u, Saved* s, PyObject** rl, PyObject** lane) {
  if (s->result != NULL && s->result != Py_None) return 0;
  if (s->reload == NULL || s->reload == Py_None) return 0;
  PyObject* const names[] = {u_reload_claimed, u_prefetch_before, u_start_reload,
                             u_reload_finish};
  for (int i = 0; i < 4; i++) {
    int r = replaced(u, names[i]);
    if (r != 0) return r > 0 ? 0 : -1;
  }
  if ((*lane = lane_of(u, s->device)) == NULL) return PyErr_Occurred() ? -1 : 0;
  *rl = s->reload;
  Py_INCREF(*rl);
  return 1;
}

PyObject* hooks_reload_claimed(PyObject* store, PyObject* front, PyObject* store_dict,
                               PyObject* prefetch_priority, PyObject* recoverable, Saved* s) {
  const Unpack u = {store, front, store_dict, prefetch_priority, recoverable};
  PyObject *rl = NULL, *lane = NULL;
  int r = usual(&u, s, &rl, &lane);
  if (r < 0) return NULL;
  if (r == 0) return PyObject_CallMethodObjArgs(store, u_reload_claimed, (PyObject*)s, NULL);
  PyObject* t = reload_sent(&u, s, rl, lane);
  Py_DECREF(rl);
  Py_DECREF(lane);
  return t;
}
