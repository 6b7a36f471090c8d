"""Run an unmodified script as __main__, then say what gpuguard-run's
instrumentation did in this process (read from sys.modules: neither
script imports gpuguard).

    introspect.py SCRIPT [ARGS...]

Prints RESULT instrument {installed, steps, views, history_turns, history,
backwards, observer, can_ask, cuda_initialized}.
"""
import runpy
import sys

from model import result


def main():
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        ti = sys.modules.get("gpuguard.torch_instrument")
        st = ti.STATE if ti is not None else None
        torch = sys.modules.get("torch")
        result("instrument", installed=st is not None,
               steps=st.steps if st else 0, views=st.views if st else 0,
               history_turns=st.history_turns if st else 0,
               history=bool(torch is not None and torch.cuda.is_initialized()
                            and torch._C._cuda_isHistoryEnabled()),
               backwards=st.backwards if st else 0, observer=bool(st and st.observer),
               can_ask=bool(st and st.can_ask),
               cuda_initialized=bool(torch is not None and torch.cuda.is_initialized()))


if __name__ == "__main__":
    main()
