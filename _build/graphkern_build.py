"""In-tree build backend: setuptools, plus a cuda-bindings pin chosen from the toolkit headers.

cuda-bindings' Cython declarations only compile against CUDA headers of the same
major.minor, so the build asks for exactly that cuda-bindings series.
"""

import os
import sys

from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F401,F403

sys.path.insert(0, os.path.dirname(__file__))
from cuda_toolkit import bindings_requirement  # noqa: E402


def _extra():
    req = bindings_requirement()
    return [req] if req else []


def get_requires_for_build_wheel(config_settings=None):
    return _orig.get_requires_for_build_wheel(config_settings) + _extra()


def get_requires_for_build_editable(config_settings=None):
    return _orig.get_requires_for_build_editable(config_settings) + _extra()
