"""The bounds that keep memory flat whatever the journal's length: timeline
buckets, marks kept, stack groups, followed call sites, advice runs and batch
changes kept at head and tail, notes and their characters, errors, recent
steps for trends, modules with device code. One home for every bound.

The other modules take these with `from .limits import NAME`, which binds
the value: a test that wants another bound patches the module that uses it
(e.g. gpuguard.journal.incidents.GROUPS_MAX), not this one or the
gpuguard.report facade.
"""

# Bounds of the summaries kept per device (see the gpuguard.journal docstring).
TIMELINE_BUCKETS = 1024     # timeline buckets, each keeping 6 samples at most
MARKS = 400                 # event marks kept per kind, evenly thinned
GROUPS_MAX = 256            # distinct stacks grouped per kind; the rest: "other stacks"
SITES_MAX = 4096            # call sites whose running near-miss count is followed
RUNS_HEAD = RUNS_TAIL = 12  # advice runs kept from the start and from the end
PATH_HEAD = PATH_TAIL = 8   # batch changes kept from the start and from the end
NOTES_MAX = 100             # notes kept (the rest counted)
NOTE_CHARS = 8192           # characters kept of a note
ERRORS_MAX = 50             # distinct error messages kept
RECENT_STEPS = 64           # step lines the trends and the step rate are fitted on
RECENT_FAILURES = 16        # refusals and OOMs kept to tell what one raised OutOfMemoryError covers
ARCH_MAX = 256              # modules with device code kept per journal (the rest counted)
FIT_POINTS = 4096             # step peaks kept for --recommend's fit (halved when full)
