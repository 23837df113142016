/* offloadd._store_front, part seven: the hooks torch calls, in C (the type Hooks).
 *
 * torch calls a saved-tensor pack hook once per saved tensor and the unpack hook once per use
 * in backward. Store.pack and Store.unpack, in Python, are frames of their own and a dozen
 * attribute look-ups and method calls around the C calls that do the work (the pump, the
 * front's pack, the step's counts, the handles due, a lane's offload; the reload's claim). Here
 * the same usual paths run in one C call each that calls those C functions directly; every
 * unusual case goes to the store's Python, with nothing done before but what that Python
 * would have done first.
 *
 *   Hooks(store, store_globals)  the hooks of an offloadd.torch._store.Store; store_globals is
 *          that module's globals (its ``_pump`` is read at every call, so that a benchmark can
 *          switch the pump; its ``_AGAIN``, ``_WAITED``, ``PREFETCH`` and ``_RECOVERABLE`` once).
 *          TypeError when store._front is not a Front, the store has no instance dict, for
 *          keyword arguments and for a second __init__.
 *     pack(t) -> what store.pack(t) returns, with the store's own policy.
 *     pack_with(small_to_host, pin_memory, t) -> what store.pack(t, small_to_host, pin_memory)
 *          returns (save_on_cpu's instances: functools.partial(hooks.pack_with, True, pin)).
 *     unpack(packed) -> what store.unpack(packed) returns.
 *
 * The pack's usual path, as Store.pack's: the hooks' pump (``_pump()``); then, when the store
 * has no error kept for the next hook (``_async_error`` None), this thread's step
 * (``_thread.step``) is open (not unpacked, its ``foreign_unpacks`` the store's), no unpack came
 * since the last pack (``_unpacking`` false) and the pinning decision is known (``_can_pin``
 * not None when pinning is asked for): the front's pack; a category (left in place) goes to
 * ``store._left(t, category, step, small_to_host, pin)``; a handle is counted as eligible in
 * the step (what _StepCounts.saw does for it), and each handle due
 * (front.pop_due(keep_last_n)) is offloaded by its device's lane (``store._lanes``), or by
 * ``store._offload`` when it has none or the lane declines. Anything else is
 * ``store.pack(t, small_to_host, pin_memory)``, which pumps again (it finds nothing new).
 *
 * The unpack: Store.unpack's first lines (``_unpacking`` set; this thread's step unpacked, or
 * one more of the store's ``_foreign_unpacks``); what is not a Saved goes to
 * ``store._unpack_left``. For a handle: the pump; then, when no error is kept, the handle's
 * tensor is alive with its version unchanged and nothing noted it modified, it has no result
 * yet, and under the store's lock it is OFFLOADED, of this process's endpoint and not being
 * reloaded: marked unpacked and its reload claimed there, its reload done (store_unpack.c: in
 * C on the usual path, else ``store._reload_claimed(s)``), and the claim let go under the lock
 * (the threads waiting for it woken through ``store._reloaded``) whatever that raised; an
 * interrupt while waiting for the lock to let it go is raised after the claim went.
 * ``_AGAIN`` from it: ``store.unpack(s)``. A result already there is returned. Anything else
 * is ``store._unpack_saved(s, pumped=True)``.
 *
 * What any of these raises propagates, as from the Python methods. The store's Python is
 * called through its attributes (an instance attribute replacing a method is what runs). */
#include "client/core/store_lane.h"

typedef struct {
  PyObject_HEAD
  PyObject *store, *front, *globals;
  PyObject *again, *waited; /* the store module's _AGAIN and _WAITED */
  PyObject *prefetch, *recoverable; /* its PREFETCH and _RECOVERABLE */
  PyObject* dict;                   /* the store's instance dict */
  int initialized;           /* __init__ began (it runs once) */
} Hooks;

static PyObject *h_front, *h_pump, *h_async_error, *h_thread, *h_step, *h_unpacked,
    *h_foreign_unpacks, *h_store_foreign_unpacks, *h_unpacking, *h_pin_memory, *h_can_pin,
    *h_threshold_bytes, *h_left,
    *h_packs, *h_eligible, *h_device, *h_keep_last_n, *h_lanes, *h_offload, *h_pack,
    *h_lane_offload, *h_unpack, *h_unpack_left, *h_unpack_saved, *h_again,
    *h_waited, *h_reloaded, *h_notify_all, *h_prefetch, *h_recoverable, *h_dict;

int store_hooks_init(void) {
  return front_intern(&h_front, "_front") && front_intern(&h_pump, "_pump") &&
         front_intern(&h_async_error, "_async_error") && front_intern(&h_thread, "_thread") &&
         front_intern(&h_step, "step") && front_intern(&h_unpacked, "unpacked") &&
         front_intern(&h_foreign_unpacks, "foreign_unpacks") &&
         front_intern(&h_store_foreign_unpacks, "_foreign_unpacks") &&
         front_intern(&h_unpacking, "_unpacking") && front_intern(&h_pin_memory, "pin_memory") &&
         front_intern(&h_can_pin, "_can_pin") &&
         front_intern(&h_threshold_bytes, "threshold_bytes") && front_intern(&h_left, "_left") &&
         front_intern(&h_packs, "packs") && front_intern(&h_eligible, "eligible") &&
         front_intern(&h_device, "device") && front_intern(&h_keep_last_n, "keep_last_n") &&
         front_intern(&h_lanes, "_lanes") && front_intern(&h_offload, "_offload") &&
         front_intern(&h_pack, "pack") && front_intern(&h_lane_offload, "offload") &&
         front_intern(&h_unpack, "unpack") && front_intern(&h_unpack_left, "_unpack_left") &&
         front_intern(&h_unpack_saved, "_unpack_saved") &&
         front_intern(&h_again, "_AGAIN") &&
         front_intern(&h_waited, "_WAITED") && front_intern(&h_reloaded, "_reloaded") &&
         front_intern(&h_notify_all, "notify_all") && front_intern(&h_prefetch, "PREFETCH") &&
         front_intern(&h_recoverable, "_RECOVERABLE") && front_intern(&h_dict, "__dict__");
}

/* The store module's _pump() (read at every call: a benchmark may switch it): 1, or 0 with an
 * error set. */
static int pump(Hooks* h) {
  PyObject* fn = PyDict_GetItemWithError(h->globals, h_pump); /* borrowed */
  if (fn == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "offloadd: the store has no _pump");
    return 0;
  }
  Py_INCREF(fn); /* the call may replace the global */
  PyObject* r = PyObject_CallNoArgs(fn);
  Py_DECREF(fn);
  Py_XDECREF(r);
  return r != NULL;
}

/* ---- the checks before the front's pack ------------------------------------------------------ */
/* This thread's open step (a new reference): NULL with no error when Store.pack must decide. */
static PyObject* open_step(PyObject* store) {
  PyObject* local = PyObject_GetAttr(store, h_thread);
  PyObject* step = local ? PyObject_GetAttr(local, h_step) : NULL;
  Py_XDECREF(local);
  if (step == NULL) {
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear(); /* no step yet */
    return NULL;
  }
  int open = step != Py_None && lane_attr_true(step, h_unpacked) == 0;
  if (open) {
    PyObject* mine = PyObject_GetAttr(step, h_foreign_unpacks);
    PyObject* now = mine ? PyObject_GetAttr(store, h_store_foreign_unpacks) : NULL;
    open = now != NULL && PyObject_RichCompareBool(mine, now, Py_EQ) == 1;
    Py_XDECREF(now);
    Py_XDECREF(mine);
  }
  if (!open) Py_CLEAR(step);
  return step;
}

/* The pin argument of the front's pack (a new reference), or NULL: with an error set, or
 * without one when Store.pack must decide (pinning asked for, its possibility not known yet). */
static PyObject* pin_of(PyObject* store, PyObject* pin_memory) {
  PyObject* pin = pin_memory;
  if (pin == Py_None) {
    if ((pin = PyObject_GetAttr(store, h_pin_memory)) == NULL) return NULL;
  } else {
    Py_INCREF(pin);
  }
  int asked = PyObject_IsTrue(pin);
  if (asked == 0) return pin; /* the front's pack gets it as it is, as from Store.pack */
  Py_DECREF(pin);
  if (asked < 0) return NULL;
  pin = PyObject_GetAttr(store, h_can_pin);
  if (pin == Py_None) Py_CLEAR(pin); /* torch.cuda.is_available() not asked yet: Python's */
  return pin;
}

/* 1 when the usual path applies (*step and *pin set), 0 when not, -1 with an error set. */
static int usual(PyObject* store, PyObject* pin_memory, PyObject** step, PyObject** pin) {
  int r = lane_attr_none(store, h_async_error);
  if (r != 1) return r;
  if ((*step = open_step(store)) == NULL) return PyErr_Occurred() ? -1 : 0;
  if ((r = lane_attr_true(store, h_unpacking)) != 0) return r < 0 ? -1 : 0;
  if ((*pin = pin_of(store, pin_memory)) == NULL) return PyErr_Occurred() ? -1 : 0;
  return 1;
}

/* ---- after the front's pack ------------------------------------------------------------------ */
/* _StepCounts.saw(t, None): the step's first pack notes t's device; one more pack, eligible. */
static int saw_eligible(PyObject* step, PyObject* t) {
  PyObject* packs = PyObject_GetAttr(step, h_packs);
  if (packs == NULL) return 0;
  long long n = PyLong_AsLongLong(packs);
  Py_DECREF(packs);
  if (n == -1 && PyErr_Occurred()) return 0;
  if (n == 0) {
    PyObject* device = PyObject_GetAttr(t, h_device);
    int ok = device != NULL && PyObject_SetAttr(step, h_device, device) == 0;
    Py_XDECREF(device);
    if (!ok) return 0;
  }
  PyObject* more = PyLong_FromLongLong(n + 1);
  int ok = more != NULL && PyObject_SetAttr(step, h_packs, more) == 0;
  Py_XDECREF(more);
  return ok && lane_attr_add(step, h_eligible, 1);
}

/* Handle o offloaded: by its device's lane, or by store._offload (1), or 0 with an error set. */
static int offload_due(PyObject* store, PyObject* lanes, PyObject* o, PyObject* step) {
  PyObject* lane = NULL;
  if (PyDict_Check(lanes) && PyDict_Size(lanes) > 0) {
    lane = PyDict_GetItemWithError(lanes, ((Saved*)o)->device ? ((Saved*)o)->device : Py_None);
    if (lane == NULL && PyErr_Occurred()) return 0;
  }
  if (lane != NULL && lane != Py_None) {
    Py_INCREF(lane); /* the dict may change while it runs */
    PyObject* const args[] = {o, step};
    PyObject* sent = Py_TYPE(lane) == LaneType
                         ? lane_offload(lane, args, 2)
                         : PyObject_CallMethodObjArgs(lane, h_lane_offload, o, step, NULL);
    Py_DECREF(lane);
    if (sent == NULL) return 0;
    int done = PyObject_IsTrue(sent);
    Py_DECREF(sent);
    if (done != 0) return done > 0;
  }
  PyObject* r = PyObject_CallMethodObjArgs(store, h_offload, o, NULL);
  Py_XDECREF(r);
  return r != NULL;
}

/* The handles due offloaded (Store.pack's last lines): 1, or 0 with an error set. */
static int offload_all_due(Hooks* h, PyObject* step) {
  PyObject* keep = PyObject_GetAttr(h->store, h_keep_last_n);
  PyObject* due = keep ? front_pop_due_of(h->front, keep) : NULL;
  Py_XDECREF(keep);
  if (due == NULL) return 0;
  int ok = 1;
  if (due != Py_None) {
    PyObject* lanes = PyObject_GetAttr(h->store, h_lanes);
    ok = lanes != NULL;
    for (Py_ssize_t i = 0; ok && i < PyList_Size(due); i++)
      ok = offload_due(h->store, lanes, PyList_GetItem(due, i), step);
    Py_XDECREF(lanes);
  }
  Py_DECREF(due);
  return ok;
}

/* ---- pack ------------------------------------------------------------------------------------ */
static PyObject* slow_pack(Hooks* h, PyObject* t, PyObject* small_to_host, PyObject* pin_memory) {
  return PyObject_CallMethodObjArgs(h->store, h_pack, t, small_to_host, pin_memory, NULL);
}

/* The front's pack and what follows it on the usual path (step and pin from usual()). */
static PyObject* pack_usual(Hooks* h, PyObject* t, PyObject* small_to_host, PyObject* step,
                            PyObject* pin) {
  PyObject* threshold = PyObject_GetAttr(h->store, h_threshold_bytes);
  if (threshold == NULL) return NULL;
  PyObject* const args[] = {t, threshold, pin, h->store, step};
  PyObject* r = front_pack_of(h->front, args, 5);
  Py_DECREF(threshold);
  if (r == NULL) return NULL;
  if (PyUnicode_CheckExact(r)) { /* left in place: the category it was left for */
    PyObject* kept = PyObject_CallMethodObjArgs(h->store, h_left, t, r, step, small_to_host,
                                                pin, NULL);
    Py_DECREF(r);
    return kept;
  }
  if (!saw_eligible(step, t) || !offload_all_due(h, step)) Py_CLEAR(r);
  return r;
}

static PyObject* pack(Hooks* h, PyObject* t, PyObject* small_to_host, PyObject* pin_memory) {
  if (h->store == NULL) {
    PyErr_SetString(PyExc_TypeError, "Hooks(store, store_globals) was never made");
    return NULL;
  }
  if (!pump(h)) return NULL;
  PyObject *step = NULL, *pin = NULL;
  int r = usual(h->store, pin_memory, &step, &pin);
  PyObject* result = r == 1   ? pack_usual(h, t, small_to_host, step, pin)
                     : r == 0 ? slow_pack(h, t, small_to_host, pin_memory)
                              : NULL;
  Py_XDECREF(step);
  Py_XDECREF(pin);
  return result;
}

static PyObject* hooks_pack(PyObject* o, PyObject* t) {
  return pack((Hooks*)o, t, Py_None, Py_None);
}

static PyObject* hooks_pack_with(PyObject* o, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "pack_with(small_to_host, pin_memory, t)");
    return NULL;
  }
  return pack((Hooks*)o, args[2], args[0], args[1]);
}

/* ---- unpack ---------------------------------------------------------------------------------- */
/* unpack's first lines: the step's backward began (store._unpacking; this thread's step
 * unpacked, or one more unpack of a thread that packs nothing): 1, or 0 with an error set. */
static int backward_began(PyObject* store) {
  if (PyObject_SetAttr(store, h_unpacking, Py_True) < 0) return 0;
  PyObject* local = PyObject_GetAttr(store, h_thread);
  PyObject* step = local ? PyObject_GetAttr(local, h_step) : NULL;
  Py_XDECREF(local);
  if (step == NULL) {
    if (local == NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) return 0;
    PyErr_Clear(); /* getattr(store._thread, "step", None) */
  }
  if (step != NULL && step != Py_None) {
    int ok = PyObject_SetAttr(step, h_unpacked, Py_True) == 0;
    Py_DECREF(step);
    return ok;
  }
  Py_XDECREF(step);
  return lane_attr_add(store, h_store_foreign_unpacks, 1);
}

/* Handle s still names its tensor, unchanged, and nothing noted it modified (else
 * _unpack_saved runs the full check): 1, 0, -1 with an error set. */
static int source_intact(Saved* s) {
  if (s->modified != NULL && s->modified != Py_None) return 0;
  if (s->src == NULL || !PyWeakref_Check(s->src)) return 0;
  PyObject* src = PyWeakref_GetObject(s->src); /* borrowed */
  if (src == NULL) return -1;
  if (src == Py_None) return 0;
  Py_INCREF(src);
  PyObject* version = PyObject_GetAttr(src, n_version);
  Py_DECREF(src);
  long long v = version ? PyLong_AsLongLong(version) : -1;
  Py_XDECREF(version);
  if (v == -1 && PyErr_Occurred()) return -1;
  return v == s->version;
}

/* Under the store's lock, as _unpack_saved's first locked block: the usual case (an
 * OFFLOADED handle of this process that no thread is reloading) marked unpacked and its reload
 * claimed: 1; 0 when not the usual case (nothing changed); -1 with an error set. */
static int claim_usual(PyObject* store, Saved* s) {
  PyObject* ep = s->ep; /* its process read before the lock: an attribute read may run code */
  Py_XINCREF(ep);
  int ours = ep == NULL || ep == Py_None ? 1 : lane_own_endpoint(ep); /* None: none yet */
  PyObject* lock = ours == 1 ? lane_lock(store) : NULL;
  if (lock == NULL) {
    Py_XDECREF(ep);
    return ours == 1 ? -1 : ours;
  }
  int usual = s->state == OFFLOADED && s->ep == ep &&
              (s->reloading == NULL || s->reloading == Py_None || s->reloading == Py_False);
  PyObject* old = NULL;
  if (usual) {
    s->unpacked = 1;
    old = s->reloading;
    Py_INCREF(Py_True);
    s->reloading = Py_True;
  }
  int unlocked = lane_unlock(lock);
  Py_XDECREF(old); /* None or False */
  Py_XDECREF(ep);
  return unlocked ? usual : -1;
}

/* _unclaim: the claim let go under the store's lock and the threads waiting for it woken, as
 * Store._unclaim does. Called with the reload's error set, or none. What letting go raised
 * (an interrupt in the wait for the lock, or in waking the waiters) replaces it, with the
 * reload's error as its __context__, as an error raised in a `finally` does: 1, or 0 with an
 * error set. */
static int unclaim(Hooks* h, Saved* s) {
  PyObject *type, *value, *tb, *interrupt[3] = {NULL, NULL, NULL};
  PyErr_Fetch(&type, &value, &tb);
  PyObject* lock = lane_lock_surely(h->store, interrupt);
  int ok = lock != NULL;
  if (ok) {
    PyObject* old = s->reloading;
    int waited = old == h->waited;
    Py_INCREF(Py_False);
    s->reloading = Py_False;
    if (waited) {
      PyObject* cond = PyObject_GetAttr(h->store, h_reloaded);
      PyObject* r = cond ? PyObject_CallMethodObjArgs(cond, h_notify_all, NULL) : NULL;
      ok = r != NULL;
      Py_XDECREF(r);
      Py_XDECREF(cond);
    }
    ok = lane_unlock(lock) && ok;
    Py_XDECREF(old); /* after the lock: it may run code (True or the _WAITED string: none) */
  }
  if (ok && interrupt[0] != NULL) { /* the claim went; the interrupt of the wait is raised */
    PyErr_Restore(interrupt[0], interrupt[1], interrupt[2]);
    ok = 0;
  } else {
    Py_XDECREF(interrupt[0]);
    Py_XDECREF(interrupt[1]);
    Py_XDECREF(interrupt[2]);
  }
  if (type == NULL) return ok;
  if (ok) { /* nothing raised in letting go: the reload's error stands */
    PyErr_Restore(type, value, tb);
    return 0;
  }
  PyObject *now_type, *now, *now_tb; /* the let-go's error, the reload's as its context */
  PyErr_Fetch(&now_type, &now, &now_tb);
  PyErr_NormalizeException(&now_type, &now, &now_tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != NULL) PyException_SetTraceback(value, tb);
  PyException_SetContext(now, value); /* steals value */
  Py_XDECREF(type);
  Py_XDECREF(tb);
  PyErr_Restore(now_type, now, now_tb);
  return 0;
}

/* A handle's unpack, its usual case in C: the pump, the checks, the claim; the reload by
 * store._reload_claimed; the claim let go. Anything else: store._unpack_saved. */
static PyObject* unpack_saved(Hooks* h, Saved* s) {
  if (!pump(h)) return NULL;
  int r = lane_attr_none(h->store, h_async_error);
  if (r == 1) r = source_intact(s);
  if (r == 1 && s->result != NULL && s->result != Py_None) {
    Py_INCREF(s->result);
    return s->result;
  }
  if (r == 1) r = claim_usual(h->store, s);
  if (r < 0) return NULL;
  if (r == 0) /* pumped already */
    return PyObject_CallMethodObjArgs(h->store, h_unpack_saved, (PyObject*)s, Py_True, NULL);
  PyObject* t = hooks_reload_claimed(h->store, h->front, h->dict, h->prefetch, h->recoverable, s);
  if (!unclaim(h, s)) Py_CLEAR(t);
  if (t == h->again) { /* the handle became a fallback meanwhile: unpacked again, in Python */
    Py_DECREF(t);
    return PyObject_CallMethodObjArgs(h->store, h_unpack, (PyObject*)s, NULL);
  }
  return t;
}

static PyObject* hooks_unpack(PyObject* o, PyObject* packed) {
  Hooks* h = (Hooks*)o;
  if (h->store == NULL) {
    PyErr_SetString(PyExc_TypeError, "Hooks(store, store_globals) was never made");
    return NULL;
  }
  if (!backward_began(h->store)) return NULL;
  if (Py_TYPE(packed) != SavedType)
    return PyObject_CallMethodObjArgs(h->store, h_unpack_left, packed, NULL);
  Py_INCREF(packed); /* the store's code may drop the caller's references */
  PyObject* t = unpack_saved(h, (Saved*)packed);
  Py_DECREF(packed);
  return t;
}

/* ---- the type -------------------------------------------------------------------------------- */
static int hooks_init(PyObject* o, PyObject* args, PyObject* kwargs) {
  Hooks* self = (Hooks*)o;
  PyObject *store, *globals;
  if (kwargs != NULL && PyDict_Size(kwargs) > 0) {
    PyErr_SetString(PyExc_TypeError, "Hooks(store, store_globals) takes no keyword arguments");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "OO!:Hooks", &store, &PyDict_Type, &globals)) return -1;
  if (self->initialized) { /* set before any code can run: a re-entered __init__ fails too */
    PyErr_SetString(PyExc_TypeError, "Hooks are made once (make another)");
    return -1;
  }
  self->initialized = 1;
  PyObject* front = PyObject_GetAttr(store, h_front);
  if (front == NULL) return -1;
  if (!front_check(front)) {
    Py_DECREF(front);
    PyErr_SetString(PyExc_TypeError, "Hooks(store, ...): store._front is not a Front");
    return -1;
  }
  PyObject* const names[] = {h_again, h_waited, h_prefetch, h_recoverable};
  PyObject* found[4] = {NULL, NULL, NULL, NULL}; /* borrowed */
  for (int i = 0; i < 4 && (i == 0 || found[i - 1] != NULL); i++)
    found[i] = PyDict_GetItemWithError(globals, names[i]);
  PyObject* dict = found[3] != NULL ? PyObject_GetAttr(store, h_dict) : NULL;
  if (dict == NULL || !PyDict_Check(dict)) {
    Py_DECREF(front);
    Py_XDECREF(dict);
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_TypeError, "Hooks(store, store_globals): store_globals has no "
                                       "_AGAIN, _WAITED, PREFETCH and _RECOVERABLE (the store "
                                       "module's globals), or the store no instance dict");
    return -1;
  }
  PyObject* const keep[] = {store, globals, found[0], found[1], found[2], found[3]};
  for (int i = 0; i < 6; i++) Py_INCREF(keep[i]);
  self->store = store;
  self->front = front;
  self->globals = globals;
  self->again = found[0];
  self->waited = found[1];
  self->prefetch = found[2];
  self->recoverable = found[3];
  self->dict = dict;
  return 0;
}

static int hooks_traverse(PyObject* o, visitproc visit, void* arg) {
  Hooks* self = (Hooks*)o;
  Py_VISIT(Py_TYPE(o)); /* a heap type's instances hold it */
  Py_VISIT(self->store);
  Py_VISIT(self->front);
  Py_VISIT(self->globals);
  Py_VISIT(self->again);
  Py_VISIT(self->waited);
  Py_VISIT(self->prefetch);
  Py_VISIT(self->recoverable);
  Py_VISIT(self->dict);
  return 0;
}

static int hooks_clear(PyObject* o) {
  Hooks* self = (Hooks*)o;
  Py_CLEAR(self->store);
  Py_CLEAR(self->front);
  Py_CLEAR(self->globals);
  Py_CLEAR(self->again);
  Py_CLEAR(self->waited);
  Py_CLEAR(self->prefetch);
  Py_CLEAR(self->recoverable);
  Py_CLEAR(self->dict);
  return 0;
}

static void hooks_dealloc(PyObject* o) { lane_gc_dealloc(o, hooks_clear); }

static PyMethodDef hooks_methods[] = {
    {"pack", (PyCFunction)hooks_pack, METH_O, "pack(t) -> what store.pack(t) returns"},
    {"pack_with", (PyCFunction)(void (*)(void))hooks_pack_with, METH_FASTCALL,
     "pack_with(small_to_host, pin_memory, t) -> store.pack(t, small_to_host, pin_memory)"},
    {"unpack", (PyCFunction)hooks_unpack, METH_O, "unpack(packed) -> store.unpack(packed)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot hooks_slots[] = {
    {Py_tp_init, hooks_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, hooks_dealloc},
    {Py_tp_traverse, hooks_traverse},
    {Py_tp_clear, hooks_clear},
    {Py_tp_methods, hooks_methods},
    {Py_tp_doc, "Hooks(store, store_globals): a store's pack and unpack hooks, their usual "
                "paths in C."},
    {0, NULL},
};

PyType_Spec store_hooks_spec = {"offloadd._store_front.Hooks", sizeof(Hooks), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, hooks_slots};
