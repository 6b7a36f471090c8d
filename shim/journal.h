/* journal.h - the JSON-lines journal (DESIGN.md section 1, "Journal").
 *
 * <dir>/gpuguard.<comm>.<pid>.jsonl (gpuguard.<comm>.rank<RANK>.<pid>.jsonl
 * with RANK), created on the first intercepted CUDA call, mode 0600, opened
 * O_NOFOLLOW|O_CREAT|O_EXCL|O_APPEND|O_CLOEXEC: never follows a symlink,
 * never touches a file it did not create. Each event is one line written
 * with one write(2), so a process killed at any moment leaves whole lines.
 */
#ifndef GG_JOURNAL_H
#define GG_JOURNAL_H

#include <stdbool.h>
#include "json.h"

/* Open the journal; false (said once on stderr) when it cannot be. */
bool gg_journal_open(const char *dir, const char *rank);
const char *gg_journal_path(void);

/* Close without writing (a forked child drops its parent's journal). */
void gg_journal_drop(void);

/* Start a line: {"t":<seconds since start>,"ev":"<ev>" ... */
void gg_journal_begin(struct gg_json *j, char *buf, size_t cap, const char *ev);
/* ... close the object, write the line, free the builder. */
void gg_journal_end(struct gg_json *j);

/* Seconds since the shim started. */
double gg_journal_time(void);

/* Between hold and release, error events wait (they are on stderr at once);
 * release writes them to the journal when it opened, else drops them. */
void gg_journal_hold(void);
void gg_journal_release(bool open);

/* An `error` event, and the same line on stderr: "gpuguard: <msg>". */
void gg_journal_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* GG_JOURNAL_H */
