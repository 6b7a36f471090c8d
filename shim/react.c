/* react.c - layer 4: verdicts become lines and advice (see react.h). */
#include "react.h"

#include "advice.h"
#include "device.h"
#include "events.h"
#include "prim.h"
#include "pyframes.h"
#include "steps.h"

static void sample(int dev, const struct gg_verdict *v)
{
    const struct gg_device *d = gg_device(dev);
    if (d && v->sample)
        gg_events_sample(dev, v->current, gg_device_estimate(d));
}

static void advise(int dev, enum gg_reason why, const struct gg_step_verdict *fc)
{
    const struct gg_policy *p = gg_device_policy(dev);
    struct gg_trainer_policy tp = {p->s.batch_size, p->s.grad_accum, p->s.min_batch_size,
                                   p->s.signal};
    struct gg_advice a;
    if (!gg_advice_raise(dev, why, &tp, &a))
        return;
    bool signaled = gg_advice_handled(tp.signal);
    gg_events_advice(&a, signaled, fc);
    if (signaled)
        gg_advice_signal(tp.signal);
}

void gg_react_python(void)
{
    const char *why = gg_py_take_error();
    if (why)
        gg_events_error("no Python frames in stacks from now on: %s", why);
}

GG_COLD void gg_react(const struct gg_call *c, const struct gg_verdict *v)
{
    gg_react_python();
    static const enum gg_reason reason[] = {
        [GG_INCIDENT_NEAR_MISS] = GG_REASON_NEAR_MISS, [GG_INCIDENT_REFUSED] = GG_REASON_REFUSED,
        [GG_INCIDENT_OOM] = GG_REASON_OOM};
    if (v->incident != GG_INCIDENT_NONE) {
        if (v->journal)
            gg_events_incident(c, v);
        advise(c->dev, reason[v->incident], NULL);
    }
    sample(c->dev, v);
}

GG_COLD void gg_react_free(int dev, const struct gg_verdict *v)
{
    sample(dev, v);
}

void gg_react_step(int dev, uint64_t step, const struct gg_step_verdict *v)
{
    if (v->journal)
        gg_events_step(dev, step, v);
    if (v->forecast)
        advise(dev, GG_REASON_FORECAST, v);
    if (v->leak)
        gg_events_leak(dev, step, v);
}

void gg_react_registered(uint64_t switched)
{
    for (int i = 0; i < 64; i++)
        if (switched & (1ull << i))
            gg_events_mode(i, "enforce", "trainer registered");
}
