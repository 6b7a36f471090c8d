/* journal.h - layer 4: the journal file and the one way lines reach it
 * (docs/journal.md).
 *
 * <dir>/gpuguard.<comm>.<pid>.jsonl (gpuguard.<comm>.rank<RANK>.<pid>.jsonl
 * with RANK), created on the first intercepted CUDA call, mode 0600, opened
 * O_NOFOLLOW|O_CREAT|O_EXCL|O_APPEND|O_CLOEXEC: never follows a symlink,
 * never touches a file it did not create. When that name is taken (the same
 * pid in an earlier container, or this process before it exec'ed itself)
 * the pid gets a suffix: <pid>-2, <pid>-3, ... Each line is written with one
 * write(2), so a process killed at any moment leaves whole lines, and a
 * line that did not fit (a full disk) is cut off again: whole lines or
 * nothing. Lines that could not be written are counted. Before
 * each write the descriptor is checked to still be the journal's (a
 * program that closes every descriptor and opens its own file may have
 * been given the same number): if not, the journal is opened again by its
 * path, or given up, said once. What the lines say is events.h's business.
 */
#ifndef GG_JOURNAL_H
#define GG_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Open the journal in dir for a process named comm with rank (-1: none).
 * False (said once on stderr) when it cannot be. */
bool gg_journal_open(const char *dir, const char *comm, long rank);
const char *gg_journal_path(void);

/* Write one whole line (with its newline): true when it is in the file.
 * Lines written before the journal opened are kept (a few) and written when
 * it does: hold() starts that, release(open) ends it, writing them or
 * dropping them. */
bool gg_journal_write(const char *line, size_t len);

/* Lines lost (not written: no space, or no turn); of them, not yet said in
 * the journal; say(n): n more have been said. */
/* The same, for a line about the journal itself: its failure is not
 * counted as a lost line. */
bool gg_journal_write_note(const char *line, size_t len);
uint64_t gg_journal_lost(void);
uint64_t gg_journal_lost_unsaid(void);
void gg_journal_lost_said(uint64_t n);
void gg_journal_hold(void);
void gg_journal_release(bool open);

/* The last lines (the summary): written even by a thread that interrupted
 * its own write to exit. */
void gg_journal_final(void);

/* Close without writing more (a forked child drops its parent's journal). */
void gg_journal_drop(void);

#endif /* GG_JOURNAL_H */
