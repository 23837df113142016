/* offloadd._store_front, part five: a lane's reload of a handle (OffloadLane.reload and
 * .finish; the type is store_lane.c's).
 *
 *   reload(saved, priority) -> the ReloadOp sent, as Store._start_reload's usual path leaves
 *          it for an OFFLOADED handle: CudaIpcTransport.prepare_reload's destination (allocated
 *          by the device's empty_on on its reload stream, in a registered segment) with its
 *          ready event recorded there after the allocation and a done event, the handle's
 *          ``reload`` set under the store's lock, and the request sent (priority: an int,
 *          URGENT or PREFETCH; release_after, as the store sends every reload) through
 *          offloadd._ring_fast.submit or, when that declines, Client.reload. None with nothing
 *          changed when Python's path must decide: another process, the handle not OFFLOADED
 *          with a block and no reload, another endpoint's handle, the client dead or closing,
 *          destinations waiting to be let go, a destination
 *          outside the registered segments, or any Exception from a device call before the
 *          handle took the reload. Once it took it, what sending raises propagates, as from
 *          Store._start_reload (the handle keeps the reload, as there).
 *   finish(reload_op, saved) -> the destination tensor, as CudaIpcTransport.finish_reload
 *          returns it for a reload already answered: the current stream made to wait on the
 *          done event (when the daemon recorded it), the destination recorded on that stream,
 *          both events back in the free list, and on a simulated device that checks bytes, the
 *          transport's check. None with nothing changed when Python's path must decide (the
 *          answer has not come: Python waits for it, counting the host wait; the reload
 *          failed; another process or endpoint). What a device call raises propagates.
 * TypeError for arguments of other types. */
#include "client/core/store_lane.h"

static PyObject *n_slot, *n_dest, *n_region_id, *n_offset, *n_ready_event, *n_done_event,
    *n_done_seq, *n_done_outcome, *n_sent, *n_priority, *n_release_after,
    *n_done_event_recorded, *k_into;

int store_reload_init(void) {
  return front_intern(&n_slot, "slot") && front_intern(&n_dest, "dest") &&
         front_intern(&n_region_id, "region_id") && front_intern(&n_offset, "offset") &&
         front_intern(&n_ready_event, "ready_event") && front_intern(&n_done_event, "done_event") &&
         front_intern(&n_done_seq, "done_seq") && front_intern(&n_done_outcome, "done") &&
         front_intern(&n_sent, "sent") && front_intern(&n_priority, "priority") &&
         front_intern(&n_release_after, "release_after") &&
         front_intern(&n_done_event_recorded, "done_event_recorded") &&
         front_intern(&k_into, "into");
}

static int is_none(PyObject* o) { return o == NULL || o == Py_None; }

/* ---- reload(saved, priority) ----------------------------------------------------------------- */
typedef struct {
  PyObject *priority, *dest, *rid, *offset, *ready, *done, *op, *block;
} Reloading;

static void reloading_clear(Reloading* x) {
  PyObject** const fields[] = {&x->dest, &x->rid, &x->offset, &x->ready, &x->done, &x->op,
                               &x->block};
  for (int i = 0; i < 7; i++) Py_CLEAR(*fields[i]);
}

/* An OFFLOADED handle of this lane's endpoint with a block and no reload. */
static int offloaded(Lane* self, Saved* s) {
  return s->state == OFFLOADED && s->ep == self->ep && !is_none(s->block_id) &&
         is_none(s->reload);
}

/* CudaIpcTransport.prepare_reload inside the device's context: 1, 0 decline, -1 error. */
static int prepare_in_context(Lane* self, Saved* s, void* arg) {
  Reloading* x = arg;
  PyObject* stream = PyObject_CallFunctionObjArgs(self->reload_stream, s->device, NULL);
  x->dest = stream ? PyObject_CallFunctionObjArgs(self->empty_on, (PyObject*)s, stream, NULL)
                   : NULL;
  int r = x->dest ? lane_region_of(self, x->dest, s->nbytes, &x->rid, &x->offset) : -1;
  if (r == 1) {
    x->ready = lane_take_event(self);
    x->done = x->ready ? lane_take_event(self) : NULL;
    if (x->done == NULL) r = -1;
  }
  if (r == 1) {
    PyObject* recorded = PyObject_CallFunctionObjArgs(self->record, x->ready, stream, NULL);
    r = recorded ? 1 : -1;
    Py_XDECREF(recorded);
  }
  Py_XDECREF(stream);
  return r;
}

/* The ReloadOp (ReloadOp.__init__'s fields, its outcome as Client.reload_outcome makes it,
 * in C: offloadd.client bound its answers at import, before any lane): 1, -1. */
static int reload_op(Lane* self, Reloading* x) {
  PyObject* outcome = answers_reload_outcome(self->client);
  if (outcome == NULL) return -1;
  PyObject* const names[] = {n_slot, n_dest, n_region_id, n_offset, n_ready_event,
                             n_done_event, n_done_seq, n_done_outcome, n_sent, n_priority,
                             n_release_after};
  PyObject* const values[] = {Py_None, x->dest, x->rid, x->offset, x->ready, x->done,
                              Py_None, outcome, Py_False, x->priority, Py_False};
  x->op = lane_record(self->reload_op_type, names, values, 11);
  Py_DECREF(outcome);
  return x->op ? 1 : -1;
}

/* The handle takes the reload under the store's lock, unless it changed meanwhile (another
 * thread reloaded or released it): 1 taken (x->block read with it), 0 not, -1 error. */
static int attach(Lane* self, Saved* s, Reloading* x) {
  PyObject* lock = lane_lock(s->store);
  if (lock == NULL) return -1;
  int r = offloaded(self, s);
  if (r) {
    Py_INCREF(x->op);
    PyObject* old = s->reload; /* None */
    s->reload = x->op;
    Py_INCREF(s->block_id);
    x->block = s->block_id;
    Py_XDECREF(old); /* None, or NULL: no code runs */
  }
  return lane_unlock(lock) ? r : -1;
}

/* CudaIpcTransport.send_reload: the done event's record count noted, the op marked sent, the
 * request on the ring, or through Client.reload when the ring does not take it at once.
 * *marked: whether the op was marked sent before what failed (an op not marked never went
 * out). */
static int send(Lane* self, Reloading* x, int* marked) {
  PyObject* seq = PyObject_CallFunctionObjArgs(self->event_seq, x->done, NULL);
  if (seq == NULL) return -1;
  if (seq != Py_None) {
    PyObject* one = PyLong_FromLong(1);
    PyObject* next = one ? PyNumber_Add(seq, one) : NULL;
    int ok = next != NULL && PyObject_SetAttr(x->op, n_done_seq, next) == 0;
    Py_XDECREF(next);
    Py_XDECREF(one);
    if (!ok) {
      Py_DECREF(seq);
      return -1;
    }
  }
  Py_DECREF(seq);
  if (PyObject_SetAttr(x->op, n_release_after, Py_True) < 0 ||
      PyObject_SetAttr(x->op, n_sent, Py_True) < 0)
    return -1;
  *marked = 1; /* from here on the request may be out: the op stays the handle's */
  PyObject* outcome = PyObject_GetAttr(x->op, n_done_outcome);
  PyObject* ready = outcome ? PyObject_GetAttr(x->ready, n_handle) : NULL;
  PyObject* done = ready ? PyObject_GetAttr(x->done, n_handle) : NULL;
  PyObject* fast = done ? PyObject_GetAttr(self->client, n_submit_fast) : NULL;
  PyObject* sent = NULL;
  if (fast != NULL && fast != Py_None) {
    PyObject* args = Py_BuildValue("(OOOOOdOO)", x->block, x->rid, x->offset, x->priority,
                                   Py_True, 0.0, ready, done);
    PyObject* kind = args ? PyLong_FromLong(1) : NULL;
    sent = kind ? PyObject_CallFunctionObjArgs(fast, self->client, kind, args, outcome, Py_None,
                                               NULL)
                : NULL;
    Py_XDECREF(kind);
    Py_XDECREF(args);
    if (sent == Py_None) Py_CLEAR(sent); /* not at once: Client.reload decides */
    else if (sent == NULL) Py_CLEAR(fast);  /* it raised: that propagates */
  }
  if (sent == NULL && fast != NULL) {
    PyObject* args = Py_BuildValue("(OOOO)", x->block, x->rid, x->offset, x->priority);
    PyObject* kwargs = args ? Py_BuildValue("{OOOOOOOO}", n_release_after, Py_True,
                                            n_ready_event, ready, n_done_event, done, k_into,
                                            outcome)
                            : NULL;
    sent = kwargs ? PyObject_Call(self->reload, args, kwargs) : NULL;
    Py_XDECREF(kwargs);
    Py_XDECREF(args);
  }
  PyObject* const refs[] = {outcome, ready, done, fast};
  for (int i = 0; i < 4; i++) Py_XDECREF(refs[i]);
  Py_XDECREF(sent);
  return sent != NULL ? 1 : -1;
}

/* A reload attached but never sent (what failed came before it was marked sent): the handle
 * lets it go under the store's lock and its events go back to the pool; the error raised is
 * kept (an error of the lock replaces it). */
static void detach(Lane* self, Saved* s, Reloading* x) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  lane_give_back_event(self, x->ready);
  lane_give_back_event(self, x->done);
  PyObject* lock = lane_lock(s->store);
  PyObject* old = NULL;
  if (lock != NULL && s->reload == x->op) {
    old = s->reload;
    Py_INCREF(Py_None);
    s->reload = Py_None;
  }
  int ok = lock != NULL && lane_unlock(lock);
  Py_XDECREF(old); /* x still holds the op: no code runs */
  if (ok) {
    PyErr_Restore(type, value, tb);
  } else {
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
  }
}

static PyObject* reload_saved(Lane* self, Saved* s, Reloading* x) {
  int r = offloaded(self, s) ? lane_ready(self) : 0;
  if (r == 1) r = lane_in_context(self, s->device, prepare_in_context, s, x);
  if (r == 1) r = reload_op(self, x);
  if (r == 1) r = attach(self, s, x);
  if (r < 0) r = lane_decline_on_exception();
  if (r != 1) { /* the destination dies with x; the events were never handed out */
    lane_give_back_event(self, x->ready);
    lane_give_back_event(self, x->done);
    if (r < 0) return NULL;
    Py_RETURN_NONE;
  }
  int marked = 0;
  if (send(self, x, &marked) < 0) {
    if (!marked) detach(self, s, x); /* the next unpack reloads it again */
    return NULL; /* a reload marked sent stays the handle's, as on Python's path */
  }
  Py_INCREF(x->op);
  return x->op;
}

PyObject* lane_reload(PyObject* o, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || Py_TYPE(args[0]) != SavedType || !PyLong_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "OffloadLane.reload(saved: Saved, priority: int)");
    return NULL;
  }
  if (!lane_made(o, "reload")) return NULL;
  Saved* s = (Saved*)args[0];
  Py_INCREF(s); /* a device call may run code that drops the caller's references */
  Reloading x = {args[1]};
  PyObject* result = reload_saved((Lane*)o, s, &x);
  reloading_clear(&x);
  Py_DECREF(s);
  return result;
}

/* ---- finish(reload_op, saved) ---------------------------------------------------------------- */
/* The reload's answer, when it came and was a success (a new reference), else NULL (with an
 * error set on failure). */
static PyObject* answered(PyObject* op) {
  PyObject* outcome = PyObject_GetAttr(op, n_done_outcome);
  if (outcome == NULL) return NULL;
  PyObject* answer = NULL;
  int r = lane_attr_true(outcome, n_done);
  if (r == 1) r = lane_attr_none(outcome, n_exc);
  if (r == 1) answer = PyObject_GetAttr(outcome, n_value);
  Py_DECREF(outcome);
  return answer;
}

/* The stream ordered after the daemon's copy, the events given back, the bytes checked. */
static int finish_answered(Lane* self, Saved* s, PyObject* op, PyObject* answer,
                           PyObject* dest) {
  PyObject* recorded = PyObject_GetAttr(answer, n_done_event_recorded);
  PyObject* ready = recorded ? PyObject_GetAttr(op, n_ready_event) : NULL;
  PyObject* done = ready ? PyObject_GetAttr(op, n_done_event) : NULL;
  PyObject* seq = done ? PyObject_GetAttr(op, n_done_seq) : NULL;
  PyObject* stream =
      seq ? PyObject_CallFunctionObjArgs(self->current_stream, s->device, NULL) : NULL;
  int ok = stream != NULL;
  int waits = ok ? PyObject_IsTrue(recorded) : 0;
  ok = ok && waits >= 0;
  if (ok && waits) {
    PyObject* r = PyObject_CallFunctionObjArgs(self->wait, stream, done, seq, NULL);
    ok = r != NULL;
    Py_XDECREF(r);
  }
  PyObject* r = ok ? PyObject_CallFunctionObjArgs(self->record_stream, dest, stream, NULL) : NULL;
  ok = r != NULL;
  Py_XDECREF(r);
  if (ok) {
    lane_give_back_event(self, ready);
    lane_give_back_event(self, done); /* the wait above captured its record */
  }
  if (ok && self->check_reloaded != NULL) {
    r = PyObject_CallFunctionObjArgs(self->check_reloaded, op, (PyObject*)s, stream, NULL);
    ok = r != NULL;
    Py_XDECREF(r);
  }
  PyObject* const refs[] = {recorded, ready, done, seq, stream};
  for (int i = 0; i < 5; i++) Py_XDECREF(refs[i]);
  return ok;
}

PyObject* lane_finish(PyObject* o, PyObject* const* args, Py_ssize_t nargs) {
  Lane* self = (Lane*)o;
  if (!lane_made(o, "finish")) return NULL;
  if (nargs != 2 || Py_TYPE(args[0]) != (PyTypeObject*)self->reload_op_type ||
      Py_TYPE(args[1]) != SavedType) {
    PyErr_SetString(PyExc_TypeError, "OffloadLane.finish(reload_op: ReloadOp, saved: Saved)");
    return NULL;
  }
  PyObject* op = args[0];
  Saved* s = (Saved*)args[1];
  if (self->pid != lane_process_pid || s->ep != self->ep) Py_RETURN_NONE;
  PyObject* answer = answered(op);
  if (answer == NULL) {
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
  }
  PyObject* dest = PyObject_GetAttr(op, n_dest);
  Py_INCREF(s);
  int ok = dest != NULL && finish_answered(self, s, op, answer, dest);
  Py_DECREF(s);
  Py_DECREF(answer);
  if (!ok) Py_CLEAR(dest);
  return dest;
}
