"""What gpuguard-preflight answers per GPU model, from its runs: the peak
PyTorch reserved and what its tensors needed, what a real GPU adds outside
PyTorch (estimated), the verdict, the largest batch (and tokens) that fits;
the text, the JSON, the next run's policies (docs/preflight.md).

Verdicts:
  fits                   the script ran its steps on the simulated GPU under
                         the policy's limit: its peak plus what a real GPU
                         adds outside PyTorch stays under the limit, or
                         PyTorch kept under it by emptying its cache when the
                         guard refused (an enforce run that completed)
  fits_without_headroom  it needs more than the limit but ran within the
                         whole device
  does_not_fit           it ran out of memory even with the whole device
"""
import math
import os

from ..report.formatting import fmt_bytes
from ..report.policy import write_policies
from ..report.recommendation import Recommendation
from . import models as gpu_models

FITS = "fits"
NO_HEADROOM = "fits_without_headroom"
DOES_NOT_FIT = "does_not_fit"


class Outside(object):
    """What a real GPU of a model adds beyond PyTorch's allocator, for one
    run: a sum of estimates, each with its source."""

    def __init__(self, model, cuda, handles=0, dist=None):
        self.parts = []     # (what, bytes, count, Figure)
        ctx = gpu_models.outside(model.name, cuda, "context")
        if ctx is not None:
            self.parts.append(("CUDA context", ctx.bytes, 1, ctx))
        blas = gpu_models.outside(model.name, cuda, "cublas_handle")
        if blas is not None and handles:
            self.parts.append(("cuBLAS handle", blas.bytes, handles, blas))
        if dist and str(dist.get("backend")) == "nccl":
            nccl = gpu_models.outside(model.name, cuda, "nccl_communicator")
            if nccl is not None:
                self.parts.append(("NCCL communicator", nccl.bytes, 1, nccl))

    @property
    def bytes(self):
        return sum(b * n for _, b, n, _ in self.parts)

    def text(self):
        out = []
        for what, b, n, _ in self.parts:
            if n > 1:
                out.append("%d %ss x %s" % (n, what, fmt_bytes(b)))
            else:
                out.append("%s %s" % (what, fmt_bytes(b)))
        return " + ".join(out) if out else "nothing counted"


class Batch(object):
    """One model at one batch value: its runs and what they say."""

    def __init__(self, model, batch):
        self.model = model
        self.batch = batch
        self.fit = None          # the run at the whole device (observe), outside charged
        self.limit_run = None    # the run under the limit (enforce), when it was needed
        self.need_run = None     # the run on a larger device, when the model's was too small
        self.verdict = None
        self.why = None          # the verdict's reasons, said
        self.failure = None      # why no verdict: the script failed otherwise
        self.outside = None
        self.limit = None
        self.total = model.total
        self.near = None
        self.headroom = None

    @property
    def source_run(self):
        """The run whose figures describe the script's own needs (no limit
        touched): the fit run when it never hit the device's end, else the
        larger device's."""
        if self.fit is not None and self.fit.completed and not self.fit.flushes:
            return self.fit
        if self.need_run is not None and self.need_run.completed:
            return self.need_run
        return self.fit

    @property
    def verdict_run(self):
        """The run the reported peaks are of: the run under the limit when
        the script fits only there (PyTorch emptying its cache: what it
        reserves on that GPU under the guard), else source_run."""
        if self.verdict == FITS and self.limit_run is not None and self.limit_run.completed:
            return self.limit_run
        return self.source_run

    @property
    def peak_reserved(self):
        r = self.verdict_run
        return r.max_reserved if r is not None else None

    @property
    def peak_needed(self):
        r = self.verdict_run
        return r.max_needed if r is not None else None

    @property
    def unconstrained(self):
        """PyTorch's peak reserved with no limit touched."""
        r = self.source_run
        return r.max_reserved if r is not None else None

    @property
    def need(self):
        """Bytes the device must have for it with no limit touched:
        PyTorch's unconstrained peak plus the rest."""
        if self.unconstrained is None or self.outside is None:
            return None
        return self.unconstrained + self.outside.bytes

    @property
    def fits(self):
        return self.verdict == FITS

    @property
    def tokens(self):
        r = self.source_run
        s = r.peak_step if r is not None else None
        return s.get("tokens") if s else None


def plan_followups(b):
    """After the fit run: which runs are still needed ('limit', 'need') to
    say the verdict, and the verdict when none is."""
    f = b.fit
    if f.failure:
        b.failure = f.failure
        return []
    if f.completed:
        if not f.flushes and b.need is not None and b.need <= b.limit:
            b.verdict = FITS
            return []
        needed = f.max_needed
        if needed is not None and needed + b.outside.bytes > b.limit:
            b.verdict = NO_HEADROOM       # its tensors alone need more than the limit
            return [] if not f.flushes else ["need"]
        return ["limit"] + (["need"] if f.flushes else [])
    b.verdict = DOES_NOT_FIT                # out of memory with the whole device
    return ["need"]


def settle(b):
    """The verdict once the limit run is back."""
    r = b.limit_run
    if r is None or b.verdict is not None:
        return
    if r.failure:
        b.failure = r.failure
        return
    b.verdict = FITS if r.completed else NO_HEADROOM


def explain(b):
    """The verdict's reasons, in words and figures."""
    lim, out = b.limit, b.outside
    if b.failure:
        return "no verdict: the script failed: %s" % b.failure
    need = b.need
    if b.verdict == FITS and b.limit_run is not None:
        r = b.limit_run
        return ("fits under the limit only because PyTorch emptied its cache when the guard "
                "refused (%d times; slower steps): it reserved %s at most there; with no "
                "limit it reserves %s, + %s outside PyTorch = %s > limit %s" % (
                    r.flushes, fmt_bytes(b.peak_reserved), fmt_bytes(b.unconstrained),
                    fmt_bytes(out.bytes), fmt_bytes(need), fmt_bytes(lim)))
    if b.verdict == FITS:
        return "%s + %s outside PyTorch = %s <= limit %s (%s spare)" % (
            fmt_bytes(b.peak_reserved), fmt_bytes(out.bytes), fmt_bytes(need), fmt_bytes(lim),
            fmt_bytes(lim - need))
    if b.verdict == NO_HEADROOM:
        return ("%s + %s outside PyTorch = %s > limit %s, within the whole %s: it fits only "
                "without the policy's headroom" % (
                    fmt_bytes(b.peak_reserved), fmt_bytes(out.bytes), fmt_bytes(need or 0),
                    fmt_bytes(lim), fmt_bytes(b.total)))
    if b.verdict == DOES_NOT_FIT:
        if need is None:
            return "out of memory with the whole %s" % fmt_bytes(b.total)
        return "%s + %s outside PyTorch = %s > the whole %s" % (
            fmt_bytes(b.peak_reserved), fmt_bytes(out.bytes), fmt_bytes(need),
            fmt_bytes(b.total))
    return ""


# --- the largest batch ---------------------------------------------------------------------

def line_fit(points):
    """need = c + k x batch through [(batch, need)]: the least-squares slope,
    lifted to lie on or above every point (as gpuguard-report --recommend
    fits peaks); None without two batches or when need does not grow."""
    if len({b for b, _ in points}) < 2:
        return None
    n = float(len(points))
    mb = sum(b for b, _ in points) / n
    mn = sum(p for _, p in points) / n
    var = sum((b - mb) ** 2 for b, _ in points)
    k = sum((b - mb) * (p - mn) for b, p in points) / var
    if k <= 0:
        return None
    c = max(p - k * b for b, p in points)
    return c, k


def largest(line, cap):
    """The largest batch whose predicted need is at most cap, or 0."""
    c, k = line
    return max(0, int(math.floor((cap - c) / k))) if cap >= c else 0


def max_tokens(model_batches, best):
    """Elements of the input at the largest batch that fits: the tokens per
    sample of the runs (their peak step's input) times that batch, when every
    run's input grew with its batch alike.

    Preflight runs each batch at one length, so the proportion is exact for
    its runs; a run of varied lengths learns its own budget from the shim's
    memory model instead (gpuguard-report --recommend, docs/trainer.md)."""
    per = set()
    for b in model_batches:
        if b.batch is None or not b.tokens:
            return None
        per.add(b.tokens / float(b.batch))
    if len(per) != 1 or best is None:
        return None
    return int(best * per.pop())


class ModelAnswer(object):
    """Everything said about one GPU model."""

    def __init__(self, model, batches):
        self.model = model
        self.batches = batches        # [Batch], in --batch order
        self.checks = []              # [Batch] run at batches the line predicted
        self.to_check = None          # a batch the line predicts to fit, not run yet
        self.line = None
        self.max_batch = None
        self.max_batch_why = None
        self.recommended = None       # (batch, accum) for the policy file
        self.max_tokens = None

    @property
    def top(self):
        """The Batch the model's figures are of: the largest batch run."""
        return self.batches[-1]

    def settle_batches(self, final=True):
        """The largest batch that fits: from the runs' (batch, need) line,
        and only a batch a run showed to fit. Not final: a batch the line
        predicts and no run has shown is left in to_check, for a run."""
        self.to_check = None
        every = [b for b in self.batches + self.checks if b.batch is not None]
        if not every:
            return
        top = self.top
        pts = [(b.batch, b.need) for b in every if b.need is not None and
               b.source_run is not None and b.source_run.completed]
        fitting = [b.batch for b in every if b.fits]
        failing = [b.batch for b in every if b.verdict is not None and not b.fits]
        shown = max(fitting) if fitting else None
        self.line = line_fit(pts)
        if self.line is None:
            self.max_batch = shown
            self.max_batch_why = ("the largest batch run that fits: one batch gives no line "
                                  "(give --batch two values to predict beyond it)"
                                  if len({b for b, _ in pts}) < 2 else
                                  "the largest batch run that fits (the need did not grow "
                                  "with the batch)")
            return
        c, k = self.line
        pred = largest(self.line, top.limit)
        above = [f for f in failing if shown is None or f > shown]
        if above:  # a run said no: the line is too low there
            pred = min(pred, min(above) - 1)
        if pred > (shown or 0) and not final:
            self.to_check = pred
            return
        self.max_batch = shown
        checked = sorted(b.batch for b in self.checks)
        self.max_batch_why = ("need = %s + %s x batch from batches %s (PyTorch's peak + %s "
                              "outside it), <= limit %s%s" % (
                                  fmt_bytes(c, 2), fmt_bytes(k, 2),
                                  ", ".join(str(b) for b in sorted({b for b, _ in pts})),
                                  fmt_bytes(top.outside.bytes), fmt_bytes(top.limit),
                                  "; checked by runs at %s" % ", ".join(map(str, checked))
                                  if checked else ""))
        if shown is None:
            return
        self.max_tokens = max_tokens([b for b in every if b.fits], shown)
        if top.near is not None:
            # the largest --batch is the step's batch the user runs: the
            # micro-batch is never larger, and accumulation keeps the step's
            eff = max(b.batch for b in self.batches if b.batch is not None)
            rec = min(shown, eff, largest(self.line, top.limit - top.near))
            if rec > 0:
                self.recommended = (rec, max(1, -(-eff // rec)))

    def recommendation(self, argv):
        """A report.recommendation.Recommendation for policy.write_policies."""
        if self.recommended is None:
            return None
        top = self.top
        r = Recommendation(self.model.name)
        r.batch, r.accum = self.recommended
        r.effective = r.batch * r.accum
        r.total, r.near, r.limit = top.total, top.near, top.limit
        r.headroom = top.headroom if top.headroom is not None else top.total - top.limit
        r.mode = None
        c, k = self.line
        r.why = ("gpuguard-preflight of %s: need = %s + %s x batch; batch %d predicted %s <= "
                 "limit %s - near-miss margin %s" % (
                     " ".join(argv), fmt_bytes(c, 2), fmt_bytes(k, 2), r.batch,
                     fmt_bytes(c + k * r.batch, 2), fmt_bytes(top.limit), fmt_bytes(top.near)))
        return r

    def json(self):
        top = self.top
        return {
            "name": self.model.name,
            "total": self.model.total,
            "limit": top.limit,
            "peak_reserved": top.peak_reserved,
            "peak_needed": top.peak_needed,
            "outside_estimate": top.outside.bytes if top.outside is not None else None,
            "verdict": top.verdict,
            "fits": top.verdict == FITS,
            "max_batch": self.max_batch,
            "max_tokens": self.max_tokens,
        }


def write_out(answers, outdir, argv):
    """Policy files for the next run (as gpuguard-report --recommend --out
    writes them); {model: path}."""
    recs = [a.recommendation(argv) for a in answers]
    recs = [r for r in recs if r is not None]
    return write_policies(recs, outdir, ["gpuguard-preflight"]) if recs else {}


# --- text -----------------------------------------------------------------------------------

def _runs(b):
    """The runs behind a verdict, said."""
    need = None
    if b.need_run is not None:
        need = ("on a larger simulated device" if b.need_run.spec.kind == "need" else
                "the %s run's" % b.need_run.spec.model.name)
    return ", ".join("%s%s" % (what, "" if r.completed else " (out of memory)")
                     for what, r in (("at the whole device", b.fit), ("under the limit", b.limit_run),
                                     (need, b.need_run))
                     if r is not None)


def _steps_text(run):
    """Per step: PyTorch's reserved / needed peaks, runs of equal steps
    folded."""
    out, last = [], None
    for s in run.steps:
        key = (s.get("reserved_peak"), s.get("needed_peak"), tuple(s.get("shape") or ()))
        if last is not None and last[0] == key:
            last[2] = s.get("step")
            continue
        last = [key, s.get("step"), s.get("step")]
        out.append(last)
    parts = []
    for (res, need, shape), a, z in out[:8]:
        parts.append("%s: %s / %s%s" % (a if a == z else "%d-%d" % (a, z), fmt_bytes(res or 0),
                                        fmt_bytes(need or 0),
                                        " [%s]" % ", ".join(str(x) for x in shape) if shape
                                        else ""))
    if len(out) > 8:
        parts.append("... (%d more)" % (len(out) - 8))
    return "; ".join(parts)


def text(answers, ctx):
    """The report, as lines."""
    out = []
    out.append("gpuguard-preflight: %s" % " ".join(ctx.argv))
    out.append("  %s; %s on the simulated GPU%s" % (
        ctx.torch.describe(), "%d steps" % ctx.steps if ctx.steps else "to its end",
        ", --batch %s" % ",".join(str(b) for b in ctx.batches) if ctx.batches[0] is not None
        else ""))
    for a in answers:
        m = a.model
        top = a.top
        out.append("")
        pol = top.fit.device.policy if top.fit is not None and top.fit.device is not None else None
        out.append("%s (%s, sm_%s)%s%s" % (
            m.name, fmt_bytes(m.total), m.cc.replace(".", ""),
            ", limit %s" % fmt_bytes(top.limit) if top.limit is not None else "",
            " (policy %s)" % os.path.basename(pol) if pol else ""))
        for b in a.batches:
            label = "  batch %s: " % b.batch if b.batch is not None else "  "
            if b.failure:
                out.append("%sno verdict: the script failed (%s)" % (label, b.failure))
                tb = b.fit.traceback if b.fit is not None else ""
                if tb:
                    out.extend("    | " + l for l in tb.splitlines()[-12:])
                continue
            src = b.verdict_run
            peak = src.peak_step if src is not None else None
            where = ""
            if peak is not None:
                where = " at step %d" % peak.get("step")
                if peak.get("shape"):
                    where += " (input [%s])" % ", ".join(str(x) for x in peak["shape"])
            at_least = "" if src is not None and src.completed else "at least "
            measured = ""
            if src is not None and src is b.need_run:
                measured = (" (on a larger simulated device)" if src.spec.kind == "need" else
                            " (in the %s run: same compute capability, more memory)" %
                            src.spec.model.name)
            out.append("%s%s: PyTorch reserved %s%s at its peak%s, its tensors needed %s%s" % (
                label, b.verdict, at_least, fmt_bytes(b.peak_reserved or 0), measured,
                fmt_bytes(b.peak_needed or 0), where))
            out.append("    %s" % explain(b))
            if src is not None and src.steps:
                out.append("    per step (reserved / needed): %s" % _steps_text(src))
            out.append("    runs: %s" % _runs(b))
        if top.outside is not None:
            out.append("  outside PyTorch (estimated): %s" % top.outside.text())
        if a.max_batch is not None or a.max_batch_why:
            if a.max_batch:
                tok = ", %d tokens" % a.max_tokens if a.max_tokens else ""
                out.append("  largest batch that fits: %d%s (%s)" % (a.max_batch, tok,
                                                                 a.max_batch_why))
            elif a.max_batch_why:
                out.append("  largest batch that fits: none known (%s)" % a.max_batch_why)
        if a.recommended is not None:
            out.append("  next run: batch %d x accum %d (clear of the near-miss zone)" %
                       a.recommended)
    figures = []
    for a in answers:
        for b in a.batches:
            for what, _, _, fig in (b.outside.parts if b.outside is not None else ()):
                if all(fig is not f for _, f in figures):
                    figures.append((what, fig))
    if figures:
        out += ["", "Estimates of what a real GPU adds outside PyTorch, and their sources:"]
        out += ["  %s, %s: %s" % (what, fmt_bytes(fig.bytes), fig.source) for what, fig in figures]
    return out
