"""The reward ensemble's training update and scoring in preference_ga3c_atari.py on channels-last pixels, against
the script before that change (BASE, default a72d453), alternating in one process, fp32 (as on an AVX2 CPU), torch's
default threads. Run it alone on a quiet machine:
    python benchmarks/preference_reward_nhwc.py [BASE]
"""

import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

root = Path(__file__).resolve().parent.parent
base = sys.argv[1] if len(sys.argv) > 1 else "a72d453"
old = Path(tempfile.mkdtemp()) / "preference_base.py"
old.write_text(subprocess.run(["git", "show", f"{base}:preference_ga3c_atari.py"], cwd=root, capture_output=True,
                              text=True, check=True).stdout)  # fmt: skip
modules = {}
for name, path in (("base", old), ("new", root / "preference_ga3c_atari.py")):
    spec = importlib.util.spec_from_file_location(name, str(path))
    modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(modules[name])
obs_train = torch.randint(0, 255, (800, 4, 84, 84), dtype=torch.uint8)  # 16 pairs x 2 clips x 25 observations
obs_score = torch.randint(0, 255, (100, 4, 84, 84), dtype=torch.uint8)  # one GA3C batch
setups = {}
for name, p in modules.items():
    torch.manual_seed(0)
    ensemble = p.RewardEnsemble(3, 4, (10, 0), 0.5, 0.05, False)
    setups[name] = (p, ensemble, [torch.optim.Adam(m.parameters(), lr=3e-4) for m in ensemble.members])


def update(name):
    p, ensemble, opts = setups[name]
    ensemble.train()
    for member, opt in zip(ensemble.members, opts):
        sums = member(obs_train).view(16, 2, 25).sum(-1)
        loss = p.preference_loss(sums[:, 0], sums[:, 1], torch.ones(16))
        opt.zero_grad()
        loss.backward()
        opt.step()


def score(name):
    p, ensemble, _ = setups[name]
    fused = p.FusedEnsemble(ensemble.eval())
    with torch.no_grad():
        fused(obs_score)
        t = time.perf_counter()
        for _ in range(20):
            fused(obs_score)
        return (time.perf_counter() - t) / 20


res = {}
for rep in range(4):
    for name in ("base", "new"):
        update(name)
        t = time.perf_counter()
        update(name)
        res.setdefault(f"ensemble update, {name}", []).append(time.perf_counter() - t)
        res.setdefault(f"scoring 100 obs, {name}", []).append(score(name))
for k, v in sorted(res.items()):
    print(f"{k:26s} median {np.median(v) * 1e3:8.1f} ms  (runs: {', '.join(f'{x * 1e3:.1f}' for x in v)})")
print("threads", torch.get_num_threads(), "load", open("/proc/loadavg").read().split()[:3])
