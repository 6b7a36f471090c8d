/* api.c - layer 6: the exported C API (include/gpuguard.h). */
#include <stdio.h>
#include <string.h>

#include "advice.h"
#include "backward.h"
#include "device.h"
#include "events.h"
#include "life.h"
#include "gpuguard.h"
#include "ledger.h"
#include "steps.h"
#include "prim.h"
#include "react.h"
#include "torch.h"
#include "trace.h"

_Static_assert(sizeof(struct gpuguard_advice) == sizeof(struct gg_advice),
               "struct gg_advice mirrors struct gpuguard_advice");

GG_EXPORT int gpuguard_stats(int dev, struct gpuguard_stats *out)
{
    struct gg_device *d = gg_active() ? gg_device(dev) : NULL;
    if (!out || !d)
        return -1;
    memset(out, 0, sizeof *out);
    out->dev = dev;
    snprintf(out->name, sizeof out->name, "%s", d->name);
    out->total = d->total;
    out->limit = d->limit;
    out->used = gg_device_estimate(d);
    out->current = atomic_load(&d->current);
    out->peak = gg_device_peak(d);
    out->peak_used = gg_device_peak_used(d);
    out->allocs = gg_ledger_allocs(dev);
    out->frees = gg_ledger_frees(dev);
    out->near_misses = atomic_load(&d->near_misses);
    out->refusals = atomic_load(&d->refusals);
    out->ooms = atomic_load(&d->ooms);
    return 0;
}

GG_EXPORT int gpuguard_policy(int dev, struct gpuguard_policy *out)
{
    struct gg_device *d = gg_active() ? gg_device(dev) : NULL;
    if (!out || !d)
        return -1;
    const struct gg_policy *p = gg_device_policy(dev);
    memset(out, 0, sizeof *out);
    out->batch_size = p->s.batch_size;
    out->grad_accum = p->s.grad_accum;
    out->min_batch_size = p->s.min_batch_size;
    out->apply_batch = p->s.apply_batch;
    snprintf(out->file, sizeof out->file, "%s", p->file);
    return 0;
}

GG_EXPORT int gpuguard_advice(struct gpuguard_advice *out)
{
    struct gg_advice a;
    if (!gg_active() || !gg_advice_pending(&a))
        return 0;
    if (out) {
        memset(out, 0, sizeof *out);
        out->seq = a.seq;
        out->dev = a.dev;
        out->batch_size = a.batch_size;
        out->grad_accum = a.grad_accum;
        memcpy(out->reason, a.reason, sizeof out->reason);
    }
    return 1;
}

GG_EXPORT void gpuguard_ack(unsigned seq)
{
    int was_inside = gg_inside();
    struct gg_batch now, was;
    if (gg_tracing())
        gg_trace_api("ack", seq, 0);
    if (gg_advice_ack(seq, &now, &was))
        gg_life_batch(now, was, "advice");
    gg_outside(was_inside);
}

GG_EXPORT void gpuguard_set_batch_why(int batch_size, int grad_accum, const char *why)
{
    int was_inside = gg_inside();
    struct gg_batch was;
    char reason[16] = "";
    if (why) /* a short word: the trainer's, copied and cut */
        snprintf(reason, sizeof reason, "%s", why);
    if (gg_tracing())
        gg_trace_api("batch", batch_size, grad_accum);
    bool changed = gg_advice_set_batch((struct gg_batch){batch_size, grad_accum}, &was);
    gg_life_registered();
    if (changed)
        gg_life_batch((struct gg_batch){batch_size, grad_accum}, was, why ? reason : NULL);
    gg_outside(was_inside);
}

GG_EXPORT void gpuguard_set_batch(int batch_size, int grad_accum)
{
    gpuguard_set_batch_why(batch_size, grad_accum, NULL);
}

GG_EXPORT void gpuguard_step(unsigned long long step)
{
    int was = gg_inside();
    if (gg_tracing())
        gg_trace_api("step", (long long)step, 0);
    gg_life_step(step);
    gg_outside(was);
}

GG_EXPORT void gpuguard_step_shape(const long long *dims, int ndims, int batch_dim)
{
    int was = gg_inside();
    if (gg_tracing())
        gg_trace_shape(dims, ndims, batch_dim);
    gg_life_shape(dims, ndims, batch_dim);
    gg_outside(was);
}

GG_EXPORT void gpuguard_step_needed(int dev, unsigned long long bytes)
{
    int was = gg_inside();
    if (gg_tracing())
        gg_trace_api("needed", dev, (long long)bytes);
    gg_life_needed(dev, bytes);
    gg_outside(was);
}

GG_EXPORT int gpuguard_predict(int dev, unsigned long long tokens,
                               struct gpuguard_prediction *out)
{
    struct gg_device *d = gg_active() ? gg_device(dev) : NULL;
    if (!out || !d)
        return -1;
    int was = gg_inside();
    struct gg_steps_model m;
    bool ok = gg_steps_model(dev, tokens, &m);
    memset(out, 0, sizeof *out);
    out->line = gg_device_line(d);
    out->steps = m.steps;
    out->most_tokens = m.most_tokens;
    out->max_tokens = (unsigned long long)gg_device_policy(dev)->s.max_tokens;
    if (ok) {
        gg_steps_asked(dev, tokens, m.bytes);
        out->bytes = m.bytes;
        out->margin = m.margin;
        out->beyond = m.beyond;
        out->quadratic = m.quadratic;
    }
    gg_outside(was);
    return ok ? 0 : 1;
}

GG_EXPORT void gpuguard_uncaught(const char *what)
{
    int was = gg_inside();
    gg_life_uncaught(what);
    gg_outside(was);
}

GG_EXPORT void gpuguard_note(const char *text)
{
    if (text && gg_active()) {
        int was = gg_inside();
        gg_react_flush();
        gg_events_note(text);
        gg_outside(was);
    }
}

GG_EXPORT int gpuguard_torch_attach(gpuguard_torch_fn fn)
{
    int was = gg_inside();
    bool can_ask = !gg_passing_through() && gg_torch_attach(fn);
    gg_outside(was);
    return can_ask ? 1 : 0;
}

GG_EXPORT void gpuguard_torch_detach(void)
{
    int was = gg_inside();
    gg_torch_detach();
    gg_outside(was);
}

GG_EXPORT void gpuguard_torch_view(const struct gpuguard_torch_view *view)
{
    if (view && gg_active()) {
        int was = gg_inside();
        gg_torch_answer(view);
        gg_outside(was);
    }
}

GG_EXPORT void gpuguard_torch_raise(void *exc)
{
    gg_torch_raise(exc);
}

GG_EXPORT void gpuguard_backward(const struct gpuguard_pyframe *frames, int nframes,
                                 const char *thread)
{
    if (gg_active()) {
        int was = gg_inside();
        gg_backward_call(frames, nframes, thread);
        gg_outside(was);
    }
}
