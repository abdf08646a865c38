#!/usr/bin/env bash
# Every number in docs/filter_irl_mujoco.md and benchmarks/results/filter_irl_mujoco.md comes from one of these commands.
# Run from the repository root with the venv active. CPU numbers depend on the machine's load (recorded by the harness).
# Usage: bash benchmarks/filter_irl_mujoco.sh {expert|irl|curves|throughput-expert|throughput-irl|profile|tests}
set -euo pipefail
cd "$(dirname "$0")/.."
EVID=runs/filter_evidence
EXPERT_STEPS=${EXPERT_STEPS:-20000}   # the reference trains 1M steps; this contended 2-core CPU fits 20k
IRL_STEPS=${IRL_STEPS:-20000}         # equal budget for FILTER and MM (the reference: 1M)
IRL_FLAGS=(--train-every 1000 --eval-frequency 2500 --eval-episodes 5 --learning-starts 2000 --disc-lr 8e-3 --disc-steps 5 --checkpoint-frequency 2500)

case "${1:-}" in
  expert)  # SAC expert on the true reward + 64 deterministic demos, cached in experts/Hopper-v5/ (shared with HyPE).
    # Recorded run: started with --expert-timesteps 60000, stopped (SIGTERM) at 12,889 steps and resumed with the
    # same --run-dir and a smaller budget (30000, then 20000) when the machine's load made 60k impossible.
    nice -n 15 python filter_irl_mujoco.py --env-id Hopper-v5 --expert-only --expert-timesteps "$EXPERT_STEPS" \
      --seed 1 --run-dir $EVID/hopper_expert
    ;;
  irl)  # FILTER (reset 0.5) and MM (reset 0) at equal budgets on the cached demos, run side by side.
    nice -n 15 python filter_irl_mujoco.py --env-id Hopper-v5 --reset-prob 0.5 --total-timesteps "$IRL_STEPS" \
      "${IRL_FLAGS[@]}" --seed 1 --run-dir $EVID/hopper_filter > $EVID/hopper_filter.log 2>&1 &
    nice -n 15 python filter_irl_mujoco.py --env-id Hopper-v5 --reset-prob 0 --total-timesteps "$IRL_STEPS" \
      "${IRL_FLAGS[@]}" --seed 1 --run-dir $EVID/hopper_mm > $EVID/hopper_mm.log 2>&1 &
    wait
    ;;
  curves)  # the PNGs in docs/assets/filter_irl_mujoco/ from the two runs' results.json
    python - <<'EOF'
import json, os, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
runs = {"FILTER (reset 0.5)": "runs/filter_evidence/hopper_filter", "MM (reset 0)": "runs/filter_evidence/hopper_mm"}
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=80)
for name, d in runs.items():
    r = json.load(open(f"{d}/results.json"))
    h = [e for e in r["history"] if e["policy_steps"] <= int(os.environ.get("MAX_STEP", 10**9))]
    axes[0].plot([e["policy_steps"] for e in h], [e["mean"] for e in h], marker="o", label=name)
    axes[1].plot([e["total_env_steps"] for e in h], [e["mean"] for e in h], marker="o", label=name)
for ax, xl in zip(axes, ["learner env steps", "all env steps (incl. discriminator rollouts)"]):
    ax.axhline(r["expert_return"], color="k", ls=":", label="expert (64 demos)")
    ax.set_xlabel(xl); ax.set_ylabel("true return (5 deterministic episodes)")
axes[0].legend(fontsize=8); fig.suptitle("Hopper-v5, seed 1"); fig.tight_layout()
fig.savefig("docs/assets/filter_irl_mujoco/hopper_filter_vs_mm.png")
EOF
    ;;
  throughput-expert)  # expert SAC phase: raw Hopper-v5 steps/s vs expert/SPS (empty experts dir -> expert phase)
    python benchmarks/throughput.py mujoco --env-id Hopper-v5 --seconds 20 --train-seconds "${TRAIN_SECONDS:-150}" --tag expert/SPS \
      --label "filter-expert-threads${THREADS:-1}" -- python filter_irl_mujoco.py --env-id Hopper-v5 --experts-dir "$(mktemp -d)" \
      --expert-only --learning-starts 1000 --threads "${THREADS:-1}"
    ;;
  throughput-irl)  # IRL phase (relabelling, discriminator rollouts and updates) on the cached demos
    python benchmarks/throughput.py mujoco --env-id Hopper-v5 --seconds 20 --train-seconds "${TRAIN_SECONDS:-150}" \
      --label "filter-irl-threads${THREADS:-1}" -- python filter_irl_mujoco.py --env-id Hopper-v5 --learning-starts 1000 --train-every 1000 --threads "${THREADS:-1}"
    ;;
  profile)  # ms per SAC critic / actor update (batch 256, Hopper sizes) at THREADS torch threads (docs: detail 9)
    THREADS=${THREADS:-1} python - <<'PY'
import os, time, numpy as np, torch
torch.set_num_threads(int(os.environ["THREADS"]))
import filter_irl_mujoco as m
dev = torch.device("cpu")
agent = m.SAC(11, 3, -np.ones(3), np.ones(3), m.Args(), dev)
rb = m.ReplayBuffer(11, 3, 10000, dev, True)
for _ in range(3000):
    rb.add(np.random.randn(11), np.random.randn(3), np.random.randn(11), False, 1.0)
b = rb.sample(256)
def ms(f, n=100):
    f(); t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n * 1e3
print(f"threads {torch.get_num_threads()}: critic {ms(lambda: agent.update_critic(*b[:4], b[4], False)):.1f} ms, "
      f"actor {ms(lambda: agent.update_actor(b[0])):.1f} ms, load {os.getloadavg()[0]:.1f}")
PY
    ;;
  tests)
    /usr/bin/time -f "%e s wall" python -m pytest tests/test_filter_irl_mujoco.py -q -p no:cacheprovider
    ;;
  *) echo "usage: $0 {expert|irl|curves|throughput-expert|throughput-irl|profile|tests}" >&2; exit 2 ;;
esac
