"""The fused reward ensemble's scoring of one GA3C batch (100 observations) with channels-last weights and pixels (as
the script does) against NCHW, interleaved 30 times (5 calls each) in one process, fp32, torch's default threads.
Run it alone on a quiet machine:
    python benchmarks/preference_fused_layout.py
"""

import importlib.util
import time
from pathlib import Path

import numpy as np
import torch

spec = importlib.util.spec_from_file_location(
    "p", str(Path(__file__).resolve().parent.parent / "preference_ga3c_atari.py")
)
p = importlib.util.module_from_spec(spec)
spec.loader.exec_module(p)
obs = torch.randint(0, 255, (100, 4, 84, 84), dtype=torch.uint8)
torch.manual_seed(0)
ensemble = p.RewardEnsemble(3, 4, (10, 0), 0.5, 0.05, False).eval()
nhwc = p.FusedEnsemble(ensemble)  # as the script builds it (channels-last weights and pixels)
nchw = p.FusedEnsemble(ensemble)
nchw.convs.to(memory_format=torch.contiguous_format)


def score(fused, layout):
    with torch.no_grad():
        x = obs.contiguous(memory_format=torch.channels_last) if layout == "nhwc" else obs
        return fused.head(fused.convs(x.float() * fused.scale)).T


assert torch.allclose(score(nchw, "nchw"), score(nhwc, "nhwc"), atol=1e-4)
res = {"nchw": [], "nhwc": []}
for rep in range(30):
    for layout, fused in (("nchw", nchw), ("nhwc", nhwc)):
        t = time.perf_counter()
        for _ in range(5):
            score(fused, layout)
        res[layout].append((time.perf_counter() - t) / 5)
for k, v in res.items():
    q = np.percentile(v, [25, 50, 75]) * 1e3
    print(f"{k}: median {q[1]:.1f} ms (quartiles {q[0]:.1f}-{q[2]:.1f})")
print("threads", torch.get_num_threads(), "load", open("/proc/loadavg").read().split()[:3])
