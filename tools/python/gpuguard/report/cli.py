"""The gpuguard-report command line: arguments, reading, --recommend and --out,
the text on stdout, --html and --trace files, exit status. console() is what
the tools/bin/gpuguard-report script runs.
"""

import argparse
import json
import os
import sys

from .. import __version__ as VERSION
from ..journal.reader import NOT_A_JOURNAL, read_journals
from .formatting import fmt_size
from .html_page import html_report
from ..journal.source import set_substitutions
from .perfetto import trace_report
from .policy import write_file, write_policies
from .recommendation import recommend
from .text import text_report


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="gpuguard-report",
        description="Report on gpuguard journals (several journals merge into one report).")
    p.add_argument("journals", nargs="+", metavar="JOURNAL",
                   help="a gpuguard.*.jsonl journal, or a directory of them")
    p.add_argument("--html", metavar="OUT", help="write a self-contained HTML page")
    p.add_argument("--trace", metavar="OUT", help="write Chrome/Perfetto trace JSON")
    p.add_argument("--recommend", action="store_true",
                   help="after the verdict, the batch and accumulation for the next run "
                        "per GPU model, from the journals' (batch, peak) points")
    p.add_argument("--out", metavar="DIR",
                   help="with --recommend: write them as policy files into DIR "
                        "(for GPUGUARD_POLICY=DIR)")
    p.add_argument("--frames", type=int, default=4, metavar="N",
                   help="top frames that group near misses and refusals (default 4)")
    p.add_argument("--depth", type=int, default=12, metavar="N",
                   help="levels of the allocation-site tree (default 12)")
    p.add_argument("--threshold", type=float, default=1.0, metavar="PCT",
                   help="fold tree nodes below PCT%% of the peak (default 1)")
    p.add_argument("--top-down", action="store_true",
                   help="root the site tree at the outermost caller instead of the allocation")
    p.add_argument("--native", action="store_true",
                   help="stacks as the shim took them: Python frames first, then every native "
                        "frame, none merged, collapsed or named in PyTorch's terms")
    p.add_argument("--substitute-path", nargs=2, action="append", default=[],
                   metavar=("FROM", "TO"),
                   help="read the Python sources the journals name under FROM from TO instead "
                        "(the report quotes the line that called .backward()), as gdb's "
                        "`set substitute-path`: journals from a container or another machine")
    p.add_argument("--version", action="version", version="gpuguard-report " + VERSION)
    opts = p.parse_args(argv)
    if opts.frames < 1 or opts.depth < 1 or opts.threshold < 0:
        p.error("--frames and --depth must be at least 1, --threshold not negative")
    if opts.out and not opts.recommend:
        p.error("--out goes with --recommend")
    return opts


def main(argv=None):
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    set_substitutions(opts.substitute_path)
    journals, failed = read_journals(opts.journals, opts.frames, opts.native)
    for path, why in failed:
        sys.stderr.write("gpuguard-report: %s: %s\n" % (path, why))
    # A file that is no journal was the wrong argument: exit status 2, and
    # with nothing else to read, its line is all that is said.
    wrong = any(why.startswith(NOT_A_JOURNAL) for _, why in failed)
    if wrong and not journals:
        return 2
    opts.recs = recommend(journals) if opts.recommend else None
    opts.written = None
    try:
        if opts.recommend and opts.out:
            opts.written = write_policies(opts.recs, opts.out, [j.path for j in journals])
    except OSError as e:
        sys.stderr.write("gpuguard-report: %s: %s\n" % (e.filename, e.strerror))
        return 1
    text = text_report(journals, failed, opts)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    try:
        if opts.html:
            write_file(opts.html, html_report(journals, failed, opts))
            wrote(opts.html, "the HTML report (one self-contained page: open it in a browser)")
        if opts.trace:
            with open(opts.trace, "w", encoding="utf-8") as f:
                json.dump(trace_report(journals), f, indent=None, separators=(",", ":"))
                f.write("\n")
            wrote(opts.trace, "the trace (open it in https://ui.perfetto.dev or "
                              "chrome://tracing)")
    except OSError as e:
        sys.stderr.write("gpuguard-report: %s: %s\n" % (e.filename, e.strerror))
        return 1
    if wrong:
        return 2
    return 1 if failed or not journals else 0


def wrote(path, what):
    """Say on stderr (stdout is the report) what a file now holds."""
    try:
        size = fmt_size(os.path.getsize(path))
    except OSError:
        size = "?"
    sys.stderr.write("gpuguard-report: wrote %s: %s, %s\n" % (path, what, size))


def console(argv=None):
    """The command: main() with a stdout that replaces what it cannot encode."""
    try:
        sys.stdout.reconfigure(errors="replace")
    except AttributeError:
        pass
    return main(argv)
