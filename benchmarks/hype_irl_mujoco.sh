#!/usr/bin/env bash
# Every number in docs/hype_irl_mujoco.md and benchmarks/results/hype_irl_mujoco.md comes from these commands.
# Run from the repository root with the venv active. On the shared 2-core machine everything ran under `nice -n 15`.
set -euo pipefail

# Issue 44, item 4: HyPE on Hopper-v5 at the paper's quality, beside FILTER and MM (benchmarks/filter_irl_mujoco.sh
# paper-*): the same expert cache ($PAPER_ROOT/experts, made once by `filter_irl_mujoco.sh paper-expert`), the same
# budget (PAPER_IRL_STEPS, default 500k learner steps; the paper: ~1M), evaluation (every 10k steps, 10 episodes),
# checkpoints (every 10k), nice 19 and one torch thread; HyPE's own settings are the script's defaults (rho per env,
# no expert resets). The env vars (PAPER_ROOT, PAPER_IRL_STEPS, EXPERT_MIN_RETURN, ...) are filter_irl_mujoco.sh's.
#   bash benchmarks/hype_irl_mujoco.sh paper-irl SEED [flags...]  # refuses (exit 2) unless the expert scores >= 3,000;
#       SIGTERM: checkpoint, exit 130; the same command resumes (a finished run: exit 0, also on a new machine when
#       its records are committed).
#       Its output: $PAPER_ROOT/hype_s<SEED>.log
#   bash benchmarks/hype_irl_mujoco.sh paper-records   # = filter_irl_mujoco.sh paper-records (all three methods)
# Without an argument this file runs the earlier evidence commands below, as before.
case "${1:-}" in
  paper-irl)
    cd "$(dirname "$0")/.."
    seed=${2:?paper-irl SEED}; shift 2
    source benchmarks/filter_irl_mujoco.sh --definitions  # PAPER_* settings, run_niced, paper_expert_check
    paper_committed "hype_s$seed"
    paper_claim "hype_s$seed"
    paper_expert_check
    dir="$PAPER_ROOT/hype_s$seed"
    run_niced "$dir.log" python hype_irl_mujoco.py "${PAPER_IRL_FLAGS[@]}" --seed "$seed" --run-dir "$dir" "$@"
    exit 0
    ;;
  paper-records)
    exec bash "$(dirname "$0")/filter_irl_mujoco.sh" paper-records
    ;;
  "") ;;
  *) echo "usage: $0 [paper-irl SEED [flags...] | paper-records] (no argument: the evidence commands)" >&2; exit 2 ;;
esac

OUT=runs/hype_evidence
FILTER_OUT=runs/filter_evidence   # FILTER and MM runs of benchmarks/filter_irl_mujoco.sh (same demos, flags, seed)
# The same protocol and flags as the FILTER/MM runs of benchmarks/filter_irl_mujoco.sh (runs/filter_evidence/
# hopper_{filter,mm}): equal budget of 20,000 policy env steps, a discriminator update (5 steps at lr0 8e-3 / k,
# larger than the reference's 1 step at 8e-4 because the budget is 50x smaller) every 1,000 steps, evaluation every
# 2,500 steps (5 deterministic episodes), 2,000 random steps first, seed 1.
IRL_FLAGS=(--env-id Hopper-v5 --seed 1 --irl.total-timesteps 20000 --irl.train-every 1000 --eval.frequency 2500
           --eval.episodes 5 --sac.learning-starts 2000 --disc.lr 8e-3 --disc.steps 5 --checkpoint-every 2500)

# 0. (EVIDENCE2=1 only) Evidence run 2 (third session): HyPE on the demos of the 100k-step expert in runs/filter_evidence2/experts
#     (`bash benchmarks/filter_irl_mujoco.sh expert2`), the same flags and budget as FILTER/MM's `irl2`, run beside them.
if [ "${EVIDENCE2:-0}" = 1 ]; then
  mkdir -p runs/hype_evidence2
  nice -n 10 python hype_irl_mujoco.py "${IRL_FLAGS[@]}" --irl.total-timesteps "${IRL2_STEPS:-20000}" \
    --torch-threads 1 --expert.experts-dir runs/filter_evidence2/experts --run-dir runs/hype_evidence2/hopper_hype \
    > runs/hype_evidence2/hopper_hype.log 2>&1
  exit 0
fi

# 1. Expert data: the shared cache experts/Hopper-v5/ written by `bash benchmarks/filter_irl_mujoco.sh expert`
#    (SAC expert, 20,000 steps on this machine, 64 deterministic demos). Either script writes the same format.
test -f experts/Hopper-v5/demos.npz

# 2. HyPE on the same demos (FILTER and MM: `bash benchmarks/filter_irl_mujoco.sh irl`, run at the same time).
mkdir -p $OUT
nice -n 15 python hype_irl_mujoco.py "${IRL_FLAGS[@]}" --run-dir $OUT/hopper_hype > $OUT/hopper_hype.log 2>&1

# 3. Table and plot from the runs' TensorBoard events (eval/episodic_return at equal policy steps).
python - <<'EOF'
import json
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

meta = json.loads(Path("experts/Hopper-v5/expert_meta.json").read_text())
expert = meta.get("return_mean")
curves = {}
runs = {"HyPE (rho 0.2->0.19)": "runs/hype_evidence/hopper_hype", "FILTER (reset 0.5)": "runs/filter_evidence/hopper_filter",
        "MM (reset 0)": "runs/filter_evidence/hopper_mm"}
for label, run in runs.items():
    ea = EventAccumulator(run); ea.Reload()
    curves[label] = [(e.step, e.value) for e in ea.Scalars("eval/episodic_return")]
fig, ax = plt.subplots(figsize=(6, 4), dpi=90)
for label, pts in curves.items():
    ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", label=label)
ax.axhline(expert, color="k", ls=":", label=f"expert demos ({expert:.0f})")
ax.set_xlabel("policy env steps"); ax.set_ylabel("true return (5 deterministic episodes)")
ax.set_title("Hopper-v5, equal budgets, seed 1"); ax.legend(fontsize=8); fig.tight_layout()
Path("docs/assets/hype_irl_mujoco").mkdir(parents=True, exist_ok=True)
fig.savefig("docs/assets/hype_irl_mujoco/hopper_hype_filter_mm.png")
steps = sorted({s for pts in curves.values() for s, _ in pts})
print("| policy env steps | " + " | ".join(curves) + " |")
print("|---" * (len(curves) + 1) + "|")
for s in steps:
    print(f"| {s:,} | " + " | ".join(next((f"{v:.0f}" for t, v in pts if t == s), "–") for pts in curves.values()) + " |")
for label, run in runs.items():
    res = Path(run) / "results.json"
    if res.exists():
        r = json.loads(res.read_text())
        print(label, {k: r.get(k) for k in ("eval_mean", "eval_std", "policy_env_steps", "disc_env_steps", "SPS")})
EOF

# 3b. What the final policies do: episode length, return and forward displacement (2 episodes, no trembling hand).
python -c '
import numpy as np, torch, hype_irl_mujoco as h
env, H = h.make_env("Hopper-v5")
actors = {"MM": torch.load("runs/filter_evidence/hopper_mm/actor.pt", weights_only=False)["actor"],
          "FILTER": torch.load("runs/filter_evidence/hopper_filter/actor.pt", weights_only=False)["actor"],
          "HyPE": torch.load("runs/hype_evidence/hopper_hype/hype_irl_mujoco.cleanrl_model", weights_only=False)}
for name, sd in actors.items():
    a = h.Actor(11, 3, env.action_space.low, env.action_space.high); a.load_state_dict(sd)
    for ep in range(2):
        o, _ = env.reset(seed=10001 + ep); x0 = env.unwrapped.data.qpos[0]; R = 0.0
        for t in range(H):
            with torch.no_grad():
                o, r, te, _, _ = env.step(a.get_action(torch.tensor(o, dtype=torch.float32)[None])[2][0].numpy())
            R += r
            if te:
                break
        print(name, "len", t + 1, "return", round(R, 1), "x displacement", round(env.unwrapped.data.qpos[0] - x0, 2))
d = np.load("experts/Hopper-v5/demos.npz")
print("demos x displacement", [round(float(d["qpos"][d["episode_ids"] == e][-1, 0] - d["qpos"][d["episode_ids"] == e][0, 0]), 2) for e in range(3)])'

# 4. Throughput (IRL phase) with the foundation's harness. The recorded run used a throwaway cache of 64
#    random-policy Hopper episodes (the speed does not depend on the demos' quality; the real demos were not ready).
python -c '
import numpy as np, hype_irl_mujoco as h
from pathlib import Path
rng = np.random.default_rng(0)
demos = h.collect_demos("Hopper-v5", lambda o: rng.uniform(-1, 1, 3), 64)
Path("/tmp/hx/hexp/Hopper-v5").mkdir(parents=True, exist_ok=True)
np.savez_compressed("/tmp/hx/hexp/Hopper-v5/demos.npz", **demos)'
nice -n 15 python benchmarks/throughput.py mujoco --env-id Hopper-v5 --seconds 20 --train-seconds 180 --label hype-irl \
    -- python hype_irl_mujoco.py --env-id Hopper-v5 --expert.experts-dir /tmp/hx/hexp --sac.learning-starts 1000 --log-frequency 100

# 5. Test-suite runtime of this script's tests.
time python -m pytest tests/test_hype_irl_mujoco.py -q -p no:cacheprovider
