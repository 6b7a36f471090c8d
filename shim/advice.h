/* advice.h - telling the trainer to shrink before the OOM (DESIGN.md
 * section 1, "Advice protocol").
 *
 * On a near-miss zone entry (once per acknowledgement), on every refusal and
 * every OOM, the guard advises: batch -> max(min_batch_size, batch / 2),
 * accumulation raised so batch x accumulation never falls. The advice is
 * journaled, kept for gpuguard_advice(), and the policy's signal is sent to
 * the process only when it has a handler installed for it.
 */
#ifndef GG_ADVICE_H
#define GG_ADVICE_H

#include <stdbool.h>

enum gg_reason { GG_REASON_NEAR_MISS, GG_REASON_REFUSED, GG_REASON_OOM };

/* Called by the guard (any thread, no locks held). */
void gg_advice_raise(int dev, enum gg_reason why);


/* The C API's side (api.c exports them). */
struct gpuguard_advice;
int gg_advice_pending(struct gpuguard_advice *out);
void gg_advice_ack(unsigned seq);
void gg_advice_set_batch(int batch_size, int grad_accum);

/* A trainer has told its batch (gpuguard_set_batch) at least once. */
bool gg_advice_registered(void);

/* In a forked child: the lock may have been held by a parent thread. */
void gg_advice_after_fork(void);
#endif /* GG_ADVICE_H */
