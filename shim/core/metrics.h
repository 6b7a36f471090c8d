/* metrics.h - layer 4: the process's figures for Prometheus, through
 * node_exporter's textfile collector (docs/metrics.md).
 *
 * With a metrics directory ([journal] metrics_dir, GPUGUARD_METRICS_DIR)
 * the shim's own thread (ticker.h) writes <dir>/gpuguard_<host>_<pid>_<instance_id>.prom
 * at its first tick and then every metrics_interval seconds: the rows of
 * metrics.def in Prometheus's text format, read from the counters the guard
 * keeps anyway (device.h, steps.h, react.h, advice.h), never on the
 * allocation path. Each write goes to a temporary file of its own in the
 * same directory (.<name>.<64 unpredictable bits>.tmp: a name the collector
 * ignores and another user of the directory cannot take first), created
 * O_EXCL|O_NOFOLLOW, mode 0644 whatever the umask, written whole, then
 * renamed over the file: a reader sees the last file or the new one, never
 * half of one. The directory itself is never followed through a symbolic
 * link. A file at the name that this process did not put there (planted by
 * another user) is replaced where the directory allows it and said once;
 * where it does not (a sticky directory), that is said once and the file is
 * never written through; the exit removes only the file this process put
 * there.
 *
 * A clean exit removes the file, so Prometheus stops seeing a finished
 * process; a killed one leaves its last write, whose age says it is stale.
 * A forked child never writes nor removes its parent's file. A directory
 * that cannot be written is said once (stderr and an `error` line) and
 * tried again at each interval; nothing else changes.
 */
#ifndef GG_METRICS_H
#define GG_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "settings.h"

/* What a process's metrics are made of (gg_metrics_start fills it from the
 * settings; the unit test directly). */
struct gg_metrics_config {
    const char *dir;         /* "" or NULL: no metrics */
    const char *setting;     /* the setting named in messages: GPUGUARD_METRICS_DIR, FILE:LINE */
    unsigned interval_s;     /* >= 1 */
    const char *comm, *host; /* label values */
    long rank, local_rank;   /* -1: none */
    const char *job;         /* "" or NULL: none */
};

/* At the start (life.c): the first device's policy says where and how
 * often, the environment the job (SLURM_JOB_ID, else TORCHELASTIC_RUN_ID).
 * A directory that is a symbolic link or cannot be written is said once. */
void gg_metrics_start(const struct gg_process *p, const char *comm, const char *host);
/* The same from a config; false when metrics are off (no directory, or no
 * memory for them). */
bool gg_metrics_open(const struct gg_metrics_config *c);
/* Are metrics on (and not closed)? */
bool gg_metrics_on(void);

/* The shim's thread, at every tick (monotonic now): writes the file when
 * the interval has passed since the last write (the first tick writes). */
void gg_metrics_tick(uint64_t now_ns);

/* A clean exit: no write after this, and the file is removed. */
void gg_metrics_exit(void);

/* A forked child: never writes nor removes the parent's file. */
void gg_metrics_after_fork(void);

/* ---- for tests ------------------------------------------------------------------ */

/* The file's text as of now into buf; its length, 0 when it did not fit. */
size_t gg_metrics_render(char *buf, size_t cap);
/* Render and write the file now (what a tick does): true when written. */
bool gg_metrics_write(void);
#ifdef GG_TESTING
/* The file's path ("" when off). */
const char *gg_metrics_path(void);
/* A label value in the exposition format: \ " and newline escaped. The
 * length written (without the NUL); 0 and "" when it did not fit. */
size_t gg_metrics_escape(char *out, size_t cap, const char *s);
#endif
/* This process's instance id (16 hex digits): its boot's id, its PID
 * namespace and its start time, hashed with its pid, so that processes that
 * share a host name and a pid (containers with host networking, each its
 * own pid 1) and a pid reused after a reboot are told apart. */
void gg_metrics_instance(char *out, size_t cap);
/* Forget everything (tests open again). */
void gg_metrics_reset(void);

#endif /* GG_METRICS_H */
