/* api.c - the exported C API (include/gpuguard.h). */
#include <string.h>

#include "advice.h"
#include "gpuguard.h"
#include "guard.h"
#include "init.h"
#include "journal.h"
#include "os.h"

GG_EXPORT int gpuguard_stats(int dev, struct gpuguard_stats *out)
{
    int s = atomic_load(&gg_state);
    if (!out || (s != GG_STATE_ACTIVE) || dev < 0 || dev >= gg_device_count ||
        !gg_devices[dev].present)
        return -1;
    const struct gg_device *d = &gg_devices[dev];
    struct gg_counters *c = &gg_ledger_counters[dev];
    memset(out, 0, sizeof *out);
    out->dev = dev;
    strncpy(out->name, d->name, sizeof out->name - 1);
    out->total = d->total;
    out->limit = d->limit;
    out->used = gg_guard_used(dev);
    out->current = atomic_load(&c->current);
    out->peak = atomic_load(&c->peak);
    out->peak_used = atomic_load(&d->peak_used);
    out->allocs = gg_ledger_allocs(dev);
    out->frees = gg_ledger_frees(dev);
    out->near_misses = atomic_load(&c->near_misses);
    out->refusals = atomic_load(&c->refusals);
    out->ooms = atomic_load(&c->ooms);
    return 0;
}

GG_EXPORT int gpuguard_advice(struct gpuguard_advice *out)
{
    return gg_active() ? gg_advice_pending(out) : 0;
}

GG_EXPORT void gpuguard_ack(unsigned seq)
{
    gg_advice_ack(seq);
}

GG_EXPORT void gpuguard_set_batch(int batch_size, int grad_accum)
{
    gg_advice_set_batch(batch_size, grad_accum);
    if (gg_active())
        gg_guard_trainer_registered();
}

GG_EXPORT void gpuguard_note(const char *text)
{
    if (!text || !gg_active())
        return;
    char buf[4096];
    struct gg_json j;
    gg_journal_begin(&j, buf, sizeof buf, "note");
    gg_json_kstr(&j, "text", text);
    gg_journal_end(&j);
}
