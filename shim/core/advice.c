/* advice.c - layer 4: the advice protocol (see advice.h). */
#include "advice.h"

#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "prim.h"

static const char *const reason_names[] = {
    [GG_REASON_NEAR_MISS] = "near_miss", [GG_REASON_REFUSED] = "refused", [GG_REASON_OOM] = "oom",
    [GG_REASON_FORECAST] = "forecast"};

/* The trainer's state and the advice waiting for its ack. */
static gg_spin lock = GG_SPIN_INIT;
static int batch, accum;          /* what the trainer runs, 0 = not told */
static bool told;                 /* gpuguard_set_batch was called */
static unsigned seq;
static struct gg_advice pending;
static bool has_pending;
static bool disarmed;             /* a zone entry advised; waiting for the ack */
static unsigned unheard_said;     /* zone kinds (a bit per reason) advised with no one
                                     to hear them: said once each */
/* Sequentially consistent against the shim's state, so a registration that
 * races the start is seen by one side or the other. */
static _Atomic bool registered;

/* Signals blocked while the lock is held (see advice.h). */
static void lock_take(sigset_t *saved)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, saved);
    gg_spin_lock(&lock);
}

static void lock_drop(const sigset_t *saved)
{
    gg_spin_unlock(&lock);
    pthread_sigmask(SIG_SETMASK, saved, NULL);
}

bool gg_advice_handled(int sig)
{
    struct sigaction sa;
    if (sig <= 0 || sigaction(sig, NULL, &sa) != 0)
        return false;
    if (sa.sa_flags & SA_SIGINFO)
        return sa.sa_sigaction != NULL;
    return sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
}

void gg_advice_signal(int sig)
{
    if (sig > 0)
        kill(getpid(), sig);
}

/* batch -> max(min, batch / 2); accumulation raised so batch x accumulation
 * never falls. 0 means "unknown": halve whatever you use. */
static void shrink(int b, int a, int min, int *nb, int *na, bool *at_min)
{
    if (a < 1)
        a = 1;
    *at_min = false;
    if (b <= 0) {
        *nb = 0;
        *na = 0;
        return;
    }
    if (min < 1)
        min = 1;
    int half = b / 2 > min ? b / 2 : min;
    if (half >= b) {
        *at_min = true;
        *nb = b;
        *na = a;
        return;
    }
    long long effective = (long long)b * a;
    *nb = half;
    *na = (int)((effective + half - 1) / half);
}

bool gg_advice_raise(int dev, enum gg_reason why, const struct gg_trainer_policy *p,
                     struct gg_advice *out)
{
    sigset_t saved;
    lock_take(&saved);
    /* A zone entry, or the trend saying one is coming: once per ack. */
    bool zone = why == GG_REASON_NEAR_MISS || why == GG_REASON_FORECAST;
    if (zone && (p->heard ? disarmed : (unheard_said & (1u << why)) != 0)) {
        lock_drop(&saved);
        return false;
    }
    /* What the trainer said, else the batch the script is seen to run (its
     * accumulation not known: 1), else the policy's. */
    int b = told ? batch : p->seen_batch > 0 ? p->seen_batch : p->batch_size;
    int a = told ? accum : p->seen_batch > 0 ? 1 : p->grad_accum;
    int nb, na;
    bool at_min;
    shrink(b, a, p->min_batch_size, &nb, &na, &at_min);
    memset(out, 0, sizeof *out);
    out->seq = ++seq;
    out->dev = dev;
    out->batch_size = nb;
    out->grad_accum = na;
    strcpy(out->reason, at_min ? "at_min" : reason_names[why]);
    pending = *out;
    has_pending = true;
    if (zone && p->heard)
        disarmed = true;
    else if (zone)
        unheard_said |= 1u << why;
    lock_drop(&saved);
    return true;
}

bool gg_advice_pending(struct gg_advice *out)
{
    sigset_t saved;
    lock_take(&saved);
    bool r = has_pending;
    if (r && out)
        *out = pending;
    lock_drop(&saved);
    return r;
}

/* The batch before and, when it changes, the change (under the lock). */
static bool change_batch(struct gg_batch now, struct gg_batch *was)
{
    *was = told ? (struct gg_batch){batch, accum} : (struct gg_batch){0, 0};
    bool changed = !told || batch != now.batch_size || accum != now.grad_accum;
    batch = now.batch_size;
    accum = now.grad_accum;
    told = true;
    return changed;
}

bool gg_advice_ack(unsigned s, struct gg_batch *now, struct gg_batch *was)
{
    sigset_t saved;
    bool changed = false;
    lock_take(&saved);
    if (has_pending && s == pending.seq) {
        if (pending.batch_size > 0) {
            *now = (struct gg_batch){pending.batch_size, pending.grad_accum};
            changed = change_batch(*now, was);
        }
        has_pending = false;
    }
    if (s <= seq)
        disarmed = false;
    lock_drop(&saved);
    return changed;
}

bool gg_advice_current(int *batch_size, int *grad_accum)
{
    sigset_t saved;
    lock_take(&saved);
    bool r = told;
    *batch_size = batch;
    *grad_accum = accum;
    lock_drop(&saved);
    return r;
}

bool gg_advice_set_batch(struct gg_batch now, struct gg_batch *was)
{
    sigset_t saved;
    lock_take(&saved);
    bool changed = change_batch(now, was);
    lock_drop(&saved);
    atomic_store(&registered, true);
    return changed;
}

bool gg_advice_registered(void)
{
    return atomic_load(&registered);
}

void gg_advice_after_fork(void)
{
    gg_spin_reset(&lock);
}
