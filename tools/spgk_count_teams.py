"""The shortest-path feature map's counting pass by OpenMP team size.

    python3 tools/spgk_count_teams.py [alone | after_gpu]

Counts the triplets of 1,000 and 10,000 fresh packed molecules (the packaged set, augmented as in
the scaling table of ``graphkern-bench spgk``) with teams of 4, 8, 12, 15 and 16 threads, 15 times
each in alternating order, and prints the median, minimum and maximum of each.  ``after_gpu`` runs a
GPU feature-map call of 1,000 molecules before each count (its copy threads may still be awake),
``alone`` a 2 ms pause.  The spread of the large teams shows how often one descheduled thread holds
the whole team at its barrier.
"""

import sys
import time

import numpy as np

from graphkern._cpu import spgk_paths
from graphkern.bench.data import molecules_path
from graphkern.bench.suites._spgk_scaling import augmented_molecules
from graphkern.io import read_sdf
from graphkern.spgk import DiracNode, ShortestPathKernel, features

TEAMS = (4, 8, 12, 15, 16)


def main():
    after_gpu = len(sys.argv) > 1 and sys.argv[1] == "after_gpu"
    base = read_sdf(molecules_path(), hydrogens=False)
    node = DiracNode("element")
    if after_gpu:
        kernel, few = ShortestPathKernel(node_kernel=node, backend="gpu"), base[:1000]
        kernel(few)
    for n in (1000, 10000):
        structure, labels = features.pack(augmented_molecules(base, n), str, node, max(TEAMS))
        labels, ids = features._label_ids(labels)
        seconds = {t: [] for t in TEAMS}
        for rep in range(15):
            for t in (TEAMS if rep % 2 else TEAMS[::-1]):
                if after_gpu:
                    kernel(few)
                else:
                    time.sleep(0.002)
                t0 = time.perf_counter()
                spgk_paths.triplet_counts(*structure, ids, len(labels), t)
                seconds[t].append(time.perf_counter() - t0)
        print(f"{'after a GPU call' if after_gpu else 'alone':16s} {n:6d} molecules: " + "  ".join(
            f"{t:2d}t med {1e3 * np.median(v):.2f} (min {1e3 * min(v):.2f} max {1e3 * max(v):.2f})"
            for t, v in seconds.items()))


if __name__ == "__main__":
    main()
