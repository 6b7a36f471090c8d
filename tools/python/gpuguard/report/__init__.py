"""gpuguard-report - the post-mortem of gpuguard journals.

    gpuguard-report JOURNAL... [--html OUT] [--trace OUT] [--recommend [--out DIR]]

Reads one or more journals (gpuguard.<comm>[.rank<R>].<pid>.jsonl, or a
directory holding them) and opens with a verdict: device code no GPU can
run, leaks and forecasts first; then which rank failed first, on which GPU,
when and asking for what; per process whether it finished and its peak
against its limit; errors. Then one section per (process, device) that did
something: mode, peak, limit, steps, the allocation sites at the peak as a
massif-style tree (by Python line, then native frames), near misses grouped
by Python line and then by stack, refusals, OOMs, the advice history as
runs, live allocations at exit. --html writes a self-contained page with an
SVG timeline and, when the trainer reported steps, an SVG of each step's
peak and live bytes with their trends; --trace writes Chrome/Perfetto trace
JSON. --recommend fits each GPU model's peak against the trainer's batch
(the `batch` events, the steps' peaks) and proposes the batch and
accumulation for the next run; --out DIR writes them as policy files for
GPUGUARD_POLICY=DIR.

Stacks through PyTorch read in its terms (gpuguard.journal.frames): native and
Python frames merged in call order, its allocator, dispatcher and the
interpreter collapsed, ATen ops and autograd nodes named, autograd's
allocations tied to the `.backward()` line; the first failure said in
PyTorch's terms when gpuguard-run's instrumentation answered it with a
`torch` line (torchtext). --native shows the stacks as the shim took them.

This package renders what gpuguard.journal reads; the command is
gpuguard.report.cli (tools/bin/gpuguard-report, or python -m gpuguard.report).

Exit status: 0, or 1 when a journal could not be read, 2 on bad usage or a
file that is not a journal.
Standard library only.
"""

from .. import __version__ as VERSION
from ..journal.arch import runs_only_by_jit, sass_runs
from ..journal.device import Device, figures
from ..journal.incidents import Incidents
from ..journal.limits import GROUPS_MAX, RECENT_STEPS, RUNS_HEAD, RUNS_TAIL, TIMELINE_BUCKETS
from ..journal.reader import Journal, read_journals
from ..journal.series import Thinned, Timeline, fit_line
from .cli import console, main, parse_args
from .formatting import fmt_about, fmt_bytes, fmt_size, fmt_t, fmt_wall, time_unit
from .groups import line_group_lines
from .html_page import html_report
from .perfetto import trace_report
from .policy import ini_glob, ini_size, policy_file_name, write_policies
from .recommendation import Recommendation, recommend, recommend_text
from .text import text_report
from .tree import render_tree, site_tree

__all__ = [
    "VERSION",
    "runs_only_by_jit", "sass_runs",
    "Device", "figures",
    "Incidents",
    "GROUPS_MAX", "RECENT_STEPS", "RUNS_HEAD", "RUNS_TAIL", "TIMELINE_BUCKETS",
    "Journal", "read_journals",
    "Thinned", "Timeline", "fit_line",
    "console", "main", "parse_args",
    "fmt_about", "fmt_bytes", "fmt_size", "fmt_t", "fmt_wall", "time_unit",
    "line_group_lines",
    "html_report",
    "trace_report",
    "ini_glob", "ini_size", "policy_file_name", "write_policies",
    "Recommendation", "recommend", "recommend_text",
    "text_report",
    "render_tree", "site_tree",
]
