/* offloadd._store_front, part four: a lane's offload of a handle (OffloadLane.offload; the type
 * is store_lane.c's).
 *
 *   offload(saved, step) -> True when the handle was sent here: as Store._offload's usual
 *          path leaves it (an OffloadOp holding the source tensor and its ready event, the
 *          handle OFFLOADING with its endpoint and op, its tensor let go, the sent version
 *          noted, the store's done-callback on the ring op, one more offload counted as sent
 *          in ``step`` or the handle's counts). False when Python's path must decide, before
 *          anything was sent: another process than the lane's, the client dead or closing, a
 *          refused-for-room back-off of the lane's endpoint, the step's stall budget spent, a
 *          handle not KEPT (or without its tensor or counts), its tensor modified since its
 *          pack, destinations waiting in the transport to be let go, a segment not registered
 *          yet or a span past its segment, the ring not taking it at once
 *          (offloadd._ring_fast.submit returned None), or any Exception from a device call
 *          (the Python path makes the same calls and handles what they raise). A declined
 *          offload leaves only what that path does again (store_lane.c). What is not an
 *          Exception (KeyboardInterrupt) propagates, as from the Python path; so does what the
 *          submission raises (the request may have gone out: it must not go again) and an
 *          interrupt while the store's lock is awaited after it went out (the handle is then
 *          left as the Python path leaves it), and one while Outcome's lock is awaited to add
 *          the store's callback (added all the same). Other errors after the request went out
 *          are reported as unraisable and True is returned: the offload is the ring op's,
 *          whose answer the client takes as for any other. TypeError for arguments of other
 *          types. */
#include "client/core/store_lane.h"

static PyObject *n_future, *n_slot, *n_orphan_reload, *n_counted, *n_sent, *n_offload_done,
    *n_stall_left;

int store_offload_init(void) {
  return front_intern(&n_future, "future") && front_intern(&n_slot, "slot") &&
         front_intern(&n_orphan_reload, "orphan_reload") && front_intern(&n_counted, "counted") &&
         front_intern(&n_sent, "sent") &&
         front_intern(&n_offload_done, "_offload_done") &&
         front_intern(&n_stall_left, "_stall_left");
}

/* 1 when Store._offload's usual path applies to handle s (as far as it can be told before a
 * device call), 0 when Python must decide, -1 with an error set. */
static int usual(Lane* self, Saved* s) {
  if (s->state != KEPT || s->tensor == NULL || s->tensor == Py_None || s->counts == NULL ||
      s->counts == Py_None)
    return 0;
  /* the tensor's version first: the attribute reads below may run code that changes s */
  PyObject* version = PyObject_GetAttr(s->tensor, n_version);
  long long v = version ? PyLong_AsLongLong(version) : -1;
  Py_XDECREF(version);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (v != s->version) return 0;
  PyObject* full = PyDict_GetItemWithError(self->full_until, self->full_key);
  if (full != NULL || PyErr_Occurred()) return full != NULL ? 0 : -1;
  int r = lane_ready(self);
  if (r != 1) return r;
  if ((r = lane_attr_none(self->client, n_submit_fast)) != 0) return r < 0 ? -1 : 0;
  PyObject* stall = PyObject_GetAttr(s->store, n_stall_left);
  double left = stall ? PyFloat_AsDouble(stall) : -1.0;
  Py_XDECREF(stall);
  if (left == -1.0 && PyErr_Occurred()) return -1;
  return left > 0 && s->tensor != NULL && s->tensor != Py_None && s->counts != NULL &&
         s->counts != Py_None; /* still there after the reads */
}

/* ---- the device's part: CudaIpcTransport.start_offload up to the submission ------------------ */
typedef struct {
  PyObject *tensor, *src, *event, *request, *target, *offload_op, *callback, *wref;
} Sending;

static void sending_clear(Sending* x) {
  Py_CLEAR(x->tensor);
  Py_CLEAR(x->src);
  Py_CLEAR(x->event);
  Py_CLEAR(x->request);
  Py_CLEAR(x->target);
  Py_CLEAR(x->offload_op);
  Py_CLEAR(x->callback);
  Py_CLEAR(x->wref);
}

/* Inside the device's context: the source, its region, the ready event recorded on the
 * current stream, and the submission's arguments. 1, 0 when Python must decide, -1 error. */
static int prepare_in_context(Lane* self, Saved* s, void* arg) {
  Sending* x = arg;
  PyObject *rid = NULL, *offset = NULL;
  if ((x->src = PyObject_CallFunctionObjArgs(self->adopt, x->tensor, NULL)) == NULL) return -1;
  if (self->checksum != NULL) { /* as the transport notes it (a simulated device's check) */
    PyObject* sum = PyObject_CallFunctionObjArgs(self->checksum, x->src, NULL);
    if (sum == NULL) return -1;
    PyObject* old = s->checksum;
    s->checksum = sum;
    Py_XDECREF(old);
  }
  int r = lane_region_of(self, x->src, s->nbytes, &rid, &offset);
  if (r == 1 && (x->event = lane_take_event(self)) == NULL) r = -1;
  PyObject* stream = NULL;
  if (r == 1) {
    stream = PyObject_CallFunctionObjArgs(self->current_stream, s->device, NULL);
    PyObject* done =
        stream ? PyObject_CallFunctionObjArgs(self->record, x->event, stream, NULL) : NULL;
    r = done ? 1 : -1;
    Py_XDECREF(done);
  }
  PyObject* handle = r == 1 ? PyObject_GetAttr(x->event, n_handle) : NULL;
  if (r == 1 && handle == NULL) r = -1;
  if (r == 1) {
    PyObject* ordering = Py_BuildValue("(LL)", s->step, s->offset);
    x->request = ordering ? Py_BuildValue("(OOLOO)", rid, offset, s->nbytes, handle, ordering)
                          : NULL;
    Py_XDECREF(ordering);
    if (x->request == NULL) r = -1;
  }
  Py_XDECREF(handle);
  Py_XDECREF(stream);
  Py_XDECREF(rid);
  Py_XDECREF(offset);
  return r;
}

/* The records the submission's answer and the store need, made before the request goes out
 * (an allocation failure then changes nothing): 1, or -1 with an error set. */
static int records(Lane* self, Saved* s, Sending* x) {
  PyObject* const names[] = {n_future, n_slot, n_tensor, n_event, n_orphan_reload};
  PyObject* const values[] = {Py_None, Py_None, x->src, x->event, Py_None};
  if ((x->offload_op = lane_record(self->offload_op_type, names, values, 5)) == NULL) return -1;
  if ((x->wref = PyWeakref_NewRef((PyObject*)s, NULL)) == NULL) return -1;
  if ((x->target = PyTuple_Pack(2, x->wref, self->free_events)) == NULL) return -1;
  PyObject* done = PyObject_GetAttr(s->store, n_offload_done);
  x->callback = done ? PyObject_CallFunctionObjArgs(self->partial, done, x->wref, self->ep,
                                                    x->offload_op, NULL)
                     : NULL;
  Py_XDECREF(done);
  return x->callback ? 1 : -1;
}

/* ---- after the request went out -------------------------------------------------------------- */
/* One more offload sent, in the step that packed the handle or the packing thread's current
 * one when that one is counted already (Store._offload's first line). */
static int count_sent(Saved* s, PyObject* step) {
  int counted = lane_attr_true(s->counts, n_counted);
  if (counted < 0) return 0;
  return lane_attr_add(counted ? step : s->counts, n_sent, 1);
}

/* The handle takes its offload under the store's lock (Store._offload's last lines): 1; 0
 * with an error set; -1 when taking the lock raised (an interrupt while another thread held
 * it: it propagates, as from `with self._lock`, the handle left as it was). */
static int hand_over(Lane* self, Saved* s, Sending* x) {
  PyObject* lock = lane_lock(s->store);
  if (lock == NULL) return -1;
  PyObject* version = PyObject_GetAttr(x->src, n_version); /* a tensor's: no code of ours */
  PyObject* old[4] = {s->ep, s->op, s->tensor, s->sent_version};
  Py_INCREF(self->ep);
  s->ep = self->ep;
  Py_INCREF(x->offload_op);
  s->op = x->offload_op;
  s->state = OFFLOADING;
  Py_INCREF(Py_None);
  s->tensor = Py_None;
  s->sent_version = version; /* NULL (reads as None) when the read failed: reported below */
  int unlocked = lane_unlock(lock);
  for (int i = 0; i < 4; i++) Py_XDECREF(old[i]); /* after the lock: they may run code */
  return version != NULL && unlocked;
}

/* 1, or -1 with the error to propagate (see hand_over); other errors are reported. */
static int after_sending(Lane* self, Saved* s, PyObject* step, PyObject* op, Sending* x) {
  if (PyObject_SetAttr(x->offload_op, n_future, op) < 0) PyErr_WriteUnraisable(op);
  if (!count_sent(s, step)) PyErr_WriteUnraisable((PyObject*)s);
  int handed = hand_over(self, s, x);
  if (handed < 0) return -1;
  if (handed == 0) PyErr_WriteUnraisable((PyObject*)s);
  if (!answers_add_done_callback(op, x->callback)) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1; /* an interrupt propagates */
    PyErr_WriteUnraisable(op);
  }
  return 1;
}

/* ---- offload(saved, step) -------------------------------------------------------------------- */
/* The submission (offloadd._ring_fast.submit): the op; Py_None when the ring did not take it
 * (nothing went out); NULL with an error set, which propagates: the submission may have gone
 * out before it raised, so Python's path must not send the handle again. */
static PyObject* submit(Lane* self, Sending* x) {
  PyObject* fast = PyObject_GetAttr(self->client, n_submit_fast);
  PyObject* kind = fast ? PyLong_FromLong(0) : NULL;
  PyObject* op = kind ? PyObject_CallFunctionObjArgs(fast, self->client, kind, x->request,
                                                     Py_None, x->target, NULL)
                      : NULL;
  Py_XDECREF(kind);
  Py_XDECREF(fast);
  return op;
}

static int send(Lane* self, Saved* s, PyObject* step, Sending* x) {
  int r = usual(self, s);
  if (r != 1) return r;
  x->tensor = s->tensor; /* held: the device's code may take it off the handle */
  Py_INCREF(x->tensor);
  r = lane_in_context(self, s->device, prepare_in_context, s, x);
  if (r == 1) r = records(self, s, x);
  if (r < 0) r = lane_decline_on_exception();
  PyObject* op = r == 1 ? submit(self, x) : NULL;
  if (op == Py_None) {
    Py_CLEAR(op);
    r = 0;
  } else if (r == 1 && op == NULL) {
    r = -1;
  }
  if (r != 1) {
    lane_give_back_event(self, x->event);
    return r;
  }
  r = after_sending(self, s, step, op, x);
  Py_DECREF(op);
  return r;
}

PyObject* lane_offload(PyObject* o, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || Py_TYPE(args[0]) != SavedType) {
    PyErr_SetString(PyExc_TypeError, "OffloadLane.offload(saved: Saved, step)");
    return NULL;
  }
  if (!lane_made(o, "offload")) return NULL;
  Saved* s = (Saved*)args[0];
  Py_INCREF(s); /* a device call may run code that drops the caller's references */
  Sending x = {0};
  int r = send((Lane*)o, s, args[1], &x);
  sending_clear(&x);
  Py_DECREF(s);
  if (r < 0) return NULL;
  return PyBool_FromLong(r);
}

