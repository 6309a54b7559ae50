"""Find the CUDA toolkit for the build (shared by setup.py and the build backend).

Order, as CuPy's builder does it: CUDA_PATH / CUDA_HOME, then nvcc on PATH, then
/usr/local/cuda.  The header version (cuda.h's CUDA_VERSION) decides which
cuda-bindings the compiled driver layer must be used with.
"""

import os
import re
import shutil

DEFAULT_ARCHS = ("75", "80", "86", "89", "90", "100", "120")


def find_cuda_root():
    for var in ("CUDA_PATH", "CUDA_HOME"):
        root = os.environ.get(var)
        if root and os.path.exists(os.path.join(root, "include", "cuda.h")):
            return root
    nvcc = shutil.which("nvcc")
    if nvcc:
        root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        if os.path.exists(os.path.join(root, "include", "cuda.h")):
            return root
    if os.path.exists("/usr/local/cuda/include/cuda.h"):
        return "/usr/local/cuda"
    return None


def nvcc_path(root):
    path = os.path.join(root, "bin", "nvcc")
    return path if os.path.exists(path) else None


def header_version(root):
    """'13.0' from <root>/include/cuda.h, or None."""
    try:
        with open(os.path.join(root, "include", "cuda.h")) as fh:
            m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", fh.read())
    except OSError:
        return None
    if not m:
        return None
    v = int(m.group(1))
    return f"{v // 1000}.{(v % 1000) // 10}"


def bindings_requirement():
    """The cuda-bindings pin matching the toolkit headers, or None without a toolkit."""
    if os.environ.get("GRAPHKERN_NO_CUDA"):
        return None
    root = find_cuda_root()
    ver = header_version(root) if root else None
    return f"cuda-bindings=={ver}.*" if ver else None


def gencode(archs):
    """nvcc's ``-gencode`` flags for the real architectures ``archs`` ("75", "86", ...): SASS for each,
    compiled from the PTX of the lowest requested architecture of its major version, plus the newest
    of those PTX for devices not yet made.

    SASS runs on every device of its major version with an equal or higher minor, and the device code
    tells architectures apart only at major versions (``__CUDA_ARCH__`` compared with multiples of 100,
    which tests/test_build.py checks), so sm_86 and sm_89 built from compute_80 are the kernels built
    from their own PTX, and the front end runs once per major version instead of once per
    architecture.  Across major versions the PTX is not shared: sm_100 built from compute_90 is other
    code than from compute_100.  An architecture-specific target ("90a") runs only on its own
    architecture and keeps its own PTX."""
    plain = sorted({a for a in archs if a.isdigit()}, key=int)
    virtual = {}
    for a in plain:
        virtual.setdefault(int(a) // 10, a)
    newest = virtual[max(virtual)] if virtual else None
    flags = []
    for major, v in sorted(virtual.items()):
        codes = [f"sm_{a}" for a in plain if int(a) // 10 == major] + ([f"compute_{v}"] if v == newest else [])
        flags += ["-gencode", f"arch=compute_{v},code=[{','.join(codes)}]"]
    for a in sorted(set(archs) - set(plain)):
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    return flags


def archs():
    """The architectures to build for: ``GRAPHKERN_CUDA_ARCHS`` ("80,sm_90,12.0,90a") or the defaults.
    A value that names no architecture is an error here, not an nvcc failure later."""
    env = os.environ.get("GRAPHKERN_CUDA_ARCHS")
    if not env:
        return DEFAULT_ARCHS
    got = tuple(a.strip().replace("sm_", "").replace(".", "") for a in re.split(r"[,; ]+", env) if a.strip())
    bad = [a for a in got if not re.fullmatch(r"\d{2,3}[af]?", a)]
    if bad or not got:
        raise ValueError(f"GRAPHKERN_CUDA_ARCHS={env!r}: {bad[0] if bad else 'nothing'} is not a CUDA architecture; "
                         "expected a list such as 80,86,90 (sm_90 and 9.0 also read as 90; 90a for an "
                         "architecture-specific target)")
    return got
