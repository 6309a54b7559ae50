"""The build's nvcc architecture flags (_build/cuda_toolkit.gencode) and the device code's
architecture checks they rely on."""

import glob
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "_build"))
import cuda_toolkit  # noqa: E402


def test_one_ptx_per_major_version_feeds_its_architectures():
    assert cuda_toolkit.gencode(cuda_toolkit.DEFAULT_ARCHS) == [
        "-gencode", "arch=compute_75,code=[sm_75]",
        "-gencode", "arch=compute_80,code=[sm_80,sm_86,sm_89]",
        "-gencode", "arch=compute_90,code=[sm_90]",
        "-gencode", "arch=compute_100,code=[sm_100]",
        "-gencode", "arch=compute_120,code=[sm_120,compute_120]",
    ]


def test_the_lowest_requested_architecture_of_a_major_version_gives_the_ptx():
    # order and repeats in GRAPHKERN_CUDA_ARCHS do not matter; PTX only for the newest major version
    assert cuda_toolkit.gencode(["89", "86", "86"]) == ["-gencode", "arch=compute_86,code=[sm_86,sm_89,compute_86]"]
    assert cuda_toolkit.gencode(["90"]) == ["-gencode", "arch=compute_90,code=[sm_90,compute_90]"]
    assert cuda_toolkit.gencode(["120", "75"]) == ["-gencode", "arch=compute_75,code=[sm_75]",
                                                   "-gencode", "arch=compute_120,code=[sm_120,compute_120]"]
    # an architecture-specific target keeps its own PTX beside the plain ones
    assert cuda_toolkit.gencode(["90a", "80"]) == ["-gencode", "arch=compute_80,code=[sm_80,compute_80]",
                                                   "-gencode", "arch=compute_90a,code=sm_90a"]


def test_device_code_tells_architectures_apart_only_by_major_version():
    # sm_86 built from compute_80 equals sm_86 built from compute_86 only while no code asks for a minor
    # version: a check such as __CUDA_ARCH__ >= 860 would need its own PTX in gencode
    checks = []
    for path in glob.glob(os.path.join(ROOT, "cuda_src", "**", "*.cu*"), recursive=True):
        with open(path) as fh:
            for m in re.finditer(r"__CUDA_ARCH__\s*(?:<=|>=|==|!=|<|>)\s*(\d+)", fh.read()):
                checks.append((os.path.relpath(path, ROOT), int(m.group(1))))
    assert checks, "no architecture check found: the pattern no longer matches the sources"
    assert [c for c in checks if c[1] % 100] == []


def test_architectures_from_the_environment(monkeypatch):
    monkeypatch.setenv("GRAPHKERN_CUDA_ARCHS", "sm_80; 9.0, 90a 120")
    assert cuda_toolkit.archs() == ("80", "90", "90a", "120")
    monkeypatch.delenv("GRAPHKERN_CUDA_ARCHS")
    assert cuda_toolkit.archs() == cuda_toolkit.DEFAULT_ARCHS


def test_a_value_that_names_no_architecture_is_a_clear_error(monkeypatch):
    for value, named in [("80,ampere", "'ampere'"), ("sm80x", "'sm80x'"), (",", "nothing")]:
        monkeypatch.setenv("GRAPHKERN_CUDA_ARCHS", value)
        with pytest.raises(ValueError, match="GRAPHKERN_CUDA_ARCHS") as err:
            cuda_toolkit.archs()
        assert named.strip("'") in str(err.value)

