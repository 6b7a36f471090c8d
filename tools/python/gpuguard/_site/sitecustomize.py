"""gpuguard's sitecustomize: PyTorch instrumented without a code change.

libgpuguard.so puts gpuguard's site directory (this file and the gpuguard
package, nothing else) first on PYTHONPATH when it is loaded into a Python
interpreter with GPUGUARD_TORCH=1 (gpuguard-run sets it), so Python's
``site`` module imports this file at start-up, as it imports any
``sitecustomize`` (https://docs.python.org/3/library/site.html). It:

  - takes the directory out of PYTHONPATH again: the process's children get
    it only where the library is loaded into them (a Python 3 interpreter
    started without -I or -E), never a shell, a Python 2, or a program that
    embeds Python;
  - in the interpreter it is made for (CPython 3.6 or later, the process's
    own program: not one embedded in gdb), when GPUGUARD_TORCH is 1 (yes,
    true, on) and GPUGUARD_MODE is not off, puts a finder in front of
    sys.meta_path that looks at one name, ``torch``. The first time the
    program imports torch, once torch's own import has finished, it hands
    the module to ``gpuguard.torch_instrument.install`` (which checks that
    libgpuguard.so is preloaded, then installs the hooks) and takes itself
    out of sys.meta_path. Until then it costs one string comparison per
    import; a program that never imports torch never imports anything of
    gpuguard's. A module of the program's own called ``gpuguard`` is never
    replaced: the instrumentation is then loaded under a name of its own;
  - in a run of gpuguard-preflight (GPUGUARD_PREFLIGHT names the file of
    its figures) also hands torch to ``gpuguard.preflight.probe.install``,
    which reads PyTorch's allocator at each step and stops the script at
    the step asked for;
  - in any interpreter (Python 2 included), runs the sitecustomize it hides,
    the next one on sys.path (Debian's /usr/lib/python3.X/sitecustomize.py,
    a virtualenv's, the user's own), as the module ``sitecustomize``,
    exactly as Python would have without this one. Its errors are its own:
    site reports them as it always does.

Standard library only; never imports torch; nothing of its own raises into
the program. It must stay readable by Python 2.7: no syntax of Python 3's.
"""
import os as _os
import sys as _sys

# The first line of this file: a copy of it (another gpuguard on the path)
# is not the sitecustomize to chain to.
_MARK = '"""gpuguard\'s sitecustomize: PyTorch instrumented without a code change.'

_HERE = _os.path.dirname(_os.path.abspath(__file__))


def _on(name):
    return _os.environ.get(name, "").strip().lower() in ("1", "yes", "true", "on")


def _swallowed(where, e):
    """An error gpuguard's start-up dropped (never the program's): said on
    stderr under GPUGUARD_DEBUG, else nothing."""
    try:
        if _on("GPUGUARD_DEBUG"):
            _sys.stderr.write("gpuguard: debug: sitecustomize %s swallowed %s: %s\n"
                              % (where, type(e).__name__, e))
    except Exception:  # noqa: stderr closed: nothing to say it on
        pass


def _made_for():
    """Is this the interpreter the instrumentation is made for: CPython 3.6
    or later, running as the process's own program (an interpreter embedded
    in another program, gdb's say, is not: its sys.executable is not the
    process's program)?"""
    if _sys.version_info < (3, 6) or getattr(_sys, "implementation", None) is None or \
            _sys.implementation.name != "cpython":
        return False
    try:
        a, b = _os.stat(_sys.executable or "."), _os.stat("/proc/self/exe")
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _unpath():
    """The directory out of PYTHONPATH, where the library put it (first)."""
    path = _os.environ.get("PYTHONPATH")
    if path is None:
        return
    parts = path.split(_os.pathsep)
    if parts and parts[0] and _os.path.abspath(parts[0]) == _HERE:
        rest = _os.pathsep.join(parts[1:])
        if rest:
            _os.environ["PYTHONPATH"] = rest
        else:
            del _os.environ["PYTHONPATH"]


class _Loader(object):
    """torch's own loader, and the hook once torch's import has finished."""

    def __init__(self, loader, watcher):
        self._loader = loader
        self._watcher = watcher

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # The module and its spec keep torch's own loader, as without us.
        loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and getattr(spec, "loader", None) is self:
            spec.loader = loader
        loader.exec_module(module)  # torch's import: its errors are its own
        self._watcher.imported(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _TorchWatcher(object):
    """A meta path finder for the name ``torch`` only. Its own search for
    the real spec is skipped only by the thread that runs it: a
    find_spec("torch") in another thread (a library asking whether torch is
    installed) never makes the program's import go unseen."""

    def __init__(self):
        import _thread
        self._ident = _thread.get_ident
        self._busy = set()   # the threads searching, by ident

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        me = self._ident()
        if me in self._busy:
            return None
        self._busy.add(me)
        spec = None
        try:
            for finder in list(_sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        except Exception as e:  # noqa: a finder's; the import system will meet it itself
            _swallowed("find_spec", e)
            return None
        finally:
            self._busy.discard(me)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader, self)
        return spec

    def imported(self, torch):
        try:
            while self in _sys.meta_path:
                _sys.meta_path.remove(self)
        except ValueError:
            pass
        _install(torch)


def _package_dir():
    """The gpuguard package beside this file: in the site directory, or
    (the package's own _site, on a path set by hand) the directory above."""
    for d in (_os.path.join(_HERE, "gpuguard"), _os.path.dirname(_HERE)):
        if _os.path.isfile(_os.path.join(d, "__init__.py")) and \
                _os.path.isfile(_os.path.join(d, "torch_instrument.py")):
            return d
    return None


def _ours(module, pkg_dir):
    f = getattr(module, "__file__", None)
    return bool(f) and _os.path.dirname(_os.path.realpath(f)) == _os.path.realpath(pkg_dir)


def _own_module(sub):
    """gpuguard.<sub> (torch_instrument, preflight.probe): the program's
    gpuguard when it is this one, else this one under a name of its own,
    never in place of a module of the program's called gpuguard."""
    import importlib
    import importlib.util
    pkg_dir = _package_dir()
    if pkg_dir is None:
        return None
    mod = _sys.modules.get("gpuguard")
    if mod is None:
        spec = importlib.util.find_spec("gpuguard")
        if spec is not None and spec.origin and \
                _os.path.realpath(_os.path.dirname(spec.origin)) == _os.path.realpath(pkg_dir):
            return importlib.import_module("gpuguard." + sub)
    elif _ours(mod, pkg_dir):
        return importlib.import_module("gpuguard." + sub)
    name = "_gpuguard_site"
    if name not in _sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, _os.path.join(pkg_dir, "__init__.py"), submodule_search_locations=[pkg_dir])
        pkg = importlib.util.module_from_spec(spec)
        _sys.modules[name] = pkg
        try:
            spec.loader.exec_module(pkg)
        except BaseException:
            _sys.modules.pop(name, None)
            raise
    return importlib.import_module(name + "." + sub)


def _install(torch):
    try:
        ti = _own_module("torch_instrument")
        if ti is not None:
            ti.install(torch)
    except Exception as e:  # the program runs as it would without gpuguard's instrumentation
        _swallowed("torch_instrument", e)
    if _os.environ.get("GPUGUARD_PREFLIGHT"):  # a gpuguard-preflight run, on the simulated GPU
        try:
            probe = _own_module("preflight.probe")
            if probe is not None:
                probe.install(torch)
        except Exception as e:
            _swallowed("preflight.probe", e)


def _watch():
    if not _on("GPUGUARD_TORCH") or _os.environ.get("GPUGUARD_MODE", "").strip().lower() == "off":
        return
    if "torch" in _sys.modules:  # imported already (a .pth file)
        _install(_sys.modules["torch"])
    elif not any(isinstance(f, _TorchWatcher) for f in _sys.meta_path):
        _sys.meta_path.insert(0, _TorchWatcher())


def _mine(origin):
    try:
        import io
        with io.open(origin, "r", encoding="utf-8", errors="replace") as f:
            return f.readline().rstrip("\n") == _MARK
    except (OSError, IOError):
        return False


def _after_here():
    """The entries of sys.path after this file's directory."""
    paths = list(_sys.path)
    at = [i for i, p in enumerate(paths) if p and _os.path.abspath(p) == _HERE]
    if not at:  # reached through a link: compare the real paths (slower)
        real = _os.path.realpath(_HERE)
        at = [i for i, p in enumerate(paths) if _os.path.realpath(p or ".") == real]
    return paths[at[0] + 1:] if at else paths


def _chain():
    """Run the sitecustomize this one hides: the first on sys.path after
    this file's directory that is not a copy of this one."""
    after = _after_here()
    finder = getattr(_sys.modules.get("_frozen_importlib_external"), "PathFinder", None)
    bootstrap = _sys.modules.get("_frozen_importlib")
    module_from_spec = getattr(bootstrap, "module_from_spec", None)
    if finder is None or module_from_spec is None:
        return _chain_imp(after)  # Python 2, and 3 before 3.5
    for p in after:
        spec = finder.find_spec("sitecustomize", [p])
        if spec is None or not spec.origin or _mine(spec.origin) or spec.loader is None:
            continue
        module = module_from_spec(spec)
        # It becomes the sitecustomize: the import system hands site whatever
        # sys.modules holds under the name once this module has run.
        _sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
        return


def _chain_imp(after):
    import imp
    for p in after:
        try:
            f, path, desc = imp.find_module("sitecustomize", [p])
        except ImportError:
            continue
        try:
            if path and not _mine(path):
                imp.load_module("sitecustomize", f, path, desc)
                return
        finally:
            if f:
                f.close()


try:
    _unpath()
    if _made_for():
        _watch()
except Exception as e:  # never into the program's start-up
    _swallowed("start-up", e)
_chain()
