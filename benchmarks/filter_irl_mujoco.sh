#!/usr/bin/env bash
# Every number in docs/filter_irl_mujoco.md and benchmarks/results/filter_irl_mujoco.md comes from one of these commands.
# Run from the repository root with the venv active. CPU numbers depend on the machine's load (recorded by the harness).
# Usage: bash benchmarks/filter_irl_mujoco.sh {expert|irl|expert2|irl2|curves|curves2|throughput-expert|throughput-irl|throughput-cleanrl|profile|profile-ops|tests}
set -euo pipefail
cd "$(dirname "$0")/.."
EVID=runs/filter_evidence
EXPERT_STEPS=${EXPERT_STEPS:-20000}   # the reference trains 1M steps; this contended 2-core CPU fits 20k
IRL_STEPS=${IRL_STEPS:-20000}         # equal budget for FILTER and MM (the reference: 1M)
EVID2=runs/filter_evidence2           # evidence run 2: 100k-step expert, IRL2_STEPS learner steps per method
IRL2_STEPS=${IRL2_STEPS:-20000}
IRL_FLAGS=(--irl.train-every 1000 --eval.frequency 2500 --eval.episodes 5 --sac.learning-starts 2000 --disc.lr 8e-3 --disc.steps 5 --checkpoint-every 2500)

case "${1:-}" in
  expert)  # SAC expert on the true reward + 64 deterministic demos, cached in experts/Hopper-v5/ (shared with HyPE).
    # Recorded run: started with --expert.timesteps 60000, stopped (SIGTERM) at 12,889 steps and resumed with the
    # same --run-dir and a smaller budget (30000, then 20000) when the machine's load made 60k impossible.
    nice -n 15 python filter_irl_mujoco.py --env-id Hopper-v5 --expert.only --expert.timesteps "$EXPERT_STEPS" \
      --seed 1 --run-dir $EVID/hopper_expert
    ;;
  irl)  # FILTER (reset 0.5) and MM (reset 0) at equal budgets on the cached demos, run side by side.
    nice -n 15 python filter_irl_mujoco.py --env-id Hopper-v5 --irl.reset-prob 0.5 --irl.total-timesteps "$IRL_STEPS" \
      "${IRL_FLAGS[@]}" --seed 1 --run-dir $EVID/hopper_filter > $EVID/hopper_filter.log 2>&1 &
    nice -n 15 python filter_irl_mujoco.py --env-id Hopper-v5 --irl.reset-prob 0 --irl.total-timesteps "$IRL_STEPS" \
      "${IRL_FLAGS[@]}" --seed 1 --run-dir $EVID/hopper_mm > $EVID/hopper_mm.log 2>&1 &
    wait
    ;;
  expert2)  # evidence run 2 (third session): a 100k-step SAC expert in its own cache (the 20k one stays in experts/)
    nice -n 10 python filter_irl_mujoco.py --env-id Hopper-v5 --expert.only --expert.timesteps 100000 --seed 1 \
      --torch-threads 1 --expert.experts-dir $EVID2/experts --run-dir $EVID2/hopper_expert > $EVID2/hopper_expert.log 2>&1
    ;;
  irl2)  # evidence run 2: FILTER and MM at equal budgets (IRL2_STEPS) on the 100k expert's demos, side by side
    for r in "filter 0.5" "mm 0"; do set -- $r
      nice -n 10 python filter_irl_mujoco.py --env-id Hopper-v5 --irl.reset-prob "$2" --irl.total-timesteps "$IRL2_STEPS" \
        "${IRL_FLAGS[@]}" --torch-threads 1 --expert.experts-dir $EVID2/experts --seed 1 \
        --run-dir $EVID2/hopper_$1 > $EVID2/hopper_$1.log 2>&1 &
    done
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
  curves2)  # evidence run 2: FILTER, MM and HyPE (hype_irl_mujoco.sh with EVIDENCE2=1) on one plot, plus a table
    python - <<'EOF'
import json, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
runs = {"FILTER (reset 0.5)": "runs/filter_evidence2/hopper_filter", "MM (reset 0)": "runs/filter_evidence2/hopper_mm",
        "HyPE": "runs/hype_evidence2/hopper_hype"}
fig, ax = plt.subplots(figsize=(6.4, 4), dpi=80)
for name, d in runs.items():
    r = json.load(open(f"{d}/results.json"))
    h = r["history"]
    steps = [e.get("policy_steps", e.get("step")) for e in h]
    ax.plot(steps, [e["mean"] for e in h], marker="o", label=name)
    print(f"| {name} | " + " | ".join(f"{e['mean']:.0f}" for e in h) + f" | {r['eval_mean']:.0f} ± {r['eval_std']:.0f} | "
          f"{r['normalized_return']:.2f} | {r['total_env_steps']:,} ({r['disc_env_steps']:,} disc.) |")
ax.axhline(r["expert_return"], color="k", ls=":", label="expert (64 demos)")
ax.set_xlabel("learner env steps"); ax.set_ylabel("true return (5 deterministic episodes)")
ax.set_title("Hopper-v5, 100k-step SAC expert, seed 1"); ax.legend(fontsize=8); fig.tight_layout()
fig.savefig("docs/assets/filter_irl_mujoco/hopper_evidence2.png")
EOF
    ;;
  throughput-expert)  # expert SAC phase: raw Hopper-v5 steps/s vs expert/SPS (empty experts dir -> expert phase)
    python benchmarks/throughput.py mujoco --env-id Hopper-v5 --seconds 20 --train-seconds "${TRAIN_SECONDS:-150}" --tag expert/SPS \
      --label "filter-expert-threads${THREADS:-1}" -- python filter_irl_mujoco.py --env-id Hopper-v5 --expert.experts-dir "$(mktemp -d)" \
      --expert.only --sac.learning-starts 1000 --torch-threads "${THREADS:-1}"
    ;;
  throughput-irl)  # IRL phase (relabelling, discriminator rollouts and updates) on the cached demos
    python benchmarks/throughput.py mujoco --env-id Hopper-v5 --seconds 20 --train-seconds "${TRAIN_SECONDS:-150}" \
      --label "filter-irl-threads${THREADS:-1}" -- python filter_irl_mujoco.py --env-id Hopper-v5 --sac.learning-starts 1000 --irl.train-every 1000 --torch-threads "${THREADS:-1}"
    ;;
  throughput-cleanrl)  # the baseline in the same window: CleanRL's sac_continuous_action.py at a pinned commit, patched
    # only to import SB3's ReplayBuffer (cleanrl_utils' is a copy of it) and for gymnasium 1.x (no final_observation
    # key: next_obs already is the final observation). Needs network access once. Compare train_sps_slope.
    C=runs/baselines/cleanrl; mkdir -p $C
    if [ ! -f $C/sac_continuous_action.py ]; then
      curl -fsSL -o $C/sac_continuous_action.py \
        https://raw.githubusercontent.com/vwxyzjn/cleanrl/004f8a086a892a2a180f4dd332b90d83a968aa7a/cleanrl/sac_continuous_action.py
      sed -i 's/^from cleanrl_utils.buffers import ReplayBuffer$/from stable_baselines3.common.buffers import ReplayBuffer/;
              s/real_next_obs\[idx\] = infos\["final_observation"\]\[idx\]/pass  # gymnasium 1.x: next_obs is the final observation/' \
        $C/sac_continuous_action.py
      pip install --no-deps --target runs/baselines/sb3 stable-baselines3
    fi
    PYTHONPATH="$PWD/runs/baselines/sb3" python benchmarks/throughput.py mujoco --env-id Hopper-v5 --seconds 10 \
      --train-seconds "${TRAIN_SECONDS:-150}" --in-run-dir --label cleanrl-sac -- python "$PWD/$C/sac_continuous_action.py" --env-id Hopper-v5
    ;;
  profile)  # ms per SAC critic / actor update (batch 256, Hopper sizes) at THREADS torch threads (docs: detail 9)
    THREADS=${THREADS:-1} python - <<'PY'
import os, time, numpy as np, torch
torch.set_num_threads(int(os.environ["THREADS"]))
import filter_irl_mujoco as m
dev = torch.device("cpu")
agent = m.SAC(m.EnvInfo(11, 3, -np.ones(3), np.ones(3)), m.SACArgs(), dev)
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
  profile-ops)  # third session's numbers: sgemm GFLOP/s at SAC shapes, torch.profiler op table of 50 SAC steps,
    # and eager vs torch.compile'd loss functions (ms per step, 3 x 200 steps each), 2 threads
    python - <<'PY'
import time, numpy as np, torch
torch.set_num_threads(2)
import filter_irl_mujoco as m
for n in (256, 512, 1024):
    a, b, c = torch.randn(n, 256), torch.randn(256, 256), torch.empty(n, 256)
    for _ in range(50): torch.mm(a, b, out=c)
    t = time.perf_counter()
    for _ in range(500): torch.mm(a, b, out=c)
    print(f"mm {n}x256x256: {2 * n * 256 * 256 / ((time.perf_counter() - t) / 500) / 1e9:.0f} GFLOP/s")
agent = m.SAC(m.EnvInfo(11, 3, -np.ones(3), np.ones(3)), m.SACArgs(), torch.device("cpu"))
rb = m.ReplayBuffer(11, 3, 10000, torch.device("cpu"), True)
for _ in range(3000):
    rb.add(np.random.randn(11), np.random.randn(3), np.random.randn(11), False, 1.0)
b = rb.sample(256)
def eager():
    agent.update_critic(*b[:4], b[4], False); agent.update_actor(b[0]); agent.update_target()
def critic_loss(obs, actions, next_obs, dones, rewards):
    alpha = agent.log_alpha.detach().exp()
    with torch.no_grad():
        na, nlp, _ = agent.actor.get_action(next_obs)
        target = m.soft_q_target(rewards, dones, agent.qf_target(next_obs, na).min(0).values, nlp, alpha, agent.cfg.gamma)
    return (agent.qf(obs, actions) - target).pow(2).mean(1).sum()
def actor_loss(obs):
    actions, log_prob, _ = agent.actor.get_action(obs)
    q = agent.qf(obs, actions).min(0).values  # critic grads are cleared by the next critic step
    alpha_loss = (-agent.log_alpha.exp() * (log_prob.detach() + agent.target_entropy)).mean()
    return (agent.log_alpha.detach().exp() * log_prob - q).mean() + alpha_loss
cl, al = torch.compile(critic_loss), torch.compile(actor_loss)
def compiled():
    loss = cl(*b[:4], b[4]); agent.q_optimizer.zero_grad(); loss.backward(); agent.q_optimizer.step()
    loss = al(b[0]); agent.actor_optimizer.zero_grad(); agent.alpha_optimizer.zero_grad(); loss.backward()
    agent.actor_optimizer.step(); agent.alpha_optimizer.step(); agent.update_target()
from torch.profiler import profile
for _ in range(30): eager()
with profile() as prof:
    for _ in range(50): eager()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
for name, f in (("eager", eager), ("compiled losses", compiled)):
    for _ in range(30): f()
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(200): f()
        print(f"{name}: {(time.perf_counter() - t) * 5:.2f} ms per SAC step")
PY
    ;;
  tests)
    /usr/bin/time -f "%e s wall" python -m pytest tests/test_filter_irl_mujoco.py -q -p no:cacheprovider
    ;;
  *) echo "usage: $0 {expert|irl|expert2|irl2|curves|curves2|throughput-expert|throughput-irl|throughput-cleanrl|profile|profile-ops|tests}" >&2; exit 2 ;;
esac
