"""A pytest plugin that runs the two-GPU tests on a machine with one GPU: device 1 is device 0.

    PYTHONPATH=tools python3 -m pytest -p one_gpu_as_two -m multigpu tests

With one GPU visible, ``graphkern._cuda.runtime`` reports two devices and hands out device 0's
handle for ordinal 1, so a call on ``device=[0, 1]`` takes its several-device paths (shares of
rows or pairs, the exchanges, each device's slots and queues, the merges) on one GPU.  It checks
that code, not the hardware: there is no peer access between the two, no second device running at
the same time, and tests that need NVLink atomics skip.  With two or more GPUs it does nothing.
"""


def pytest_configure(config):
    from graphkern._cuda import runtime as rt

    if rt.unavailable_reason() is None and rt.device_count() == 1:
        rt._devices[1] = rt.get_device(0)
        rt.device_count = lambda: 2
