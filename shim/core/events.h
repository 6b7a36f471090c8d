/* events.h - layer 4: every journal event's schema, in one file
 * (docs/journal.md).
 *
 * Each function builds one JSON line ({"t":<seconds since start>,"ev":...})
 * and hands it to the journal. Field names live here and nowhere else.
 */
#ifndef GG_EVENTS_H
#define GG_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

#include "advice.h"
#include "guard.h"
#include "json.h"
#include "settings.h"
#include "steps.h"

/* Every event of events.def (GG_EVENT_near_miss, ...): each is also a kind
 * of line with its own budget (budget.h), its row's. */
enum gg_event {
#define EVENT(ev, budget, fields, meaning) GG_EVENT_##ev,
#define PART(part, meaning)
#define FIELD(ev, id, key, parent, type, use, meaning)
#include "events.def"
#undef FIELD
#undef PART
#undef EVENT
    GG_EVENTS
};

/* A line of event ev that the per-source rule (gg_budget_thin) left out:
 * counted, as the budget counts the lines it refuses. */
void gg_events_suppress(enum gg_event ev);
/* Lines of event ev not written since the start. */
uint64_t gg_events_left_out(enum gg_event ev);

/* start: the process and its devices. */
void gg_events_start(const char *comm, const char *host, long rank);
/* mode: device dev switched (auto -> enforce). */
void gg_events_mode(int dev, const char *mode, const char *why);
/* near_miss, refused or oom, from a verdict, with the moment's facts (the
 * line is written when a failure's outcome is known: retry.h). */
struct gg_incident_facts {
    uint64_t ns;               /* the moment (gg_now_ns) */
    uint64_t reserved, allocated; /* the process's bytes then; of them handed out */
    uint64_t step1;            /* the step in progress + 1; 0: none yet */
    const struct gg_shape *input; /* its input, or NULL */
    bool failure;              /* a refusal or OOM: its outcome follows */
    int recovered;             /* 1, 0, or -1 (null: not known) */
    bool retried;
    uint64_t freed, freed_count, freed_largest;
};
void gg_events_incident(const struct gg_call *c, const struct gg_verdict *v,
                        const struct gg_incident_facts *f);
/* advice; fc (may be NULL): a forecast's step and predicted bytes. */
struct gg_step_verdict;
void gg_events_advice(const struct gg_advice *a, bool signaled, bool heard,
                      const struct gg_step_verdict *fc);
/* step: what step `step` saw on device dev. */
void gg_events_step(int dev, uint64_t step, const struct gg_step_verdict *v);
/* leak: live bytes at the boundaries grow steadily on device dev. */
void gg_events_leak(int dev, uint64_t step, const struct gg_step_verdict *v);
/* batch: the trainer runs batch now instead of was (when known); w: the
 * phase of was that ended, on device dev (final: at exit, the phase the
 * process ended in, now = was); why: the trainer's reason, or NULL. */
struct gg_window;
void gg_events_batch(int dev, struct gg_batch now, struct gg_batch was, const struct gg_window *w,
                     bool final, const char *why);
/* arch: a module's device code judged against the GPUs of one compute
 * capability (arch.c). */
struct gg_fatbin;
struct gg_arch_event {
    int dev;                    /* the first GPU of that compute capability */
    const char *cc;             /* "8.6" */
    const char *module;
    const struct gg_fatbin *fb; /* what the module carries */
    bool ok;
    const char *message;
    int devs[64], ndevs;        /* every GPU of that compute capability */
    bool from_memory;           /* judged from registered fat binaries */
    uint64_t read_us;
};
void gg_events_arch(const struct gg_arch_event *e);
/* torch: PyTorch's caching allocator on a device (torch.c). */
#define GG_TORCH_TENSORS 32  /* lines of tensors in a `torch` line, at most */
#define GG_TORCH_FRAMES 16   /* Python frames per line of tensors, at most */
#define GG_BACKWARD_FRAMES 8 /* Python frames of a `backward` line, at most */
struct gpuguard_torch_tensor;
struct gpuguard_pyframe;
struct gg_torch_event {
    int dev;
    const char *why;          /* refused, oom, near_miss, forecast, leak */
    bool has_step;
    uint64_t step;
    uint64_t reserved, allocated, largest_free, inactive_split;
    bool has_request;
    uint64_t request;
    int fits;                 /* fits_unfragmented: 1, 0, or -1 (null) */
    uint64_t asked_ns;        /* the moment the view was asked about; 0: the observer's */
    bool has_kept;
    uint64_t kept;            /* a leak check's: what one step allocated and kept */
    bool raised;              /* PyTorch's OOM observer answered: it raised OutOfMemoryError */
    uint64_t segments[4];     /* small, large, huge, expandable */
    bool history;             /* tensors[ntensors] follow */
    int ntensors;
    const struct gpuguard_torch_tensor *tensors;
};
void gg_events_torch(const struct gg_torch_event *e);
/* backward: .backward() called from frames f[0..n) (innermost first) on
 * thread `thread`, at t (seconds since the start: the call's moment). */
void gg_events_backward(double t, const char *thread, const struct gpuguard_pyframe *f, int n,
                        bool has_step, uint64_t step, uint64_t count);
/* error, in the journal only: a problem that is not the user's input (a
 * library's unreadable device code), not worth the host's stderr. */
void gg_events_problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* sample: a timeline point, at t (seconds since the start: when the move
 * happened, which is before it is written). */
void gg_events_sample(int dev, uint64_t current, uint64_t used, double t);
/* note: the trainer's text. */
void gg_events_note(const char *text);
/* error: a configuration or internal problem, also said on stderr. */
void gg_events_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* summary: at exit; with_stacks false: counters only (an exit that
 * interrupted the shim on its own thread: `partial` says so); how: the
 * exit status and the uncaught error, where known. */
struct gg_exit {
    bool has_status;
    int status;
    const char *uncaught;     /* NULL: none said */
    uint64_t backward_calls;  /* every .backward() told */
    uint64_t advice[GG_MAX_DEVICES], unheard[GG_MAX_DEVICES]; /* advice heard / not */
};
void gg_events_summary(double duration, bool with_stacks, const struct gg_exit *how);
/* peak: device dev's peak so far and the sites that held it (step1: the
 * step in progress + 1, 0: none), for a post-mortem of a process killed
 * before its summary. */
void gg_events_peak(int dev, uint64_t peak, uint64_t peak_used, uint64_t step1);
/* killed: the process dies of signal sig (its default action), now. Safe
 * in a signal handler: no lock, no allocation. */
void gg_events_killed(int sig);
/* suppressed: lines the budgets left out (budget.h) since the counts in
 * base[GG_EVENTS], and in all; base is then updated. False (nothing
 * written) when none were left out since. */
bool gg_events_suppressed(uint64_t *base);

/* A site's native frames as [{ip, module, sym, off}] (for tests too). */
void gg_events_stack(struct gg_json *j, gg_site site);

#endif /* GG_EVENTS_H */
