"""gpuguard-preflight's throwaway layer: run a command with no network and
with every write it makes going to a layer that is thrown away at its end,
then say what it wrote and where (docs/preflight.md, "Harmless").

A preflight runs the user's own script on a simulated GPU, where every value
the GPU computes is zero: a checkpoint it saves, a log it appends to, a file
it deletes must never touch the user's real files. So the script runs:

- in a **private mount namespace** whose every file system is seen through
  an **overlay** (``lowerdir`` the real tree, ``upperdir`` on a fresh tmpfs):
  reads see the real files, writes land in the tmpfs, which goes away with
  the namespace (https://docs.kernel.org/filesystems/overlayfs.html). The
  root and every mount under it get their own overlay; ``/proc``, ``/sys``
  and ``/dev`` are the real ones (``/dev/shm`` a fresh tmpfs), and one
  directory of the preflight's own (``results``) is bound through, where the
  journal and the figures go;
- in a **network namespace** with only loopback up: nothing leaves the
  machine (no upload, no download), ``localhost`` still works;
- in a **PID namespace** of its own, the command its first process: when it
  ends, or is stopped, nothing it started outlives it (a daemon would keep
  the namespaces, and the layer, alive);
- as root, with ``unshare(CLONE_NEWNS | CLONE_NEWNET)``; as another user,
  in a **user namespace** (``CLONE_NEWUSER``, the user's own uid mapped to
  itself), where the kernel allows overlays there (Linux 5.11+) and the
  distribution allows user namespaces.

When one part cannot be had, the run is **refused**, with the reason: it
never runs unprotected. Afterwards the upper layers are walked and every file
written or deleted is reported, with the real path it would have had.

This file runs on its own, as ``python3 -I sandbox.py`` with a JSON spec on
stdin (standard library only, no package imports): a single-threaded process
of its own, which unshare(CLONE_NEWUSER) requires, holding the namespaces
while the command runs. ``run()`` is what the preflight calls.
"""
import ctypes
import errno
import fcntl
import json
import os
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

#: File systems that are not files: never overlaid (the kernel's own views,
#: mounted again or bound as they are).
PSEUDO = frozenset((
    "proc", "sysfs", "devtmpfs", "devpts", "mqueue", "cgroup", "cgroup2", "debugfs",
    "tracefs", "securityfs", "pstore", "bpf", "configfs", "fusectl", "hugetlbfs",
    "autofs", "binfmt_misc", "efivarfs", "rpc_pipefs", "nsfs", "selinuxfs"))
#: Trees that are bound from the real system, not overlaid.
KERNEL_TREES = ("/proc", "/sys", "/dev")

#: Seconds between the polite stop (SIGINT, as Ctrl-C) and SIGKILL.
STOP_GRACE = 10.0


class Refused(Exception):
    """The throwaway layer cannot be had; the command did not run."""


# --- the kernel's calls ----------------------------------------------------------------

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
        _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        _libc.unshare.argtypes = [ctypes.c_int]
    return _libc


def _b(s):
    return None if s is None else os.fsencode(s)


def _check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def unshare(flags):
    _check(_c().unshare(flags), "unshare")


def mount(source, target, fstype, flags=0, data=None):
    _check(_c().mount(_b(source), _b(target), _b(fstype), flags, _b(data)),
           "mount %s on %s" % (fstype or source or "", target))


def umount(target, flags=0):
    _check(_c().umount2(_b(target), flags), "umount %s" % target)


def pivot_root(new, old):
    nr = 155  # x86-64 (pivot_root has no glibc wrapper)
    if os.uname().machine in ("aarch64", "arm64"):
        nr = 41
    _check(_c().syscall(nr, _b(new), _b(old)), "pivot_root")


# --- mounts ----------------------------------------------------------------------------

def _unescape(field):
    """mountinfo's octal escapes (\\040 for a space) undone."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) + 0 and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts():
    """The mounts this process sees, in mount order: [{point, fstype, shared}]
    (shared: its mountinfo line has a shared:N peer group)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) < 6 or not right:
                continue
            out.append({"point": _unescape(fields[4]), "fstype": right.split()[0],
                        "shared": any(o.startswith("shared:") for o in fields[6:])})
    return out


def _under(path, top):
    return path == top or path.startswith(top.rstrip("/") + "/")


def _opt_path(p):
    """A path as an overlay option value (commas, colons and backslashes
    escaped, as the kernel's parser wants them)."""
    return p.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def _overlay(lower, upper, work, target, userns):
    base = "lowerdir=%s,upperdir=%s,workdir=%s" % (_opt_path(lower), _opt_path(upper),
                                                  _opt_path(work))
    # index=off: several preflights may share the same lower directory
    tries = [base + ",userxattr,index=off", base + ",userxattr"] if userns else []
    tries += [base + ",index=off", base]
    last = None
    for data in tries:
        try:
            mount("overlay", target, "overlay", 0, data)
            return
        except OSError as e:
            last = e
    raise last


def _lo_up():
    """Loopback up in this network namespace (ioctl SIOCSIFFLAGS)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
    finally:
        s.close()


class Layer(object):
    """The namespaces and mounts of one run, made in this process."""

    def __init__(self, scratch, keep, writable=()):
        self.scratch = scratch           # an empty directory: the tmpfs goes there
        self.keep = list(keep)           # directories bound through, writable
        self.writable = list(writable)   # in a user namespace: layers of their own
        self.root = os.path.join(scratch, "root")
        self.layers = []                 # [(mount point, upper dir)]
        self.notes = []                  # what the run should know (read-only mounts)
        self.userns = False

    def enter(self):
        uid, gid = os.getuid(), os.getgid()
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
        if uid != 0:
            flags |= CLONE_NEWUSER
            self.userns = True
        try:
            unshare(flags)
        except OSError as e:
            if self.userns:
                raise Refused(
                    "cannot make a user namespace as uid %d (%s): run gpuguard-preflight as "
                    "root, or allow unprivileged user namespaces (kernel.unprivileged_userns_clone"
                    ", or AppArmor's kernel.apparmor_restrict_unprivileged_userns on Ubuntu); a "
                    "chroot never allows them" % (uid, e.strerror))
            raise Refused("cannot make private mount, network and PID namespaces (%s)" %
                          e.strerror)
        if self.userns:
            try:
                with open("/proc/self/setgroups", "w") as f:
                    f.write("deny")
                with open("/proc/self/uid_map", "w") as f:
                    f.write("%d %d 1" % (uid, uid))
                with open("/proc/self/gid_map", "w") as f:
                    f.write("%d %d 1" % (gid, gid))
            except OSError as e:
                raise Refused("cannot map uid %d in a user namespace (%s)" % (uid, e.strerror))
        try:
            _lo_up()
        except OSError as e:
            raise Refused("cannot bring up loopback in the private network namespace (%s)" %
                          e.strerror)
        self._private()
        self._layers()
        self._kernel_trees()
        for d in self.keep:
            target = self.root + d
            try:
                mount(d, target, None, MS_BIND | MS_REC)
            except OSError as e:
                raise Refused("cannot bind %s into the layer (%s)" % (d, e.strerror))

    def _private(self):
        """Nothing mounted here may reach the host: the root's mounts made
        private, or (in a chroot, whose root is no mount point) the scratch
        tmpfs checked to have no peer outside."""
        try:
            mount(None, "/", None, MS_REC | MS_PRIVATE)
            chrooted = False
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise Refused("cannot make the mounts private (%s)" % e.strerror)
            chrooted = True
        try:
            mount("tmpfs", self.scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
        except OSError as e:
            raise Refused("cannot mount a tmpfs for the throwaway layer (%s)" % e.strerror)
        if chrooted:
            mine = [m for m in mounts() if m["point"] == self.scratch]
            if not mine or mine[-1]["shared"]:
                try:
                    umount(self.scratch)
                except OSError:
                    pass
                raise Refused("inside a chroot whose root is not a mount point, the root's "
                              "mount is shared with the host: a mount made here would appear "
                              "there (run it outside the chroot, or in `unshare --mount "
                              "--propagation private`)")
            for m in mounts():
                if m["shared"]:
                    try:
                        mount(None, m["point"], None, MS_PRIVATE)
                    except OSError:
                        pass

    def _layers(self):
        """An overlay for the root and for every mount under it (parents
        first: an overlay shows its lower directory without the mounts on
        it). Where the kernel refuses an overlay of a directory because
        mounts of a more privileged namespace sit under it (a user
        namespace's "locked" mounts: clone_private_mount), the directory is
        made in the tmpfs and each of its entries placed on its own."""
        os.mkdir(self.root)
        self._skip = [self.scratch] + self.keep + list(KERNEL_TREES)
        self._placed = set()
        self._bound = []                 # read-only views (their mounts came with them)
        self._readonly_files = 0
        self._place("/", self.root)
        points = []
        for m in mounts():
            p = m["point"]
            if p in points or not p.startswith("/") or m["fstype"] in PSEUDO:
                continue
            points.append(p)
        if self.userns:
            # In a user namespace an overlay cannot copy up a directory whose
            # owner is not mapped (EOVERFLOW): root's /home on the way to the
            # user's files. The places a user writes get layers of their own,
            # whose root needs no copy-up.
            for p in self.writable:
                p = os.path.realpath(p)
                if p != "/" and os.path.isdir(p) and p not in points:
                    points.append(p)
        points.sort(key=lambda q: q.rstrip("/").count("/"))  # parents first
        for p in points:
            if p in self._placed or any(_under(p, q) for q in self._skip + self._bound):
                continue
            target = self.root + p
            if os.path.isdir(p) and os.path.isdir(target):
                self._place(p, target)
        if self._readonly_files:
            self.notes.append("%d files are read-only for the script (bound one by one where "
                              "the kernel refused an overlay of their directory)" %
                              self._readonly_files)

    def _new_upper(self):
        n = len(self.layers) + len(self._placed)
        upper = os.path.join(self.scratch, "u%d" % n)
        work = os.path.join(self.scratch, "w%d" % n)
        os.mkdir(upper)
        os.mkdir(work)
        return upper, work

    def _place(self, p, target):
        self._placed.add(p)
        if p != "/" and any(_under(p, q) for q in self._skip):
            if os.path.isdir(p) and not os.path.lexists(target):
                os.mkdir(target)         # a mount point for what is bound there
            return
        try:
            st = os.lstat(p)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode):
            if not os.path.lexists(target):
                os.symlink(os.readlink(p), target)
            return
        if stat.S_ISREG(st.st_mode):
            if not os.path.lexists(target):
                open(target, "w").close()
            try:
                mount(p, target, None, MS_BIND)
                mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
                self._readonly_files += 1
            except OSError:
                pass
            return
        if not stat.S_ISDIR(st.st_mode):
            return                       # devices, sockets, fifos: not for the script
        if not os.path.lexists(target):
            os.mkdir(target)
        upper, work = self._new_upper()
        try:
            _overlay(p, upper, work, target, self.userns)
            self.layers.append((p, upper))
            return
        except OSError as e:
            refused = e
        if refused.errno == errno.EINVAL and self.userns:
            try:
                names = sorted(os.listdir(p))
            except OSError as e:
                raise Refused("%s: cannot list it to build the layer (%s)" % (p, e.strerror))
            for name in names:
                self._place(os.path.join(p, name), os.path.join(target, name))
            return
        if p == "/":
            raise Refused("the kernel refused an overlay over / (%s): no throwaway layer for "
                          "the script's writes" % refused.strerror)
        try:  # the script may read there, never write
            mount(p, target, None, MS_BIND | MS_REC)
            mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        except OSError as e2:
            raise Refused("%s: neither an overlay (%s) nor a read-only view (%s) could be "
                          "made" % (p, refused.strerror, e2.strerror))
        self._bound.append(p)
        self.notes.append("%s is read-only for the script (the kernel refused an overlay "
                          "there: %s)" % (p, refused.strerror))

    def _kernel_trees(self):
        for p in KERNEL_TREES:
            target = self.root + p
            if not os.path.isdir(p) or not os.path.isdir(target):
                continue
            try:  # /proc: mounted again by the command, the first of its PID namespace
                mount(p, target, None, MS_BIND | MS_REC)
            except OSError as e:
                raise Refused("cannot show %s to the script (%s)" % (p, e.strerror))
            if p == "/sys":
                try:
                    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
                except OSError:
                    pass
            if p == "/dev" and os.path.isdir(target + "/shm"):
                try:
                    mount("tmpfs", target + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
                except OSError as e:
                    raise Refused("cannot give the script its own /dev/shm (%s)" % e.strerror)

    def enter_root(self):
        """In the command's process (the first of its PID namespace): a
        mount namespace of its own whose root is the layer (pivot_root, the
        old root detached), or, where the current root is no mount point (a
        chroot), a chroot into it; then its PID namespace's own /proc."""
        try:
            unshare(CLONE_NEWNS)
            if not os.path.ismount(self.root):  # a directory of the tmpfs: made a mount
                mount(self.root, self.root, None, MS_BIND | MS_REC)
            os.chdir(self.root)
            pivot_root(".", ".")
            umount(".", MNT_DETACH)
            os.chdir("/")
        except OSError:
            os.chdir(self.root)
            os.chroot(".")
            os.chdir("/")
        if os.path.isdir("/proc"):
            try:
                mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            except OSError:
                pass  # the bound one stays: other PIDs, same files

    def written(self):
        """[{path, what, bytes}] of what the command left in the upper
        layers: files written (what: file, link, dir made) and paths deleted."""
        out = []
        for point, upper in self.layers:
            for d, dirs, files in os.walk(upper):
                rel = os.path.relpath(d, upper)
                real_dir = point if rel == "." else os.path.join(point, rel)
                for name in dirs + files:
                    full = os.path.join(d, name)
                    real = os.path.join(real_dir, name)
                    try:
                        st = os.lstat(full)
                    except OSError:
                        continue
                    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                        out.append({"path": real, "what": "deleted", "bytes": 0})
                    elif stat.S_ISDIR(st.st_mode):
                        if not os.path.lexists(real):
                            out.append({"path": real + "/", "what": "dir made", "bytes": 0})
                    elif stat.S_ISLNK(st.st_mode):
                        out.append({"path": real, "what": "link", "bytes": 0})
                    else:
                        out.append({"path": real, "what": "file", "bytes": st.st_size})
        out.sort(key=lambda w: w["path"])
        return out


# --- the helper process ------------------------------------------------------------------

def _serve(spec):
    """Make the layer, run the command in it, and write what it did to
    spec["report"]. Returns the exit status to leave with."""
    report = spec["report"]
    layer = Layer(spec["scratch"], spec.get("keep", []), spec.get("writable", []))
    result = {"refused": None, "status": None, "signal": None, "timed_out": False,
              "written": [], "notes": [], "seconds": 0.0}
    try:
        layer.enter()
    except (Refused, OSError) as e:
        result["refused"] = str(e)
        _write(report, result)
        return 3
    result["notes"] = layer.notes
    out = os.open(spec["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    err = os.open(spec["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    ready_r, ready_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the command
        try:
            os.close(ready_r)
            os.setpgid(0, 0)
            layer.enter_root()
            os.chdir(spec["cwd"])
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.execvpe(spec["argv"][0], spec["argv"], spec["env"])  # closes ready_w (CLOEXEC)
        except BaseException as e:  # noqa: B036 (the child must never return)
            try:
                os.write(ready_w, ("%s: %s" % (spec["argv"][0], e)).encode("utf-8", "replace"))
            except OSError:
                pass
            os._exit(127)
    os.close(ready_w)
    os.close(out)
    os.close(err)
    failed = b""
    while True:  # the exec closes the pipe; a failure writes to it first
        chunk = os.read(ready_r, 4096)
        if not chunk:
            break
        failed += chunk
    os.close(ready_r)

    stopping = [None]

    def stop(signum, frame):
        if stopping[0] is None:
            stopping[0] = time.monotonic()
        try:
            os.killpg(pid, signal.SIGINT)
        except OSError:
            pass
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    timeout = spec.get("timeout")
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            break
        now = time.monotonic()
        if timeout and stopping[0] is None and now - start > timeout:
            result["timed_out"] = True
            stop(None, None)
        if stopping[0] is not None and now - stopping[0] > STOP_GRACE:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        select.select([], [], [], 0.05)
    # what is left of its process group (DataLoader workers...) goes too
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    result["seconds"] = round(time.monotonic() - start, 3)
    if os.WIFSIGNALED(status):
        result["signal"] = os.WTERMSIG(status)
    else:
        result["status"] = os.WEXITSTATUS(status)
    if failed:
        result["exec_failed"] = failed.decode("utf-8", "replace")
    result["written"] = layer.written()
    _write(report, result)
    return 0


def _write(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.rename(tmp, path)


def main():
    spec = json.load(sys.stdin)
    try:
        _c().prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # no libc to ask: the sandbox runs without it
        pass
    return _serve(spec)


# --- what the preflight calls ------------------------------------------------------------

class Outcome(object):
    """What one sandboxed run did."""

    def __init__(self, report):
        self.refused = report.get("refused")
        self.status = report.get("status")
        self.signal = report.get("signal")
        self.timed_out = bool(report.get("timed_out"))
        self.written = report.get("written") or []
        self.notes = report.get("notes") or []
        self.seconds = report.get("seconds") or 0.0
        self.exec_failed = report.get("exec_failed")

    @property
    def ok(self):
        return self.refused is None and self.status == 0


def start(argv, env, cwd, results, stdout, stderr, timeout=None, python=None):
    """Start one run in its own throwaway layer; (process, finish) where
    finish() waits for it and returns its Outcome. results: a directory
    (made by the caller, empty) that the command can write, bound through
    the layer; stdout and stderr: files in it."""
    scratch = tempfile.mkdtemp(prefix="gpuguard-preflight-layer.")
    report = os.path.join(results, ".layer.json")
    writable = [cwd, env.get("HOME") or os.path.expanduser("~"), env.get("TMPDIR") or "/tmp",
                "/var/tmp"]
    spec = {"argv": list(argv), "env": dict(env), "cwd": cwd, "keep": [results],
            "writable": [w for w in writable if w],
            "stdout": stdout, "stderr": stderr, "timeout": timeout, "report": report,
            "scratch": scratch}
    helper = subprocess.Popen([python or sys.executable, "-I", "-S", os.path.abspath(__file__)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, env={"PATH": os.environ.get("PATH", "")},
                              cwd="/")
    helper.stdin.write(json.dumps(spec).encode("utf-8"))
    helper.stdin.close()

    def finish():
        said = helper.stdout.read().decode("utf-8", "replace")
        helper.wait()
        try:
            os.rmdir(scratch)
        except OSError:
            pass
        try:
            with open(report) as f:
                data = json.load(f)
            os.unlink(report)
        except (OSError, ValueError):
            data = {"refused": "the sandbox helper ended without a report (exit %s)%s" % (
                helper.returncode, ": " + said.strip()[-500:] if said.strip() else "")}
        return Outcome(data)
    return helper, finish


def run(argv, env, cwd, results, stdout, stderr, timeout=None):
    """start() and wait: the Outcome."""
    _, finish = start(argv, env, cwd, results, stdout, stderr, timeout)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
