"""The CUDA runtime layer: discovery, memory, launches from the packaged fatbin, errors."""

import gc
import math
import pickle
import time

import types

import numpy as np
import pytest

import graphkern
from graphkern import CudaError, GPUUnavailableError
from graphkern._backend import resolve_backend, resolve_devices, resolve_dtype, resolve_threads
from graphkern._cuda import runtime as rt

from conftest import SANITIZER, run_python


def test_cuda_error_is_picklable_and_named():
    err = CudaError("CUDA_ERROR_OUT_OF_MEMORY", "out of memory", 2, "cuMemAlloc")
    back = pickle.loads(pickle.dumps(err))
    assert back.name == "CUDA_ERROR_OUT_OF_MEMORY" and back.code == 2 and back.call == "cuMemAlloc"
    assert "CUDA_ERROR_OUT_OF_MEMORY" in str(back) and isinstance(back, RuntimeError)


def test_auto_backend_without_gpu_uses_cpu():
    if rt.gpu_available():
        pytest.skip("a GPU is present")
    assert resolve_backend("auto") == "cpu"
    with pytest.raises(GPUUnavailableError, match="cannot be used: "):
        resolve_backend("gpu")
    assert graphkern.devices() == []


def test_no_driver_reports_false_in_a_fresh_process():
    # Importing and asking must never crash, whatever the machine has.
    code = ("import graphkern; ok = graphkern.gpu_available(); "
            "print(ok, graphkern.gpu_unavailable_reason())")
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] in ("True", "False")


def test_disabled_gpu_reason():
    code = "import graphkern; print(graphkern.gpu_available(), graphkern.gpu_unavailable_reason())"
    env = {"GRAPHKERN_DISABLE_GPU": "1", "PATH": ""}
    out = run_python(code, env=env)
    assert out.stdout.startswith("False disabled by GRAPHKERN_DISABLE_GPU"), out.stderr


@pytest.mark.parametrize("have", [None, "12.9.0"])
def test_missing_or_mismatched_bindings_name_the_extra_to_install(monkeypatch, have):
    """A build against CUDA 13.0 headers without matching cuda-bindings says to install graphkern[cuda]."""
    import sys
    import types
    monkeypatch.setattr(rt, "build_info", types.SimpleNamespace(CUDA_BUILT=True, CUDA_HEADER_VERSION="13.0"))
    monkeypatch.setattr(rt, "_driver", None)
    monkeypatch.setattr(rt, "_driver_import_error", None)
    bindings = None if have is None else types.SimpleNamespace(__version__=have)
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    assert rt._load_driver_module() is None
    assert "pip install 'graphkern[cuda]' (brings cuda-bindings==13.0.*)" in rt._driver_import_error
    assert ("12.9.0 is installed" in rt._driver_import_error) == (have is not None)


def test_build_info_recorded():
    info = rt.build_summary()
    assert "cuda_built" in info
    if info["cuda_built"]:
        assert info["cuda_header_version"].count(".") == 1
        assert info["cuda_archs"]


@pytest.mark.parametrize("value, message", [
    ("tpu", "backend must be one of"), (0, "backend must be one of")])
def test_resolve_backend_rejects(value, message):
    with pytest.raises(ValueError, match=message):
        resolve_backend(value)


def test_resolve_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert resolve_threads(None) == 3
    assert resolve_threads(2) == 2
    with pytest.raises(ValueError, match=">= 1"):
        resolve_threads(0)
    with pytest.raises(TypeError):
        resolve_threads(1.5)


def test_resolve_dtype():
    assert resolve_dtype("float32") == np.float32
    with pytest.raises(ValueError, match="float32, float64"):
        resolve_dtype(np.int32)


def test_openmp_module_compiled():
    from graphkern._cpu import _openmp
    assert _openmp.max_threads() >= 1


# --------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
def test_device_discovery():
    info = graphkern.devices()
    assert len(info) == rt.device_count() >= 1
    d = info[0]
    assert d["name"] and d["multiprocessor_count"] > 0 and d["total_memory"] > 2**30
    assert d["compute_capability"][0] >= 7
    assert resolve_backend("auto") == "gpu"
    assert resolve_devices(None) == [0]
    with pytest.raises(ValueError, match="does not exist"):
        resolve_devices([rt.device_count()])


@pytest.mark.gpu
def test_copies_both_ways(rng, gpu_device):
    x = rng.normal(size=100_003)
    buf = rt.to_device(gpu_device, x)
    np.testing.assert_array_equal(buf.to_host(), x)
    out = np.empty_like(x)
    buf.copy_to_host(out)
    np.testing.assert_array_equal(out, x)
    # device-to-device and a view
    other = rt.alloc(gpu_device, x.shape, x.dtype)
    other.copy_from_device(buf)
    np.testing.assert_array_equal(other.view(8 * 10, 8 * 5, dtype=np.float64, shape=(5,)).to_host(), x[10:15])
    other.memset32(0x7FC00000)
    assert np.isnan(other.to_host(np.float32)).all()


@pytest.mark.gpu
def test_pinned_async_copy(rng, gpu_device):
    x = rng.normal(size=4096)
    pinned = rt.PinnedBuffer(x.nbytes)
    host = pinned.array(np.float64, x.shape)
    host[:] = x
    s = rt.Stream(gpu_device)
    buf = rt.alloc(gpu_device, x.shape, x.dtype)
    buf.copy_from_host(host, s)
    back = rt.PinnedBuffer(x.nbytes).array(np.float64, x.shape)
    buf.copy_to_host(back, s)
    s.synchronize()
    np.testing.assert_array_equal(back, x)


@pytest.mark.gpu
def test_mapped_pinned_memory_is_written_by_a_kernel(rng, gpu_device):
    # a kernel updates page-locked host memory in place through its device pointer
    n = 1000
    x, y = rng.normal(size=n), rng.normal(size=n)
    mapped = rt.PinnedBuffer(8 * n, mapped=True)
    host = mapped.array(np.float64, (n,))
    host[:] = y
    fn = rt.kernel(gpu_device, "runtime_selftest", "selftest_axpy_f64")
    s = rt.Stream(gpu_device)
    rt.launch(fn, (n + 255) // 256, 256,
              (np.float64(2.5), rt.to_device(gpu_device, x), np.uint64(mapped.device_pointer(gpu_device)),
               np.int64(n)), stream=s)
    s.synchronize()
    np.testing.assert_allclose(host, 2.5 * x + y, rtol=0, atol=1e-15 * np.abs(2.5 * x + y).max())
    with pytest.raises(ValueError, match="mapped=True"):
        rt.PinnedBuffer(64).device_pointer(gpu_device)


@pytest.mark.gpu
def test_launch_packaged_kernel(rng, gpu_device):
    n = 1_000_003
    x, y = rng.normal(size=n), rng.normal(size=n)
    dx, dy = rt.to_device(gpu_device, x), rt.to_device(gpu_device, y)
    fn = rt.kernel(gpu_device, "runtime_selftest", "selftest_axpy_f64")
    s = rt.Stream(gpu_device)
    start, end = rt.Event(gpu_device), rt.Event(gpu_device)
    start.record(s)
    rt.launch(fn, (n + 255) // 256, 256, (np.float64(2.5), dx, dy, np.int64(n)), stream=s)
    end.record(s)
    s.synchronize()
    assert start.elapsed_ms(end) >= 0
    # the device contracts a*x+y into one FMA: equal to within one rounding
    np.testing.assert_allclose(dy.to_host(), 2.5 * x + y, rtol=0, atol=1e-15 * np.abs(2.5 * x + y).max())
    # the module is loaded once per device and functions are cached
    assert rt.kernel(gpu_device, "runtime_selftest", "selftest_axpy_f64") is fn
    assert fn.attributes["num_regs"] > 0


class _ExportingImage:
    """A loaded module that holds only an export table (rows of name, value)."""

    def __init__(self, rows):
        self.raw = np.array(rows, dtype=rt._EXPORT_ROW).tobytes()

    def global_bytes(self, name):
        assert name == "graphkern_exports"
        return self.raw


class _ExportingDevice:
    def __init__(self, rows):
        self.image, self.loads = _ExportingImage(rows), 0

    def load_module(self, key, image):
        self.loads += 1
        return self.image


def test_exports_are_read_once_and_checked_against_what_planning_holds(monkeypatch):
    monkeypatch.setattr(rt, "_module_image", lambda name: b"")
    monkeypatch.setattr(rt, "_exports", {})
    monkeypatch.setattr(rt, "_agreed", {})
    dev = _ExportingDevice([(b"threads", 256), (b"reduce_bytes", 256)])
    lim = rt.exports(dev, "mgk_csr")
    assert (lim.threads, lim.reduce_bytes) == (256, 256)
    assert rt.exports(dev, "mgk_csr") is lim and dev.loads == 1
    assert rt.exports(dev, "mgk_csr", agree={"threads": 256}) is lim
    wrong = {"threads": 256, "reduce_bytes": 128, "entry_bytes": 16}
    with pytest.raises(RuntimeError, match=r"cuda_src/mgk_csr\.cu .*: they export reduce_bytes = 256 \(graphkern plans "
                                           r"with 128\), entry_bytes = nothing \(graphkern plans with 16\); rebuild"):
        rt.exports(dev, "mgk_csr", agree=wrong)


def _field(offset, width, kind):  # a struct field's export row value (cuda_src/common/exports.cuh)
    return offset | width << 32 | kind << 48


def test_a_struct_layout_writes_every_field_where_the_module_reads_it(monkeypatch):
    monkeypatch.setattr(rt, "_module_image", lambda name: b"")
    monkeypatch.setattr(rt, "_exports", {})
    monkeypatch.setattr(rt, "_layouts", {})
    rows = [(b"job", 40), (b"job.data", _field(0, 8, 0)), (b"job.count", _field(8, 8, 1)),
            (b"job.width", _field(16, 4, 1)), (b"job.flags", _field(20, 4, 2)), (b"job.scale", _field(24, 4, 3)),
            (b"job.tol", _field(32, 8, 3)), (b"jobs", 1)]
    dev = _ExportingDevice(rows)
    layout = rt.layout(dev, "mgk", "job")
    assert rt.layout(dev, "mgk", "job") is layout and layout.fields == ("data", "count", "width", "flags", "scale", "tol")
    buf = types.SimpleNamespace(ptr=0x7F0012345678)
    packed = layout.pack(tol=1e-9, scale=np.float32(0.25), flags=3, width=np.int32(-7), count=1 << 40, data=buf)
    assert isinstance(packed, bytes) and len(packed) == 40 and packed.fields["data"] is buf
    got = np.frombuffer(packed, np.dtype({"names": ["data", "count", "width", "flags", "scale", "tol"],
                                          "formats": ["<u8", "<i8", "<i4", "<u4", "<f4", "<f8"],
                                          "offsets": [0, 8, 16, 20, 24, 32], "itemsize": 40}))[0]
    assert got.tolist() == (0x7F0012345678, 1 << 40, -7, 3, 0.25, 1e-9)
    assert np.frombuffer(layout.pack(data=None, count=0, width=0, flags=0, scale=0, tol=0), np.uint8).max() == 0
    # an address as launch() takes it (mapped host memory's device pointer)
    assert np.frombuffer(layout.pack(data=np.uint64(0x7F00DEADBEE8), count=0, width=0, flags=0, scale=0, tol=0),
                         "<u8")[0] == 0x7F00DEADBEE8
    # many at once: each the bytes pack() makes of its row's values
    counts, tols = np.array([5, 1 << 40, -3]), np.array([0.5, 1e-9, -2.0])
    addresses = np.array([0x7F0000001000, 0x7F0000002008, 0], np.uint64)
    for data, want in ((buf, [buf] * 3), (None, [None] * 3), (addresses, [np.uint64(a) for a in addresses]),
                       (addresses[1], [addresses[1]] * 3)):
        rows = layout.pack_rows(3, data=data, count=counts, width=-7, flags=3, scale=0.25, tol=tols)
        assert rows == [layout.pack(data=d, count=int(c), width=-7, flags=3, scale=0.25, tol=float(t))
                        for d, c, t in zip(want, counts, tols)]

    fields = dict(data=None, count=1, width=2, flags=3, scale=1.0, tol=0.5)
    with pytest.raises(TypeError, match=r"mgk:job: missing tol; no field tolerance"):
        layout.pack(**{k: v for k, v in fields.items() if k != "tol"}, tolerance=0.5)
    with pytest.raises(TypeError, match=r"mgk:job\.width = 2\.5"):
        layout.pack(**fields | {"width": 2.5})
    with pytest.raises(TypeError, match=r"mgk:job\.flags = -1"):
        layout.pack(**fields | {"flags": -1})
    with pytest.raises(TypeError, match=r"mgk:job\.width = 4294967296"):
        layout.pack(**fields | {"width": 1 << 32})
    with pytest.raises(ValueError, match=r"mgk:job\.scale = 1e\+40"):
        layout.pack(**fields | {"scale": 1e40})
    pointer = r"mgk:job\.data is a device pointer: pass a device buffer, None or an np\.uint64 address, not "
    with pytest.raises(TypeError, match=pointer + "ndarray"):
        layout.pack(**fields | {"data": np.zeros(3)})
    with pytest.raises(TypeError, match=pointer + "int"):
        layout.pack(**fields | {"data": 0x7F00DEADBEE8})  # a plain int may be a size as well as an address
    with pytest.raises(TypeError, match=r"mgk:job: missing tol"):
        layout.pack_rows(2, **{k: v for k, v in fields.items() if k != "tol"})
    with pytest.raises(RuntimeError, match="exports no struct missing"):
        rt.layout(dev, "mgk", "missing")
    bad = _ExportingDevice([(b"pair", 12), (b"pair.a", _field(0, 8, 1)), (b"pair.b", _field(4, 8, 1))])
    monkeypatch.setattr(rt, "_exports", {})
    with pytest.raises(RuntimeError, match=r"mgk:pair\.b: a field of kind 1, 8 bytes at offset 4"):
        rt.layout(bad, "mgk", "pair")


def test_many_structs_packed_at_once_are_the_bytes_of_each_packed_alone():
    """Layout.pack_rows against Layout.pack on random layouts (every field kind, gaps, a tail) and values."""
    pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    kinds = [(0, 8, "Q"), (1, 4, "i"), (1, 8, "q"), (2, 4, "I"), (2, 8, "Q"), (3, 4, "f"), (3, 8, "d")]

    def values(code, count):
        ints = {"i": (-2**31, 2**31 - 1), "q": (-2**63, 2**63 - 1), "I": (0, 2**32 - 1), "Q": (0, 2**64 - 1)}
        if code in ints:
            return st.lists(st.integers(*ints[code]), min_size=count, max_size=count)
        width = 32 if code == "f" else 64
        return st.lists(st.floats(width=width, allow_nan=False), min_size=count, max_size=count)

    @st.composite
    def case(draw):
        fields, offset = {}, 0
        for k in range(draw(st.integers(1, 6))):
            kind, width, code = draw(st.sampled_from(kinds))
            offset = -(-offset // width) * width + width * draw(st.integers(0, 1))  # aligned, maybe a gap
            fields[f"f{k}"] = (offset, width, kind, code)
            offset += width
        size = -(-offset // 8) * 8 + 8 * draw(st.integers(0, 1))
        count = draw(st.integers(0, 5))
        data = {name: draw(values(code, count)) for name, (_, _, _, code) in fields.items()}
        return fields, size, count, data

    @settings(max_examples=80, deadline=None, database=None)
    @given(case())
    def check(c):
        fields, size, count, data = c
        layout = rt.Layout("test", "s", size, {name: f[:3] for name, f in fields.items()})
        rows = layout.pack_rows(count, **{name: np.array(v, dtype=np.dtype(fields[name][3]).newbyteorder("<"))
                                          if fields[name][2] != 0 else np.array(v, np.uint64)
                                          for name, v in data.items()})
        alone = [layout.pack(**{name: np.uint64(v[i]) if fields[name][2] == 0 else v[i]
                                for name, v in data.items()}) for i in range(count)]
        assert rows == alone

    check()


@pytest.mark.gpu
def test_struct_parameters_are_the_size_their_layouts_pack(gpu_device):
    """Each MGK entry point takes its sets, job, terms and outputs as structs of the sizes the module
    exports, so do the shortest-path kernels, the feature map's counting and Gram product, the
    similarity kernels and their hash tables, exp's SpMV and update, its degree order and row move,
    and the CSR check; a launch whose arguments do not match the kernel's parameters is refused."""
    for module, entry, structs in (
            ("spgk", "spgk_batched", ("batch!", "batch!", "batched")),
            ("jaccard", "jaccard_element_count", ("similarity", 8)),
            ("jaccard", "jaccard_pair_weight", ("similarity", 4, 4)),
            ("jaccard", "jaccard_finalize_count", ("similarity", 8, 8, 4, 8, 8)),
            ("jaccard", "jaccard_row_hashes!", (8, 8, "row_tables!")),
            ("spgk", "spgk_vertex_matrix", ("graph_paths!", "graph_paths!", 4, 4, 8, 8)),
            ("spgk_features", "spgk_count_columns!", ("graphs!", "tables!", 4)),
            ("expm", "lanczos_permute_rows_idx_i64!", ("row_move!", 8, 8)),
            ("spgk_features", "spgk_count_graphs!", ("graphs!", "tables!", 4, 8)),
            ("spgk_features", "spgk_features_gram!", ("dense_rows!", "dense_rows!", "gram_tile!")),
            ("mgk", "mgk_solve_general", ("set", "set", "job", "out")),
            ("mgk", "mgk_gradient_sqexp", ("set", "set", "job", "terms", "gradient_out")),
            ("mgk_csr", "mgk_csr_kronecker", ("set", "set", "job", "out")),
            ("mgk_csr", "mgk_csr_gradient_seq_constant", ("set", "set", "job", "terms", "gradient_out")),
            ("mgk_gemm", "mgk_gemm_r3", ("set", "set", "job", "out")),
            ("mgk_gemm", "mgk_gemm_gradient_r2", ("set", "set", "job", "terms", "gradient_out")),
            ("mgk_tiled", "mgk_tiled_sqexp_block_compact", (None, None, "job", "schedule", "out"))):
        for sfx in ("f32", "f64"):  # "name!": one entry point for both types
            fn = rt.kernel(gpu_device, module, entry.rstrip("!") if entry.endswith("!") else f"{entry}_{sfx}")
            # None: a pointer; a number: a scalar of that width; "name!": a struct of one layout for both types
            sizes = tuple(8 if name is None else name if isinstance(name, int) else rt.layout(
                gpu_device, module, name.rstrip("!") if name in ("gradient_out", "schedule") or name.endswith("!")
                else f"{name}_{sfx}").size for name in structs)
            assert fn.parameter_widths == sizes, (module, entry, sfx)
    # exp's SpMV variants: the share by index type, then step k's vectors and slots; its update
    def size(name):
        return rt.layout(gpu_device, "expm", name).size

    for sfx in ("f32", "f64"):
        for pn in ("i32", "i64"):
            for variant in ("scalar", "vector8", "tasks"):
                fn = rt.kernel(gpu_device, "expm", f"lanczos_spmv_{variant}_{sfx}_w_{pn}")
                assert fn.parameter_widths == (size(f"spmv_share_{sfx}_{pn}"),) + (8,) * 9 + (4, 8), (variant, pn)
        fn = rt.kernel(gpu_device, "expm", f"lanczos_update_{sfx}")
        assert fn.parameter_widths == (size("update_share"),) + (8,) * 6 + (4, 8, 8, size(f"row_peers_{sfx}"), 8)
    for step in ("count", "tiles", "starts", "scatter", "big"):  # the degree order's kernels share one struct
        assert rt.kernel(gpu_device, "expm", f"degree_order_{step}").parameter_widths == (size("degree_order"),)
    for module, pn in (("expm", "i32"), ("expm", "i64"), ("jaccard", "i64")):  # the CSR check after an upload
        assert rt.kernel(gpu_device, module, f"csr_check_{pn}").parameter_widths == (
            rt.layout(gpu_device, module, f"csr_check_{pn}").size,)
    for pn in ("i32", "i64"):  # the rowblock plan's rule, by row pointer type
        assert rt.kernel(gpu_device, "expm", f"rowblock_count_{pn}").parameter_widths == (
            8, size("rowblock_rule"), 8, 8)
        assert rt.kernel(gpu_device, "expm", f"rowblock_write_{pn}").parameter_widths == (
            8, size("rowblock_rule"), 8, 8, 8)
    fn = rt.kernel(gpu_device, "runtime_selftest", "selftest_axpy_f64")
    assert len(fn.parameter_widths) > 1
    with pytest.raises(TypeError, match=f"kernel selftest_axpy_f64 takes {len(fn.parameter_widths)} arguments, got 1"):
        rt.launch(fn, 1, 32, (None,))
    args = [None] * len(fn.parameter_widths)
    args[0] = bytes(3)
    with pytest.raises(TypeError, match="argument 0 is 3 bytes wide where the kernel's parameter is"):
        rt.launch(fn, 1, 32, args)


@pytest.mark.gpu
def test_kernel_modules_export_what_their_python_plans_with(gpu_device):
    from graphkern.expm import plans as expm_plans
    from graphkern.mgk import csr, gemm, tiled
    from graphkern.similarity import plan as similarity_plan
    for module, planned in (("mgk_csr", csr._PLANNED), ("mgk_gemm", gemm._PLANNED), ("mgk_tiled", tiled._PLANNED),
                            ("expm", expm_plans._PLANNED), ("jaccard", similarity_plan._PLANNED)):
        assert set(planned) <= set(vars(rt.exports(gpu_device, module, agree=planned)))
    # what only the launches read: the scratch vectors of a gradient hold those of a solve and more
    for module in ("mgk", "mgk_csr", "mgk_gemm"):
        lim = rt.exports(gpu_device, module)
        assert 0 < lim.vectors < lim.gradient_vectors
    assert rt.exports(gpu_device, "mgk_tiled").vectors > 0
    features = rt.exports(gpu_device, "spgk_features")
    assert features.tile % features.depth == 0 and features.threads % 32 == 0 and features.max_vertices == 64
    image = gpu_device.load_module("mgk", rt._module_image("mgk"))
    with pytest.raises(CudaError, match="CUDA_ERROR_NOT_FOUND") as err:
        image.global_bytes("no_such_global")
    assert "no_such_global" in str(err.value)
    assert len(image.global_bytes("graphkern_exports")) % rt._EXPORT_ROW.itemsize == 0


@pytest.mark.gpu
def test_dynamic_shared_memory_limit_only_grows(gpu_device):
    """Callers of one kernel on one device asking for different dynamic shared memory (two threads'
    MGK calls, or two shares of one device): a smaller request after a larger one must not fail the
    larger one's launch."""
    fn = rt.kernel(gpu_device, "runtime_selftest", "selftest_iota_i32")
    big = 64 * 1024
    out = rt.alloc(gpu_device, 32, np.int32)
    fn.set_max_dynamic_shared_memory(big)
    fn.set_max_dynamic_shared_memory(1024)
    rt.launch(fn, 1, 32, (out, np.int32(5), np.int32(32)), shared_mem=big)
    assert np.array_equal(out.to_host(), np.arange(5, 37))


@pytest.mark.gpu
def test_module_loaded_once_by_threads_starting_together(gpu_device):
    """Several threads making a process's first call of one module at once (the load releases the
    GIL) all get the one module the device keeps."""
    import threading

    image = rt._module_image("runtime_selftest")
    for attempt in range(3):
        key = f"runtime_selftest (threads, {attempt})"
        start, got = threading.Barrier(6), []

        def load():
            start.wait()
            got.append(gpu_device.load_module(key, image))

        threads = [threading.Thread(target=load) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 6 and all(m is got[0] for m in got)
        assert got[0] is gpu_device.load_module(key, image)


@pytest.mark.gpu
def test_function_queries_from_a_thread_with_no_current_context(gpu_device):
    """A Dask worker runs tasks on threads that never touched the device: a cached function's
    occupancy and attribute queries must still work there (they make the context current)."""
    import threading

    fn = rt.kernel(gpu_device, "runtime_selftest", "selftest_axpy_f64")
    expected = (fn.max_active_blocks_per_sm(256), fn.attributes)
    got, errors = [], []

    def task():
        try:
            fn.set_max_dynamic_shared_memory(0)
            got.append((fn.max_active_blocks_per_sm(256), fn.attributes))
        except Exception as exc:  # reported below, with the driver's name
            errors.append(exc)

    t = threading.Thread(target=task)
    t.start()
    t.join()
    assert not errors, errors
    assert got == [expected]


def _butterfly(v):
    """Every lane's sum of v (32 lanes) in warp_sum's order: v[l] + v[l ^ off], off = 16 .. 1."""
    for off in (16, 8, 4, 2, 1):
        v = v + v[np.arange(32) ^ off]
    return v


def _tree(v):
    """Lane 0's sum of v (32 lanes) in the shuffle-down order: v[l] + v[l + off], off = 16 .. 1."""
    v = v.copy()
    for off in (16, 8, 4, 2, 1):
        v[:off] = v[:off] + v[off:2 * off]
    return v[0]


@pytest.mark.gpu
def test_device_reductions_add_in_their_documented_order(rng, gpu_device):
    # magnitudes over 16 decades: any other order of the additions changes the bits
    x = rng.normal(size=256) * 10.0 ** rng.integers(-8, 8, size=256)
    dx = rt.to_device(gpu_device, x)
    warp, block, first = (rt.to_device(gpu_device, np.full(n, np.nan)) for n in (256, 256, 1))
    fn = rt.kernel(gpu_device, "runtime_selftest", "selftest_reductions")
    s = rt.Stream(gpu_device)
    rt.launch(fn, 1, 256, (dx, warp, block, first), stream=s)
    s.synchronize()
    lanes = x.reshape(8, 32)
    want_warp = np.concatenate([_butterfly(w) for w in lanes])
    totals = want_warp[::32]
    want_block = 0.0
    for t in totals:  # every thread adds the warps' totals in warp order
        want_block += t
    want_first = _tree(np.concatenate([[_tree(w) for w in lanes], np.zeros(24)]))
    np.testing.assert_array_equal(warp.to_host(), want_warp)
    np.testing.assert_array_equal(block.to_host(), np.full(256, want_block))
    assert first.to_host()[0] == want_first
    assert abs(want_block - math.fsum(x)) <= 1e-12 * np.abs(x).sum()


@pytest.mark.gpu
def test_hold_stream_delays_work_and_events_see_it(gpu_device):
    s = rt.Stream(gpu_device)
    start, held, after = rt.Event(gpu_device), rt.Event(gpu_device), rt.Event(gpu_device)
    start.record(s)
    rt.hold_stream(s, 0.05)
    held.record(s)
    assert not held.query()  # 50 ms on the device: still running right after enqueueing
    out = rt.alloc(gpu_device, 8, np.int32)
    rt.launch(rt.kernel(gpu_device, "runtime_selftest", "selftest_iota_i32"), 1, 32,
              (out, np.int32(7), np.int32(8)), stream=s)
    after.record(s)
    after.synchronize()
    assert held.query() and after.query()
    assert 45 <= start.elapsed_ms(held) <= 500
    np.testing.assert_array_equal(out.to_host(), np.arange(7, 15))


@pytest.mark.gpu
def test_time_gpu_excludes_host_launch_overhead(gpu_device):
    from graphkern.bench.timing import time_gpu

    s = rt.Stream(gpu_device)
    out = rt.alloc(gpu_device, 32, np.int32)
    fn = rt.kernel(gpu_device, "runtime_selftest", "selftest_iota_i32")

    def slow_host_launches():  # 5 tiny kernels, each after 2 ms of host work
        for _ in range(5):
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 2e-3:
                pass
            rt.launch(fn, 1, 32, (out, np.int32(0), np.int32(32)), stream=s)

    def fast_host_launches():  # the same 5 kernels back to back
        for _ in range(5):
            rt.launch(fn, 1, 32, (out, np.int32(0), np.int32(32)), stream=s)

    t = time_gpu(slow_host_launches, s, repeat=3, warmup=1)
    kernels = time_gpu(fast_host_launches, s, repeat=3, warmup=1)
    assert len(t.times) == 3 and len(kernels.times) == 3
    if not SANITIZER:  # the host's 10 ms are not counted, only the five kernels
        assert t.median < kernels.median + 5e-3


@pytest.mark.gpu
def test_time_gpu_of_a_call_that_waits_for_the_device(gpu_device):
    from graphkern.bench.timing import time_gpu

    s = rt.Stream(gpu_device)
    host = np.zeros(1 << 20)
    buf = rt.to_device(gpu_device, host)

    def copy_back():  # a pageable copy: returns only once the device has done it
        buf.copy_to_host(host, s)

    t0 = time.perf_counter()
    t = time_gpu(copy_back, s, repeat=10, warmup=1)
    assert len(t.times) == 10 and t.median > 0
    assert time.perf_counter() - t0 < 1.0  # no hold is wasted on a call that cannot queue behind one


@pytest.mark.gpu
def test_shared_carveout_preference(gpu_device):
    fn = rt.kernel(gpu_device, "runtime_selftest", "selftest_iota_i32")
    for percent in (0, 50, 100):
        fn.set_preferred_shared_carveout(percent)
    with pytest.raises(ValueError, match="carveout"):
        fn.set_preferred_shared_carveout(101)
    out = rt.alloc(gpu_device, 32, np.int32)
    rt.launch(fn, 1, 32, (out, np.int32(3), np.int32(32)))
    np.testing.assert_array_equal(out.to_host(), np.arange(3, 35))


@pytest.mark.gpu
def test_invalid_launch_raises_named_error(gpu_device):
    fn = rt.kernel(gpu_device, "runtime_selftest", "selftest_iota_i32")
    out = rt.alloc(gpu_device, (16,), np.int32)
    with pytest.raises(CudaError) as info:
        rt.launch(fn, 1, 4096, (out, np.int32(0), np.int32(16)))  # more threads than a block may have
    assert info.value.name == "CUDA_ERROR_INVALID_VALUE"
    # the context is not poisoned: a valid launch still works
    rt.launch(fn, 1, 16, (out, np.int32(7), np.int32(16)))
    np.testing.assert_array_equal(out.to_host(), np.arange(7, 23))


@pytest.mark.gpu
def test_missing_kernel_name(gpu_device):
    with pytest.raises(CudaError, match="CUDA_ERROR_NOT_FOUND.*no_such_kernel"):
        rt.kernel(gpu_device, "runtime_selftest", "no_such_kernel")


@pytest.mark.gpu
def test_python_ints_refused_as_kernel_arguments(gpu_device):
    fn = rt.kernel(gpu_device, "runtime_selftest", "selftest_iota_i32")
    out = rt.alloc(gpu_device, (4,), np.int32)
    with pytest.raises(TypeError, match="argument 1 has type int"):
        rt.launch(fn, 1, 4, (out, 0, np.int32(4)))


@pytest.mark.gpu
def test_out_of_memory_is_named_and_recoverable(gpu_device):
    free, total = gpu_device.memory_info()
    with pytest.raises(CudaError) as info:
        rt.alloc(gpu_device, (total * 2,), np.uint8)
    assert info.value.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert f"{total * 2:,} bytes" in str(info.value)
    buf = rt.alloc(gpu_device, (1 << 20,), np.uint8)  # the next call still works
    buf.zero()
    assert not buf.to_host().any()


@pytest.mark.gpu
def test_check_fits_names_the_size(gpu_device):
    from graphkern.errors import GraphTooLargeError
    _, total = gpu_device.memory_info()
    with pytest.raises(GraphTooLargeError, match=r"graph CSR needs .* GiB on device 0"):
        rt.check_fits(gpu_device, 4 * total, "graph CSR")


@pytest.mark.gpu
def test_too_many_kernel_arguments_refused(gpu_device):
    # the limit is generous (gradient kernels pass about 60) but past it the error says so
    fn = rt.kernel(gpu_device, "runtime_selftest", "selftest_iota_i32")
    out = rt.alloc(gpu_device, (8,), np.int32)
    with pytest.raises(ValueError, match="at most 128 kernel arguments"):
        rt.launch(fn, 1, 8, (out, np.int32(3), np.int32(8)) + (np.int32(0),) * 126)


def test_stream_and_event_refuse_a_missing_device():
    """No device object is a TypeError, not a crash (this needs no GPU, only the compiled driver
    layer: the argument is checked first)."""
    _driver = pytest.importorskip("graphkern._cuda._driver", reason="the driver layer is not built here")

    with pytest.raises(TypeError):
        rt.Stream(None)
    with pytest.raises(TypeError):
        _driver.Event(None)


@pytest.mark.gpu
def test_allocated_bytes_count_this_process_buffers(gpu_device):
    """The per-device count of live buffers: up by an allocation, not by a view, down when freed."""
    from graphkern._cuda import runtime as rt

    gc.collect()
    before = gpu_device.allocated_bytes()
    buf = rt.alloc(gpu_device, 1 << 20, np.uint8)
    view = buf.view(0, 1 << 10)
    assert gpu_device.allocated_bytes() == before + (1 << 20)
    del buf
    assert gpu_device.allocated_bytes() == before + (1 << 20)  # the view keeps its parent alive
    del view
    gc.collect()
    assert gpu_device.allocated_bytes() == before


@pytest.mark.gpu
def test_a_freed_block_is_reused_only_after_the_work_queued_before_its_free(gpu_device):
    """A freed buffer's memory serves the next allocation of its size once the device has finished
    what was queued before the free: a kernel still to write the old buffer cannot write the new."""
    rt.release_cached(gpu_device.ordinal)
    n = 1 << 18
    fn = rt.kernel(gpu_device, "runtime_selftest", "selftest_iota_i32")
    s = rt.Stream(gpu_device)
    old = rt.alloc(gpu_device, n, np.int32)
    ptr = old.ptr
    rt.hold_stream(s, 0.2)
    rt.launch(fn, n // 256, 256, (old, np.int32(1), np.int32(n)), stream=s)
    t0 = time.perf_counter()
    del old
    new = rt.alloc(gpu_device, n, np.int32)
    waited = time.perf_counter() - t0
    assert new.ptr == ptr  # the only cached block of this size
    assert waited >= 0.1  # the free waited for the held stream's kernel
    new.zero()
    gpu_device.synchronize()
    assert not new.to_host().any()


@pytest.mark.gpu
def test_cached_memory_counts_as_free_and_is_given_back(gpu_device):
    from graphkern._cuda import _driver

    rt.release_cached(gpu_device.ordinal)
    assert _driver.cached_bytes(gpu_device) == 0
    buf = rt.alloc(gpu_device, 64 << 20, np.uint8)
    del buf
    assert _driver.cached_bytes(gpu_device) == 64 << 20
    free_cached, _ = gpu_device.memory_info()
    assert graphkern.release_gpu_memory() >= 64 << 20
    assert _driver.cached_bytes(gpu_device) == 0
    free_after, _ = gpu_device.memory_info()
    assert abs(free_after - free_cached) <= 16 << 20


@pytest.mark.gpu
def test_an_allocation_that_needs_the_cached_memory_gets_it_back(gpu_device):
    rt.release_cached(gpu_device.ordinal)
    free, _ = gpu_device.memory_info()
    held = rt.alloc(gpu_device, free // 5, np.uint8)
    del held  # cached: under a quarter of the device
    free_reported, _ = gpu_device.memory_info()
    assert free_reported >= free - (64 << 20)
    big = rt.alloc(gpu_device, free_reported - (512 << 20), np.uint8)  # more than the driver has free
    big.view(0, 1 << 20).zero()
    del big
    rt.release_cached(gpu_device.ordinal)


@pytest.mark.gpu
def test_staging_lanes_are_made_once_when_the_device_opens(gpu_device):
    """The device's staging lanes are made in the background when it is opened; a large copy then
    uses them (every byte arrives) and makes none, and no device holds more than STAGING_LANES_MAX."""
    from graphkern._cuda import runtime as rt

    rt._warming[gpu_device.ordinal].result()
    made = rt._staging["made"]
    assert rt.STAGING_THREADS <= rt._staging["lanes"][gpu_device.ordinal] <= rt.STAGING_LANES_MAX
    data = np.random.default_rng(1).integers(0, 256, 3 * rt.STAGED_MIN_BYTES + 77, dtype=np.uint8)
    buf = rt.to_device(gpu_device, data)
    out = np.empty_like(data)
    rt.copy_to_pageable(buf, out)
    np.testing.assert_array_equal(out, data)
    assert rt._staging["made"] == made


@pytest.mark.gpu
@pytest.mark.parametrize("nbytes", [1000, (3 << 20) + 24, 2 * (8 << 20) + 12345, 5 * (8 << 20) + 8])
def test_copies_to_and_from_pageable_memory_through_staging(nbytes):
    """Device to pageable memory and back through pinned chunks on several threads: every byte, at
    an offset, small copies direct (3 MB: staged out of the device, direct into it); the staging
    chunks are reused by the next copy."""
    from graphkern._cuda import runtime as rt

    rng = np.random.default_rng(nbytes)
    data = rng.integers(0, 256, nbytes + 4096, dtype=np.uint8)
    buf = rt.to_device(rt.get_device(0), data)
    for offset in (0, 4096 - 8):
        out = np.empty(nbytes, dtype=np.uint8)
        rt.copy_to_pageable(buf, out, offset=offset)
        np.testing.assert_array_equal(out, data[offset:offset + nbytes])
    made = rt._staging["made"]
    doubles = np.empty(nbytes // 8, dtype=np.float64)
    rt.copy_to_pageable(buf, doubles)
    np.testing.assert_array_equal(doubles.view(np.uint8), data[:doubles.nbytes])
    assert rt._staging["made"] == made
    # the other way: into a buffer at an offset, and to_device's staged upload
    back = rt.alloc(rt.get_device(0), nbytes + 4096, np.uint8)
    back.zero()
    rt.copy_from_pageable(back, data[:nbytes], offset=4096)
    np.testing.assert_array_equal(back.to_host()[4096:], data[:nbytes])
    np.testing.assert_array_equal(rt.to_device(rt.get_device(0), data[::-1]).to_host(), data[::-1])
