#!/usr/bin/env bash
# Every number in docs/filter_irl_mujoco.md and benchmarks/results/filter_irl_mujoco.md comes from one of these commands.
# Run from the repository root with the venv active. CPU numbers depend on the machine's load (recorded by the harness).
# Usage: bash benchmarks/filter_irl_mujoco.sh {expert|irl|expert2|irl2|curves|curves2|throughput-expert|throughput-irl|throughput-cleanrl|profile|profile-ops|tests}
#        bash benchmarks/filter_irl_mujoco.sh {paper-expert|paper-expert-check|paper-irl filter|mm SEED|paper-records}
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EVID=runs/filter_evidence
EXPERT_STEPS=${EXPERT_STEPS:-20000}   # the reference trains 1M steps; this contended 2-core CPU fits 20k
IRL_STEPS=${IRL_STEPS:-20000}         # equal budget for FILTER and MM (the reference: 1M)
EVID2=runs/filter_evidence2           # evidence run 2: 100k-step expert, IRL2_STEPS learner steps per method
IRL2_STEPS=${IRL2_STEPS:-20000}
IRL_FLAGS=(--irl.train-every 1000 --eval.frequency 2500 --eval.episodes 5 --sac.learning-starts 2000 --disc.lr 8e-3 --disc.steps 5 --checkpoint-every 2500)

# Issue 44, item 4: Hopper-v5 at the paper's quality, as resumable background runs (the paper-* targets below).
# An expert of >= 3,000 (the paper's ~3,550) cached once in $PAPER_ROOT/experts, then FILTER, MM (here) and HyPE
# (benchmarks/hype_irl_mujoco.sh paper-irl) at 500k learner steps each (the paper: ~1M) on its demos. The env vars
# exist to check the plumbing on a tiny budget in a /tmp root; the real runs use the defaults.
# They run unattended in lane b of benchmarks/lanes.sh (after the Montezuma PPO run), in this order. By hand
# (niced, in the background; the same lines resume after a kill or a session's end):
#   mkdir -p runs/hopper_paper
#   nohup bash benchmarks/filter_irl_mujoco.sh paper-expert >> runs/hopper_paper/starts.log 2>&1 &  # first, once
#   nohup bash benchmarks/filter_irl_mujoco.sh paper-irl filter 1 >> runs/hopper_paper/starts.log 2>&1 &  # then two
#   nohup bash benchmarks/filter_irl_mujoco.sh paper-irl mm 1 >> runs/hopper_paper/starts.log 2>&1 &      # at a time
#   nohup bash benchmarks/hype_irl_mujoco.sh paper-irl 1 >> runs/hopper_paper/starts.log 2>&1 &
#   bash benchmarks/filter_irl_mujoco.sh paper-records   # at each check; commit benchmarks/results/hopper_paper/
# A kill: `kill -TERM PID` of the bash (passed on) or of its python: a checkpoint, exit 130.
PAPER_ROOT=${PAPER_ROOT:-runs/hopper_paper}                          # run dirs, logs and the expert cache
PAPER_RESULTS=${PAPER_RESULTS:-benchmarks/results/hopper_paper}      # where paper-records copies the small files
PAPER_EXPERTS=$PAPER_ROOT/experts                                    # the cache shared by all three methods
PAPER_EXPERT_STEPS=${PAPER_EXPERT_STEPS:-1000000}                    # the reference's; to be checked: >= 3,000?
PAPER_EXPERT_TARGET=${PAPER_EXPERT_TARGET:-3440}                     # stop early once an evaluation reaches it
PAPER_EXPERT_ACTOR=${PAPER_EXPERT_ACTOR:-$PAPER_RESULTS/expert/expert_actor.pt}  # committed: records the demos
PAPER_IRL_STEPS=${PAPER_IRL_STEPS:-500000}                           # learner env steps per method (the paper: ~1M)
EXPERT_MIN_RETURN=${EXPERT_MIN_RETURN:-3000}                         # the IRL runs refuse an expert below this
# Evaluation every 10k learner steps (10 deterministic episodes: a 50-point curve), a checkpoint every 10k env steps
# (a kill loses at most ~10k steps), scalars every 1,000 steps (small CSVs), one torch thread. The algorithm's
# settings are the scripts' defaults: one discriminator step (lr 8e-4 / k, the reference's) every 5,000 learner steps.
PAPER_FLAGS=(--env-id Hopper-v5 --torch-threads 1 --expert.experts-dir "$PAPER_EXPERTS" --checkpoint-every 10000
             --log-frequency 1000)
PAPER_IRL_FLAGS=("${PAPER_FLAGS[@]}" --irl.total-timesteps "$PAPER_IRL_STEPS" --eval.frequency 10000 --eval.episodes 10)

run_niced() {  # run_niced LOG CMD...: CMD at nice 19 with one OpenMP thread, its output appended to LOG; a SIGTERM or
  # SIGINT to this shell is passed on to CMD (which saves its checkpoint and exits 130); returns CMD's exit code
  local log=$1 child rc=0
  shift
  mkdir -p "$(dirname "$log")"
  echo "== $(date -u +%FT%TZ) $*" >> "$log"
  echo "logging to $log" >&2
  OMP_NUM_THREADS=1 nice -n 19 "$@" >> "$log" 2>&1 &
  child=$!
  trap 'kill -TERM "$child" 2>/dev/null || true' TERM INT
  wait "$child" || rc=$?
  while kill -0 "$child" 2>/dev/null; do  # the wait above was cut short by a signal: wait for CMD's own exit
    rc=0
    wait "$child" || rc=$?
  done
  trap - TERM INT
  return "$rc"
}

paper_expert_check() {  # print the cached expert's score from its expert_meta.json; exit 2 if missing or < the minimum
  python - "$PAPER_EXPERTS/Hopper-v5/expert_meta.json" "$EXPERT_MIN_RETURN" <<'PY'
import json, sys
from pathlib import Path
meta_path, need = Path(sys.argv[1]), float(sys.argv[2])
if not meta_path.is_file():
    print(f"error: no expert in {meta_path.parent}: run `bash benchmarks/filter_irl_mujoco.sh paper-expert` first "
          f"(the IRL runs need its demos, scoring >= {need:.0f})", file=sys.stderr)
    sys.exit(2)
m = json.loads(meta_path.read_text())
print(f"expert {meta_path.parent}: {m['expert_timesteps']:,} SAC steps, seed {m['seed']}, {m['num_demos']} "
      f"deterministic demos, return {m['return_mean']:.1f} +- {m['return_std']:.1f} (needed: >= {need:.0f})")
if not m["return_mean"] >= need:
    print(f"error: the expert scores {m['return_mean']:.1f} < {need:.0f}, below the paper's quality: move "
          f"{meta_path.parent} aside and re-run paper-expert with a larger PAPER_EXPERT_STEPS (it resumes from its "
          f"checkpoint), or with another seed in a fresh PAPER_ROOT", file=sys.stderr)
    sys.exit(2)
PY
}

paper_committed() {  # paper_committed RUN: exit 0 with a line when RUN finished and its records are committed in
  # $PAPER_RESULTS/RUN but this machine has no $PAPER_ROOT/RUN (a new machine: runs/ is not kept), so that a lane
  # goes on to its next run instead of redoing this one from nothing
  if [ -f "$PAPER_RESULTS/$1/results.json" ] && [ ! -d "$PAPER_ROOT/$1" ]; then
    echo "$1 finished: its records are committed in $PAPER_RESULTS/$1; nothing to run"
    exit 0
  fi
}

paper_claim() {  # paper_claim RUN: hold $PAPER_ROOT/RUN.lock while this shell runs RUN; when another lane holds it
  # (both lanes' queues can reach the same run), exit 0 with a line, and this lane goes on to its next run
  mkdir -p "$PAPER_ROOT"
  exec 8>> "$PAPER_ROOT/$1.lock"
  if ! flock -n 8; then
    echo "$1 is being run by another lane; nothing to do here"
    exit 0
  fi
}

# hype_irl_mujoco.sh's paper-irl sources this file for the definitions above (PAPER_*, run_niced, paper_expert_check)
if [ "${1:-}" = --definitions ] && (return 0 2>/dev/null); then return 0; fi
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
  paper-expert)  # [flags...] the SAC expert on the true reward, 64 deterministic demos into $PAPER_EXPERTS (once).
    # Budget: PAPER_EXPERT_STEPS (default 1M, the reference's; SAC usually reaches ~3,000 on Hopper there, not
    # always: the score printed at the end decides), or fewer: training stops at the first evaluation (5
    # deterministic episodes every 10k steps) whose mean reaches PAPER_EXPERT_TARGET, and that actor records the
    # demos. The default, 3,440: the first run started with 3,500 (the paper's expert scores ~3,550), but its
    # evaluations levelled off at 3,408-3,446 from 380k to 450k steps (apart from dips to 319 at 400k and 2,857 at
    # 420k), so at 457k steps it was stopped and resumed with 3,400 (still above the 3,000 the IRL runs need); it
    # stopped at once with the 450k actor (3,446). On 2026-11-29 a new machine had lost runs/: retrained from
    # nothing, seed 1 gave the same curve to the printed digit, and 3,440 stops it at that same 450k actor (3,400
    # would stop at 380k's 3,408). That actor is committed (PAPER_EXPERT_ACTOR): when it is there, this target
    # records the 64 demos with it (--expert.actor) instead of training SAC again.
    # Resumable: a SIGTERM to this shell (or to the python) saves a checkpoint and exits 130; the same command
    # resumes. Once the demos exist it starts nothing and prints the score (exit 2 when below EXPERT_MIN_RETURN).
    # Output: $PAPER_ROOT/expert.log. Flags after the target override these.
    shift
    mkdir -p "$PAPER_ROOT"
    exec 9>> "$PAPER_ROOT/expert.lock"
    flock 9  # one expert at a time: a second lane waits here, then finds the demos made
    if [ ! -f "$PAPER_EXPERTS/Hopper-v5/demos.npz" ] && [ -f "$PAPER_EXPERT_ACTOR" ]; then
      rc=0
      run_niced "$PAPER_ROOT/expert.log" python filter_irl_mujoco.py "${PAPER_FLAGS[@]}" --expert.only \
        --expert.actor "$PAPER_EXPERT_ACTOR" --seed 1 --run-dir "$PAPER_ROOT/expert_demos" "$@" || rc=$?
      [ "$rc" = 0 ] || exit "$rc"
    elif [ ! -f "$PAPER_EXPERTS/Hopper-v5/demos.npz" ]; then
      rc=0
      run_niced "$PAPER_ROOT/expert.log" python filter_irl_mujoco.py "${PAPER_FLAGS[@]}" --expert.only \
        --expert.timesteps "$PAPER_EXPERT_STEPS" --expert.target-return "$PAPER_EXPERT_TARGET" --seed 1 \
        --run-dir "$PAPER_ROOT/expert" "$@" || rc=$?
      [ "$rc" = 0 ] || exit "$rc"
    fi
    paper_expert_check
    ;;
  paper-expert-check)  # the cached expert's score; exit 2 (with the fix) when it is missing or below EXPERT_MIN_RETURN
    paper_expert_check
    ;;
  paper-irl)  # paper-irl {filter|mm} SEED [flags...]: FILTER (--irl.reset-prob 0.5) or MM (0, moment matching) for
    # PAPER_IRL_STEPS learner steps on the cached expert's demos, in $PAPER_ROOT/{filter|mm}_s<SEED>; refuses to start
    # (exit 2) unless the expert scores >= EXPERT_MIN_RETURN. SIGTERM: checkpoint, exit 130; the same command
    # resumes; a finished run exits 0, also on a new machine when its records are committed (paper_committed).
    # Output: $PAPER_ROOT/{filter|mm}_s<SEED>.log. At most two runs at a time.
    name=${2:?paper-irl filter|mm SEED}; seed=${3:?paper-irl filter|mm SEED}; shift 3
    case "$name" in filter) reset=0.5 ;; mm) reset=0 ;; *) echo "paper-irl: filter or mm, not $name" >&2; exit 2 ;; esac
    paper_committed "${name}_s$seed"
    paper_claim "${name}_s$seed"
    paper_expert_check
    dir="$PAPER_ROOT/${name}_s$seed"
    run_niced "$dir.log" python filter_irl_mujoco.py "${PAPER_IRL_FLAGS[@]}" --irl.reset-prob "$reset" --seed "$seed" \
      --run-dir "$dir" "$@"
    ;;
  paper-records)  # at any time (a run still going gives its curve so far): each paper run's small files into
    # $PAPER_RESULTS/<run>/ (expert, filter_s1, mm_s1, hype_s1, ...): curves.csv (charts/, eval/, irl/ and the
    # expert's episodes), args.json, learning_curve.png, results.json once finished, the trained expert's
    # expert_meta.json and expert_actor.pt (not those of a cache
    # recorded from the committed actor); then $PAPER_RESULTS/hopper_paper.png: true return (10 deterministic
    # episodes) against learner env steps, a run still going dotted and named so in the legend.
    for dir in "$PAPER_ROOT"/expert "$PAPER_ROOT"/filter_s* "$PAPER_ROOT"/mm_s* "$PAPER_ROOT"/hype_s*; do
      [ -f "$dir/args.json" ] || continue
      out="$PAPER_RESULTS/$(basename "$dir")"
      mkdir -p "$out"
      python benchmarks/tb_to_csv.py "$dir" "$out/curves.csv" --prefix charts/ --prefix eval/ --prefix irl/ \
        --prefix expert/episodic --prefix expert/eval || echo "$dir: no curve yet" >&2
      cp "$dir/args.json" "$out/"
      for f in learning_curve.png results.json; do
        if [ -f "$dir/$f" ]; then cp "$dir/$f" "$out/"; fi
      done
    done
    meta="$PAPER_EXPERTS/Hopper-v5/expert_meta.json"
    if [ -f "$meta" ] && python -c 'import json, sys; sys.exit(bool(json.load(open(sys.argv[1])).get("recorded_by_actor")))' "$meta"; then
      mkdir -p "$PAPER_RESULTS/expert" && cp "$meta" "$PAPER_EXPERTS/Hopper-v5/expert_actor.pt" "$PAPER_RESULTS/expert/"
    fi
    python - "$PAPER_RESULTS" <<'PY'
import csv, json, sys
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
root = Path(sys.argv[1])
# The paper's Hopper curves (IQM of 10 seeds), read off the reference's plot by benchmarks/digitize_paper_curves.py
# into the committed paper_curves.json; drawn dashed in the reference's colours, ours solid in the same colours.
paper = json.loads(Path("benchmarks/results/hopper_paper/paper_curves.json").read_text())
names = {"filter": "FILTER", "hype": "HyPE", "mm": "MM"}
colour = {"filter": "#724BA1", "hype": "#F79646", "mm": "grey"}
fig, ax = plt.subplots(figsize=(7, 4.2), dpi=80)
for method, name in names.items():
    pts = [(x, y) for x, y in zip(paper["x"], paper[method]) if y is not None]
    ax.plot(*zip(*pts), color=colour[method], ls="--", lw=1, alpha=0.8, label=f"paper's {name} (10 seeds, IQM)")
drawn = 0
table = ["| run | learner env steps | last evaluation (10 episodes) | mean of the last 5 evaluations | best evaluation | "
         "paper's IQM at the nearest 50k steps (10 seeds) | final evaluation (results.json) |", "|---|---|---|---|---|---|---|"]
finished = {}  # method -> [(seed, evaluation curve, results.json)] of the runs that have finished
for run in sorted(root.glob("*_s*")):
    if not (run / "curves.csv").is_file():
        continue
    with open(run / "curves.csv") as f:
        pts = [(int(r["step"]), float(r["value"])) for r in csv.DictReader(f) if r["tag"] == "eval/episodic_return"]
    if pts:
        method, seed = run.name.rsplit("_s", 1)
        res = json.loads((run / "results.json").read_text()) if (run / "results.json").is_file() else None
        ax.plot(*zip(*pts), marker=".", ms=3, lw=0.8, alpha=0.7, color=colour.get(method), ls="-" if res else ":",
                label=f"{names.get(method, method)} seed {seed}" + ("" if res else ", running (dotted)"))
        drawn += 1
        step, last = pts[-1]
        tail = [v for _, v in pts[-5:]]
        near = [(abs(x - step), y) for x, y in zip(paper["x"], paper.get(method, [])) if y is not None]
        theirs = f"{min(near)[1]:,}" if near else "-"  # the paper's point nearest our last evaluation
        final = "running" if res is None else f"{res['eval_mean']:.0f} ± {res['eval_std']:.0f} ({len(res['eval_returns'])} episodes)"
        table.append(f"| {names.get(method, method)} s{seed} | {step:,} | {last:.0f} | {sum(tail) / len(tail):.0f} | "
                     f"{max(v for _, v in pts):.0f} | {theirs} | {final} |")
        if res is not None:
            finished.setdefault(method, []).append((seed, pts, res))
# Where two or more seeds of a method have finished: their mean curve (at the evaluations they all have), thick, and
# a row with the mean over seeds of each column (the final column: the mean of their final evaluations, each seed's
# beside it; the best evaluation is a per-seed maximum, so it has no mean).
for method, runs in finished.items():
    if len(runs) < 2:
        continue
    curves = [dict(pts) for _, pts, _ in runs]
    common = sorted(set.intersection(*(set(curve) for curve in curves)))
    mean = [sum(curve[x] for curve in curves) / len(runs) for x in common]
    ax.plot(common, mean, lw=2.2, color=colour.get(method), label=f"{names.get(method, method)}, mean of {len(runs)} seeds")
    tails = [sum(v for _, v in pts[-5:]) / len(pts[-5:]) for _, pts, _ in runs]
    near = [(abs(x - common[-1]), y) for x, y in zip(paper["x"], paper.get(method, [])) if y is not None]
    finals = ", ".join(f"s{seed} {res['eval_mean']:.0f}" for seed, _, res in runs)
    final = sum(res["eval_mean"] for _, _, res in runs) / len(runs)
    table.append(f"| {names.get(method, method)}, mean of {len(runs)} seeds | {common[-1]:,} | {mean[-1]:.0f} | "
                 f"{sum(tails) / len(tails):.0f} | - | {f'{min(near)[1]:,}' if near else '-'} | {final:.0f} ({finals}) |")
meta = root / "expert" / "expert_meta.json"
if meta.is_file():
    m = json.loads(meta.read_text())
    ax.axhline(m["return_mean"], color="k", ls=":", label=f"our expert ({m['num_demos']} demos)")
ax.axhline(paper["expert"][0], color="green", ls="--", lw=0.8, label=f"paper's expert (~{paper['expert'][0]:,})")
ax.set_xlabel("learner env steps"); ax.set_ylabel("true return (deterministic evaluation)")
ax.set_title("Hopper-v5: FILTER, HyPE and MM; dashed: the paper's (Hopper-v3, read off its plot)", fontsize=9)
if drawn:
    ax.legend(fontsize=7); fig.tight_layout(); fig.savefig(root / "hopper_paper.png")
    (root / "hopper_table.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
print(f"{drawn} learning curves -> {root / 'hopper_paper.png' if drawn else 'no figure (no evaluations yet)'}")
PY
    ;;
  tests)
    /usr/bin/time -f "%e s wall" python -m pytest tests/test_filter_irl_mujoco.py -q -p no:cacheprovider
    ;;
  *) echo "usage: $0 {expert|irl|expert2|irl2|curves|curves2|throughput-expert|throughput-irl|throughput-cleanrl|profile|\
profile-ops|tests|paper-expert|paper-expert-check|paper-irl|paper-records}" >&2; exit 2 ;;
esac
