/* torch.h - layer 4: PyTorch's own view of its memory, asked for at the
 * moments that matter (docs/trainer.md, "Without a code change: gpuguard-run
 * instruments PyTorch"; docs/how-it-works.md, "Asking PyTorch").
 *
 * The shim cannot run Python. PyTorch's instrumentation
 * (gpuguard.torch_instrument, which gpuguard-run's sitecustomize installs
 * once the program imports torch) registers a C callback
 * (gpuguard_torch_attach). When something happens that PyTorch's view would
 * explain, the shim notes what it wants, per device and kind, and asks the
 * interpreter to call back at its next safe point in the main thread
 * (pycall.h; never waited for). There, with the GIL, the callback reads
 * PyTorch's allocator and hands the figures back (gpuguard_torch_view),
 * which become one `torch` line. The moments:
 *
 *   - the first near miss of each step on a device;
 *   - a refusal or an OOM: PyTorch's OOM observer answers those unasked, at
 *     the moment its allocator raises (an answer with seq 0); the request
 *     stands for the failure PyTorch recovered from (it emptied its cache
 *     and the retry worked), and an unasked answer on the device settles it;
 *   - a forecast, which also turns PyTorch's allocation history on for the
 *     step the forecast names, and off again at the boundary that ends it;
 *   - a leak suspected at step S: history on for step S + 1 only, and at
 *     the boundary of S + 2 (once history is off) the view's tensors are the
 *     blocks that still carry a Python stack: what step S + 1 allocated and
 *     the step after it did not free. That is the leak's rate, and the
 *     suspicion is said as a leak (`leak`) only when it is not nothing:
 *     live bytes that grow because the step's inputs do, or because the
 *     cache keeps what it reserved, are not a leak.
 *
 * Nothing here runs on the allocation path: gg_torch_incident is called for
 * incidents only (a relaxed load when nothing is attached).
 */
#ifndef GG_TORCH_H
#define GG_TORCH_H

#include <stdbool.h>
#include <stdint.h>

#include "gpuguard.h"

/* The instrumentation's callback; true when the interpreter can be asked
 * (its answers and the OOM observer's work either way). */
/* The callback hands back exc (a Python exception a signal handler raised
 * while it worked): kept (a reference taken) and raised into the program
 * when the callback returns. Outside the callback: ignored. */
void gg_torch_raise(void *exc);
bool gg_torch_attach(gpuguard_torch_fn fn);
/* No call from now on: before the interpreter finalizes (Python's atexit). */
void gg_torch_detach(void);
#ifdef GG_TESTING
bool gg_torch_attached(void);
#endif

/* An incident (enum gg_incident) of `bytes` on device dev; ask: PyTorch's
 * view is wanted (else only noted: which kind of failure the observer's
 * answer is about). */
void gg_torch_incident(int dev, int incident, uint64_t bytes, bool ask);
/* Step `step` ended (gpuguard_step), before its forecasts: history asked
 * for the step that ended goes off. */
void gg_torch_boundary(uint64_t step);
/* The forecast at this boundary names step fc_step on device dev. */
void gg_torch_forecast(int dev, uint64_t fc_step);
/* A leak was suspected on device dev at the boundary of step `step` (v: what
 * the steps found): checked by PyTorch's history (on for step + 1, read at
 * the end of step + 2: what step + 1 allocated and kept), then said as a
 * leak at the rate one step kept, or cleared. False: it cannot be checked
 * (say it as it is). */
struct gg_step_verdict;
bool gg_torch_leak(int dev, uint64_t step, const struct gg_step_verdict *v);
/* PyTorch's reserved-but-unallocated bytes and largest free block on dev at
 * the last view; false before the first (the metrics). */
bool gg_torch_last_view(int dev, uint64_t *unallocated, uint64_t *largest_free);
/* The step in progress (the last boundary's + 1); false before the first
 * boundary. */
bool gg_torch_step(uint64_t *step);

/* The instrumentation's answer: a `torch` line. */
void gg_torch_answer(const struct gpuguard_torch_view *v);

/* What the interpreter calls (pycall.h): the wanted views and history
 * changes, one callback each. Exposed for the unit test. */
int gg_torch_pending(void *arg);

#ifdef GG_TESTING
/* Start again (unit tests). */
void gg_torch_reset(void);
#endif

#endif /* GG_TORCH_H */
