"""graphkern-bench: the benchmark runner (one suite per capability under suites/)."""
