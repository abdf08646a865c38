#!/usr/bin/env bash
# Every number in docs/preference_ga3c_atari.md and benchmarks/results/preference_ga3c_atari.md comes from these
# commands. The evidence steps made before 2026-11-26 pin GA3C's RMSProp eps 0.1 (their runs' setting; the default is
# now 1e-5, and a resumed run takes its settings from the command line); the synthetic-label steps made before
# 2026-11-27 pin the reward model's dropout 0.5 (the paper's; the default is now 0). Run from the repository root
# with the venv active: `bash benchmarks/preference_ga3c_atari.sh STEP`.
set -euo pipefail
cd "$(dirname "$0")/.."
step=${1:-help}

# CPU evidence configuration: the paper's method at a budget a shared 2-core CPU can run in about an hour. Changed
# from the defaults: 150k agent steps (0.6M frames; the paper ran 50M), 1,000 labels of which 200 on random play
# (paper: ~3,300 / 500 over 50M frames), 5 pretraining epochs (paper: 200), 0.02 label samples trained per agent
# step (paper: ~0.1). Everything else (GA3C, the predictor, the ensemble, the queries) is the default.
# (A first attempt with 20 pretraining epochs at nice 19 on a machine at load 11 was still pretraining after 23
# minutes and was stopped; the rl run of that attempt is the one reported, its settings do not involve labels.)
EVIDENCE=(--env-id PongNoFrameskip-v4 --seed 1 --total-timesteps 150000 --labels.budget 1000 --labels.pretrain 200
          --reward.pretrain-epochs 5 --reward.labels-per-step 0.02 --torch-threads 1 --ga3c.env-threads 1
          --checkpoint-every-s 60 --labels.store-dir runs/preference_store_evidence --ga3c.rms-eps 0.1)

case $step in
  evidence)  # three runs at equal frames, in parallel, niced (the machine was shared with other jobs)
    nice -n 19 python preference_ga3c_atari.py "${EVIDENCE[@]}" --labeler rl --exp-name ev_rl \
        --run-dir runs/pref_evidence_rl > runs/pref_evidence_rl.log 2>&1 &
    nice -n 5 python preference_ga3c_atari.py "${EVIDENCE[@]}" --labeler synthetic --reward.dropout 0.5 --feedback pairwise \
        --exp-name ev2_pairwise --run-dir runs/pref_evidence2_pairwise > runs/pref_evidence2_pairwise.log 2>&1 &
    nice -n 5 python preference_ga3c_atari.py "${EVIDENCE[@]}" --labeler synthetic --reward.dropout 0.5 --feedback sort-tree \
        --exp-name ev2_tree --run-dir runs/pref_evidence2_tree > runs/pref_evidence2_tree.log 2>&1 &
    wait ;;
  evidence-preferences)  # the two synthetic runs alone (the rl run had finished)
    nice -n 5 python preference_ga3c_atari.py "${EVIDENCE[@]}" --labeler synthetic --reward.dropout 0.5 --feedback pairwise \
        --exp-name ev2_pairwise --run-dir runs/pref_evidence2_pairwise > runs/pref_evidence2_pairwise.log 2>&1 &
    nice -n 5 python preference_ga3c_atari.py "${EVIDENCE[@]}" --labeler synthetic --reward.dropout 0.5 --feedback sort-tree \
        --exp-name ev2_tree --run-dir runs/pref_evidence2_tree > runs/pref_evidence2_tree.log 2>&1 &
    wait ;;
  evidence-long-rl)  # the true-reward baseline at a budget where GA3C should learn Pong (10M agent steps = 40M frames),
    # sharing the 2-core CPU with one other 1-thread job; resumable: re-run the same line after an interruption
    python preference_ga3c_atari.py --env-id PongNoFrameskip-v4 --labeler rl --seed 1 --exp-name pong_rl_long \
        --run-dir runs/pref_pong_rl_long --torch-threads 1 --ga3c.env-threads 1 --ga3c.rms-eps 0.1 --checkpoint-every-s 300 ;;
  evidence-long-preferences)  # the synthetic labeller at the long run's frames, pairwise and sort-tree side by side
    # (one torch + one emulator thread each, the 2-core CPU shared by the two). Changed from the defaults to what the
    # CPU carries: 20 pretraining epochs (paper: 200), 0.01 label samples trained per agent step (paper: ~0.1).
    # Resumable: re-run the same line after an interruption. FEEDBACK="pairwise" runs one of the two.
    for feedback in ${FEEDBACK:-pairwise sort-tree}; do
      python preference_ga3c_atari.py --env-id PongNoFrameskip-v4 --labeler synthetic --reward.dropout 0.5 --feedback $feedback --seed 1 \
          --exp-name "pong_${feedback}_long" --run-dir "runs/pref_pong_${feedback}_long" --torch-threads 1 \
          --ga3c.env-threads 1 --ga3c.rms-eps 0.1 --checkpoint-every-s 300 --reward.pretrain-epochs 20 --reward.labels-per-step 0.01 \
          --labels.store-dir runs/preference_store_long > "runs/pref_pong_${feedback}_long.log" 2>&1 &
    done
    wait ;;
  evidence-eps)  # the true-reward runs again with RMSProp eps 1e-5 (the default since 2026-11-26; the runs above had
    # GA3C's 0.1), Breakout and Pong side by side, one torch + one emulator thread each. Resumable: re-run the same line.
    for game in Breakout Pong; do
      python preference_ga3c_atari.py --env-id ${game}NoFrameskip-v4 --labeler rl --seed 1 \
          --exp-name "${game,,}_rl_eps" --run-dir "runs/pref_${game,,}_rl_eps1e-5" --torch-threads 1 \
          --ga3c.env-threads 1 --ga3c.rms-eps 1e-5 --checkpoint-every-s 300 > "runs/pref_${game,,}_rl_eps1e-5.log" 2>&1 &
    done
    wait ;;
  evidence-pong-rl-alone)  # evidence-eps's Pong run again, alone on the VM (that one shared a slower VM with the
    # Breakout run): the same-machine baseline for evidence-pong-dropout-scratch. Resumable: re-run the same line.
    python preference_ga3c_atari.py --env-id PongNoFrameskip-v4 --labeler rl --seed 1 --exp-name pong_rl_alone \
        --run-dir runs/pref_pong_rl_eps1e-5_alone --torch-threads 1 --ga3c.env-threads 1 --ga3c.rms-eps 1e-5 \
        --checkpoint-every-s 300 >> runs/pref_pong_rl_eps1e-5_alone.log 2>&1 ;;
  evidence-breakout)  # Breakout: the true reward and synthetic sort-tree labels side by side at equal frames, the Pong long
    # runs' flags (one torch + one emulator thread each); the synthetic labeller charges 1 point per lost life (the
    # paper's penalty for the episode ends the agent never sees). Resumable: re-run the same line.
    python preference_ga3c_atari.py --env-id BreakoutNoFrameskip-v4 --labeler rl --seed 1 --exp-name breakout_rl \
        --run-dir runs/pref_breakout_rl --torch-threads 1 --ga3c.env-threads 1 --ga3c.rms-eps 0.1 --checkpoint-every-s 300 \
        > runs/pref_breakout_rl.log 2>&1 &
    python preference_ga3c_atari.py --env-id BreakoutNoFrameskip-v4 --labeler synthetic --reward.dropout 0.5 --feedback sort-tree --seed 1 \
        --exp-name breakout_sort-tree --run-dir runs/pref_breakout_sort-tree --torch-threads 1 --ga3c.env-threads 1 \
        --ga3c.rms-eps 0.1 --checkpoint-every-s 300 --reward.pretrain-epochs 20 --reward.labels-per-step 0.01 \
        --labels.store-dir runs/preference_store_long > runs/pref_breakout_sort-tree.log 2>&1 &
    wait ;;
  evidence-breakout-eps)  # Breakout with synthetic labels and RMSProp eps 1e-5, pairwise and sort-tree side by side
    # (one torch + one emulator thread each), the flags of evidence-breakout otherwise; compared at equal frames with
    # evidence-eps's true-reward Breakout run. Resumable: re-run the same line. FEEDBACK="pairwise" runs one of the two.
    for feedback in ${FEEDBACK:-pairwise sort-tree}; do
      python preference_ga3c_atari.py --env-id BreakoutNoFrameskip-v4 --labeler synthetic --reward.dropout 0.5 --feedback $feedback --seed 1 \
          --exp-name "breakout_${feedback}_eps" --run-dir "runs/pref_breakout_${feedback}_eps1e-5" --torch-threads 1 \
          --ga3c.env-threads 1 --ga3c.rms-eps 1e-5 --checkpoint-every-s 300 --reward.pretrain-epochs 20 \
          --reward.labels-per-step 0.01 --labels.store-dir runs/preference_store_long \
          > "runs/pref_breakout_${feedback}_eps1e-5.log" 2>&1 &
    done
    wait ;;
  curves-long)  # the long runs (true reward, synthetic pairwise, synthetic sort-tree): game scores, labels, entropy.
    # Each run's curves are also kept in benchmarks/results/pong_long/RUN.csv.gz (run dirs are not in git and a machine
    # can be replaced between sessions): a run dir that is gone is drawn from its saved curves (Pong: the long runs,
    # evidence-eps's, evidence-pong-rl-alone's and evidence-pong-dropout-scratch's). GAME=breakout draws
    # the evidence-breakout, evidence-eps, evidence-breakout-eps, evidence-breakout-dropout and
    # evidence-breakout-dropout-scratch Breakout runs instead (saved under benchmarks/results/breakout/).
    GAME=${GAME:-pong} python - <<'PY'
import glob
import os
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TAGS = ("charts/episodic_return", "labels/answered", "losses/entropy", "charts/SPS", "ga3c/policy_lag",
        "reward/label_accuracy")

GAME = os.environ["GAME"]
SAVED = {"pong": "pong_long", "breakout": "breakout"}[GAME]


def curves(run):  # every event file of the run (one per resume), in step order -> {tag: (frames, values)}
    saved = f"benchmarks/results/{SAVED}/{os.path.basename(run)}.csv.gz"
    if not glob.glob(run + "/events*"):
        if not os.path.exists(saved):
            return {}
        rows = np.loadtxt(saved, delimiter=",", skiprows=1)
        return {tag: (rows[rows[:, 0] == i, 1], rows[rows[:, 0] == i, 2]) for i, tag in enumerate(TAGS)}
    points = {tag: {} for tag in TAGS}
    for path in sorted(glob.glob(run + "/events*")):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in TAGS:
            if tag in acc.Tags()["scalars"]:
                points[tag].update({(e.step, e.wall_time): e.value for e in acc.Scalars(tag)})
    out = {tag: (np.array([k[0] for k in sorted(p)]) * 4, np.array([p[k] for k in sorted(p)])) for tag, p in points.items()}
    os.makedirs(os.path.dirname(saved), exist_ok=True)
    rows = [np.column_stack([np.full(len(f), i), f, v]) for i, (f, v) in enumerate(out.values())]
    np.savetxt(saved, np.concatenate(rows), delimiter=",", fmt=["%d", "%d", "%.6g"], header="tag,frames,value",
               comments="")
    return out

runs = {"rl (true reward), eps 0.1": "runs/pref_pong_rl_long",
        "synthetic, pairwise, eps 0.1, dropout 0.5": "runs/pref_pong_pairwise_long",
        "synthetic, sort-tree, eps 0.1, dropout 0.5": "runs/pref_pong_sort-tree_long", "rl (true reward), eps 1e-5": "runs/pref_pong_rl_eps1e-5",
        "rl (true reward), eps 1e-5, alone": "runs/pref_pong_rl_eps1e-5_alone",
        "synthetic, pairwise, eps 1e-5, dropout 0": "runs/pref_pong_pairwise_d0_scratch",
        "synthetic, sort-tree, eps 1e-5, dropout 0": "runs/pref_pong_sort-tree_d0_scratch"}
if GAME == "breakout":
    runs = {"rl (true reward), eps 0.1": "runs/pref_breakout_rl", "synthetic, sort-tree, eps 0.1": "runs/pref_breakout_sort-tree",
            "rl (true reward), eps 1e-5": "runs/pref_breakout_rl_eps1e-5",
            "synthetic, pairwise, eps 1e-5": "runs/pref_breakout_pairwise_eps1e-5",
            "synthetic, sort-tree, eps 1e-5": "runs/pref_breakout_sort-tree_eps1e-5",
            "synthetic, pairwise, eps 1e-5, dropout 0 from 1.02M": "runs/pref_breakout_pairwise_d0_eps1e-5",
            "synthetic, pairwise, eps 1e-5, dropout 0 from scratch": "runs/pref_breakout_pairwise_d0_scratch",
            "synthetic, sort-tree, eps 1e-5, dropout 0 from scratch": "runs/pref_breakout_sort-tree_d0_scratch"}
actions = {"pong": 6, "breakout": 4}[GAME]
fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(7, 7.5), sharex=True)
for (name, run), color in zip(runs.items(), [f"C{i}" for i in range(8)]):
    c = curves(run)
    if not c or not len(c["charts/episodic_return"][1]):  # gone with no saved curves, or no game finished yet
        continue
    frames, scores = c["charts/episodic_return"]  # the docs' table: mean score per 0.5M agent steps (2M frames)
    print(f"{name}: {len(scores)} games to {frames.max() / 4 / 1e6:.2f}M steps; median SPS "
          f"{np.median(c['charts/SPS'][1]):.0f}, policy lag {np.median(c['ga3c/policy_lag'][1]):.1f}; last 100 games "
          f"{scores[-100:].mean():+.1f} (best {scores.max():+.0f})")
    for lo in np.arange(0, frames.max(), 2e6):
        window = (frames >= lo) & (frames < lo + 2e6)
        f_labels, labels = c["labels/answered"]
        f_acc, acc = c["reward/label_accuracy"]
        had = labels[f_labels < lo + 2e6]
        recent = acc[(f_acc >= lo) & (f_acc < lo + 2e6)]
        print(f"  {lo / 4e6:.1f}-{(lo + 2e6) / 4e6:.1f}M steps: {scores[window].mean():+.1f} ({window.sum()} games)"
              + (f", labels {had[-1]:.0f}" if len(had) else "")
              + (f", label accuracy {recent.mean():.2f}" if len(recent) else ""))
    frames, scores = c["charts/episodic_return"]
    if len(scores) >= 100:
        top.plot(frames[99:], np.convolve(scores, np.ones(100) / 100, "valid"), color=color, label=name)
    frames, labels = c["labels/answered"]
    if len(labels):
        middle.plot(frames, labels, color=color, label=name)
    frames, entropy = c["losses/entropy"]
    bottom.plot(frames, entropy, color=color, lw=0.8, label=name)
top.set_ylabel("true score, mean of 100 games")
top.legend(fontsize=8)
middle.set_ylabel("labels answered")
bottom.axhline(np.log(actions), color="grey", lw=0.8, ls="--")
bottom.set_ylabel(f"policy entropy (ln {actions} dashed)")
bottom.set_xlabel("frames")
fig.suptitle(f"{GAME.capitalize()}NoFrameskip-v4, GA3C, seed 1, 2-core CPU")
fig.tight_layout()
fig.savefig(f"docs/assets/preference_ga3c_atari/{SAVED}.png", dpi=90)
PY
    ;;
  curves)  # the three evidence runs' training-game scores and labels in one figure for the docs
    python - <<'PY'
import glob
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
runs = {"rl (true reward)": "runs/pref_evidence_rl", "synthetic, pairwise": "runs/pref_evidence2_pairwise",
        "synthetic, sort-tree": "runs/pref_evidence2_tree"}
fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
for (name, run), color in zip(runs.items(), ["C0", "C1", "C2"]):
    acc = EventAccumulator(glob.glob(run + "/events*")[0], size_guidance={"scalars": 0})
    acc.Reload()
    games = acc.Scalars("charts/episodic_return")
    steps, scores = np.array([g.step for g in games]) * 4, np.array([g.value for g in games])
    window = min(20, len(scores))
    top.plot(steps[window - 1:], np.convolve(scores, np.ones(window) / window, "valid"), label=name, color=color)
    if "labels/answered" in acc.Tags()["scalars"]:
        labels = acc.Scalars("labels/answered")
        bottom.plot([x.step * 4 for x in labels], [x.value for x in labels], label=name, color=color)
top.set_ylabel("true game score (mean of 20 games)")
top.legend(fontsize=8)
bottom.set_ylabel("labels answered")
bottom.set_xlabel("frames")
bottom.legend(fontsize=8)
fig.suptitle("PongNoFrameskip-v4, 0.6M frames, seed 1 (CPU evidence configuration)")
fig.tight_layout()
fig.savefig("docs/assets/preference_ga3c_atari/evidence_pong.png", dpi=90)
PY
    ;;
  trex-reward)  # T-REX's quick configuration: the reward model its policy phase needs for the throughput baseline
    [ -f runs/trex_quick/reward_model.pt ] || python trex_ppo_atari.py --env-id BreakoutNoFrameskip-v4 \
        --demonstrator.total-timesteps 8192 --policy.total-timesteps 8192 --reward.num-pairs 300 --reward.epochs 1 \
        --eval.episodes 2 --env.max-episode-frames 4000 --run-dir runs/trex_quick ;;
  throughput)  # one window, nothing else running: T-REX's policy phase (the baseline), then GA3C on the same game
    python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 8 --label trex-policy \
        --train-seconds 120 -- python trex_ppo_atari.py --env-id BreakoutNoFrameskip-v4 \
        --reward-model runs/trex_quick/reward_model.pt
    for threads in 0 1; do  # 0 = torch's default (2 threads here)
      python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 32 --label "ga3c-rl-t$threads" \
          --train-seconds 120 -- python preference_ga3c_atari.py --env-id BreakoutNoFrameskip-v4 --labeler rl \
          --torch-threads $threads
    done
    # with the synthetic labeller (reward inference + asynchronous reward training), after a short pretraining
    for rate in 0.1 0.02; do
      python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 32 \
          --label "ga3c-synthetic-rate$rate" --train-seconds 150 -- python preference_ga3c_atari.py \
          --env-id BreakoutNoFrameskip-v4 --labeler synthetic --reward.dropout 0.5 --labels.pretrain 50 --reward.pretrain-epochs 1 \
          --reward.labels-per-step $rate --torch-threads 1 --labels.store-dir runs/preference_store_bench \
          --exp-name "bench$rate"
    done ;;
  throughput-synthetic-0.1)  # re-measured alone with a longer window: the first measurement had pretraining
    # eating most of its 150 s and another agent's tests running beside it
    python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 32 \
        --label "ga3c-synthetic-rate0.1-long" --train-seconds 210 -- python preference_ga3c_atari.py \
        --env-id BreakoutNoFrameskip-v4 --labeler synthetic --reward.dropout 0.5 --labels.pretrain 50 --reward.pretrain-epochs 1 \
        --reward.labels-per-step 0.1 --torch-threads 1 --labels.store-dir runs/preference_store_bench \
        --exp-name bench0.1 ;;
  throughput-precision)  # one window, nothing else running: the baseline, then GA3C in bf16 (auto here) and fp32,
    # with the true reward and with the synthetic labeller at 0.02 label samples per step (the achieved rate recorded)
    python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 8 --label trex-policy \
        --train-seconds 120 -- python trex_ppo_atari.py --env-id BreakoutNoFrameskip-v4 \
        --reward-model runs/trex_quick/reward_model.pt
    for precision in bf16 fp32; do
      python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 32 \
          --label "ga3c-rl-$precision" --train-seconds 120 -- python preference_ga3c_atari.py \
          --env-id BreakoutNoFrameskip-v4 --labeler rl --precision $precision
    done
    for precision in bf16 fp32; do
      rm -rf runs/preference_store_bench_precision
      python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 32 \
          --label "ga3c-synthetic-rate0.02-$precision" --train-seconds 180 --counter-tag reward/updates -- \
          python preference_ga3c_atari.py --env-id BreakoutNoFrameskip-v4 --labeler synthetic --reward.dropout 0.5 --labels.pretrain 50 \
          --reward.pretrain-epochs 1 --reward.labels-per-step 0.02 --precision $precision \
          --labels.store-dir runs/preference_store_bench_precision --exp-name "bench-$precision"
    done ;;
  throughput-rate)  # the synthetic labeller at a training rate a 2-core CPU can carry (bf16, after the window above)
    rm -rf runs/preference_store_bench_precision
    python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 32 \
        --label "ga3c-synthetic-rate${RATE:-0.003}-bf16" --train-seconds 180 --counter-tag reward/updates -- \
        python preference_ga3c_atari.py --env-id BreakoutNoFrameskip-v4 --labeler synthetic --reward.dropout 0.5 --labels.pretrain 50 \
        --reward.pretrain-epochs 1 --reward.labels-per-step "${RATE:-0.003}" \
        --labels.store-dir runs/preference_store_bench_precision --exp-name "bench-rate" ;;
  throughput-window)  # one quiet window after the byte-mask dropout / NHWC GA3C net change: the baseline, GA3C on
    # the true reward, the synthetic labeller at two training rates (label samples trained per agent step) with each
    # reward-model dropout in DROPOUT (0.5 in the windows before the default became 0; "0 0.5": both, in that order)
    python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 8 --label trex-policy \
        --train-seconds 120 -- python trex_ppo_atari.py --env-id BreakoutNoFrameskip-v4 \
        --reward-model runs/trex_quick/reward_model.pt
    python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 32 --label "ga3c-rl${TAG:-}" \
        --train-seconds 120 -- python preference_ga3c_atari.py --env-id BreakoutNoFrameskip-v4 --labeler rl
    for dropout in ${DROPOUT:-0.5}; do
      for rate in ${RATES:-0.003 0.02}; do
        rm -rf runs/preference_store_bench_precision
        python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 32 \
            --label "ga3c-synthetic-rate$rate$([ "$dropout" = 0.5 ] || echo "-dropout$dropout")${TAG:-}" \
            --train-seconds 180 --counter-tag reward/updates -- python preference_ga3c_atari.py \
            --env-id BreakoutNoFrameskip-v4 --labeler synthetic --reward.dropout "$dropout" --labels.pretrain 50 \
            --reward.pretrain-epochs 1 --reward.labels-per-step "$rate" \
            --labels.store-dir runs/preference_store_bench_precision --exp-name "bench-rate"
      done
    done ;;
  reward-precision)  # the reward model's training update and the trainer's scoring, bf16 vs fp32 (alone, quiet)
    python benchmarks/preference_reward_precision.py ;;
  reward-diagnostic)  # what each long synthetic run's learned reward pays for: its agent vs a random policy
    for run in ${RUNS:-runs/pref_pong_pairwise_long runs/pref_pong_sort-tree_long runs/pref_pong_pairwise_d0_scratch}; do
      python benchmarks/preference_reward_diagnostic.py $run
      python benchmarks/preference_reward_diagnostic.py $run --random
    done ;;
  evidence-breakout-dropout)  # the pairwise Breakout eps 1e-5 run forked at its last checkpoint (1.02M agent steps)
    # and resumed with --reward.dropout 0 (label-fit: with the paper's 0.5 its predictor could not fit the labels).
    # The fork gets copies of the run dir and the label store, so the original stays as it stopped. Resumable.
    fork=runs/pref_breakout_pairwise_d0_eps1e-5 store=runs/preference_store_breakout_d0
    if [ ! -d $fork ]; then
      cp -r runs/pref_breakout_pairwise_eps1e-5 $fork
      mkdir -p $store && cp -r runs/preference_store_long/BreakoutNoFrameskip-v4_clips $store/
      python -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
          runs/preference_store_long/BreakoutNoFrameskip-v4.sqlite $store/BreakoutNoFrameskip-v4.sqlite
    fi
    python preference_ga3c_atari.py --env-id BreakoutNoFrameskip-v4 --labeler synthetic --feedback pairwise --seed 1 \
        --exp-name breakout_pairwise_eps --run-dir $fork --torch-threads 1 --ga3c.env-threads 1 --ga3c.rms-eps 1e-5 \
        --checkpoint-every-s 300 --reward.pretrain-epochs 20 --reward.labels-per-step 0.01 --labels.store-dir $store \
        --reward.dropout 0 >> $fork.log 2>&1 ;;
  evidence-breakout-dropout-scratch|evidence-pong-dropout-scratch)  # evidence-{breakout,pong}-eps again from scratch
    # with --reward.dropout 0, nothing else changed, each feedback mode alone on the VM one after the other
    # (FEEDBACK="sort-tree" runs one), sharing one new label store per game as the eps runs shared theirs: dropout 0
    # against the paper's 0.5 from the first label on. Stopped with SIGTERM; resumable: re-run the same line.
    # DROPOUT=0.5 runs the same with the paper's dropout (own run dirs and label store, suffix d0.5): on Pong the
    # hacked dropout-0.5 run also had ε 0.1, so this isolates dropout.
    game=${step#evidence-}; game=${game%%-*}; env_id=$([ "$game" = pong ] && echo PongNoFrameskip-v4 || echo BreakoutNoFrameskip-v4)
    d=d${DROPOUT:-0}
    for feedback in ${FEEDBACK:-pairwise sort-tree}; do
      python preference_ga3c_atari.py --env-id $env_id --labeler synthetic --feedback $feedback --seed 1 \
          --exp-name "${game}_${feedback}_${d}_scratch" --run-dir "runs/pref_${game}_${feedback}_${d}_scratch" \
          --torch-threads 1 --ga3c.env-threads 1 --ga3c.rms-eps 1e-5 --checkpoint-every-s 300 \
          --reward.pretrain-epochs 20 --reward.labels-per-step 0.01 --reward.dropout ${DROPOUT:-0} \
          --labels.store-dir "runs/preference_store_${game}_${d}_scratch" >> "runs/pref_${game}_${feedback}_${d}_scratch.log" 2>&1
    done ;;
  label-fit)  # why the pairwise Breakout run's ensemble ordered its newest labels at chance: how the run's own and the
    # sort-tree run's reward models order its labels, and a fresh predictor trained offline on them for 1,200 updates
    python benchmarks/preference_label_fit.py runs/pref_breakout_pairwise_eps1e-5 \
        --also runs/pref_breakout_sort-tree_eps1e-5 --updates 1200 --eval-every 300
    python benchmarks/preference_label_fit.py runs/pref_breakout_pairwise_eps1e-5 --updates 600 --eval-every 150 \
        --dropout 0 ;;
  throughput-nhwc)  # the reward model on channels-last pixels against the code before it (BASE, default a72d453),
    # alternating, the synthetic labeller held to RATE (0.003) label samples per step by --reward.keep-pace
    git show "${BASE:-a72d453}:preference_ga3c_atari.py" > /tmp/preference_ga3c_atari_base.py
    for pass in 1 2; do
      for which in base new; do
        script=preference_ga3c_atari.py; [ $which = base ] && script=/tmp/preference_ga3c_atari_base.py
        rm -rf runs/preference_store_bench_nhwc
        python benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 32 --train-seconds 120 \
          --label "ga3c-synthetic-rate${RATE:-0.003}-keep-pace-$which" --counter-tag reward/updates -- \
          python $script --env-id BreakoutNoFrameskip-v4 --labeler synthetic --reward.dropout 0.5 --labels.pretrain 50 \
          --reward.pretrain-epochs 1 --reward.labels-per-step "${RATE:-0.003}" --reward.keep-pace \
          --labels.store-dir runs/preference_store_bench_nhwc --exp-name bench-nhwc
      done
    done ;;
  *) echo "usage: $0 evidence|evidence-preferences|evidence-long-rl|evidence-long-preferences|evidence-eps|evidence-breakout|evidence-breakout-eps|curves-long|trex-reward|throughput|throughput-precision|throughput-rate|throughput-window|throughput-nhwc|reward-precision|reward-diagnostic|label-fit|evidence-breakout-dropout|evidence-breakout-dropout-scratch|evidence-pong-dropout-scratch|evidence-pong-rl-alone"
     exit 2 ;;
esac
