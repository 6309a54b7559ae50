"""exp(beta A) x, f(beta A) x and total communicability by Lanczos (see graphkern.expm.api)."""

from graphkern.expm.api import (ExpmInfo, cache_info, clear_cache, expm_multiply, funm_multiply,
                                total_communicability)

__all__ = ["expm_multiply", "funm_multiply", "total_communicability", "ExpmInfo", "clear_cache", "cache_info"]
