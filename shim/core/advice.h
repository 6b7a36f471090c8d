/* advice.h - layer 4: telling the trainer to shrink before the OOM
 * (docs/trainer.md, "Advice protocol").
 *
 * On a near-miss zone entry or a forecast of one (once per acknowledgement;
 * while no trainer can hear it, once per kind: nobody acknowledges),
 * on every refusal and every OOM, advise: batch -> max(min_batch_size, batch / 2), accumulation
 * raised so batch x accumulation never falls. The caller journals the
 * advice, then sends the signal, which goes only to a process that handles
 * it. The trainer's side (the C API) reads, acknowledges and registers.
 *
 * One short lock guards the state; every path that holds it blocks signals,
 * so a signal handler that calls the C API on the same thread never waits
 * for its own thread.
 */
#ifndef GG_ADVICE_H
#define GG_ADVICE_H

#include <stdbool.h>

enum gg_reason { GG_REASON_NEAR_MISS, GG_REASON_REFUSED, GG_REASON_OOM, GG_REASON_FORECAST };

/* What the device's policy says of the trainer. */
struct gg_trainer_policy {
    int batch_size, grad_accum, min_batch_size; /* 0: not given */
    int signal;                                  /* 0: none */
    int seen_batch;   /* the batch the script is seen to run (its input's batch
                         dimension); 0: not known. Halved before the policy's
                         batch_size, after what the trainer said. */
    bool heard;       /* a trainer can hear it (registered, or a handler for the
                         signal): zone entries and forecasts advise once per ack;
                         unheard, once per kind (nobody will ack) */
};

/* A batch and its accumulation; {0, 0}: not known (never told). */
struct gg_batch {
    int batch_size, grad_accum;
};

/* One advice, as the C API hands it out (struct gpuguard_advice's fields). */
struct gg_advice {
    unsigned seq;
    int dev, batch_size, grad_accum;
    char reason[32];
};

/* Raise an advice for device dev (any thread). True when one was made
 * (*out filled); false for a zone entry while the last one waits for its
 * ack. */
bool gg_advice_raise(int dev, enum gg_reason why, const struct gg_trainer_policy *p,
                     struct gg_advice *out);

/* Does the process handle sig? (Python's default for SIGUSR2 is to die.) */
bool gg_advice_handled(int sig);
/* Send sig to the process. */
void gg_advice_signal(int sig);

/* The C API's side. */
bool gg_advice_pending(struct gg_advice *out);
/* The trainer acted on advice seq: the advised batch becomes the current
 * one. True when that changed it: *now is the new batch, *was the one
 * before (not known when the trainer never told it). */
bool gg_advice_ack(unsigned seq, struct gg_batch *now, struct gg_batch *was);
/* The trainer runs this batch now: true when that changed it (*was: the
 * one before). */
bool gg_advice_set_batch(struct gg_batch now, struct gg_batch *was);
/* What the trainer runs now, as it last said or acked; false if never told. */
bool gg_advice_current(int *batch_size, int *grad_accum);
/* A trainer has told its batch (gpuguard_set_batch) at least once. */
bool gg_advice_registered(void);

/* The fork story (life.c). */
void gg_advice_after_fork(void);

#endif /* GG_ADVICE_H */
