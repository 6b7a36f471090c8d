"""gpuguard.journal - reading gpuguard journals into bounded summaries.

A journal is the JSON-lines file the shim writes per process,
gpuguard.<comm>[.rank<R>].<pid>.jsonl; Journal reads one, read_journals
several (files or directories holding them). Nothing here renders: that is
gpuguard.report.

Journals are read line by line into bounded summaries (counts, the top
stacks, a timeline of at most 1024 buckets that keep each bucket's minima
and maxima, the steps likewise, thinned event marks): memory stays flat
whatever the length, and the text of a run with millions of events stays a
few hundred lines.

A journal is read leniently: a truncated last line, unknown events and
unknown fields are skipped, and a journal without a summary (the process
was killed) is reported from its samples and events.

Standard library only.
"""

from .device import Device, figures
from .incidents import FAILURES, STACK_EVENTS
from .reader import Journal, left_out, read_journals, sections

__all__ = ["Journal", "Device", "read_journals", "figures", "sections", "left_out",
           "STACK_EVENTS", "FAILURES"]
