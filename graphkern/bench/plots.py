"""PNG figures of a benchmark run (``graphkern-bench --plot DIR``; needs matplotlib).

Per suite: time against problem size on log-log axes, one line per implementation (graphkern's
CPU and GPU calls and each peer; estimated points hollow); speed-up bars of graphkern against its
best peer; for the SpMV and Jaccard kernels, achieved bandwidth against the measured copy
bandwidth (the device's copy on a GPU, the host memcpy otherwise).
"""

from __future__ import annotations

import os


def write_plots(results, directory):
    """Write the figures of ``results`` (the runner's dict) to ``directory``; returns their paths."""
    try:
        import matplotlib
    except ImportError:
        print("--plot needs matplotlib: pip install 'graphkern[bench]' or pip install matplotlib")
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    system = results["system"]
    paths = []
    for suite, res in results["suites"].items():
        rows = res["rows"]
        points = [r for r in rows if r.get("kind") == "point" and r.get("seconds")]
        if points:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for series in sorted({p["series"] for p in points}):
                pts = sorted((p for p in points if p["series"] == series), key=lambda p: p["size"])
                line, = ax.plot([p["size"] for p in pts], [p["seconds"] for p in pts], ":", lw=0.8, label=series)
                for p in pts:
                    ax.plot(p["size"], p["seconds"], "o", color=line.get_color(),
                            fillstyle="none" if p.get("estimated") else "full")
            ax.set(xscale="log", yscale="log", xlabel=points[0].get("size_label", "problem size"),
                   ylabel="time per call (s)", title=f"{suite}: time against problem size (hollow: estimated)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            paths.append(_save(fig, directory, f"{suite}_time.png"))
        bars = [r for r in rows if r.get("kind") == "headline" and r.get("ratio")]
        speedups = _speedups(points)
        if speedups or bars:
            fig, ax = plt.subplots(figsize=(7, 4))
            items = speedups or [(f"{b['what']}\nvs {b['peer']}", b["ratio"], b.get("estimated")) for b in bars]
            ax.barh([i[0] for i in items], [i[1] for i in items],
                    color=["#bbbbbb" if i[2] else "#3070b0" for i in items])
            ax.set(xscale="log", xlabel="speed-up: peer time / graphkern time (grey: estimated)",
                   title=f"{suite}: graphkern against its peers")
            ax.axvline(1.0, color="k", lw=0.8)
            ax.tick_params(axis="y", labelsize=7)
            paths.append(_save(fig, directory, f"{suite}_speedup.png"))
        bw = [r for r in rows if r.get("kind") == "bandwidth"]
        if bw:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for series in sorted({p["series"] for p in bw}):
                pts = sorted((p for p in bw if p["series"] == series), key=lambda p: p["size"])
                ax.plot([p["size"] for p in pts], [p["bytes_per_s"] / 1e9 for p in pts], "o-", label=series)
            for key, label in (("device_copy_bandwidth", "device copy (measured)"),
                               ("host_copy_bandwidth", "host memcpy (measured)")):
                if system.get(key):
                    ax.axhline(system[key] / 1e9, ls="--", color="k" if "device" in key else "grey", label=label)
            ax.set(xscale="log", yscale="log", xlabel="stored entries",
                   ylabel="GB/s (bytes of one pass over the CSR and vectors)",
                   title=f"{suite}: achieved bandwidth against the copy bandwidth")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            paths.append(_save(fig, directory, f"{suite}_bandwidth.png"))
    return paths


def _speedups(points):
    """(label, peer time / best graphkern time, estimated) per graph and peer."""
    out = []
    for graph in dict.fromkeys(p["graph"] for p in points):
        here = [p for p in points if p["graph"] == graph]
        ours = [p for p in here if p["series"].startswith("graphkern")]
        if not ours:
            continue
        best = min(ours, key=lambda p: p["seconds"])
        for p in here:
            if not p["series"].startswith("graphkern"):
                out.append((f"{graph}: vs {p['series']}", p["seconds"] / best["seconds"],
                            p.get("estimated") or best.get("estimated")))
    return out


def _save(fig, directory, name):
    import matplotlib.pyplot as plt

    path = os.path.join(directory, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
