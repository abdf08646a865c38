"""The HyPER actor update of mbirl_antmaze.py (TD3+BC, the maze defaults: batch 256 = 128 model rollouts + 128 expert
transitions, 20 updates per real step, relabelled by the discriminator) three ways, in one process on one device:

  per-update   each update draws its two minibatches and relabels them (the script before 2026-11-27: two host-to-
               device index copies, i.e. two syncs, per update), eager
  batched      a real step's 20 minibatches drawn and relabelled at once (the script now), eager
  graphs       batched, and each update replayed as a CUDA graph (the script now on a GPU; CUDA only)

It first checks that the graphed update computes what the eager one does (same weights and batches, policy noise 0:
the largest parameter difference after 12 updates), then times each way for SECONDS (default 8) after a warm-up,
alternating twice. Random data of AntMaze's shapes (31-D observations, 8-D actions); the rates do not depend on
the values. Run it alone:
    python benchmarks/mbirl_actor_update.py            # or: python3 ... on the GPU machine (benchmarks/gpu.sh)
Prints one JSON line per measurement (updates per second, the device, the torch version).
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import mbirl_antmaze as m  # noqa: E402

OBS, ACT, U = 31, 8, 20
SECONDS = float(os.environ.get("SECONDS_PER_WAY", 8))
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
args = m.ActorArgs(hidden=256, lr=3e-4, lr_decay=0)
gen = torch.Generator().manual_seed(0)
learner, expert = m.Buffer(OBS, ACT, 500_000, device), m.Buffer(OBS, ACT, 23_366, device)
for buf in (learner, expert):
    n = buf.capacity
    buf.add(torch.randn(n, OBS), torch.rand(n, ACT) * 2 - 1, torch.randn(n, OBS), torch.zeros(n))
disc = m.Discriminator(OBS + ACT).to(device)


def make_agent(graphs: bool) -> m.TD3BC:
    torch.manual_seed(1)
    agent = m.TD3BC(OBS, ACT, args, device)
    if not graphs:
        agent.graphs.enabled = False
    return agent


def per_update_step(agent: m.TD3BC) -> None:
    B = args.batch_size
    for _ in range(U):
        o, a, no, d = learner.sample(B // 2, gen)
        eo, ea, en, ed = expert.sample(B - B // 2, gen)
        o, a, no, d = torch.cat([o, eo]), torch.cat([a, ea]), torch.cat([no, en]), torch.cat([d, ed])
        with torch.no_grad():
            reward = -disc(torch.cat([o, a], -1))
        agent.update(o, a, no, d, reward)


def batches() -> list[torch.Tensor]:
    B, n = args.batch_size, args.batch_size // 2
    batch = [x.view(U, n, *x.shape[1:]) for x in learner.sample(U * n, gen)]
    ex = expert.sample(U * (B - n), gen)
    batch = [torch.cat([x, e.view(U, B - n, *e.shape[1:])], 1) for x, e in zip(batch, ex)]
    with torch.no_grad():
        return batch + [-disc(torch.cat(batch[:2], -1))]


def batched_step(agent: m.TD3BC) -> None:
    batch = batches()
    for u in range(U):
        agent.update(*(x[u] for x in batch))


def sync() -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def rate(step, agent) -> float:
    for _ in range(3):  # warm-up (and, for graphs, the captures)
        step(agent)
    sync()
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < SECONDS:
        step(agent)
        steps += 1
        if steps % 5 == 0:
            sync()
    sync()
    return steps * U / (time.perf_counter() - t0)


def check_graphs() -> float:
    """Largest |parameter difference| between eager and graphed TD3BC after 12 identical updates (no noise)."""
    saved = args.policy_noise
    args.policy_noise = 0.0
    eager, graphed = make_agent(False), make_agent(True)
    batch = [x.clone() for x in batches()]
    for u in range(12):
        for agent in (eager, graphed):
            agent.update(*(x[u] for x in batch))
    sync()
    args.policy_noise = saved
    pairs = zip(eager.state_dict()["critic"].values(), graphed.state_dict()["critic"].values())
    pairs = list(pairs) + list(zip(eager.actor.parameters(), graphed.actor.parameters()))
    return max(float((a - b).abs().max()) for a, b in pairs)


info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__}
if device.type == "cuda":
    diff = check_graphs()
    print(json.dumps({"check": "graphed vs eager, max |param diff| after 12 updates", "value": diff} | info))
ways = {"per-update": (per_update_step, False), "batched": (batched_step, False)}
if device.type == "cuda":
    ways["graphs"] = (batched_step, True)
for repeat in range(2):
    for name, (step, graphs) in ways.items():
        agent = make_agent(graphs)
        r = rate(step, agent)
        captured = agent.graphs is not None and len(agent.graphs.captured) == 2 and not agent.graphs.broken
        print(json.dumps({"way": name, "repeat": repeat, "updates_per_s": round(r, 1), "graphs": captured} | info))
        del agent
