#!/usr/bin/python3
"""Which BLAS, OpenMP runtime and oneDNN a process actually loaded, for bench_train.py.

Used as a module by bench_train.py (reading another process's /proc/PID/maps) and by
torch_gpt.py (asking its own process where sgemm_ resolves), and as a command:

    /usr/bin/python3 bench/blas_probe.py --openblas PATH   # JSON: config and core of PATH

which loads that OpenBLAS file and asks it for its build string and kernel. OpenBLAS picks
its kernel when it is loaded, from the CPU and the environment (OPENBLAS_CORETYPE), so run
it with the environment of the process it stands in for.

Nothing here imports torch.
"""

import ctypes
import json
import os
import re
import subprocess
import sys

# basename patterns of the shared objects worth reporting, by kind
KINDS = (
    ("blas", re.compile(r"^lib(openblas|blas|cblas|mkl_|blis|flexiblas|s?atlas|tatlas|armpl)")),
    ("lapack", re.compile(r"^liblapack")),
    ("openmp", re.compile(r"^lib(gomp|iomp5|omp5?|omptarget)\.so")),
    ("onednn", re.compile(r"^lib(dnnl|mkldnn)")),
)


def lib_kind(path):
    """'blas', 'lapack', 'openmp', 'onednn' or None for a shared object's path."""
    base = os.path.basename(path)
    for kind, pat in KINDS:
        if pat.match(base):
            return kind
    return None


def mapped_files(pid="self", keep=lib_kind):
    """Real paths of the files mapped into process pid now that `keep` accepts (by default
    the BLAS-family, OpenMP and oneDNN ones); an empty set when the process is gone or not
    readable. The kernel already writes
    symbolic links resolved (libblas.so.3 -> alternatives -> the real file); realpath is
    kept for files reached through a bind mount or a link the kernel leaves."""
    found = set()
    try:
        with open("/proc/%s/maps" % pid) as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or not parts[5].startswith("/"):
                    continue
                path = parts[5].rstrip("\n")
                if path.endswith(" (deleted)"):
                    path = path[:-len(" (deleted)")]
                if keep(path):
                    found.add(os.path.realpath(path))
    except OSError:
        pass
    return found


def by_kind(paths):
    """{kind: sorted paths} of the paths that have a kind."""
    out = {}
    for p in sorted(paths):
        k = lib_kind(p)
        if k:
            out.setdefault(k, []).append(p)
    return out


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def symbol_provider(symbol, user_path=None):
    """Real path of the object that provides `symbol` to this process, or None.

    The dynamic linker resolves a library's undefined symbols in the global scope first
    (the program, LD_PRELOAD and their dependencies), then in that library's own
    dependencies; this looks in the same order, the second through a handle on
    user_path (for PyTorch, libtorch_cpu, which Python loads with RTLD_LOCAL). It is the
    sgemm_ that calls from user_path reach, not just one of several BLAS files mapped:
    with libblas.so.3 pointing at the reference BLAS, OpenBLAS is still mapped (through
    liblapack.so.3) but unused for sgemm_."""
    libc = ctypes.CDLL(None)
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    handles = [libc]
    if user_path:
        try:
            handles.append(ctypes.CDLL(user_path))  # already loaded: the same handle
        except OSError:
            pass
    for h in handles:
        try:
            fn = getattr(h, symbol)
        except AttributeError:
            continue
        info = _DlInfo()
        if libc.dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode())
    return None


def openblas_config(path):
    """(build string, kernel name) of the OpenBLAS in `path`, loaded in this process, or
    None when the file does not export them (the reference BLAS, OpenBLAS's thin
    libblas.so.3, which defers to its libopenblas.so.0)."""
    try:
        lib = ctypes.CDLL(path)
        get_config, get_core = lib.openblas_get_config, lib.openblas_get_corename
    except (OSError, AttributeError):
        return None
    get_config.restype = get_core.restype = ctypes.c_char_p
    return get_config().decode().strip(), get_core().decode().strip()


def openblas_config_in(path, env):
    """openblas_config(path) as a fresh process with `env` reports it (see the module
    note: the kernel depends on the environment), or None."""
    try:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--openblas", path],
                             env=env, check=True, capture_output=True, text=True).stdout
        got = json.loads(out)
    except (subprocess.CalledProcessError, ValueError):
        return None
    return tuple(got) if got else None


def openblas_for(provider, mapped):
    """The libopenblas file that does the work of `provider`: provider itself, or for
    OpenBLAS's libblas.so.3 the libopenblas mapped from the same folder."""
    if provider is None:
        return None
    if os.path.basename(provider).startswith("libopenblas"):
        return provider
    if "openblas" in provider:
        folder = os.path.dirname(provider)
        for p in sorted(mapped):
            if os.path.dirname(p) == folder and os.path.basename(p).startswith("libopenblas"):
                return p
    return None


def label(provider, config=None):
    """Short name of a BLAS for a table cell: 'OpenBLAS 0.3.21 OpenMP Cooperlake',
    'reference BLAS 3.11.0', 'MKL', ... from its path and, for OpenBLAS, its build."""
    if provider is None:
        return "unknown"
    base = os.path.basename(provider)
    if config:
        build, core = config
        ver = re.search(r"OpenBLAS\s+(\S+)", build)
        threads = "OpenMP" if "USE_OPENMP" in build else "pthreads"
        return "OpenBLAS %s %s %s" % (ver.group(1) if ver else "", threads, core)
    if "openblas" in provider:
        m = re.search(r"openblas-(openmp|pthread|serial)", provider)
        return "OpenBLAS" + (" " + m.group(1) if m else "")
    if base.startswith("libmkl"):
        return "MKL"
    if base.startswith("libblis"):
        return "BLIS"
    if base.startswith("libflexiblas"):
        return "FlexiBLAS"
    if "atlas" in base:
        return "ATLAS"
    m = re.match(r"libblas\.so\.(\d[\d.]*)$", base)
    if m and os.path.basename(os.path.dirname(provider)) == "blas":
        return "reference BLAS " + m.group(1)  # Debian's netlib libblas3
    return base


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--openblas":
        print(json.dumps(openblas_config(sys.argv[2])))
        return 0
    print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
