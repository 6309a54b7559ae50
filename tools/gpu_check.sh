#!/usr/bin/env bash
# Verify graphkern on a GPU machine: build for the local arch, run every test (GPU ones
# included), run the benchmark runner, write logs and JSON into OUTDIR, print a summary.
#
# Usage: tools/gpu_check.sh OUTDIR [--sanitize] [--wheel] [--tests "PYTEST ARGS"] [--bench "BENCH ARGS"]
#   --sanitize  also run the GPU tests under compute-sanitizer memcheck, racecheck and initcheck with
#               tools/sanitize.py: one process per tool and ~150 s of tests, --sanitize-jobs per GPU on every
#               GPU, no job started after --sanitize-timeout seconds (default 900); summary, per-job
#               JSON and the ids left unfinished in OUTDIR/sanitize*, logs in OUTDIR/sanitize-logs.tgz
#   --sanitize-files  the test files for the sanitizer runs (default: every test file)
#   --wheel     also build a wheel, install it into a clean folder and run the GPU runtime
#               tests from it with no toolkit on PATH (the driver alone must suffice)
#   --tests     pytest arguments (default: the whole suite)
#   --bench     graphkern-bench arguments (default: the quick run of every suite; "" skips it)
set -uo pipefail
out=${1:?usage: tools/gpu_check.sh OUTDIR [options]}
shift
sanitize=0 wheel=0 tests="tests" bench="--quick" sanitize_files="" jobs=6 limit=900
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=1 ;;
    --wheel) wheel=1 ;;
    --tests) tests=$2; shift ;;
    --sanitize-files) sanitize_files=$2; shift ;;
    --sanitize-jobs) jobs=$2; shift ;;
    --sanitize-timeout) limit=$2; shift ;;
    --bench) bench=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

# Wheels the machine lacks (cython, cuda-bindings, peers) travel in .whl/.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>"$out/pip.log"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader | tee "$out/gpu.txt"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
export GRAPHKERN_CUDA_ARCHS=${GRAPHKERN_CUDA_ARCHS:-$arch}
note "GPU: $(head -1 "$out/gpu.txt")  archs: $GRAPHKERN_CUDA_ARCHS"

t0=$(date +%s)
if ! python3 setup.py build_ext --inplace -j "$(nproc)" >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"; note "BUILD FAILED"; exit 1
fi
note "build: $(( $(date +%s) - t0 )) s"

python3 -m pytest $tests -q -rs -p no:cacheprovider --junitxml="$out/tests.xml" >"$out/tests.log" 2>&1
rc_tests=$?
note "tests: $(tail -1 "$out/tests.log") (exit $rc_tests)"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -30 | tee -a "$summary"

if [ "$sanitize" = 1 ]; then
  python3 tools/sanitize.py "$out" ${sanitize_files:+--files $sanitize_files} --jobs-per-gpu "$jobs" \
    --deadline "$limit" --job-timeout 600 >"$out/sanitize-stdout.txt" 2>&1
  note "sanitizers (exit $?):"; tail -n +2 "$out/sanitize_summary.txt" | tee -a "$summary"
fi

if [ "$wheel" = 1 ]; then
  rm -rf /tmp/gk-wheel /tmp/gk-site
  if python3 -m pip wheel -q --no-build-isolation --no-deps -w /tmp/gk-wheel . >"$out/wheel.log" 2>&1; then
    python3 -m pip install -q --no-deps --no-index --target /tmp/gk-site /tmp/gk-wheel/graphkern-*.whl >>"$out/wheel.log" 2>&1
    # run from outside the source tree, with no nvcc and no CUDA_PATH: only the driver remains
    py=$(command -v python3)
    (cd /tmp && env -u CUDA_PATH -u CUDA_HOME PATH=/usr/bin:/bin PYTHONPATH=/tmp/gk-site:${PYTHONPATH} \
       "$py" -m pytest -q -p no:cacheprovider "$OLDPWD/tests/test_cuda_runtime.py" >"$out/wheel-tests.log" 2>&1)
    note "wheel: $(ls /tmp/gk-wheel) -> runtime tests from the wheel: $(tail -1 "$out/wheel-tests.log")"
  else
    note "wheel build FAILED (see wheel.log)"
  fi
fi

rc_bench=0
if [ -n "$bench" ]; then
  python3 -m graphkern.bench $bench --no-progress --json "$out/bench.json" >"$out/bench.log" 2>&1
  rc_bench=$?
  note "bench ($bench): exit $rc_bench"
fi
echo "=== summary"; cat "$summary"
[ $rc_tests -eq 0 ] && [ $rc_bench -eq 0 ]
