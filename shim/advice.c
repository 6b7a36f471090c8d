/* advice.c - the advice protocol (see advice.h). */
#include "advice.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "gpuguard.h"
#include "guard.h"
#include "journal.h"
#include "os.h"

static const char *const reason_names[] = {
    [GG_REASON_NEAR_MISS] = "near_miss", [GG_REASON_REFUSED] = "refused", [GG_REASON_OOM] = "oom"};

/* The trainer's state and the advice waiting for its ack, under one short
 * lock that is never held across a call out of this file. */
static gg_spin lock = GG_SPIN_INIT;
static int batch, accum;          /* what the trainer runs, 0 = not told */
static bool told;                 /* gpuguard_set_batch was called */
static unsigned seq;
static struct gpuguard_advice pending;
static bool has_pending;
static bool disarmed;             /* a zone entry advised; waiting for the ack */
/* Sequentially consistent against the shim's state, so a registration that
 * races the start is seen by one side or the other. */
static _Atomic bool registered;

/* Does the process handle sig? Python's default for SIGUSR2 is to die. */
static bool handled(int sig)
{
    struct sigaction sa;
    if (sig <= 0 || sigaction(sig, NULL, &sa) != 0)
        return false;
    if (sa.sa_flags & SA_SIGINFO)
        return sa.sa_sigaction != NULL;
    return sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
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

void gg_advice_raise(int dev, enum gg_reason why)
{
    const struct gg_policy *p = &gg_devices[dev].policy;
    struct gpuguard_advice adv;

    gg_spin_lock(&lock);
    if (why == GG_REASON_NEAR_MISS && disarmed) {
        gg_spin_unlock(&lock);
        return;
    }
    int b = told ? batch : p->batch_size;
    int a = told ? accum : p->grad_accum;
    int nb, na;
    bool at_min;
    shrink(b, a, p->min_batch_size, &nb, &na, &at_min);
    memset(&adv, 0, sizeof adv);
    adv.seq = ++seq;
    adv.dev = dev;
    adv.batch_size = nb;
    adv.grad_accum = na;
    strcpy(adv.reason, at_min ? "at_min" : reason_names[why]);
    pending = adv;
    has_pending = true;
    if (why == GG_REASON_NEAR_MISS)
        disarmed = true;
    gg_spin_unlock(&lock);

    /* The line first, then the signal: a handler that attaches a note finds
     * its advice already in the journal. */
    bool signaled = handled(p->signal);
    char buf[512];
    struct gg_json j;
    gg_journal_begin(&j, buf, sizeof buf, "advice");
    gg_json_ku64(&j, "seq", adv.seq);
    gg_json_ki64(&j, "dev", dev);
    gg_json_ki64(&j, "batch_size", nb);
    gg_json_ki64(&j, "grad_accum", na);
    gg_json_kstr(&j, "reason", adv.reason);
    gg_json_kbool(&j, "signaled", signaled);
    gg_journal_end(&j);
    if (signaled)
        kill(getpid(), p->signal);
}

int gg_advice_pending(struct gpuguard_advice *out)
{
    gg_spin_lock(&lock);
    int r = has_pending;
    if (r && out)
        *out = pending;
    gg_spin_unlock(&lock);
    return r;
}

void gg_advice_ack(unsigned s)
{
    gg_spin_lock(&lock);
    if (has_pending && s == pending.seq) {
        if (pending.batch_size > 0) {
            batch = pending.batch_size;
            accum = pending.grad_accum;
            told = true;
        }
        has_pending = false;
    }
    if (s <= seq)
        disarmed = false;
    gg_spin_unlock(&lock);
}

void gg_advice_set_batch(int batch_size, int grad_accum)
{
    gg_spin_lock(&lock);
    batch = batch_size;
    accum = grad_accum;
    told = true;
    gg_spin_unlock(&lock);
    atomic_store(&registered, true);
}

bool gg_advice_registered(void)
{
    return atomic_load(&registered);
}

void gg_advice_after_fork(void)
{
    gg_spin_unlock(&lock);
}
