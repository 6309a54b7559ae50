"""Build graphkern: Cython CPU kernels with OpenMP, the cydriver layer, and CUDA fatbins.

* Every ``graphkern/_cpu/*.pyx`` becomes an extension compiled with OpenMP.
* With a CUDA toolkit (CUDA_PATH / CUDA_HOME, nvcc on PATH, /usr/local/cuda) and a
  cuda-bindings of the same major.minor as its headers, ``graphkern/_cuda/_driver.pyx``
  is built and every ``cuda_src/*.cu`` is compiled by nvcc into
  ``graphkern/_cuda/kernels/<name>.fatbin``: SASS for each arch in
  ``GRAPHKERN_CUDA_ARCHS`` (default 75,80,86,89,90,100,120), one PTX per major version
  feeding them (``_build/cuda_toolkit.gencode``), plus PTX for the newest.
* Without a toolkit the build succeeds CPU-only and records why.
* ``GRAPHKERN_ONLY=jaccard,expm`` limits a development build to matching modules.
"""

import glob
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "_build"))
import cuda_toolkit  # noqa: E402

OPENMP_COMPILE = ["-fopenmp", "-O3"]
OPENMP_LINK = ["-fopenmp"]
ONLY = [s for s in os.environ.get("GRAPHKERN_ONLY", "").split(",") if s]


def _wanted(path):
    stem = os.path.splitext(os.path.basename(path))[0]
    return not ONLY or any(o in stem for o in ONLY)


def _cuda_config():
    """(root, header_version, reason_if_skipped)."""
    if os.environ.get("GRAPHKERN_NO_CUDA"):
        return None, None, "GRAPHKERN_NO_CUDA is set"
    root = cuda_toolkit.find_cuda_root()
    if root is None:
        return None, None, "no CUDA toolkit found (set CUDA_PATH or put nvcc on PATH)"
    ver = cuda_toolkit.header_version(root)
    if ver is None:
        return None, None, f"could not read CUDA_VERSION from {root}/include/cuda.h"
    if cuda_toolkit.nvcc_path(root) is None:
        return None, None, f"no nvcc in {root}/bin"
    try:
        from cuda.bindings import __version__ as have
    except ImportError:
        return None, None, f"cuda-bindings is not installed in the build environment (need {ver}.*)"
    if ".".join(have.split(".")[:2]) != ver:
        return None, None, (f"cuda-bindings {have} does not match the CUDA {ver} headers in {root}; "
                            f"install cuda-bindings=={ver}.*")
    return root, ver, None


CUDA_ROOT, CUDA_VER, CUDA_SKIP = _cuda_config()


def _extensions():
    import numpy as np

    exts = []
    for pyx in sorted(glob.glob(os.path.join("graphkern", "_cpu", "*.pyx"))):
        if not _wanted(pyx):
            continue
        mod = "graphkern._cpu." + os.path.splitext(os.path.basename(pyx))[0]
        # depends: the C headers a module includes (spgk's dense walk), rebuilt and put in an sdist with it
        exts.append(Extension(mod, [pyx], include_dirs=[np.get_include()],
                              depends=sorted(glob.glob(os.path.join("graphkern", "_cpu", "*.h"))),
                              extra_compile_args=OPENMP_COMPILE, extra_link_args=OPENMP_LINK,
                              define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]))
    if CUDA_ROOT is not None:
        exts.append(Extension("graphkern._cuda._driver", ["graphkern/_cuda/_driver.pyx"],
                              depends=["graphkern/_cuda/_driver_launch.pxi"],
                              include_dirs=[os.path.join(CUDA_ROOT, "include")], language="c++",
                              extra_compile_args=["-std=c++17"] + OPENMP_COMPILE,
                              extra_link_args=OPENMP_LINK))
    from Cython.Build import cythonize
    return cythonize(exts, compiler_directives={"language_level": 3}, nthreads=os.cpu_count() or 1)


class BuildExt(build_ext):
    """build_ext that also compiles cuda_src/*.cu to fatbins and writes _build_info.py."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:  # pip passes no -j: compile the Cython modules side by side anyway
            self.parallel = os.cpu_count() or 1

    def run(self):
        super().run()
        pkg_dir = os.path.join(ROOT if self.inplace else self.build_lib, "graphkern")
        archs = cuda_toolkit.archs()
        if CUDA_ROOT is not None:
            self._build_fatbins(os.path.join(pkg_dir, "_cuda", "kernels"), archs)
        self._write_build_info(pkg_dir, archs)

    def _nvcc_version(self):
        out = subprocess.run([cuda_toolkit.nvcc_path(CUDA_ROOT), "--version"], capture_output=True, text=True)
        return out.stdout.strip().splitlines()[-1] if out.returncode == 0 else "unknown"

    def _build_fatbins(self, out_dir, archs):
        os.makedirs(out_dir, exist_ok=True)
        nvcc = cuda_toolkit.nvcc_path(CUDA_ROOT)
        gencode = cuda_toolkit.gencode(archs)
        headers = glob.glob(os.path.join(ROOT, "cuda_src", "**", "*.cuh"), recursive=True)
        sources = [s for s in sorted(glob.glob(os.path.join(ROOT, "cuda_src", "*.cu"))) if _wanted(s)]

        def compile_one(src):
            name = os.path.splitext(os.path.basename(src))[0]
            out = os.path.join(out_dir, name + ".fatbin")
            stamp = out + ".archs"
            fresh = (os.path.exists(out) and os.path.exists(stamp) and open(stamp).read() == " ".join(gencode)
                     and all(os.path.getmtime(out) >= os.path.getmtime(d) for d in [src] + headers))
            if fresh and not self.force:
                return name
            cmd = [nvcc, "-fatbin", "-O3", "-std=c++17", "-lineinfo", "--threads", "0",
                   "-I", os.path.join(ROOT, "cuda_src"), *gencode, "-o", out + ".tmp", src]
            print("nvcc", os.path.basename(src), "->", os.path.relpath(out, ROOT), "archs", ",".join(archs))
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"nvcc failed on {src}:\n{' '.join(cmd)}\n{res.stdout}\n{res.stderr}")
            os.replace(out + ".tmp", out)
            with open(stamp, "w") as fh:
                fh.write(" ".join(gencode))
            return name

        with ThreadPoolExecutor(max_workers=max(1, min(len(sources), os.cpu_count() or 1))) as pool:
            return sorted(pool.map(compile_one, sources))

    def _write_build_info(self, pkg_dir, archs):
        os.makedirs(pkg_dir, exist_ok=True)
        info = {
            "CUDA_BUILT": CUDA_ROOT is not None,
            "CUDA_SKIP_REASON": CUDA_SKIP,
            "CUDA_HEADER_VERSION": CUDA_VER,
            "CUDA_ROOT": CUDA_ROOT,
            "CUDA_ARCHS": list(archs) if CUDA_ROOT else [],
            # every fatbin present, not only those this (possibly GRAPHKERN_ONLY-limited) build compiled
            "CUDA_MODULES": sorted(os.path.splitext(f)[0] for f in os.listdir(os.path.join(pkg_dir, "_cuda", "kernels"))
                                   if f.endswith(".fatbin")) if CUDA_ROOT else [],
            "NVCC_VERSION": self._nvcc_version() if CUDA_ROOT else None,
        }
        with open(os.path.join(pkg_dir, "_build_info.py"), "w") as fh:
            fh.write('"""Written by setup.py at build time."""\n')
            for k, v in info.items():
                fh.write(f"{k} = {v!r}\n")


def _extras():
    """Optional dependencies.  ``pip install graphkern`` never needs cuda-bindings: the CPU path runs
    without it and the GPU path says what to install.  ``graphkern[cuda]`` adds the cuda-bindings
    series matching the headers the driver layer was compiled against (any series for a CPU-only
    build, which has no driver layer to use it)."""
    cuda = [f"cuda-bindings=={CUDA_VER}.*" if CUDA_VER else "cuda-bindings"]
    # zarr 3 (the Zarr output of graphkern.distributed) needs Python 3.11; on 3.10 gram returns NumPy only
    distributed = ["dask>=2024.1", "distributed>=2024.1", "zarr>=3; python_version >= '3.11'"]
    peers = ["networkx>=3", "igraph", "grakel", "rdkit"]
    return {
        "cuda": cuda,
        "sklearn": ["scikit-learn>=1.2"],
        "rdkit": ["rdkit"],
        "distributed": distributed,
        "plot": ["matplotlib"],
        "progress": ["tqdm"],
        "bench": ["matplotlib", *peers],
        # the GPU tests need the driver bindings, so the README's install command brings them;
        # mpmath: the references of exp(beta A) x on entries 1e-300..1e300, which float64 cannot give
        "test": ["pytest>=7", "hypothesis", "mpmath", "scikit-learn>=1.2", "tqdm", *cuda, *peers, *distributed],
    }


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt}, install_requires=["numpy>=1.25", "scipy>=1.10"],
      extras_require=_extras(), zip_safe=False,
      package_data={"graphkern": ["py.typed"], "graphkern.bench.data": ["*.sdf.gz", "README.md"]},
      # the wheel carries the compiled modules, not their sources or Cython's generated C/C++
      exclude_package_data={"graphkern._cpu": ["*.c", "*.cpp", "*.pyx", "*.pxd", "*.h"], "graphkern._cuda": ["*.cpp", "*.pyx", "*.pxi"]})
