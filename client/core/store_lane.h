/* offloadd._store_front's lanes: one endpoint's usual per-tensor path in C (the type
 * OffloadLane; store_lane.c documents it). store_lane.c makes the type and holds what both of
 * its halves use; store_offload.c is a handle's offload, store_reload.c its reload. */
#ifndef OFFLOADD_CLIENT_CORE_STORE_LANE_H_
#define OFFLOADD_CLIENT_CORE_STORE_LANE_H_

#include "client/core/store_front.h"

/* What a lane reads once, when it is made, from its endpoint: the client and transport, the
 * device's methods (bound), the transport's free IPC events (a list) and region table (an
 * OrderedDict: segment buffer id -> region id). */
typedef struct {
  PyObject_HEAD
  PyObject *ep, *client, *transport;
  PyObject *context, *adopt, *describe, *current_stream, *record, *reload_stream, *empty_on,
      *event_seq, *wait, *record_stream;
  PyObject* reload;                   /* the client's method */
  PyObject* acquire_event;            /* the transport's IpcEventPool.acquire (makes one) */
  PyObject *free_events, *regions, *full_until, *offload_op_type, *reload_op_type, *partial;
  PyObject* full_key;       /* (pid, socket path, device key): the endpoint's back-off entry */
  PyObject* checksum;       /* a simulated device's checksum method when it checks, else NULL */
  PyObject* check_reloaded; /* then the transport's _check_simulated, else NULL */
  long long pid;            /* the process that made it */
  int initialized;          /* __init__ began (it runs once) */
} Lane;

/* This process's id (read again in a forked child by a pthread_atfork handler). */
extern long long lane_process_pid;

/* Interned attribute names (store_lane.c). */
extern PyObject *n_dead, *n_closing, *n_abandoned, *n_submit_fast, *n_version, *n_handle,
    *n_lock, *n_acquire, *n_release, *n_done, *n_exc, *n_value, *n_tensor, *n_event;

/* 1 when attribute `name` of o is None / true, 0 when not, -1 with an error set. */
int lane_attr_none(PyObject* o, PyObject* name);
int lane_attr_true(PyObject* o, PyObject* name);

/* 1 when endpoint ep (an offloadd.torch._endpoint.Endpoint: its pid) was made by this
 * process, 0 when not, -1 with an error set. */
int lane_own_endpoint(PyObject* ep);

/* o.name += n (a count kept as a Python int): 1, or 0 with an error set. */
int lane_attr_add(PyObject* o, PyObject* name, Py_ssize_t n);

/* tp_dealloc of the module's GC types: untracked, cleared by `clear`, freed, its heap type let
 * go. */
void lane_gc_dealloc(PyObject* o, inquiry clear);

/* 1 when the lane serves this process and its client is alive with no destination waiting in
 * the transport; 0 when not; -1 with an error set. */
int lane_ready(Lane* self);

/* The region id and offset of `nbytes` at tensor t's data pointer, from the device's describe
 * and the region table (the entry moved last, as region_for does): 1; 0 when the segment is not
 * registered or the span runs past it (Python's path registers, or raises); -1 error. */
int lane_region_of(Lane* self, PyObject* t, long long nbytes, PyObject** rid,
                   PyObject** offset);

/* An IPC event: the last of the free list, or when it is empty the pool's new one
 * (IpcEventPool.acquire: a device call). NULL with an error set. lane_give_back_event puts one
 * back (NULL: nothing). */
PyObject* lane_take_event(Lane* self);
void lane_give_back_event(Lane* self, PyObject* ev);

/* fn(self, s, arg) inside dev.context(device), left with what fn raised: fn's result. */
int lane_in_context(Lane* self, PyObject* device, int (*fn)(Lane*, Saved*, void*), Saved* s,
                    void* arg);

/* An Exception from a device call: cleared, 0 (Python's path decides); anything else that
 * is not an Exception (KeyboardInterrupt): -1, left set to propagate. */
int lane_decline_on_exception(void);

/* A new instance of a plain record class with __slots__ (no __init__ run): the n fields
 * named set to the values. NULL with an error set. */
PyObject* lane_record(PyObject* type, PyObject* const* names, PyObject* const* values, int n);

/* owner._lock (a handle's store's, or a client's), taken (blocking, as `with owner._lock`
 * takes it): the lock, or NULL with an error set. lane_unlock gives it back and drops the
 * reference, keeping an error the holder set: 1, or 0 with an error set. */
PyObject* lane_lock(PyObject* owner);
/* lane_lock, waited for until taken: an interrupt while waiting (a signal handler that raised)
 * is kept in first[0..2] (type, value, traceback: the first one; later ones dropped; the caller
 * restores or drops it) and the wait goes on, for work that must be done whatever happens.
 * NULL with an error set only for an error that does not go away (100 tries). */
PyObject* lane_lock_surely(PyObject* owner, PyObject* first[3]);
/* The error set kept in first[0..3] when none is kept yet (PyErr_Fetch), else cleared: the
 * first of several errors, to raise after the work they interrupted is done. */
void lane_keep_first(PyObject* first[3]);
int lane_unlock(PyObject* lock);

/* 1 when lane o was made (its __init__ ran); else 0 with a TypeError naming `method`. */
int lane_made(PyObject* o, const char* method);

/* store_offload.c and store_reload.c: their names interned (0 with an error set), methods. */
int store_offload_init(void);
int store_reload_init(void);
PyObject* lane_offload(PyObject* o, PyObject* const* args, Py_ssize_t nargs);
PyObject* lane_reload(PyObject* o, PyObject* const* args, Py_ssize_t nargs);
PyObject* lane_finish(PyObject* o, PyObject* const* args, Py_ssize_t nargs);

#endif  /* OFFLOADD_CLIENT_CORE_STORE_LANE_H_ */
