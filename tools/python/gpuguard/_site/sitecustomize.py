"""gpuguard's sitecustomize: PyTorch instrumented without a code change.

gpuguard-run puts this file's directory first on PYTHONPATH, and sets
GPUGUARD_TORCH=1 (under a plain LD_PRELOAD, libgpuguard.so does the same
when GPUGUARD_TORCH=1), so Python's ``site`` module imports it at start-up,
as it imports any ``sitecustomize``
(https://docs.python.org/3/library/site.html). It:

  - when GPUGUARD_TORCH is 1 (yes, true, on) and GPUGUARD_MODE is not off,
    puts a finder in front of sys.meta_path that looks at one name, ``torch``.
    The first time the program imports torch, once torch's own import has
    finished, it hands the module to ``gpuguard.torch_instrument.install``
    (which checks that libgpuguard.so is preloaded, then installs the hooks)
    and takes itself out of sys.meta_path. Until then it costs one string
    comparison per import; a program that never imports torch never imports
    anything of gpuguard's;
  - in a run of gpuguard-preflight (GPUGUARD_PREFLIGHT names the file of
    its figures) also hands torch to ``gpuguard.preflight.probe.install``,
    which reads PyTorch's allocator at each step and stops the script at
    the step asked for;
  - then runs the sitecustomize it hides, the next one on sys.path (Debian's
    /usr/lib/python3.X/sitecustomize.py, a virtualenv's, the user's own), as
    the module ``sitecustomize``, exactly as Python would have without this
    one. Its errors are its own: site reports them as it always does.

Standard library only; never imports torch; nothing of its own raises into
the program.
"""
import os as _os
import sys as _sys

# The first line of this file: a copy of it (another gpuguard on the path)
# is not the sitecustomize to chain to.
_MARK = '"""gpuguard\'s sitecustomize: PyTorch instrumented without a code change.'


def _on(name):
    return _os.environ.get(name, "").strip().lower() in ("1", "yes", "true", "on")


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
    """A meta path finder for the name ``torch`` only."""

    def __init__(self):
        self._busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or self._busy:
            return None
        self._busy = True
        spec = None
        try:
            for finder in _sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        except Exception:
            return None  # the import system will meet the same error itself
        finally:
            self._busy = False
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


def _instrument_module():
    """gpuguard.torch_instrument: from the path, or from beside this file
    (<dir>/gpuguard/_site/sitecustomize.py) when the path does not have it."""
    try:
        from gpuguard import torch_instrument
        return torch_instrument
    except ImportError:
        pass
    import importlib.util
    pkg_dir = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        "gpuguard", _os.path.join(pkg_dir, "__init__.py"), submodule_search_locations=[pkg_dir])
    pkg = importlib.util.module_from_spec(spec)
    _sys.modules["gpuguard"] = pkg
    try:
        spec.loader.exec_module(pkg)
    except BaseException:
        _sys.modules.pop("gpuguard", None)
        raise
    from gpuguard import torch_instrument
    return torch_instrument


def _install(torch):
    try:
        _instrument_module().install(torch)
    except Exception:
        pass  # the program runs as it would without gpuguard's instrumentation
    if _os.environ.get("GPUGUARD_PREFLIGHT"):  # a gpuguard-preflight run, on the simulated GPU
        try:
            from gpuguard.preflight import probe
            probe.install(torch)
        except Exception:
            pass


def _watch():
    if not _on("GPUGUARD_TORCH") or _os.environ.get("GPUGUARD_MODE", "").strip().lower() == "off":
        return
    if "torch" in _sys.modules:  # imported already (a .pth file)
        _install(_sys.modules["torch"])
    elif not any(isinstance(f, _TorchWatcher) for f in _sys.meta_path):
        _sys.meta_path.insert(0, _TorchWatcher())


def _ours(origin):
    try:
        with open(origin, "r", encoding="utf-8", errors="replace") as f:
            return f.readline().rstrip("\n") == _MARK
    except OSError:
        return False


def _next_sitecustomize():
    """The spec of the sitecustomize this one hides: the first on sys.path
    after this file's directory that is not a copy of this one."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    paths = list(_sys.path)
    at = [i for i, p in enumerate(paths) if p and _os.path.abspath(p) == here]
    if not at:  # reached through a link: compare the real paths (slower)
        real = _os.path.realpath(here)
        at = [i for i, p in enumerate(paths) if _os.path.realpath(p or ".") == real]
    after = paths[at[0] + 1:] if at else paths
    finder = getattr(_sys.modules.get("_frozen_importlib_external"), "PathFinder", None)
    if finder is None:
        from importlib.machinery import PathFinder as finder
    for p in after:
        spec = finder.find_spec("sitecustomize", [p])
        if spec is not None and spec.origin and not _ours(spec.origin):
            return spec
    return None


def _chain():
    spec = _next_sitecustomize()
    if spec is None or spec.loader is None:
        return
    bootstrap = _sys.modules.get("_frozen_importlib")
    module_from_spec = getattr(bootstrap, "module_from_spec", None)
    if module_from_spec is None:
        from importlib.util import module_from_spec
    module = module_from_spec(spec)
    # It becomes the sitecustomize: the import system hands site whatever
    # sys.modules holds under the name once this module has run.
    _sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _watch()
except Exception:
    pass
_chain()
