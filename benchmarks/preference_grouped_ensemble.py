"""One reward-ensemble training update of preference_ga3c_atari.py member by member (the script's way) against the
three members as one module of grouped convs (one forward and backward for all; an experiment, not in the script),
alternating in one process, fp32, torch's default threads, 16 pairs x 2 clips x 25 observations per member. Run it
alone on a quiet machine:
    python benchmarks/preference_grouped_ensemble.py
Result on the 2-core AVX2 VM (2026-11-26, the two other jobs SIGSTOPped): member by member 1.41, 1.31, 1.12, 1.41 s;
grouped 1.50, 1.41, 1.61, 1.92 s, so the script keeps its members apart.
"""

import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import preference_ga3c_atari as p  # noqa: E402

E = 3


class Grouped(nn.Module):
    """The paper's predictor x E as grouped convs: member e sees channels [4e, 4e + 4) of the input."""

    def __init__(self, members: int, in_frames: int = 4, dropout: float = 0.5):
        super().__init__()
        channels, self.convs = in_frames, nn.ModuleList()
        for kernel, stride in ((7, 3), (5, 2), (3, 1), (3, 1)):
            self.convs.append(nn.Conv2d(channels * members, 16 * members, kernel, stride, groups=members))
            channels = 16
        self.norms = nn.ModuleList(nn.BatchNorm2d(16 * members) for _ in range(4))  # per channel = per member
        self.drop = p.ByteDropout(dropout)
        self.fc = nn.Conv2d(16 * members, 64 * members, 7, groups=members)
        self.out = nn.Conv2d(64 * members, members, 1, groups=members)
        self.to(memory_format=torch.channels_last)

    def forward(self, obs):  # (E, N, 4, 84, 84) uint8, each member its own observations
        members, n = obs.shape[:2]
        x = obs.permute(1, 0, 2, 3, 4).reshape(n, -1, 84, 84).contiguous(memory_format=torch.channels_last)
        x = x.float() / 255
        for conv, norm in zip(self.convs, self.norms):
            x = F.leaky_relu(self.drop(norm(conv(x))), 0.01)
        return self.out(F.leaky_relu(self.fc(x), 0.01)).view(n, members).T


torch.manual_seed(0)
grouped = Grouped(E)
grouped_opt = torch.optim.Adam(grouped.parameters(), 3e-4)
ensemble = p.RewardEnsemble(E, 4, (10, 0), 0.5, 0.05, False)
opts = [torch.optim.Adam(m.parameters(), lr=3e-4) for m in ensemble.members]
obs = torch.randint(0, 255, (E, 800, 4, 84, 84), dtype=torch.uint8)
mu = torch.ones(16)


def apart():
    ensemble.train()
    for e, (member, opt) in enumerate(zip(ensemble.members, opts)):
        sums = member(obs[e]).view(16, 2, 25).sum(-1)
        loss = p.preference_loss(sums[:, 0], sums[:, 1], mu)
        opt.zero_grad()
        loss.backward()
        opt.step()


def together():
    grouped.train()
    sums = grouped(obs).view(E, 16, 2, 25).sum(-1)
    loss = sum(p.preference_loss(sums[e, :, 0], sums[e, :, 1], mu) for e in range(E))
    grouped_opt.zero_grad()
    loss.backward()
    grouped_opt.step()


times = {"member by member": [], "grouped": []}
apart(), together()  # warm-up
for _ in range(4):
    for name, update in (("member by member", apart), ("grouped", together)):
        start = time.perf_counter()
        update(), update()
        times[name].append((time.perf_counter() - start) / 2)
for name, t in times.items():
    print(f"{name}: " + ", ".join(f"{s:.2f} s" for s in t))
