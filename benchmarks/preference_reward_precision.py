"""The reward model's two costs in preference_ga3c_atari.py, bf16 vs fp32, wall time with torch's default threads:
one training update of the ensemble (3 members x 16 pairs x 2 clips x 25 observations) and the trainer's scoring
of one GA3C batch (100 observations) member by member or through the fused copy. Run it alone on a quiet machine:
    python benchmarks/preference_reward_precision.py
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
torch.manual_seed(0)
obs_train = torch.randint(0, 255, (800, 4, 84, 84), dtype=torch.uint8)
obs_score = torch.randint(0, 255, (100, 4, 84, 84), dtype=torch.uint8)


def ensemble(bf16):
    torch.manual_seed(0)
    return p.RewardEnsemble(3, 4, (10, 0), 0.5, 0.05, bf16)


models = {bf: ensemble(bf) for bf in (False, True)}
opts = {bf: [torch.optim.Adam(m.parameters(), lr=3e-4) for m in models[bf].members] for bf in (False, True)}


def update(bf):
    models[bf].train()
    for member, opt in zip(models[bf].members, opts[bf]):
        sums = member(obs_train).view(16, 2, 25).sum(-1)
        loss = p.preference_loss(sums[:, 0], sums[:, 1], torch.ones(16))
        opt.zero_grad()
        loss.backward()
        opt.step()


def score(bf, fused):
    m = models[bf].eval()
    net = p.FusedEnsemble(m) if fused else m
    with torch.no_grad():
        t = time.perf_counter()
        for _ in range(10):
            net(obs_score)
        return (time.perf_counter() - t) / 10


res = {}
for rep in range(4):
    for bf in (False, True):
        update(bf)
        t = time.perf_counter()
        update(bf)
        update(bf)
        res.setdefault(f"update {'bf16' if bf else 'fp32'}", []).append((time.perf_counter() - t) / 2)
        for fused in (False, True):
            res.setdefault(f"score {'bf16' if bf else 'fp32'} {'fused' if fused else 'members'}", []).append(
                score(bf, fused)
            )
for k, v in res.items():
    print(f"{k:24s} median {np.median(v) * 1e3:8.1f} ms  (runs: {', '.join(f'{x * 1e3:.1f}' for x in v)})")
print("threads", torch.get_num_threads(), "load", open("/proc/loadavg").read().split()[:3])
