#!/usr/bin/env bash
# Every number in docs/rnd_ppo_atari.md and benchmarks/results/rnd_ppo_atari.md comes from one of these commands.
# Run from the repository root with the venv active. CPU numbers depend on the machine's load (recorded by the harness).
# Flags as the script spells them now (nested groups, issue 17); the recorded runs used the earlier flat spelling
# of the same settings (--num-envs, --int-coef, ...). The records below were made on ale-py's C++ vector env:
# --env.no-track-rooms keeps them on it (the default on Montezuma now steps RoomEnvs, to count rooms in training).
set -euo pipefail
cd "$(dirname "$0")/.."

throughput() {  # throughput LABEL NUM_ENVS TRAIN_SECONDS [script args...]
  local label=$1 n=$2 secs=$3; shift 3
  python benchmarks/throughput.py atari --env-id MontezumaRevengeNoFrameskip-v4 --num-envs "$n" --seconds 20 \
    --train-seconds "$secs" --label "$label" -- \
    python rnd_ppo_atari.py --env-id MontezumaRevengeNoFrameskip-v4 --ppo.num-envs "$n" --no-progress-bar \
      --env.no-track-rooms "$@"
}

case "${1:-}" in
  throughput-8)  # 8 envs x 128 steps: RND, then the same with --rnd.int-coef 0 (no RND networks: their cost); short warm-up
    throughput rnd 8 240 --rnd.num-iterations-obs-norm-init 1
    throughput rnd-int-coef-0 8 240 --rnd.num-iterations-obs-norm-init 1 --rnd.int-coef 0
    ;;
  throughput-128)  # the paper's 128 envs (warm-up skipped). On a quiet machine or a GPU use the full 128-step
    # rollout: the quiet-CPU number in the docs (212 SPS) is NUM_STEPS=128 SECONDS_128=420. On the contended 2-core CPU a 16,384-step iteration takes over 10 minutes, so the
    # recorded CPU run used --ppo.num-steps 16 (2,048 steps per iteration) to fit three iterations (SPS is logged from the
    # second) in a 720 s window. Per-step costs are linear in num_steps x num_envs, so SPS barely depends on it.
    throughput rnd-128envs 128 "${SECONDS_128:-720}" --rnd.num-iterations-obs-norm-init 0 --ppo.num-steps "${NUM_STEPS:-16}"
    ;;
  throughput-128-int0)
    throughput rnd-128envs-int-coef-0 128 "${SECONDS_128:-720}" --rnd.num-iterations-obs-norm-init 0 --ppo.num-steps "${NUM_STEPS:-16}" --rnd.int-coef 0
    ;;
  warmup)  # the paper's observation-normalisation warm-up: 50 x 128 steps x 128 envs = 819,200 random steps
    log=$(mktemp)
    python rnd_ppo_atari.py --env-id MontezumaRevengeNoFrameskip-v4 --no-progress-bar --env.no-track-rooms --eval.episodes 0 \
      --run-dir "$(mktemp -d)/run" >"$log" 2>&1 &
    pid=$!
    until grep -q "obs-norm warm-up:" "$log"; do sleep 2; kill -0 $pid 2>/dev/null || break; done
    kill -TERM $pid 2>/dev/null || true; wait $pid || true
    grep "obs-norm warm-up:" "$log"
    ;;
  evidence)  # Montezuma, RND vs plain PPO (--rnd.int-coef 0), same budget, seed 1, niced on the shared CPU. CPU evidence:
    # 32 envs (the paper's App. A.4 setting: predictor on 100 % of samples), 10 warm-up rollouts. Both start with a
    # budget larger than the time allowed; `evidence-finish` stops them and writes their final evaluation.
    mkdir -p runs/rnd_evidence
    for cfg in "rnd 1.0" "ppo 0.0"; do
      set -- $cfg
      OMP_NUM_THREADS=1 nice -n 15 python rnd_ppo_atari.py --env-id MontezumaRevengeNoFrameskip-v4 --ppo.num-envs 32 --env.no-track-rooms \
        --rnd.update-proportion 1.0 --rnd.num-iterations-obs-norm-init 10 --rnd.int-coef "$2" --ppo.total-timesteps 4096000 \
        --eval.every 10 --eval.episodes 3 --checkpoint-every 5 --keep-checkpoints 3 --seed 1 --no-progress-bar \
        --run-dir "runs/rnd_evidence/montezuma_$1_s1" > "runs/rnd_evidence/montezuma_$1_s1.log" 2>&1 &
      echo $! > "runs/rnd_evidence/montezuma_$1_s1.pid"
    done
    wait
    ;;
  evidence-finish)  # SIGTERM both runs (each saves a snapshot at the end of its iteration), then re-run each with
    # --ppo.total-timesteps = the steps its snapshot reached: training is skipped and the final evaluation is written.
    for name in rnd ppo; do
      kill -TERM "$(cat runs/rnd_evidence/montezuma_${name}_s1.pid)" 2>/dev/null || true
    done
    for name in rnd ppo; do
      while kill -0 "$(cat runs/rnd_evidence/montezuma_${name}_s1.pid)" 2>/dev/null; do sleep 5; done
      dir=runs/rnd_evidence/montezuma_${name}_s1
      steps=$(python -c "import rnd_ppo_atari as r, torch; print(torch.load(r.checkpoint_paths(__import__('pathlib').Path('$dir'))[-1], weights_only=False)['global_step'])")
      coef=$([ "$name" = rnd ] && echo 1.0 || echo 0.0)
      OMP_NUM_THREADS=1 nice -n 15 python rnd_ppo_atari.py --env-id MontezumaRevengeNoFrameskip-v4 --ppo.num-envs 32 --env.no-track-rooms \
        --rnd.update-proportion 1.0 --rnd.int-coef "$coef" --ppo.total-timesteps "$steps" --eval.episodes "${EVAL_EPISODES:-3}" \
        --seed 1 --no-progress-bar --run-dir "$dir" >> "$dir.log" 2>&1 &
    done
    wait
    ;;
  room-envs-cost)  # env steps/s of RoomEnvs (--env.track-rooms: Python envs, rooms from RAM) against ale-py's C++
    # vector env, random actions, 32 envs, alternating 15 s rounds in one window: report the ratio, not the rates.
    python - <<'PY'
import time, numpy as np, rnd_ppo_atari as r
rates = {True: [], False: []}
for _ in range(3):
    for track in (False, True):
        envs = r.make_envs(r.EnvArgs(track_rooms=track), "montezuma_revenge", 32, 1)
        rng, steps, t0 = np.random.default_rng(0), 0, time.perf_counter()
        while time.perf_counter() - t0 < 15:
            envs.step(rng.integers(0, 18, 32))
            steps += 32
        rates[track].append(steps / (time.perf_counter() - t0))
        envs.close()
for track, label in ((False, "AtariVectorEnv"), (True, "RoomEnvs")):
    print(label, " ".join(f"{x:.0f}" for x in rates[track]), "env steps/s")
print("RoomEnvs / AtariVectorEnv, per round:", " ".join(f"{a / b:.2f}" for a, b in zip(rates[True], rates[False])))
PY
    ;;
  montezuma)  # montezuma {rnd|ppo} SEED [flags...]: Montezuma's Revenge, RND against plain PPO (--rnd.int-coef 0, the
    # script's own baseline: no bonus, predictor not trained), the same flags otherwise. 611 iterations x 4,096 agent
    # steps = 2,502,656 steps = 10.0M frames. The paper's 128 envs x 128 steps would only make each iteration 4x longer
    # on this 2-core CPU (SPS barely depends on num_envs: throughput-128 above); 32 envs x 128 steps keep an iteration
    # (and a checkpoint's lost work) small, and --rnd.update-proportion 1.0 trains the predictor on as many samples per
    # iteration as the paper's 0.25 of 128 envs (its App. A.4). --env.track-rooms (the default) logs the rooms visited
    # in training from RAM. Niced, one torch thread, at most two of the four at a time; the process becomes python
    # (exec), so a SIGTERM to its pid saves a snapshot and exits 130; the same command resumes (a finished run exits
    # 0). Its output goes to RUN_DIR.log. RUN_ROOT (default runs) moves the run dir;
    # flags after SEED override the ones here. A tiny check of the plumbing (seconds per start; SIGTERM it, re-run it):
    #   RUN_ROOT=/tmp/rnd_check benchmarks/rnd_ppo_atari.sh montezuma rnd 1 --ppo.num-envs 4 --ppo.num-steps 16 \
    #     --ppo.total-timesteps 640 --rnd.num-iterations-obs-norm-init 1 --checkpoint-every 1 --eval.episodes 1
    name=${2:?montezuma rnd|ppo SEED}; seed=${3:?montezuma rnd|ppo SEED}; shift 3
    case "$name" in rnd) coef=1.0 ;; ppo) coef=0.0 ;; *) echo "montezuma: rnd or ppo, not $name" >&2; exit 2 ;; esac
    dir="${RUN_ROOT:-runs}/rnd_montezuma_${name}_s${seed}"
    mkdir -p "$(dirname "$dir")"
    exec env OMP_NUM_THREADS=1 nice -n 19 python rnd_ppo_atari.py --env-id MontezumaRevengeNoFrameskip-v4 --seed "$seed" \
      --rnd.int-coef "$coef" --ppo.num-envs 32 --ppo.num-steps 128 --rnd.update-proportion 1.0 \
      --ppo.total-timesteps 2502656 --checkpoint-every 10 --keep-checkpoints 2 --torch-threads 1 \
      --run-dir "$dir" "$@" >> "$dir.log" 2>&1
    ;;
  montezuma-records)  # each montezuma run's small records into benchmarks/results/rnd_montezuma_<name>_s<seed>/ (or
    # RESULTS_ROOT/...), at any time (a run still going gives its curves so far): the
    # charts/, eval/ and rnd/ curves as CSV (rooms in training: charts/visited_rooms_train per iteration and
    # charts/episodic_rooms per episode), args.json, curves.png, and results.json once the run has finished. A run
    # that has not logged a scalar yet (just started) is skipped with a line, and the others are still recorded.
    for dir in "${RUN_ROOT:-runs}"/rnd_montezuma_*_s*; do
      [ -f "$dir/args.json" ] || continue
      out="${RESULTS_ROOT:-benchmarks/results}/$(basename "$dir")"
      if ! python benchmarks/tb_to_csv.py "$dir" "$out/curves.csv" --prefix charts/ --prefix eval/ --prefix rnd/; then
        echo "skipped $dir: no curves yet" >&2
        continue
      fi
      cp "$dir/args.json" "$out/"
      for f in curves.png results.json; do
        if [ -f "$dir/$f" ]; then cp "$dir/$f" "$out/"; fi
      done
    done
    ;;
  montezuma-plot)  # the montezuma runs' figure and table, from their committed records only
    # (benchmarks/results/rnd_montezuma_<name>_s<seed>/curves.csv, results.json): docs/assets/rnd_ppo_atari/montezuma_10M.png
    # (score and length of the training episodes as 100-episode running means, rooms visited in training so far,
    # intrinsic reward;
    # one line per run, RND and PPO in two colours) and a markdown table, one row per run, on stdout and in
    # benchmarks/results/rnd_montezuma_table.md (the record the docs check reads for the page's table). RESULTS_ROOT
    # and ASSETS (default docs/assets/rnd_ppo_atari) move the records read, the table and the figure (the tests).
    RESULTS_ROOT=${RESULTS_ROOT:-benchmarks/results} ASSETS=${ASSETS:-docs/assets/rnd_ppo_atari} python - <<'PY'
import csv, json, os
from pathlib import Path
import numpy as np
import matplotlib; matplotlib.use("Agg")
import matplotlib.pyplot as plt
results = Path(os.environ["RESULTS_ROOT"])
runs = sorted(p.parent for p in results.glob("rnd_montezuma_*_s*/curves.csv"))
fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
colour = {"rnd": "tab:red", "ppo": "tab:blue"}
table = ["| run | frames | training episodes | episodes that scored | score, last 100 training episodes | agent steps per episode, last 100 | rooms visited in training | intrinsic reward per step, first → last | evaluation (results.json) |",
         "|---|---|---|---|---|---|---|---|---|"]
for run in runs:
    name, seed = run.name.split("_")[2:4]
    tags = {}
    for row in csv.DictReader(open(run / "curves.csv")):
        tags.setdefault(row["tag"], []).append((int(row["step"]), float(row["value"])))
    curves = {tag: np.array(sorted(pts)) for tag, pts in tags.items()}
    ret, length, rooms, intr = (curves.get(t) for t in (
        "charts/episodic_return", "charts/episodic_length", "charts/visited_rooms_train", "rnd/intrinsic_reward"))
    label = f"{'RND' if name == 'rnd' else 'PPO'} {seed}"
    style = dict(color=colour[name], ls="-" if seed == "s1" else "--", lw=1.2, label=label)
    for ax, curve in ((axes[0], ret), (axes[1], length)):  # per episode: a 100-episode running mean
        if curve is not None and len(curve):
            k = min(100, len(curve))
            ax.plot(4e-6 * curve[k - 1 :, 0], np.convolve(curve[:, 1], np.ones(k) / k, "valid"), **style)
    for ax, curve in ((axes[2], rooms), (axes[3], intr)):
        if curve is not None:
            ax.plot(4e-6 * curve[:, 0], curve[:, 1], **style)
    frames = 4 * max(c[-1, 0] for c in curves.values() if len(c))
    last = f"{ret[-100:, 1].mean():.1f} (max {ret[:, 1].max():.0f})" if ret is not None else "-"
    result = json.load(open(run / "results.json")) if (run / "results.json").exists() else None
    evaluation = "running" if result is None else f"{result['eval_mean_return']:.1f} ± {result['eval_std_return']:.1f} ({result['eval_episodes']} games)"
    nrooms = f"{rooms[-1, 1]:.0f}" if rooms is not None else "-"
    steps = f"{length[-100:, 1].mean():.0f}" if length is not None else "-"
    scored = "-" if ret is None else f"{int((ret[:, 1] > 0).sum())}"
    bonus = "none (int-coef 0)" if name == "ppo" else f"{intr[0, 1]:.3f} → {intr[-1, 1]:.3f}" if intr is not None and len(intr) else "-"
    table.append(f"| {label} | {frames / 1e6:.2f}M | {0 if ret is None else len(ret)} | {scored} | {last} | {steps} | {nrooms} | {bonus} | {evaluation} |")
print("\n".join(table))
(results / "rnd_montezuma_table.md").write_text("\n".join(table) + "\n")
titles = ("score per training episode (100-episode mean)", "agent steps per training episode (100-episode mean)",
          "rooms visited in training", "intrinsic reward per step")
for ax, title in zip(axes, titles):
    ax.set_title(title, fontsize=9); ax.set_xlabel("frames (millions)"); ax.grid(alpha=0.3)
axes[0].legend(fontsize=8)
fig.suptitle("Montezuma's Revenge: RND against PPO at equal frames (2-core CPU; seeds as lines)", fontsize=9)
fig.tight_layout()
out = Path(os.environ["ASSETS"]) / "montezuma_10M.png"; out.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(out, dpi=70); print(out, out.stat().st_size)
PY
    ;;
  montezuma-coverage)  # where the finished runs' policies go inside the rooms: 30 games each (seeds 50000-50029, the
    # same for every policy) of each finished montezuma run and of random actions, the player's 8x8-pixel cells read
    # from RAM; benchmarks/results/rnd_montezuma_coverage.jsonl rewritten with one JSON line per policy (the same
    # policy and seeds give the same line again)
    runs=()
    for dir in "${RUN_ROOT:-runs}"/rnd_montezuma_*_s*; do
      if [ -f "$dir/policy.pt" ]; then runs+=("$dir"); fi
    done
    out=benchmarks/results/rnd_montezuma_coverage.jsonl
    rm -f "$out.tmp"
    python benchmarks/rnd_coverage.py "$out.tmp" "${runs[@]}" random --games 30
    mv "$out.tmp" "$out"
    ;;
  plot)  # docs/assets/rnd_ppo_atari/montezuma_cpu_evidence.png from the two evidence runs' TensorBoard events
    python - <<'PY'
import matplotlib; matplotlib.use("Agg")
import matplotlib.pyplot as plt
from pathlib import Path
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
def series(run, tag):
    pts = []
    for ev in sorted(Path(run).glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(ev)); acc.Reload()
        if tag in acc.Tags()["scalars"]:
            pts += [(e.step, e.value) for e in acc.Scalars(tag)]
    return sorted(pts)
fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
for name, label in (("rnd", "RND (int-coef 1)"), ("ppo", "PPO (int-coef 0)")):
    run = f"runs/rnd_evidence/montezuma_{name}_s1"
    for ax, tag in zip(axes, ("charts/episodic_return", "charts/visited_rooms", "rnd/intrinsic_reward")):
        pts = series(run, tag)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if len(pts) < 30 else "-", ms=3, label=label)
        ax.set_title(tag); ax.set_xlabel("agent steps"); ax.grid(alpha=0.3)
axes[0].legend(fontsize=8)
fig.suptitle("Montezuma's Revenge, CPU evidence run (tiny budget, see table)", fontsize=9)
fig.tight_layout()
out = Path("docs/assets/rnd_ppo_atari/montezuma_cpu_evidence.png"); out.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(out, dpi=70); print(out, out.stat().st_size)
PY
    ;;
  *)
    echo "usage: $0 {throughput-8|throughput-128|throughput-128-int0|warmup|room-envs-cost|montezuma|montezuma-records|montezuma-plot|evidence|evidence-finish|plot}" >&2; exit 2 ;;
esac
