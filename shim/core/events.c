/* events.c - layer 4: the journal's events (see events.h), written from
 * their schema, events.def. */
#include "events.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "callers.h"
#include "device.h"
#include "fatbin.h"
#include "gpuguard.h"
#include "journal.h"
#include "prim.h"
#include "stack.h"
#include "steps.h"
#include "symbolize.h"

/* ---- the schema: events.def ------------------------------------------------------ */

/* Every event's name, and the budget its lines are written under: its
 * row's LIMIT(burst, per_min), or ALWAYS (never limited). */
static const char *const event_name[GG_EVENTS] = {
#define EVENT(ev, budget, fields, meaning) [GG_EVENT_##ev] = #ev,
#define PART(part, meaning)
#define FIELD(ev, id, key, parent, type, use, meaning)
#include "events.def"
#undef FIELD
#undef PART
#undef EVENT
};

#define ALWAYS GG_BUDGET(0, 0)
#define LIMIT(burst, per_min) GG_BUDGET(burst, per_min)
static struct gg_budget budgets[GG_EVENTS] = {
#define EVENT(ev, budget, fields, meaning) [GG_EVENT_##ev] = budget,
#define PART(part, meaning)
#define FIELD(ev, id, key, parent, type, use, meaning)
#include "events.def"
#undef FIELD
#undef PART
#undef EVENT
};
#undef LIMIT
#undef ALWAYS

void gg_events_suppress(enum gg_event ev)
{
    if ((unsigned)ev < GG_EVENTS)
        gg_budget_suppress(&budgets[ev]);
}

uint64_t gg_events_left_out(enum gg_event ev)
{
    return (unsigned)ev < GG_EVENTS ? gg_budget_suppressed(&budgets[ev]) : 0;
}

/* Every field, by event (or part) and id: F(ev, id) is the key events.def
 * gives it, and a key without a row there does not compile. */
enum gg_field {
#define EVENT(ev, budget, fields, meaning)
#define PART(part, meaning)
#define FIELD(ev, id, key, parent, type, use, meaning) GG_FIELD_##ev##_##id,
#include "events.def"
#undef FIELD
#undef PART
#undef EVENT
    GG_FIELDS
};

static const char *const field_key[GG_FIELDS] = {
#define EVENT(ev, budget, fields, meaning)
#define PART(part, meaning)
#define FIELD(ev, id, key, parent, type, use, meaning) [GG_FIELD_##ev##_##id] = #key,
#include "events.def"
#undef FIELD
#undef PART
#undef EVENT
};

#define F(ev, id) (field_key[GG_FIELD_##ev##_##id])
#define EV(ev) GG_EVENT_##ev

/* {"t":<seconds since start>,"ev":...: t is now, but for a line about an
 * earlier moment (a timeline point). */
static void open_line(struct gg_json *j, char *buf, size_t cap, enum gg_event ev, double t)
{
    gg_json_init(j, buf, cap);
    gg_json_obj(j);
    gg_json_kf64(j, "t", t);
    gg_json_kstr(j, "ev", event_name[ev]);
}

/* A line of event ev may be written (its budget, budget.h): begin it, in a
 * buffer of cap bytes on the side stack (prim.h: a thread's own stack may
 * be small), or on the heap when the side stack has no room. */
static bool begin(struct gg_json *j, size_t cap, enum gg_event ev)
{
    if (!gg_budget_take(&budgets[ev]))
        return false;
    open_line(j, gg_side_push(cap), cap, ev, gg_clock_since_start());
    return true;
}

/* Lines the journal could not take (a full disk) are said by the first line
 * that it can take again: an `error` with their count. */
static GG_COLD void say_lost(uint64_t n)
{
    char buf[256];
    struct gg_json j;
    open_line(&j, buf, sizeof buf, EV(error), gg_clock_since_start());
    char msg[160];
    snprintf(msg, sizeof msg, "%llu journal line%s lost: the journal could not be written "
             "(full disk?)", (unsigned long long)n, n == 1 ? "" : "s");
    gg_json_kstr(&j, F(error, message), msg);
    gg_json_ku64(&j, F(error, lost), n);
    gg_json_obj_end(&j);
    gg_json_raw_newline(&j);
    if (!j.failed && gg_journal_write_note(j.buf, j.len))
        gg_journal_lost_said(n);
    gg_json_free(&j);
}

/* Said at most once a minute (a nearly full disk may take small lines and
 * lose big ones, over and over); the summary carries the total. */
#define LOST_EVERY_NS 60000000000ull
static _Atomic uint64_t lost_said_ns;

static void end(struct gg_json *j)
{
    gg_json_obj_end(j);
    gg_json_raw_newline(j);
    uint64_t unsaid = gg_journal_lost_unsaid();
    if (gg_unlikely(unsaid)) {
        uint64_t now = gg_now_ns(), last = atomic_load(&lost_said_ns);
        if ((!last || now - last >= LOST_EVERY_NS) &&
            atomic_compare_exchange_strong(&lost_said_ns, &last, now))
            say_lost(unsaid);
    }
    if (!j->failed)
        gg_journal_write(j->buf, j->len);
    gg_json_free(j);
    gg_side_pop(j->origin);
}

/* key: the site's Python frames [pyframe], innermost first; and for a
 * stack with none, thread_key: the name of the thread that made it
 * (autograd's, NCCL's), when known. */
static void python_frames(struct gg_json *j, gg_site site, const char *key,
                          const char *thread_key)
{
    const struct gg_stack_note *n = gg_stack_note(site);
    gg_json_key(j, key);
    gg_json_arr(j);
    for (int i = 0; n && i < n->npy; i++) {
        gg_json_obj(j);
        gg_json_kstr(j, F(pyframe, file), n->py[i].file);
        gg_json_ki64(j, F(pyframe, line), n->py[i].line);
        gg_json_kstr(j, F(pyframe, func), n->py[i].func);
        gg_json_obj_end(j);
    }
    gg_json_arr_end(j);
    if (n && !n->npy && n->thread[0])
        gg_json_kstr(j, thread_key, n->thread);
}

void gg_events_stack(struct gg_json *j, gg_site site)
{
    const uintptr_t *ips;
    size_t n = gg_sites_native(site, &ips);
    gg_json_arr(j);
    for (size_t i = 0; i < n; i++) {
        struct gg_frame_info fi;
        gg_symbolize(ips[i], &fi);
        gg_json_obj(j);
        gg_json_key(j, F(frame, ip));
        gg_json_hex(j, ips[i]);
        gg_json_kstr(j, F(frame, module), fi.module);
        gg_json_kstr(j, F(frame, sym), fi.sym);
        gg_json_key(j, F(frame, off));
        if (fi.has_off)
            gg_json_u64(j, fi.off);
        else
            gg_json_null(j);
        gg_json_obj_end(j);
    }
    gg_json_arr_end(j);
}

void gg_events_start(const char *comm, const char *host, long rank)
{
    struct gg_json j;
    if (!begin(&j, 8192, EV(start)))
        return;
    gg_json_ki64(&j, F(start, pid), (int64_t)getpid());
    gg_json_kf64(&j, F(start, wall), gg_wall_s()); /* aligns the journals of several ranks */
    gg_json_kstr(&j, F(start, comm), comm);
    gg_json_kstr(&j, F(start, host), host);
    gg_json_key(&j, F(start, rank));
    if (rank >= 0)
        gg_json_i64(&j, rank);
    else
        gg_json_null(&j);
    gg_json_kstr(&j, F(start, version), GPUGUARD_VERSION);
    gg_json_kstr(&j, F(start, mode), gg_device_count ? gg_mode_name(gg_devices[0].mode) : "auto");
    gg_json_key(&j, F(start, devices));
    gg_json_arr(&j);
    for (int i = 0; i < gg_device_count; i++) {
        const struct gg_device *d = &gg_devices[i];
        const struct gg_policy *p = gg_device_policy(i);
        char cc[16];
        snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
        gg_json_obj(&j);
        gg_json_ki64(&j, F(start, dev), i);
        gg_json_kstr(&j, F(start, name), d->name);
        gg_json_ku64(&j, F(start, total), d->total);
        gg_json_kstr(&j, F(start, cc), cc);
        gg_json_kstr(&j, F(start, policy), p->file[0] ? p->file : "(built-in)");
        gg_json_key(&j, F(start, limit));
        if (d->total)
            gg_json_u64(&j, d->limit);
        else
            gg_json_null(&j);
        gg_json_kstr(&j, F(start, dev_mode), gg_mode_name(d->mode));
        gg_json_ku64(&j, F(start, headroom), d->total ? d->total - d->limit : 0);
        gg_json_ku64(&j, F(start, near_miss), d->near);
        gg_json_kstr(&j, F(start, uuid), d->uuid);
        if (gg_peers_on(&d->peers))
            gg_json_kbool(&j, F(start, shared), true);
        gg_json_obj_end(&j);
    }
    gg_json_arr_end(&j);
    end(&j);
}

void gg_events_mode(int dev, const char *mode, const char *why)
{
    struct gg_json j;
    if (!begin(&j, 256, EV(mode)))
        return;
    gg_json_ki64(&j, F(mode, dev), dev);
    gg_json_kstr(&j, F(mode, mode), mode);
    gg_json_kstr(&j, F(mode, why), why);
    end(&j);
}

static const enum gg_event incident_event[] = {
    [GG_INCIDENT_NEAR_MISS] = EV(near_miss), [GG_INCIDENT_REFUSED] = EV(refused),
    [GG_INCIDENT_OOM] = EV(oom)};

/* A step's input as [dims...] and its tokens. */
static void shape_fields(struct gg_json *j, const char *shape_key, const char *tokens_key,
                         const struct gg_shape *in)
{
    gg_json_key(j, shape_key);
    gg_json_arr(j);
    for (int i = 0; i < in->ndims && i < GG_SHAPE_DIMS; i++)
        gg_json_i64(j, in->dims[i]);
    gg_json_arr_end(j);
    gg_json_ku64(j, tokens_key, in->tokens);
}

void gg_events_incident(const struct gg_call *c, const struct gg_verdict *v,
                        const struct gg_incident_facts *f)
{
    const struct gg_device *d = gg_device(c->dev);
    if (!d || v->incident == GG_INCIDENT_NONE || !f)
        return;
    struct gg_json j;
    enum gg_event ev = incident_event[v->incident];
    if (!gg_budget_take(&budgets[ev]))
        return;
    open_line(&j, gg_side_push(4096), 4096, ev, gg_clock_at(f->ns)); /* the moment's t */
    gg_json_ki64(&j, F(incident, dev), c->dev);
    gg_json_kstr(&j, F(incident, api), c->api_name);
    gg_json_ku64(&j, F(incident, bytes), c->bytes);
    gg_json_ku64(&j, F(incident, used), v->used);
    gg_json_ku64(&j, F(incident, limit), d->limit);
    gg_json_ku64(&j, F(incident, total), d->total);
    gg_json_ku64(&j, F(incident, count), v->count); /* this site's, this kind: lines are thinned */
    if (v->incident == GG_INCIDENT_NEAR_MISS && v->over_limit)
        gg_json_kbool(&j, F(incident, over_limit), true);
    if (v->spared)
        gg_json_kstr(&j, F(incident, spared), "never_refuse"); /* enforcing, and let through */
    char module[64];
    gg_json_key(&j, F(incident, caller)); /* the module that asked (callers.h) */
    if (gg_callers_module(c->caller, module, sizeof module))
        gg_json_str(&j, module);
    else
        gg_json_null(&j);
    if (c->pool) /* a pool's request: what the device grew by, beside what was asked */
        gg_json_ku64(&j, F(incident, grows), c->grows);
    /* the process's bytes on the device at the moment (its pools' whole
     * reservations), and what it had handed out of them */
    gg_json_ku64(&j, F(incident, reserved), f->reserved);
    gg_json_ku64(&j, F(incident, allocated), f->allocated);
    if (f->step1)
        gg_json_ku64(&j, F(incident, step), f->step1 - 1);
    if (f->input && f->input->ndims > 0)
        shape_fields(&j, F(incident, shape), F(incident, tokens), f->input);
    if (f->failure) {
        gg_json_key(&j, F(incident, recovered));
        if (f->recovered < 0)
            gg_json_null(&j);
        else
            gg_json_bool(&j, f->recovered != 0);
        gg_json_kbool(&j, F(incident, retried), f->retried);
        gg_json_ku64(&j, F(incident, freed), f->freed);
        gg_json_ku64(&j, F(incident, freed_count), f->freed_count);
        gg_json_ku64(&j, F(incident, freed_largest), f->freed_largest);
    }
    gg_json_key(&j, F(incident, stack));
    gg_events_stack(&j, c->site);
    python_frames(&j, c->site, F(incident, pystack), F(incident, thread));
    if (v->peers)
        gg_json_ku64(&j, F(incident, peers), v->peers);
    end(&j);
}

void gg_events_advice(const struct gg_advice *a, bool signaled, bool heard,
                      const struct gg_step_verdict *fc)
{
    struct gg_json j;
    if (!begin(&j, 512, EV(advice)))
        return;
    gg_json_ku64(&j, F(advice, seq), a->seq);
    gg_json_ki64(&j, F(advice, dev), a->dev);
    gg_json_ki64(&j, F(advice, batch_size), a->batch_size);
    gg_json_ki64(&j, F(advice, grad_accum), a->grad_accum);
    gg_json_kstr(&j, F(advice, reason), a->reason);
    gg_json_kbool(&j, F(advice, signaled), signaled);
    gg_json_kbool(&j, F(advice, heard), heard);
    if (fc) {
        gg_json_key(&j, F(advice, forecast));
        gg_json_obj(&j);
        gg_json_ku64(&j, F(advice, fc_step), fc->fc_step);
        gg_json_ku64(&j, F(advice, fc_bytes), fc->fc_bytes);
        gg_json_obj_end(&j);
    }
    end(&j);
}

void gg_events_step(int dev, uint64_t step, const struct gg_step_verdict *v)
{
    struct gg_json j;
    if (!begin(&j, 512, EV(step)))
        return;
    gg_json_ku64(&j, F(step, step), step);
    gg_json_ki64(&j, F(step, dev), dev);
    gg_json_ku64(&j, F(step, peak), v->w.peak);
    gg_json_ku64(&j, F(step, peak_used), v->w.peak_used);
    gg_json_ku64(&j, F(step, live), v->w.live);
    if (v->flushes)
        gg_json_ku64(&j, F(step, flushes), v->flushes);
    if (v->input.ndims > 0) {
        shape_fields(&j, F(step, shape), F(step, tokens), &v->input);
        int b = gg_shape_batch(&v->input);
        if (b > 0)
            gg_json_ki64(&j, F(step, batch), b);
    }
    if (v->has_needed)
        gg_json_ku64(&j, F(step, needed), v->needed);
    if (v->has_predicted)
        gg_json_ku64(&j, F(step, predicted), v->predicted);
    end(&j);
}

void gg_events_leak(int dev, uint64_t step, const struct gg_step_verdict *v)
{
    struct gg_json j;
    if (!begin(&j, 8192, EV(leak)))
        return;
    gg_json_ki64(&j, F(leak, dev), dev);
    gg_json_ku64(&j, F(leak, since_step), v->since_step);
    gg_json_ku64(&j, F(leak, step), step);
    gg_json_ku64(&j, F(leak, rate), v->rate);
    gg_json_kbool(&j, F(leak, confirmed), v->confirmed);
    gg_json_ku64(&j, F(leak, live_rate), v->confirmed ? v->live_rate : v->rate);
    gg_json_ku64(&j, F(leak, live), v->w.live);
    gg_json_key(&j, F(leak, projected_step));
    if (v->projected_step)
        gg_json_u64(&j, v->projected_step);
    else
        gg_json_null(&j);
    gg_json_key(&j, F(leak, sites));
    gg_json_arr(&j);
    for (size_t k = 0; k < v->nsites; k++) {
        gg_json_obj(&j);
        gg_json_key(&j, F(leak, site_stack));
        gg_events_stack(&j, v->sites[k].site);
        python_frames(&j, v->sites[k].site, F(leak, site_pystack), F(leak, site_thread));
        gg_json_ku64(&j, F(leak, site_bytes), v->sites[k].bytes);
        gg_json_obj_end(&j);
    }
    gg_json_arr_end(&j);
    end(&j);
}

void gg_events_batch(int dev, struct gg_batch now, struct gg_batch was, const struct gg_window *w,
                     bool final, const char *why)
{
    struct gg_json j;
    if (!begin(&j, 256, EV(batch)))
        return;
    gg_json_ki64(&j, F(batch, dev), dev);
    gg_json_ki64(&j, F(batch, batch_size), now.batch_size);
    gg_json_ki64(&j, F(batch, grad_accum), now.grad_accum);
    if (was.batch_size > 0) {
        gg_json_ki64(&j, F(batch, was_batch_size), was.batch_size);
        gg_json_ki64(&j, F(batch, was_grad_accum), was.grad_accum);
    }
    gg_json_ku64(&j, F(batch, peak), w->peak);
    gg_json_ku64(&j, F(batch, peak_used), w->peak_used);
    gg_json_ku64(&j, F(batch, live), w->live);
    if (final)
        gg_json_kbool(&j, F(batch, final), true);
    if (why && *why)
        gg_json_kstr(&j, F(batch, reason), why);
    end(&j);
}

void gg_events_sample(int dev, uint64_t current, uint64_t used, double t)
{
    char buf[256];
    struct gg_json j;
    if (!gg_budget_take(&budgets[EV(sample)]))
        return;
    open_line(&j, buf, sizeof buf, EV(sample), t);
    gg_json_ki64(&j, F(sample, dev), dev);
    gg_json_ku64(&j, F(sample, current), current);
    gg_json_ku64(&j, F(sample, used), used);
    end(&j);
}

void gg_events_note(const char *text)
{
    struct gg_json j;
    if (!begin(&j, 4096, EV(note)))
        return;
    gg_json_kstr(&j, F(note, text), text);
    end(&j);
}

void gg_events_problem(const char *fmt, ...)
{
    char msg[1280];
    struct gg_json j;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!begin(&j, 2048, EV(error)))
        return;
    gg_json_kstr(&j, F(error, message), msg);
    end(&j);
}

/* A string handed in through the C API, at most max bytes of it (cut at
 * a character boundary): a journal line stays bounded whatever the caller. */
static void api_str(struct gg_json *j, const char *s, size_t max)
{
    if (!s) {
        gg_json_null(j);
        return;
    }
    size_t n = strnlen(s, max + 1);
    if (n > max) {
        n = max;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--;
    }
    gg_json_strn(j, s, n);
}

/* Python frames handed in through the C API, innermost first. */
static void api_pyframes(struct gg_json *j, const struct gpuguard_pyframe *f, int n, int max)
{
    gg_json_arr(j);
    for (int i = 0; f && i < n && i < max; i++) {
        gg_json_obj(j);
        gg_json_key(j, F(pyframe, file));
        api_str(j, f[i].file ? f[i].file : "?", 1024);
        gg_json_ki64(j, F(pyframe, line), f[i].line);
        gg_json_key(j, F(pyframe, func));
        api_str(j, f[i].func ? f[i].func : "?", 512);
        gg_json_obj_end(j);
    }
    gg_json_arr_end(j);
}

void gg_events_torch(const struct gg_torch_event *e)
{
    struct gg_json j;
    if (!begin(&j, 16384, EV(torch)))
        return;
    gg_json_ki64(&j, F(torch, dev), e->dev);
    gg_json_kstr(&j, F(torch, why), e->why);
    gg_json_key(&j, F(torch, step));
    if (e->has_step)
        gg_json_u64(&j, e->step);
    else
        gg_json_null(&j);
    gg_json_ku64(&j, F(torch, reserved), e->reserved);
    gg_json_ku64(&j, F(torch, allocated), e->allocated);
    gg_json_ku64(&j, F(torch, unallocated),
                 e->reserved > e->allocated ? e->reserved - e->allocated : 0);
    gg_json_ku64(&j, F(torch, largest_free), e->largest_free);
    gg_json_ku64(&j, F(torch, inactive_split), e->inactive_split);
    gg_json_key(&j, F(torch, request));
    if (e->has_request)
        gg_json_u64(&j, e->request);
    else
        gg_json_null(&j);
    gg_json_key(&j, F(torch, fits_unfragmented));
    if (e->fits < 0)
        gg_json_null(&j);
    else
        gg_json_bool(&j, e->fits != 0);
    if (e->raised) {
        gg_json_key(&j, F(torch, raised));
        gg_json_bool(&j, true);
    }
    gg_json_key(&j, F(torch, asked));
    if (e->asked_ns)
        gg_json_f64(&j, gg_clock_at(e->asked_ns));
    else
        gg_json_null(&j);
    if (e->has_kept)
        gg_json_ku64(&j, F(torch, kept), e->kept);
    static const char *const classes[4] = {"small", "large", "huge", "expandable"};
    gg_json_key(&j, F(torch, segments));
    gg_json_obj(&j);
    for (int k = 0; k < 4; k++)
        gg_json_ku64(&j, classes[k], e->segments[k]);
    gg_json_obj_end(&j);
    if (e->history) {
        gg_json_key(&j, F(torch, tensors));
        gg_json_arr(&j);
        for (int i = 0; e->tensors && i < e->ntensors; i++) {
            const struct gpuguard_torch_tensor *t = &e->tensors[i];
            gg_json_obj(&j);
            gg_json_ku64(&j, F(torch, t_bytes), t->bytes);
            gg_json_ku64(&j, F(torch, t_count), t->count);
            gg_json_key(&j, F(torch, t_pystack));
            api_pyframes(&j, t->frames, t->nframes, GG_TORCH_FRAMES);
            gg_json_key(&j, F(torch, t_op));
            api_str(&j, t->op, 256);
            gg_json_obj_end(&j);
        }
        gg_json_arr_end(&j);
    }
    end(&j);
}

void gg_events_backward(double t, const char *thread, const struct gpuguard_pyframe *f, int n,
                        bool has_step, uint64_t step, uint64_t count)
{
    struct gg_json j;
    if (!gg_budget_take(&budgets[EV(backward)]))
        return;
    open_line(&j, gg_side_push(4096), 4096, EV(backward), t);
    gg_json_key(&j, F(backward, thread));
    api_str(&j, thread ? thread : "?", 64);
    gg_json_key(&j, F(backward, pystack));
    api_pyframes(&j, f, n, GG_BACKWARD_FRAMES);
    gg_json_key(&j, F(backward, step));
    if (has_step)
        gg_json_u64(&j, step);
    else
        gg_json_null(&j);
    gg_json_ku64(&j, F(backward, count), count);
    end(&j);
}

/* The codes of one kind, oldest arch first, as a JSON array of names. */
static void arch_codes(struct gg_json *j, const char *key, const struct gg_fatbin *fb, int kind)
{
    bool done[GG_FATBIN_CODES] = {false};
    gg_json_key(j, key);
    gg_json_arr(j);
    for (;;) {
        int pick = -1;
        for (unsigned i = 0; i < fb->ncode; i++)
            if (!done[i] && fb->code[i].kind == kind &&
                (pick < 0 || fb->code[i].arch < fb->code[pick].arch))
                pick = (int)i;
        if (pick < 0)
            break;
        done[pick] = true;
        char name[32];
        gg_fatbin_code_name(fb->code[pick], name, sizeof name);
        gg_json_str(j, name);
    }
    gg_json_arr_end(j);
}

void gg_events_arch(const struct gg_arch_event *e)
{
    struct gg_json j;
    if (!begin(&j, 4096, EV(arch)))
        return;
    gg_json_ki64(&j, F(arch, dev), e->dev);
    gg_json_kstr(&j, F(arch, cc), e->cc);
    gg_json_kstr(&j, F(arch, module), e->module);
    arch_codes(&j, F(arch, sass), e->fb, GG_FATBIN_SASS);
    arch_codes(&j, F(arch, ptx), e->fb, GG_FATBIN_PTX);
    gg_json_kbool(&j, F(arch, ok), e->ok);
    gg_json_kstr(&j, F(arch, message), e->message);
    gg_json_key(&j, F(arch, devs));
    gg_json_arr(&j);
    for (int k = 0; k < e->ndevs; k++)
        gg_json_i64(&j, e->devs[k]);
    gg_json_arr_end(&j);
    gg_json_kstr(&j, F(arch, source), e->from_memory ? "registered" : "file");
    gg_json_ku64(&j, F(arch, fatbins), e->fb->fatbins);
    gg_json_ku64(&j, F(arch, read_bytes), e->fb->bytes_read);
    gg_json_ku64(&j, F(arch, read_us), e->read_us);
    end(&j);
}

void gg_events_error(const char *fmt, ...)
{
    char msg[768];
    struct gg_json j;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!begin(&j, 2048, EV(error)))
        return; /* nor on stderr: errors are bounded there too */
    gg_say("%s", msg);
    gg_json_kstr(&j, F(error, message), msg);
    end(&j);
}

/* The keys of a list of sites at the peak (the summary's, a `peak` line's). */
struct site_keys {
    const char *stack, *pystack, *thread, *bytes, *allocs;
};

/* What no listed site holds (allocations made without a stack, or below
 * the largest listed) is one entry with an empty stack, in its place by
 * size. At most max sites. */
static void peak_sites(struct gg_json *j, int dev, uint64_t peak, size_t max,
                       const struct site_keys *key)
{
    struct gg_site_usage top[32];
    size_t n = gg_guard_peak_sites(dev, top, max < 32 ? max : 32);
    uint64_t attributed = 0;
    for (size_t k = 0; k < n; k++)
        attributed += top[k].bytes;
    uint64_t rest = peak > attributed ? peak - attributed : 0;
    gg_json_arr(j);
    for (size_t k = 0; k <= n; k++) {
        if (rest && (k == n || top[k].bytes < rest)) {
            gg_json_obj(j);
            gg_json_key(j, key->stack);
            gg_json_arr(j);
            gg_json_arr_end(j);
            gg_json_key(j, key->pystack);
            gg_json_arr(j);
            gg_json_arr_end(j);
            gg_json_ku64(j, key->bytes, rest);
            gg_json_key(j, key->allocs);
            gg_json_null(j);
            gg_json_obj_end(j);
            rest = 0;
        }
        if (k == n)
            break;
        gg_json_obj(j);
        gg_json_key(j, key->stack);
        gg_events_stack(j, top[k].site);
        python_frames(j, top[k].site, key->pystack, key->thread);
        gg_json_ku64(j, key->bytes, top[k].bytes);
        gg_json_ku64(j, key->allocs, top[k].allocs);
        gg_json_obj_end(j);
    }
    gg_json_arr_end(j);
}

void gg_events_peak(int dev, uint64_t peak, uint64_t peak_used, uint64_t step1)
{
    const struct site_keys keys = {F(peak, site_stack), F(peak, site_pystack),
                                   F(peak, site_thread), F(peak, site_bytes),
                                   F(peak, site_allocs)};
    struct gg_json j;
    if (!begin(&j, 16384, EV(peak)))
        return;
    gg_json_ki64(&j, F(peak, dev), dev);
    gg_json_ku64(&j, F(peak, peak), peak);
    gg_json_ku64(&j, F(peak, peak_used), peak_used);
    gg_json_key(&j, F(peak, step));
    if (step1)
        gg_json_u64(&j, step1 - 1);
    else
        gg_json_null(&j);
    gg_json_key(&j, F(peak, sites));
    peak_sites(&j, dev, peak, 16, &keys);
    end(&j);
}

/* {kind: lines not written} for the kinds with any; since `base` (the
 * counts at the last report) when given. */
static void suppressed_counts(struct gg_json *j, const uint64_t *base)
{
    gg_json_obj(j);
    for (int k = 0; k < GG_EVENTS; k++) {
        uint64_t n = gg_events_left_out((enum gg_event)k) - (base ? base[k] : 0);
        if (n)
            gg_json_ku64(j, event_name[k], n);
    }
    gg_json_obj_end(j);
}

bool gg_events_suppressed(uint64_t *base)
{
    bool any = false;
    for (int k = 0; k < GG_EVENTS; k++)
        any = any || gg_events_left_out((enum gg_event)k) != base[k];
    if (!any)
        return false;
    struct gg_json j;
    if (!begin(&j, 1024, EV(suppressed)))
        return false;
    gg_json_key(&j, F(suppressed, since)); /* since the last suppressed line */
    suppressed_counts(&j, base);
    gg_json_key(&j, F(suppressed, total));
    suppressed_counts(&j, NULL);
    end(&j);
    for (int k = 0; k < GG_EVENTS; k++)
        base[k] = gg_events_left_out((enum gg_event)k);
    return true;
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    default: return "signal";
    }
}

void gg_events_killed(int sig)
{
    char buf[256];
    struct gg_json j;
    open_line(&j, buf, sizeof buf, EV(killed), gg_clock_since_start());
    gg_json_kstr(&j, F(killed, signal), signal_name(sig));
    uint64_t step = 0;
    bool any = false;
    for (int i = 0; i < gg_device_count; i++) {
        struct gg_steps_now now;
        gg_steps_now(i, &now);
        if (now.steps && (!any || now.step > step))
            step = now.step, any = true;
    }
    gg_json_key(&j, F(killed, step));
    if (any)
        gg_json_u64(&j, step);
    else
        gg_json_null(&j);
    gg_json_obj_end(&j);
    gg_json_raw_newline(&j);
    if (!j.failed)
        gg_journal_write(j.buf, j.len);
}

void gg_events_summary(double duration, bool with_stacks, const struct gg_exit *how)
{
    struct gg_json j;
    if (!begin(&j, 16384, EV(summary)))
        return;
    gg_json_kf64(&j, F(summary, duration), duration);
    gg_json_ku64(&j, F(summary, sites), gg_sites_count()); /* distinct stacks stored */
    gg_json_key(&j, F(summary, suppressed)); /* lines left out by the budgets, per kind */
    suppressed_counts(&j, NULL);
    gg_json_ku64(&j, F(summary, lost_lines), gg_journal_lost()); /* lines the journal could not take */
    if (!with_stacks)
        gg_json_kstr(&j, F(summary, partial), "exit interrupted the shim: stacks and sites left out");
    gg_json_ku64(&j, F(summary, backward_calls), how ? how->backward_calls : 0);
    gg_json_key(&j, F(summary, status));
    if (how && how->has_status)
        gg_json_i64(&j, how->status);
    else
        gg_json_null(&j);
    if (how && how->uncaught)
        gg_json_kstr(&j, F(summary, uncaught), how->uncaught);
    gg_json_key(&j, F(summary, devices));
    gg_json_arr(&j);
    for (int i = 0; i < gg_device_count; i++) {
        struct gg_device *d = &gg_devices[i];
        uint64_t allocs = gg_ledger_allocs(i), frees = gg_ledger_frees(i);
        uint64_t peak = gg_device_peak(d);
        gg_json_obj(&j);
        gg_json_ki64(&j, F(summary, dev), i);
        gg_json_kstr(&j, F(summary, name), d->name);
        gg_json_ku64(&j, F(summary, total), d->total);
        gg_json_ku64(&j, F(summary, limit), d->total ? d->limit : 0);
        gg_json_ku64(&j, F(summary, peak), peak);
        gg_json_ku64(&j, F(summary, peak_used), gg_device_peak_used(d));
        gg_json_ku64(&j, F(summary, allocs), allocs);
        gg_json_ku64(&j, F(summary, frees), frees);
        gg_json_ku64(&j, F(summary, near_misses), atomic_load(&d->near_misses));
        gg_json_ku64(&j, F(summary, refusals), atomic_load(&d->refusals));
        gg_json_ku64(&j, F(summary, ooms), atomic_load(&d->ooms));
        gg_json_ku64(&j, F(summary, ooms_recovered), atomic_load(&d->ooms_recovered));
        gg_json_ku64(&j, F(summary, refusals_recovered), atomic_load(&d->refusals_recovered));
        gg_json_ku64(&j, F(summary, live_bytes), atomic_load(&d->current));
        gg_json_ku64(&j, F(summary, live_allocs), allocs - frees);
        struct gg_steps_now now;
        gg_steps_now(i, &now);
        gg_json_key(&j, F(summary, step));
        if (now.steps)
            gg_json_u64(&j, now.step);
        else
            gg_json_null(&j);
        gg_json_ku64(&j, F(summary, steps), now.steps);
        gg_json_ku64(&j, F(summary, flush_steps), now.flush_steps);
        gg_json_ku64(&j, F(summary, advice), how && i < GG_MAX_DEVICES ? how->advice[i] : 0);
        gg_json_ku64(&j, F(summary, advice_unheard),
                     how && i < GG_MAX_DEVICES ? how->unheard[i] : 0);
        /* Stream-ordered pools: the process's bytes on the device (reserved)
         * beside what it has handed out (allocated); what its pools hold, of
         * it handed out, and the most they held. */
        uint64_t cur = atomic_load(&d->current), pr = atomic_load(&d->pool_reserved),
                 pu = atomic_load(&d->pool_used);
        gg_json_ku64(&j, F(summary, reserved), cur);
        gg_json_ku64(&j, F(summary, allocated), cur - pr + pu);
        gg_json_ku64(&j, F(summary, pool_reserved), pr);
        gg_json_ku64(&j, F(summary, pool_allocated), pu);
        gg_json_ku64(&j, F(summary, peak_pool_reserved), atomic_load(&d->peak_pool_reserved));
        gg_json_ku64(&j, F(summary, unknown_frees), atomic_load(&d->unknown_frees));
        struct gg_steps_model m;
        if (gg_steps_model(i, 0, &m)) { /* the run's memory model, as fitted at exit */
            gg_json_key(&j, F(summary, model));
            gg_json_obj(&j);
            gg_json_ku64(&j, F(summary, model_steps), m.steps);
            gg_json_ku64(&j, F(summary, model_most), m.most_tokens);
            gg_json_kf64(&j, F(summary, model_intercept), m.intercept);
            gg_json_kf64(&j, F(summary, model_per_token), m.per_token);
            gg_json_kf64(&j, F(summary, model_per_token2), m.per_token2);
            gg_json_kf64(&j, F(summary, model_sigma), m.sigma);
            gg_json_obj_end(&j);
        }
        int peers = atomic_load(&d->peers_most);
        if (peers) { /* a shared GPU: who else was on it */
            gg_json_ku64(&j, F(summary, peers), (uint64_t)peers);
            gg_json_ku64(&j, F(summary, peers_peak), atomic_load(&d->peers_peak));
        }
        gg_site at_peak = with_stacks ? atomic_load(&d->peak_site) : GG_SITE_NONE;
        gg_json_key(&j, F(summary, peak_stack));
        gg_events_stack(&j, at_peak);
        python_frames(&j, at_peak, F(summary, peak_pystack), F(summary, peak_thread));
        gg_json_key(&j, F(summary, peak_sites));
        if (with_stacks) {
            const struct site_keys keys = {
                F(summary, site_stack), F(summary, site_pystack), F(summary, site_thread),
                F(summary, site_bytes), F(summary, site_allocs)};
            peak_sites(&j, i, peak, 32, &keys);
        } else {
            gg_json_arr(&j);
            gg_json_arr_end(&j);
        }
        gg_json_obj_end(&j);
    }
    gg_json_arr_end(&j);
    end(&j);
}
