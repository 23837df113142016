/* offloadd._store_front's shared declarations: the handle record (Saved) that the module's two
 * sources read and write directly -- store_front_module.c (the records and the pack's front)
 * and store_answers.c (the request ring's answers applied to the records). */
#ifndef OFFLOADD_CLIENT_CORE_STORE_FRONT_H_
#define OFFLOADD_CLIENT_CORE_STORE_FRONT_H_

#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030A0000
#include <Python.h>
#include <stdint.h>

/* Saved.state: the values of offloadd/torch/_store.py's SavedState. */
#define KEPT 0
#define OFFLOADING 1
#define OFFLOADED 2
#define LOST 4

/* A handle: what the store's pack returns for a tensor it may offload (store_front_module.c
 * documents its fields). An object field is NULL or Py_None when unset; both read as None. */
typedef struct Saved {
  PyObject_HEAD
  PyObject *store, *front, *tensor, *src, *base_src, *ep, *op, *block_id, *reload, *result,
      *counts, *modified, *sent_version, *reloading, *pin, *shape, *stride, *dtype, *device,
      *checksum;
  long long seq, offset, step, version, numel, nbytes;
  int state;
  char unpacked, dead, served, prefetch_kept, finalized;
  uint64_t seen_key, base_key; /* its de-duplication entries' keys (0: none) */
  PyObject* weakreflist;
} Saved;

/* The Saved type, made at the module's import (store_front_module.c). */
extern PyTypeObject* SavedType;

/* *out = the interned str s: 1, or 0 with an error set (store_front_module.c; every source of
 * the module interns its attribute names with it at import). */
int front_intern(PyObject** out, const char* s);

/* store_answers.c: interns its names (0 with an error set), and its module-level functions. */
int store_answers_init(void);
PyObject* store_answers_bind(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* store_answers_take(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
/* op.add_done_callback(fn): for an op of the ring op type bind_answers was given, in C (fn
 * appended to its callbacks under Outcome's lock, or called at once when op is done, as
 * offloadd._outcome.Outcome.add_done_callback does); else that method. 1, or 0 with an error
 * set: what fn raises when called at once, or what interrupted the wait for the lock (the
 * callback is added all the same, the lock waited for again). */
int answers_add_done_callback(PyObject* op, PyObject* fn);

/* A new outcome for a reload not sent yet, as Client.reload_outcome makes it
 * (_RingOp(client, "reload", None), of the ring op type bind_answers was given, made without
 * running its __init__), or NULL with an error set (RuntimeError before bind_answers). */
PyObject* answers_reload_outcome(PyObject* client);

/* store_pump.c: interns its names (0 with an error set), pump(client, batch, take) and
 * pump_all(endpoints, batch, client_module). */
int store_pump_init(void);
PyObject* store_pump(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* store_pump_all(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

/* store_lane.c: interns its names and registers its fork handler (0 with an error set), and
 * the spec of its type OffloadLane; LaneType is that type, made at the module's import. */
int store_lane_init(void);
extern PyType_Spec store_lane_spec;
extern PyTypeObject* LaneType;

/* store_front_module.c, for the hooks: whether o is a Front; its pack (args as Front.pack's),
 * pop_due and prefetch_candidates (the same results and errors as the methods). */
int front_check(PyObject* o);
PyObject* front_pack_of(PyObject* front, PyObject* const* args, Py_ssize_t nargs);
PyObject* front_pop_due_of(PyObject* front, PyObject* keep_last_n);
PyObject* front_prefetch_candidates_of(PyObject* front, PyObject* const* args, Py_ssize_t nargs);

/* store_hooks.c: interns its names (0 with an error set), and the spec of its type Hooks. */
int store_hooks_init(void);
extern PyType_Spec store_hooks_spec;

/* store_unpack.c: interns its names (0 with an error set), and the unpack hook's reload of a
 * handle whose reload claim it holds (documented there). */
int store_unpack_init(void);
PyObject* hooks_reload_claimed(PyObject* store, PyObject* front, PyObject* store_dict,
                               PyObject* prefetch_priority, PyObject* recoverable, Saved* s);

/* store_counts.c: adds the type TensorCounts to the module (0 with an error set), and the C
 * callers' counts of one offloaded and one reloaded tensor (1, or 0 with an error set: what a
 * replaced method raised), documented there. */
int store_counts_add_type(PyObject* module);
int counts_add_offloaded(PyObject* stats, long long nbytes);
int counts_add_reloaded(PyObject* stats, long long nbytes, int in_time, double waited_seconds);

#endif  /* OFFLOADD_CLIENT_CORE_STORE_FRONT_H_ */
