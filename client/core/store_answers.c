/* offloadd._store_front, part two: the request ring's answers applied in C.
 *
 * offloadd.client.Client.pump takes a batch of answers from its session's request ring (the
 * tuples of offloadd._ring_fast.drain) and, holding the client's lock, hands them here first.
 * What Python did per answer -- an outcome's record, its completion, and for an offload of the
 * torch hooks the store's callback, the transport's finish and the statistics: a dozen Python
 * calls -- is done here for the usual answers; the rest goes back to the Python path unchanged.
 *
 *   bind_answers(kinds, flags, answer_types, outcome_lock, ring_op_type)   once per process,
 *          by offloadd.client: kinds = (OFFLOAD_DONE, RELOAD_DONE, RELEASED), the ring's answer
 *          kinds; flags = (FLAG_RELEASED, FLAG_DONE_EVENT_RECORDED); answer_types =
 *          (OffloadAnswer, ReloadAnswer, ReleaseAnswer), the classes of the answer records;
 *          outcome_lock = offloadd._outcome.Outcome._lock; ring_op_type = offloadd.client._RingOp
 *          (only ops of exactly that class are taken here: their fields are slots, read without
 *          running Python code). None. RuntimeError when called again with other values;
 *          TypeError for arguments of another shape.
 *   (in C, for the lanes: answers_add_done_callback, answers_reload_outcome, store_front.h)
 *   take_answers(answers, ops, confirmed) -> list of the answers left to the caller, in order
 *          (a new list). answers: list of drain tuples (request_id, kind, status_code,
 *          block_id, bytes, queued_seconds, copy_seconds, flags, message); ops: the client's
 *          dict ring request id -> _RingOp; confirmed: the client's set of confirmed block ids.
 *          RuntimeError before bind_answers.
 *
 * An answer is taken here when it is a success of the kind its op asked for, and the op is not
 * done, no thread waits on it (no event) and it has no callbacks -- or, for an offload, exactly
 * one callback (the store's) and a ``target``: (weak reference to the handle that sent it, the
 * list of free IPC events of its transport), whose handle is still OFFLOADING with nothing
 * attached (no reload waiting for this answer, not used from the device meanwhile, its source
 * not modified in place since it was sent). Taking it does what the Python path does: the op
 * gets its answer record and is done, it leaves ``ops``, and ``confirmed`` is kept as for the
 * stream (_ring_outcome_locked); for a target, what Store._offload_done and
 * CudaIpcTransport.finish_offload do: the handle becomes OFFLOADED with its block, the
 * offload's event goes back to the free list, its source tensor is let go, the store's
 * statistics count the bytes (as stats.add_offloaded would: in C for the store's OffloadStats,
 * store_counts.c), and the callback is dropped unrun.
 *
 * Locks: the caller holds the client's lock. The handle's store lock and Outcome's lock are
 * tried, never waited for: when another thread holds either (it may be half way through
 * changing the op or the handle), the answer is left to the Python path. Nothing is written
 * before both are held and the conditions are read again under them; nothing that may run
 * Python code (an allocation that starts a collection, a release of the last reference to an
 * object) happens while they are held. An error after the writes (a MemoryError adding to a
 * set) is reported as unraisable and the answer counts as taken: it was applied. */
#include "client/core/store_lane.h"

enum { OFFLOAD_ANSWER, RELOAD_ANSWER, RELEASE_ANSWER, ANSWER_KINDS };
#define ANSWER_FIELDS 9 /* the drain tuple's length */

static struct {
  int bound;
  long kinds[ANSWER_KINDS];
  long flag_released, flag_done_event;
  PyObject* types[ANSWER_KINDS];
  PyObject* outcome_lock;
  PyObject* ring_op_type;
} g;

static PyObject* op_kinds[ANSWER_KINDS]; /* _RingOp.kind: "offload", "reload", "release" */
static PyObject *a_kind, *a_args, *a_target, *a_done, *a_value, *a_exc, *a_callbacks, *a_event,
    *a_lock, *a_stats, *a_future, *a_tensor, *a_acquire, *a_release,
    *a_version, *a_op_event, *a_add_done_callback, *a_client, *a_request_id;
static PyObject *f_block_id, *f_bytes, *f_queued, *f_copy, *f_released, *f_done_event;

int store_answers_init(void) {
  return front_intern(&op_kinds[OFFLOAD_ANSWER], "offload") &&
         front_intern(&op_kinds[RELOAD_ANSWER], "reload") &&
         front_intern(&op_kinds[RELEASE_ANSWER], "release") && front_intern(&a_kind, "kind") &&
         front_intern(&a_args, "args") && front_intern(&a_target, "target") &&
         front_intern(&a_done, "_done") && front_intern(&a_value, "_value") &&
         front_intern(&a_exc, "_exc") && front_intern(&a_callbacks, "_callbacks") &&
         front_intern(&a_event, "_event") && front_intern(&a_lock, "_lock") &&
         front_intern(&a_stats, "stats") &&
         front_intern(&a_future, "future") && front_intern(&a_tensor, "tensor") &&
         front_intern(&a_acquire, "acquire") && front_intern(&a_release, "release") &&
         front_intern(&a_version, "_version") && front_intern(&a_op_event, "event") &&
         front_intern(&a_add_done_callback, "add_done_callback") &&
         front_intern(&a_client, "client") && front_intern(&a_request_id, "request_id") &&
         front_intern(&f_block_id, "block_id") && front_intern(&f_bytes, "bytes") &&
         front_intern(&f_queued, "queued_seconds") && front_intern(&f_copy, "copy_seconds") &&
         front_intern(&f_released, "released") &&
         front_intern(&f_done_event, "done_event_recorded");
}

/* ---- bind_answers ---------------------------------------------------------------------------- */
static int long_items(PyObject* t, Py_ssize_t n, long* out) {
  if (!PyTuple_Check(t) || PyTuple_Size(t) != n) {
    PyErr_Format(PyExc_TypeError, "offloadd._store_front: a tuple of %zd ints is required", n);
    return 0;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    out[i] = PyLong_AsLong(PyTuple_GetItem(t, i));
    if (out[i] == -1 && PyErr_Occurred()) return 0;
  }
  return 1;
}

PyObject* store_answers_bind(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  long kinds[ANSWER_KINDS], flags[2];
  if (nargs != 5) {
    PyErr_Format(PyExc_TypeError, "bind_answers() takes 5 arguments (%zd given)", nargs);
    return NULL;
  }
  if (!PyType_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError, "bind_answers(): ring_op_type is a class");
    return NULL;
  }
  if (!long_items(args[0], ANSWER_KINDS, kinds) || !long_items(args[1], 2, flags)) return NULL;
  PyObject *types = args[2], *lock = args[3];
  if (!PyTuple_Check(types) || PyTuple_Size(types) != ANSWER_KINDS) {
    PyErr_SetString(PyExc_TypeError, "bind_answers(): answer_types is a tuple of 3 classes");
    return NULL;
  }
  for (int i = 0; i < ANSWER_KINDS; i++) {
    if (!PyType_Check(PyTuple_GetItem(types, i))) {
      PyErr_SetString(PyExc_TypeError, "bind_answers(): answer_types is a tuple of 3 classes");
      return NULL;
    }
  }
  if (g.bound) {
    int same = g.outcome_lock == lock && g.ring_op_type == args[4] &&
               g.flag_released == flags[0] && g.flag_done_event == flags[1];
    for (int i = 0; i < ANSWER_KINDS; i++)
      same = same && g.kinds[i] == kinds[i] && g.types[i] == PyTuple_GetItem(types, i);
    if (!same) {
      PyErr_SetString(PyExc_RuntimeError, "offloadd._store_front: bound to another client "
                                          "module's answers already");
      return NULL;
    }
    Py_RETURN_NONE;
  }
  for (int i = 0; i < ANSWER_KINDS; i++) {
    g.kinds[i] = kinds[i];
    g.types[i] = PyTuple_GetItem(types, i);
    Py_INCREF(g.types[i]);
  }
  g.flag_released = flags[0];
  g.flag_done_event = flags[1];
  Py_INCREF(lock);
  g.outcome_lock = lock;
  Py_INCREF(args[4]);
  g.ring_op_type = args[4];
  g.bound = 1;
  Py_RETURN_NONE;
}

/* ---- small helpers --------------------------------------------------------------------------- */
static int is_none(PyObject* o) { return o == NULL || o == Py_None; }

/* 1 when attribute `name` of o is None (or unset), 0 when not, -1 with an error set. */
static int attr_is_none(PyObject* o, PyObject* name) {
  PyObject* v = PyObject_GetAttr(o, name);
  if (v == NULL) return -1;
  int r = v == Py_None;
  Py_DECREF(v);
  return r;
}

/* lock.acquire(False): 1 when taken, 0 when another thread holds it, -1 with an error set. */
static int try_acquire(PyObject* lock) {
  PyObject* r = PyObject_CallMethodObjArgs(lock, a_acquire, Py_False, NULL);
  if (r == NULL) return -1;
  int taken = PyObject_IsTrue(r);
  Py_DECREF(r);
  return taken;
}

static void release(PyObject* lock) {
  PyObject* r = PyObject_CallMethodObjArgs(lock, a_release, NULL);
  if (r == NULL) PyErr_WriteUnraisable(lock);
  Py_XDECREF(r);
}

/* A new answer record of class types[which] with `n` fields named `names` (no __init__ run:
 * the classes are plain records with __slots__). */
static PyObject* record(int which, PyObject* const* names, PyObject* const* values, int n) {
  PyObject* empty = PyTuple_New(0);
  if (empty == NULL) return NULL;
  PyObject* r = PyType_GenericNew((PyTypeObject*)g.types[which], empty, NULL);
  Py_DECREF(empty);
  for (int i = 0; r != NULL && i < n; i++) {
    if (PyObject_SetAttr(r, names[i], values[i]) < 0) Py_CLEAR(r);
  }
  return r;
}

/* The answer record of drain tuple `a` for an op of kind `which` (release_block: the block id
 * the release asked for, which its record names), as _ring_outcome_locked builds it. */
static PyObject* answer_record(int which, PyObject* a, PyObject* release_block, long flags) {
  PyObject* block = PyTuple_GetItem(a, 3);
  if (which == OFFLOAD_ANSWER) {
    PyObject* names[] = {f_block_id, f_bytes, f_queued, f_copy};
    PyObject* values[] = {block, PyTuple_GetItem(a, 4), PyTuple_GetItem(a, 5),
                          PyTuple_GetItem(a, 6)};
    return record(which, names, values, 4);
  }
  if (which == RELOAD_ANSWER) {
    PyObject* names[] = {f_block_id, f_bytes, f_released, f_copy, f_done_event};
    PyObject* values[] = {block, PyTuple_GetItem(a, 4),
                          (flags & g.flag_released) ? Py_True : Py_False,
                          PyTuple_GetItem(a, 6),
                          (flags & g.flag_done_event) ? Py_True : Py_False};
    return record(which, names, values, 5);
  }
  PyObject* names[] = {f_block_id};
  PyObject* values[] = {release_block};
  return record(which, names, values, 1);
}

/* ---- one answer ------------------------------------------------------------------------------ */
typedef struct {
  int which;       /* OFFLOAD_ANSWER, RELOAD_ANSWER or RELEASE_ANSWER */
  long flags;      /* the answer's flags */
  PyObject* op;    /* the _RingOp */
  PyObject* callbacks;  /* its callbacks when read (None, or the store's one) */
  PyObject* callback;   /* that one callback (borrowed from the list, which t holds), or NULL */
  PyObject* target;     /* (weakref to the handle, free events list), or NULL */
  Saved* saved;         /* the handle, or NULL */
  PyObject* offload;    /* the handle's OffloadOp (its `op` field), or NULL */
  PyObject* store_lock; /* the handle's store's lock, or NULL */
  PyObject* release_block; /* a release's block id, or NULL */
  PyObject* answer;        /* the record */
} Take;

static void take_clear(Take* t) {
  Py_CLEAR(t->callbacks);
  Py_CLEAR(t->target);
  Py_CLEAR(t->saved);
  Py_CLEAR(t->offload);
  Py_CLEAR(t->store_lock);
  Py_CLEAR(t->release_block);
  Py_CLEAR(t->answer);
}

/* 1 when the op may be completed here (read again under the locks), 0 when not, -1 on error. */
static int op_open(Take* t) {
  PyObject* done = PyObject_GetAttr(t->op, a_done);
  if (done == NULL) return -1;
  int r = PyObject_IsTrue(done);
  Py_DECREF(done);
  if (r != 0) return r < 0 ? -1 : 0;
  if ((r = attr_is_none(t->op, a_event)) != 1) return r;
  if ((r = attr_is_none(t->op, a_exc)) != 1) return r;
  PyObject* callbacks = PyObject_GetAttr(t->op, a_callbacks);
  if (callbacks == NULL) return -1;
  /* the same list with the same one callback: add_done_callback appends to it in place */
  r = callbacks == t->callbacks &&
      (t->callback == NULL ||
       (PyList_Size(callbacks) == 1 && PyList_GetItem(callbacks, 0) == t->callback));
  Py_DECREF(callbacks);
  return r;
}

/* 1 when handle t->saved may take its block here, 0 when not: its C fields alone (read again
 * under the locks, where no Python code may run). */
static int saved_open(Take* t) {
  Saved* s = t->saved;
  return !s->dead && s->state == OFFLOADING && !s->served && is_none(s->reload) &&
         s->op == t->offload;
}

/* 1 when the handle's offload is the one this op answers (OffloadOp.future, set when it was
 * made and never changed), 0 when not, -1 on error. Read before the locks. */
static int offload_of_op(Take* t) {
  PyObject* future = PyObject_GetAttr(t->offload, a_future);
  if (future == NULL) return -1;
  int r = future == t->op;
  Py_DECREF(future);
  return r;
}

/* The source tensor the offload read was not modified in place since it was sent (the version
 * check of Store._offload_done): 1, 0 when it was (or may have been), -1 on error. */
static int source_unchanged(Take* t) {
  Saved* s = t->saved;
  if (!is_none(s->modified)) return 1; /* noted already: nothing more to note */
  PyObject* source = PyObject_GetAttr(t->offload, a_tensor);
  if (source == NULL) return -1;
  int r = 1;
  if (source != Py_None) {
    if (is_none(s->sent_version)) {
      r = 0;
    } else {
      PyObject* v = PyObject_GetAttr(source, a_version);
      r = v == NULL ? -1 : PyObject_RichCompareBool(v, s->sent_version, Py_EQ);
      Py_XDECREF(v);
    }
  }
  Py_DECREF(source);
  return r;
}

/* Reads what taking the answer needs (t->op and t->which set): 1 ready, 0 leave it, -1 error. */
static int take_prepare(Take* t, PyObject* a) {
  PyObject* kind = PyObject_GetAttr(t->op, a_kind);
  if (kind == NULL) return -1;
  int r = PyObject_RichCompareBool(kind, op_kinds[t->which], Py_EQ);
  Py_DECREF(kind);
  if (r != 1) return r;
  if ((t->callbacks = PyObject_GetAttr(t->op, a_callbacks)) == NULL) return -1;
  if ((r = op_open(t)) != 1) return r;
  if (t->callbacks != Py_None) {
    if (t->which != OFFLOAD_ANSWER || !PyList_Check(t->callbacks) ||
        PyList_Size(t->callbacks) != 1)
      return 0;
    t->callback = PyList_GetItem(t->callbacks, 0);
    if ((t->target = PyObject_GetAttr(t->op, a_target)) == NULL) return -1;
    if (!PyTuple_Check(t->target) || PyTuple_Size(t->target) != 2 ||
        !PyWeakref_CheckRef(PyTuple_GetItem(t->target, 0)) ||
        !PyList_Check(PyTuple_GetItem(t->target, 1)))
      return 0;
    PyObject* handle = PyWeakref_GetObject(PyTuple_GetItem(t->target, 0));
    if (handle == NULL) return -1;
    if (Py_TYPE(handle) != SavedType) return 0; /* the handle died: _offload_orphaned's */
    Py_INCREF(handle);
    t->saved = (Saved*)handle;
    if (is_none(t->saved->op)) return 0;
    t->offload = t->saved->op;
    Py_INCREF(t->offload);
    if (!saved_open(t)) return 0;
    if ((r = offload_of_op(t)) != 1 || (r = source_unchanged(t)) != 1) return r;
    if ((t->store_lock = PyObject_GetAttr(t->saved->store, a_lock)) == NULL) return -1;
  }
  if (t->which == RELEASE_ANSWER) {
    PyObject* args = PyObject_GetAttr(t->op, a_args);
    if (args == NULL) return -1;
    t->release_block = PyTuple_Check(args) && PyTuple_Size(args) >= 1
                           ? PyTuple_GetItem(args, 0) : NULL;
    Py_XINCREF(t->release_block);
    Py_DECREF(args);
    if (t->release_block == NULL) return 0;
  }
  t->answer = answer_record(t->which, a, t->release_block, t->flags);
  return t->answer == NULL ? -1 : 1;
}

/* Under both locks, with the conditions read again: the writes. Nothing here runs Python code:
 * the references the writes replace are kept in `old` and let go by the caller. */
static int take_write(Take* t, PyObject* block, PyObject* old[3]) {
  if (t->saved != NULL) {
    Saved* s = t->saved;
    old[0] = s->block_id;
    Py_INCREF(block);
    s->block_id = block;
    old[1] = s->op; /* t->offload holds it too */
    Py_INCREF(Py_None);
    s->op = Py_None;
    s->state = OFFLOADED;
  }
  /* _callbacks' old list is kept alive by t->callbacks; _value's old value is None */
  if (PyObject_SetAttr(t->op, a_value, t->answer) < 0 ||
      PyObject_SetAttr(t->op, a_callbacks, Py_None) < 0 ||
      PyObject_SetAttr(t->op, a_done, Py_True) < 0)
    return -1;
  return 1;
}

/* CudaIpcTransport.finish_offload and the statistics of Store._offload_done, for the handle
 * that took its block: 1, or 0 with an error set. */
static int finish_offload(Take* t) {
  PyObject* event = PyObject_GetAttr(t->offload, a_op_event);
  if (event == NULL) return 0;
  int ok = event == Py_None || PyList_Append(PyTuple_GetItem(t->target, 1), event) == 0;
  Py_DECREF(event);
  ok = ok && PyObject_SetAttr(t->offload, a_op_event, Py_None) == 0 &&
       PyObject_SetAttr(t->offload, a_tensor, Py_None) == 0;
  PyObject* stats = ok ? PyObject_GetAttr(t->saved->store, a_stats) : NULL;
  ok = stats != NULL && counts_add_offloaded(stats, t->saved->nbytes);
  Py_XDECREF(stats);
  return ok;
}

/* After the locks: the client's view of its blocks, the op out of `ops`, and for a handle the
 * transport's finish and the statistics. Errors are reported as unraisable (already taken). */
static void take_finish(Take* t, PyObject* a, PyObject* ops, PyObject* confirmed) {
  PyObject* block = PyTuple_GetItem(a, 3);
  int ok = 1;
  if (t->which == OFFLOAD_ANSWER)
    ok = PySet_Add(confirmed, block) == 0;
  else if (t->which == RELOAD_ANSWER && (t->flags & g.flag_released))
    ok = PySet_Discard(confirmed, block) >= 0;
  else if (t->which == RELEASE_ANSWER)
    ok = PySet_Discard(confirmed, t->release_block) >= 0;
  if (ok) ok = PyDict_DelItem(ops, PyTuple_GetItem(a, 0)) == 0;
  if (ok && t->saved != NULL) ok = finish_offload(t);
  if (!ok) PyErr_WriteUnraisable(t->op);
}

/* Takes one answer: 1 taken, 0 left to the caller, -1 with an error set (nothing written,
 * except where setting a slot of the op itself failed: then the handle holds its block, as the
 * Python path would leave it too). */
static int take_one(PyObject* a, PyObject* ops, PyObject* confirmed) {
  if (!PyTuple_Check(a) || PyTuple_Size(a) != ANSWER_FIELDS) return 0;
  long kind = PyLong_AsLong(PyTuple_GetItem(a, 1)), code = PyLong_AsLong(PyTuple_GetItem(a, 2));
  Take t = {0};
  t.flags = PyLong_AsLong(PyTuple_GetItem(a, 7));
  if (PyErr_Occurred()) return -1;
  t.which = -1;
  for (int i = 0; i < ANSWER_KINDS; i++)
    if (kind == g.kinds[i]) t.which = i;
  if (code != 0 || t.which < 0) return 0;
  t.op = PyDict_GetItemWithError(ops, PyTuple_GetItem(a, 0));
  if (t.op == NULL) return PyErr_Occurred() ? -1 : 0;
  if (Py_TYPE(t.op) != (PyTypeObject*)g.ring_op_type) return 0; /* its attributes may be code */
  Py_INCREF(t.op);
  int r = take_prepare(&t, a);
  PyObject* old[3] = {NULL, NULL, NULL};
  if (r == 1) r = try_acquire(g.outcome_lock);
  if (r == 1) {
    if (t.store_lock != NULL) r = try_acquire(t.store_lock);
    if (r == 1) {
      r = op_open(&t);
      if (r == 1 && t.saved != NULL) r = saved_open(&t);
      if (r == 1) r = take_write(&t, PyTuple_GetItem(a, 3), old);
      if (t.store_lock != NULL) release(t.store_lock);
    }
    release(g.outcome_lock);
  }
  if (r == 1) take_finish(&t, a, ops, confirmed);
  for (int i = 0; i < 3; i++) Py_XDECREF(old[i]);
  Py_DECREF(t.op);
  take_clear(&t);
  return r;
}

/* ---- a reload's outcome made ----------------------------------------------------------------- */
PyObject* answers_reload_outcome(PyObject* client) {
  if (!g.bound) {
    PyErr_SetString(PyExc_RuntimeError, "offloadd._store_front: bind_answers() first");
    return NULL;
  }
  PyObject* zero = PyLong_FromLong(0);
  if (zero == NULL) return NULL;
  /* _RingOp.__init__(client, "reload", None)'s fields (Outcome's first) */
  PyObject* const names[] = {a_done,   a_value, a_exc,  a_callbacks,  a_event,
                             a_client, a_kind,  a_args, a_request_id, a_target};
  PyObject* const values[] = {Py_False, Py_None, Py_None, Py_None, Py_None,
                              client, op_kinds[RELOAD_ANSWER], Py_None, zero, Py_None};
  PyObject* op = lane_record(g.ring_op_type, names, values, 10);
  Py_DECREF(zero);
  return op;
}

/* ---- a callback added ------------------------------------------------------------------------ */
int answers_add_done_callback(PyObject* op, PyObject* fn) {
  if (!g.bound || Py_TYPE(op) != (PyTypeObject*)g.ring_op_type) {
    PyObject* r = PyObject_CallMethodObjArgs(op, a_add_done_callback, fn, NULL);
    Py_XDECREF(r);
    return r != NULL;
  }
  PyObject* fresh = PyList_New(0); /* made before the lock: an allocation may run code */
  if (fresh == NULL) return 0;
  /* The request went out: the callback must be added even when the wait for the lock is
   * interrupted (a signal handler raising); the first interruption is raised afterwards. */
  PyObject *type = NULL, *value = NULL, *tb = NULL, *got;
  for (int tries = 1; (got = PyObject_CallMethodObjArgs(g.outcome_lock, a_acquire, NULL)) == NULL;
       tries++) {
    if (type == NULL)
      PyErr_Fetch(&type, &value, &tb);
    else
      PyErr_Clear(); /* a later interruption: the first one is what is raised */
    if (tries >= 100) { /* an error that does not go away: the callback is not added */
      PyErr_Restore(type, value, tb);
      Py_DECREF(fresh);
      return 0;
    }
  }
  Py_DECREF(got);
  /* under the lock: slots of a plain __slots__ class, read and written without running code */
  PyObject* done = PyObject_GetAttr(op, a_done);
  int is_done = done ? PyObject_IsTrue(done) : -1;
  Py_XDECREF(done);
  int ok = is_done >= 0;
  if (is_done == 0) {
    PyObject* callbacks = PyObject_GetAttr(op, a_callbacks);
    if (callbacks == NULL) {
      ok = 0;
    } else if (callbacks == Py_None) {
      ok = PyList_Append(fresh, fn) == 0 && PyObject_SetAttr(op, a_callbacks, fresh) == 0;
    } else {
      ok = PyList_Check(callbacks) && PyList_Append(callbacks, fn) == 0;
      if (!ok && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "offloadd: an outcome's callbacks are not a list");
    }
    Py_XDECREF(callbacks); /* still held by the op, or None: no code runs */
  }
  if (ok) {
    release(g.outcome_lock);
  } else {
    PyObject *failed_type, *failed, *failed_tb;
    PyErr_Fetch(&failed_type, &failed, &failed_tb);
    release(g.outcome_lock);
    PyErr_Restore(failed_type, failed, failed_tb);
  }
  Py_DECREF(fresh);
  if (ok && is_done == 1) { /* complete already: called at once, as Outcome does */
    PyObject* r = PyObject_CallFunctionObjArgs(fn, op, NULL);
    Py_XDECREF(r);
    ok = r != NULL;
  }
  if (type != NULL) { /* the interrupt of the wait, in place of anything after it */
    PyErr_Restore(type, value, tb);
    return 0;
  }
  return ok;
}

PyObject* store_answers_take(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError, "take_answers() takes 3 arguments (%zd given)", nargs);
    return NULL;
  }
  if (!g.bound) {
    PyErr_SetString(PyExc_RuntimeError, "offloadd._store_front: bind_answers() first");
    return NULL;
  }
  PyObject *answers = args[0], *ops = args[1], *confirmed = args[2];
  if (!PyList_Check(answers) || !PyDict_Check(ops) || !PySet_Check(confirmed)) {
    PyErr_SetString(PyExc_TypeError, "take_answers(answers: list, ops: dict, confirmed: set)");
    return NULL;
  }
  /* a tuple of the answers: what runs here may run Python code that changes the list */
  PyObject* batch = PyList_AsTuple(answers);
  PyObject* left = batch ? PyList_New(0) : NULL;
  if (left == NULL) {
    Py_XDECREF(batch);
    return NULL;
  }
  Py_ssize_t n = PyTuple_Size(batch);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* a = PyTuple_GetItem(batch, i);
    int r = take_one(a, ops, confirmed);
    if (r < 0) { /* nothing of it was written: the Python path takes it, and reports */
      PyErr_WriteUnraisable(a);
      r = 0;
    }
    if (r == 0 && PyList_Append(left, a) < 0) {
      Py_DECREF(batch);
      Py_DECREF(left);
      return NULL;
    }
  }
  Py_DECREF(batch);
  return left;
}
