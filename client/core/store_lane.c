/* offloadd._store_front, part three: a lane, one endpoint's usual per-tensor path in C (the
 * type OffloadLane).
 *
 * The store's Python path sends a handle's offload, and its reload, through a dozen Python
 * calls each and as many objects made and touched per tensor: the store's checks, the
 * CudaIpcTransport's steps (the device's context, the tensor's segment and region, IPC events
 * recorded on a stream, the destination's allocation), Client.offload / reload and the ring
 * submission, the op records and the done-callback. A lane does the same for one endpoint's
 * device in one C call each, with what does not change per tensor read once when it is made.
 * The device calls still go through the device object's methods (offloadd.cuda.TorchCudaDevice,
 * or the simulated one), the submissions through offloadd._ring_fast.submit. Whenever Python's
 * path must decide, a lane declines with nothing changed and the store's Python runs as before.
 *
 *   OffloadLane(ep, full_until, offload_op_type, reload_op_type, partial)  one endpoint's
 *          lane: ep an offloadd.torch._endpoint.Endpoint whose transport is a CudaIpcTransport
 *          (its client, transport, device methods, free IPC events and region table are read
 *          here once); full_until the dict of refused-for-room back-offs (an entry for this
 *          endpoint: its offloads decline, and Python's path says whether it expired);
 *          offload_op_type and reload_op_type offloadd.torch._transport's OffloadOp and
 *          ReloadOp (classes with __slots__ and object's __new__); partial functools.partial
 *          (an offload's done-callback is partial(store._offload_done, weakref to the handle,
 *          ep, its OffloadOp), as the Python path's closure calls it). TypeError for other
 *          types and for a second __init__; what reading the endpoint raises
 *          (AttributeError) for an object that is not one. Made by the store after the
 *          endpoint served an offload of the current step in Python (which checked the
 *          allocator's settings), kept until the step's end or the endpoint's next look-up.
 *     offload(saved, step) -> bool       Store._offload's usual path (store_offload.c).
 *     reload(saved, priority) -> ReloadOp or None    Store._start_reload's (store_reload.c).
 *     finish(reload_op, saved) -> tensor or None     CudaIpcTransport.finish_reload's for an
 *          answered reload (store_reload.c).
 * Every method declines (False or None) in another process than the one that made the lane
 * (a forked child: Python's path says what to do there). A decline leaves only what the Python
 * path then does again: an event recorded and put back in the free list (or one the pool made),
 * a segment's place in the region table's LRU order, a simulated tensor's checksum.
 *
 * Runs under the GIL; it is released only inside the device's Python methods and around a
 * wait for the store's lock, as on the Python path. */
#include "client/core/store_lane.h"

#include <pthread.h>
#include <unistd.h>

long long lane_process_pid;
PyTypeObject* LaneType;
static void after_fork_in_child(void) { lane_process_pid = (long long)getpid(); }

PyObject *n_dead, *n_closing, *n_abandoned, *n_submit_fast, *n_version, *n_handle, *n_lock,
    *n_acquire, *n_release, *n_done, *n_exc, *n_value, *n_tensor, *n_event;
static PyObject *n_client, *n_transport, *n_dev, *n_events, *n_free, *n_regions, *n_data_ptr,
    *n_base, *n_size, *n_buffer_id, *n_move_to_end, *n_enter, *n_exit, *n_simulated,
    *n_checksums, *n_checksum, *n_check_simulated, *n_pid;

int store_lane_init(void) {
  lane_process_pid = (long long)getpid();
  if (pthread_atfork(NULL, NULL, after_fork_in_child) != 0) {
    PyErr_SetString(PyExc_RuntimeError, "offloadd._store_front: pthread_atfork failed");
    return 0;
  }
  return front_intern(&n_dead, "_dead") && front_intern(&n_closing, "_closing") &&
         front_intern(&n_abandoned, "_abandoned") && front_intern(&n_submit_fast, "_submit_fast") &&
         front_intern(&n_version, "_version") && front_intern(&n_handle, "handle") &&
         front_intern(&n_lock, "_lock") && front_intern(&n_acquire, "acquire") &&
         front_intern(&n_release, "release") && front_intern(&n_done, "_done") &&
         front_intern(&n_exc, "_exc") && front_intern(&n_value, "_value") &&
         front_intern(&n_tensor, "tensor") && front_intern(&n_event, "event") &&
         front_intern(&n_client, "client") && front_intern(&n_transport, "transport") &&
         front_intern(&n_dev, "dev") && front_intern(&n_events, "events") &&
         front_intern(&n_free, "_free") && front_intern(&n_regions, "_regions") &&
         front_intern(&n_data_ptr, "data_ptr") && front_intern(&n_base, "base") &&
         front_intern(&n_size, "size") && front_intern(&n_buffer_id, "buffer_id") &&
         front_intern(&n_move_to_end, "move_to_end") && front_intern(&n_enter, "__enter__") &&
         front_intern(&n_exit, "__exit__") && front_intern(&n_simulated, "simulated") &&
         front_intern(&n_checksums, "checksums") && front_intern(&n_checksum, "checksum") &&
         front_intern(&n_check_simulated, "_check_simulated") && front_intern(&n_pid, "pid") &&
         store_offload_init() &&
         store_reload_init();
}

/* ---- helpers of both halves ------------------------------------------------------------------ */
int lane_attr_none(PyObject* o, PyObject* name) {
  PyObject* v = PyObject_GetAttr(o, name);
  if (v == NULL) return -1;
  int r = v == Py_None;
  Py_DECREF(v);
  return r;
}

int lane_attr_true(PyObject* o, PyObject* name) {
  PyObject* v = PyObject_GetAttr(o, name);
  if (v == NULL) return -1;
  int r = PyObject_IsTrue(v);
  Py_DECREF(v);
  return r;
}

int lane_own_endpoint(PyObject* ep) {
  PyObject* pid = PyObject_GetAttr(ep, n_pid);
  long long v = pid ? PyLong_AsLongLong(pid) : -1;
  Py_XDECREF(pid);
  if (v == -1 && PyErr_Occurred()) return -1;
  return v == lane_process_pid;
}

int lane_attr_add(PyObject* o, PyObject* name, Py_ssize_t n) {
  PyObject* had = PyObject_GetAttr(o, name);
  PyObject* more = had ? PyLong_FromSsize_t(n) : NULL;
  PyObject* sum = more ? PyNumber_Add(had, more) : NULL;
  int ok = sum != NULL && PyObject_SetAttr(o, name, sum) == 0;
  Py_XDECREF(sum);
  Py_XDECREF(more);
  Py_XDECREF(had);
  return ok;
}

void lane_gc_dealloc(PyObject* o, inquiry clear) {
  PyObject_GC_UnTrack(o);
  clear(o);
  PyTypeObject* type = Py_TYPE(o);
  freefunc tp_free = (freefunc)PyType_GetSlot(type, Py_tp_free);
  tp_free(o);
  Py_DECREF(type);
}

int lane_ready(Lane* self) {
  if (self->pid != lane_process_pid) return 0;
  int r = lane_attr_none(self->client, n_dead);
  if (r != 1) return r;
  if ((r = lane_attr_true(self->client, n_closing)) != 0) return r < 0 ? -1 : 0;
  if ((r = lane_attr_true(self->transport, n_abandoned)) != 0) return r < 0 ? -1 : 0;
  return 1;
}

/* Whether [offset, offset + nbytes) lies in a segment of `size` bytes: 1, 0, -1 error. */
static int span_fits(PyObject* offset, PyObject* size, long long nbytes) {
  long long off = PyLong_AsLongLong(offset);
  if (off == -1 && PyErr_Occurred()) return -1;
  long long limit = PyLong_AsLongLong(size);
  if (limit == -1 && PyErr_Occurred()) return -1;
  return off >= 0 && nbytes >= 0 && off <= limit && nbytes <= limit - off;
}

int lane_region_of(Lane* self, PyObject* t, long long nbytes, PyObject** rid,
                   PyObject** offset) {
  PyObject* ptr = PyObject_CallMethodObjArgs(t, n_data_ptr, NULL);
  PyObject* info = ptr ? PyObject_CallFunctionObjArgs(self->describe, ptr, NULL) : NULL;
  PyObject* base = info ? PyObject_GetAttr(info, n_base) : NULL;
  PyObject* size = base ? PyObject_GetAttr(info, n_size) : NULL;
  PyObject* buffer = size ? PyObject_GetAttr(info, n_buffer_id) : NULL;
  *rid = NULL;
  *offset = buffer ? PyNumber_Subtract(ptr, base) : NULL;
  int r = *offset ? span_fits(*offset, size, nbytes) : -1;
  if (r == 1) {
    *rid = PyDict_GetItemWithError(self->regions, buffer); /* borrowed */
    if (*rid == NULL) r = PyErr_Occurred() ? -1 : 0;
  }
  if (r == 1) {
    Py_INCREF(*rid);
    PyObject* moved = PyObject_CallMethodObjArgs(self->regions, n_move_to_end, buffer, NULL);
    r = moved ? 1 : -1;
    Py_XDECREF(moved);
  }
  PyObject* const refs[] = {ptr, info, base, size, buffer};
  for (int i = 0; i < 5; i++) Py_XDECREF(refs[i]);
  if (r != 1) {
    Py_CLEAR(*rid);
    Py_CLEAR(*offset);
  }
  return r;
}

PyObject* lane_take_event(Lane* self) {
  Py_ssize_t n = PyList_Size(self->free_events);
  if (n <= 0) return PyObject_CallNoArgs(self->acquire_event);
  PyObject* ev = PyList_GetItem(self->free_events, n - 1);
  Py_XINCREF(ev);
  if (ev != NULL && PyList_SetSlice(self->free_events, n - 1, n, NULL) < 0) Py_CLEAR(ev);
  return ev;
}

void lane_give_back_event(Lane* self, PyObject* ev) {
  if (ev != NULL && PyList_Append(self->free_events, ev) < 0)
    PyErr_WriteUnraisable((PyObject*)self);
}

int lane_in_context(Lane* self, PyObject* device, int (*fn)(Lane*, Saved*, void*), Saved* s,
                    void* arg) {
  PyObject* cm = PyObject_CallFunctionObjArgs(self->context, device, NULL);
  PyObject* entered = cm ? PyObject_CallMethodObjArgs(cm, n_enter, NULL) : NULL;
  if (entered == NULL) {
    Py_XDECREF(cm);
    return -1;
  }
  Py_DECREF(entered);
  int r = fn(self, s, arg);
  PyObject *type = NULL, *value = NULL, *tb = NULL;
  if (r < 0) {
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
  }
  PyObject* left = PyObject_CallMethodObjArgs(cm, n_exit, type ? type : Py_None,
                                              value ? value : Py_None, tb ? tb : Py_None, NULL);
  Py_DECREF(cm);
  if (left == NULL) { /* __exit__ raised: that error replaces the one it was given */
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return -1;
  }
  Py_DECREF(left);
  if (r < 0) PyErr_Restore(type, value, tb); /* a context that would suppress it does not */
  return r;
}

int lane_made(PyObject* o, const char* method) {
  if (((Lane*)o)->ep != NULL) return 1;
  PyErr_Format(PyExc_TypeError, "OffloadLane.%s(): the lane was never made (OffloadLane(...) "
               "runs its __init__)", method);
  return 0;
}

int lane_decline_on_exception(void) {
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
  PyErr_Clear();
  return 0;
}

PyObject* lane_record(PyObject* type, PyObject* const* names, PyObject* const* values, int n) {
  PyObject* empty = PyTuple_New(0);
  PyObject* r = empty ? PyType_GenericNew((PyTypeObject*)type, empty, NULL) : NULL;
  Py_XDECREF(empty);
  for (int i = 0; r != NULL && i < n; i++)
    if (PyObject_SetAttr(r, names[i], values[i]) < 0) Py_CLEAR(r);
  return r;
}

PyObject* lane_lock(PyObject* owner) {
  PyObject* lock = PyObject_GetAttr(owner, n_lock);
  PyObject* got = lock ? PyObject_CallMethodObjArgs(lock, n_acquire, NULL) : NULL;
  if (got == NULL) {
    Py_XDECREF(lock);
    return NULL;
  }
  Py_DECREF(got);
  return lock;
}

void lane_keep_first(PyObject* first[3]) {
  if (first[0] == NULL)
    PyErr_Fetch(&first[0], &first[1], &first[2]);
  else
    PyErr_Clear();
}

PyObject* lane_lock_surely(PyObject* owner, PyObject* first[3]) {
  for (int tries = 1;; tries++) {
    PyObject* lock = lane_lock(owner);
    if (lock != NULL || tries >= 100) return lock;
    lane_keep_first(first);
  }
}

int lane_unlock(PyObject* lock) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb); /* let go whatever the holder raised, which stays set */
  PyObject* r = PyObject_CallMethodObjArgs(lock, n_release, NULL);
  Py_DECREF(lock);
  if (r == NULL) {
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return 0;
  }
  Py_DECREF(r);
  PyErr_Restore(type, value, tb);
  return 1;
}

/* ---- the type -------------------------------------------------------------------------------- */
/* The simulated device's checks, when it checksums every tensor: its checksum method and the
 * transport's reload check. 1, or 0 with an error set. */
static int checks_of(Lane* self, PyObject* dev) {
  int r = lane_attr_true(dev, n_simulated);
  if (r == 1) r = lane_attr_true(dev, n_checksums);
  if (r != 1) return r == 0;
  return (self->checksum = PyObject_GetAttr(dev, n_checksum)) != NULL &&
         (self->check_reloaded = PyObject_GetAttr(self->transport, n_check_simulated)) != NULL;
}

/* What the lane reads of its endpoint once: 1, or 0 with an error set. */
static int read_endpoint(Lane* self, PyObject* ep) {
  static const char* const device_methods[] = {"context", "adopt", "describe", "current_stream",
                                               "record", "reload_stream", "empty_on",
                                               "event_seq", "wait", "record_stream"};
  PyObject** const into[] = {&self->context, &self->adopt, &self->describe,
                             &self->current_stream, &self->record, &self->reload_stream,
                             &self->empty_on, &self->event_seq, &self->wait,
                             &self->record_stream};
  if ((self->client = PyObject_GetAttr(ep, n_client)) == NULL ||
      (self->transport = PyObject_GetAttr(ep, n_transport)) == NULL)
    return 0;
  PyObject* dev = PyObject_GetAttr(self->transport, n_dev);
  int ok = dev != NULL;
  for (int i = 0; ok && i < 10; i++)
    ok = (*into[i] = PyObject_GetAttrString(dev, device_methods[i])) != NULL;
  ok = ok && checks_of(self, dev);
  Py_XDECREF(dev);
  PyObject* events = ok ? PyObject_GetAttr(self->transport, n_events) : NULL;
  ok = events != NULL && (self->free_events = PyObject_GetAttr(events, n_free)) != NULL &&
       (self->acquire_event = PyObject_GetAttrString(events, "acquire")) != NULL &&
       (self->regions = PyObject_GetAttr(self->transport, n_regions)) != NULL &&
       (self->reload = PyObject_GetAttrString(self->client, "reload")) != NULL;
  Py_XDECREF(events);
  if (ok && (!PyList_Check(self->free_events) || !PyDict_Check(self->regions))) {
    PyErr_SetString(PyExc_TypeError, "OffloadLane(): the endpoint's transport keeps no free "
                                     "event list and region table (not a CudaIpcTransport)");
    ok = 0;
  }
  return ok;
}

#define LANE_FIELDS(self)                                                                       \
  {&self->ep, &self->client, &self->transport, &self->context, &self->adopt, &self->describe,  \
   &self->current_stream, &self->record, &self->reload_stream, &self->empty_on,                \
   &self->event_seq, &self->wait, &self->record_stream, &self->reload,                        \
   &self->acquire_event, &self->free_events, &self->regions, &self->full_until,                \
   &self->offload_op_type, &self->reload_op_type, &self->partial, &self->checksum,             \
   &self->check_reloaded, &self->full_key}

/* A lane is in the cycle collector's view: the ops it sends hold the store's done-callback,
 * and the store holds its lanes. */
static int lane_traverse(PyObject* o, visitproc visit, void* arg) {
  Lane* self = (Lane*)o;
  PyObject** const fields[] = LANE_FIELDS(self);
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) Py_VISIT(*fields[i]);
  Py_VISIT(Py_TYPE(o));
  return 0;
}

static int lane_clear(PyObject* o) {
  Lane* self = (Lane*)o;
  PyObject** const fields[] = LANE_FIELDS(self);
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) Py_CLEAR(*fields[i]);
  return 0;
}

/* A class made by a class statement (a heap type) whose instances object's __new__ makes:
 * lane_record may make one without running its __init__. */
static int record_type(PyObject* t) {
  return PyType_Check(t) && (PyType_GetFlags((PyTypeObject*)t) & Py_TPFLAGS_HEAPTYPE) &&
         PyType_GetSlot((PyTypeObject*)t, Py_tp_new) ==
             PyType_GetSlot(&PyBaseObject_Type, Py_tp_new);
}

/* (ep.pid, ep.socket_path, ep.key): the endpoint's key in the back-off table. */
static PyObject* full_key_of(PyObject* ep) {
  PyObject* pid = PyObject_GetAttrString(ep, "pid");
  PyObject* sock = pid ? PyObject_GetAttrString(ep, "socket_path") : NULL;
  PyObject* key = sock ? PyObject_GetAttrString(ep, "key") : NULL;
  PyObject* t = key ? PyTuple_Pack(3, pid, sock, key) : NULL;
  Py_XDECREF(pid);
  Py_XDECREF(sock);
  Py_XDECREF(key);
  return t;
}

static int lane_init(PyObject* o, PyObject* args, PyObject* kwargs) {
  Lane* self = (Lane*)o;
  PyObject *ep, *full_until, *offload_type, *reload_type, *partial;
  if (kwargs != NULL && PyDict_Size(kwargs) != 0) {
    PyErr_SetString(PyExc_TypeError, "OffloadLane() takes positional arguments only");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "OOOOO:OffloadLane", &ep, &full_until, &offload_type,
                        &reload_type, &partial))
    return -1;
  if (self->initialized) {
    PyErr_SetString(PyExc_TypeError, "an OffloadLane is made once (make another)");
    return -1;
  }
  self->initialized = 1;
  if (!PyDict_Check(full_until) || !record_type(offload_type) || !record_type(reload_type) ||
      !PyCallable_Check(partial)) {
    PyErr_SetString(PyExc_TypeError, "OffloadLane(ep, full_until: dict, offload_op_type and "
                                     "reload_op_type: classes with __slots__, partial)");
    return -1;
  }
  if (!read_endpoint(self, ep) || (self->full_key = full_key_of(ep)) == NULL) {
    lane_clear(o);
    return -1;
  }
  PyObject* const keep[] = {full_until, offload_type, reload_type, partial, ep};
  PyObject** const into[] = {&self->full_until, &self->offload_op_type, &self->reload_op_type,
                             &self->partial, &self->ep};
  for (int i = 0; i < 5; i++) {
    Py_INCREF(keep[i]);
    *into[i] = keep[i];
  }
  self->pid = lane_process_pid;
  return 0;
}

static void lane_dealloc(PyObject* o) { lane_gc_dealloc(o, lane_clear); }

static PyMethodDef lane_methods[] = {
    {"offload", (PyCFunction)(void (*)(void))lane_offload, METH_FASTCALL,
     "offload(saved, step) -> True when sent here, False when Python's path must decide"},
    {"reload", (PyCFunction)(void (*)(void))lane_reload, METH_FASTCALL,
     "reload(saved, priority) -> the ReloadOp sent or attached, or None: Python decides"},
    {"finish", (PyCFunction)(void (*)(void))lane_finish, METH_FASTCALL,
     "finish(reload_op, saved) -> the reloaded tensor, or None: Python decides (and waits)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot lane_slots[] = {
    {Py_tp_init, lane_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, lane_dealloc},
    {Py_tp_traverse, lane_traverse},
    {Py_tp_clear, lane_clear},
    {Py_tp_methods, lane_methods},
    {Py_tp_doc, "OffloadLane(ep, full_until, offload_op_type, reload_op_type, partial): one "
                "endpoint's usual per-tensor path in C (offload, reload, finish)."},
    {0, NULL},
};

PyType_Spec store_lane_spec = {"offloadd._store_front.OffloadLane", sizeof(Lane), 0,
                               Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, lane_slots};
