/* pycall.h - layer 3: asking the Python interpreter to call a C function
 * in its main thread, without the GIL and without ever waiting for it
 * (docs/how-it-works.md, "Asking PyTorch").
 *
 * CPython's Py_AddPendingCall is documented to need neither the GIL nor a
 * thread state (https://docs.python.org/3/c-api/init.html#c.Py_AddPendingCall):
 * it queues fn(arg) (a queue of 32) and the main thread of the main
 * interpreter calls it, holding the GIL, at its next check between bytecodes.
 * The shim never waits for that call: the main thread may be blocked (in a
 * backward, a collective, a sleep) as long as it likes, and the request
 * simply waits with it.
 *
 * What is not safe is adding a call once the interpreter is being torn
 * down (3.10 and 3.11 free the queue's lock with the interpreter). So the
 * queue is opened by the instrumentation, with the GIL (gg_pycall_open), and
 * closed from Python's atexit, which runs before Py_FinalizeEx tears
 * anything down (gg_pycall_close): closing waits for the adds in flight (a
 * few microseconds each: the queue's lock is held only to push or pop one
 * entry) and nothing is added after it. Every add also checks that the
 * interpreter is not finalizing. A forked child keeps its copy open (its
 * interpreter is its own) with no add in flight.
 *
 * Python is found once, at open: Py_AddPendingCall in the global scope, or
 * in a libpython*.so loaded RTLD_LOCAL (an embedded interpreter).
 */
#ifndef GG_PYCALL_H
#define GG_PYCALL_H

#include <stdbool.h>

typedef int (*gg_pycall_fn)(void *arg);

/* Find the interpreter's pending-call queue and allow adds. False when
 * there is no Python in the process (nothing will be added). */
bool gg_pycall_open(void);

/* No add from now on; returns once the adds in flight are done (or after
 * 100 ms: an add that never returns is the interpreter's bug, not ours to
 * wait for). */
void gg_pycall_close(void);

/* Is the queue open? */
bool gg_pycall_is_open(void);

/* Queue fn(arg) for the main thread: true when queued. Never waits for
 * fn; false when closed, finalizing, or the queue is full. Any thread, any
 * time, no lock of the shim held. */
bool gg_pycall_add(gg_pycall_fn fn, void *arg);

/* With the GIL (a pending call, or a callback it makes): take a reference
 * to the Python object `obj` (false when the interpreter's functions were
 * not found: nothing is taken). */
bool gg_pycall_keep(void *obj);
/* In a pending call (the main thread, the GIL held): make `exc` (a Python
 * exception object, a reference gg_pycall_keep took) the exception the call
 * raises into the program: true, and the call must return -1. False (the
 * reference given back) when the interpreter's functions are missing. */
bool gg_pycall_raise(void *exc);

#ifdef GG_TESTING
/* For tests: use these in place of the interpreter's functions (NULL
 * finalizing: never). */
void gg_pycall_test_use(int (*add)(gg_pycall_fn, void *), int (*finalizing)(void));
#endif

#endif /* GG_PYCALL_H */
