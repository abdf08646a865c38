#!/usr/bin/env bash
# Commands behind docs/simple_worldmodel_atari.md. Run from anywhere with the venv active:
#   bash benchmarks/simple_worldmodel_atari.sh quick     # CPU quick configuration: every phase, toy sizes
#   bash benchmarks/simple_worldmodel_atari.sh paper     # the paper's loop and budget (a GPU; days on CPU)
#   bash benchmarks/simple_worldmodel_atari.sh baseline  # model-free PPO on the same 102,400 real steps
#   bash benchmarks/simple_worldmodel_atari.sh pong-cpu          # the CPU evidence run on Pong (resumable)
#   bash benchmarks/simple_worldmodel_atari.sh pong-cpu-random   # its random-policy baseline (needs policy.pt)
#   bash benchmarks/simple_worldmodel_atari.sh pong-cpu-records  # copy its small records to benchmarks/results/
#   bash benchmarks/simple_worldmodel_atari.sh pong-cpu-plot     # the docs figure and table from those records
#   bash benchmarks/simple_worldmodel_atari.sh pong-cpu-probe    # does its reward head see real play's rewards?
#   bash benchmarks/simple_worldmodel_atari.sh pong-cpu-refit    # would a weighted reward loss let its policy learn?
#   bash benchmarks/simple_worldmodel_atari.sh pong-cpu-refit-control  # ... its control: the run's own reward head
# (freeway-cpu*: the same on Freeway, stopped after epoch 0: its uniform-random first collection of 11,264 steps
# crossed the road 0 times, so the reward head could only learn "0" and PPO inside the model had nothing to learn
# from; two of the paper's five Freeway runs also ended at 0. Records: benchmarks/results/simple_cpu_freeway_s1/.)
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_ID=${ENV_ID:-PongNoFrameskip-v4}
SEED=${SEED:-1}

# The CPU quick configuration (every phase, <= 10 minutes on the 2-core CPU, issue 13): 4 collections x 1,024 real
# steps (4 envs), a 16-channel 4-block stochastic world model trained 80 Adam steps per epoch on 105x80 RGB, 6 PPO
# iterations of 8 simulated envs x 25 steps per epoch, 3 epochs, one full evaluation game per epoch, both cores.
# The schedules (scheduled sampling, latent warm-ups) are shortened to the few hundred steps the run has, so every
# part of the model is active.
QUICK=(
    --loop.epochs 3 --loop.real-steps 3072 --env.num-envs 4
    --wm.hidden-size 16 --wm.compress-steps 4 --wm.filter-double-steps 2 --wm.bits 32 --wm.lstm-size 32
    --wm.inference-filters 16 --wm.target-frames 2 --wm.batch-size 4 --wm.optimizer adam --wm.learning-rate 1e-3
    --wm.warmup-steps 50 --wm.train-steps 80 --wm.epoch-multiplier 1 --wm.ss-exp-steps 100 --wm.ss-lin-steps 300
    --wm.discretize-warmup 200 --wm.prior-warmup 200 --wm.latent-use-warmup 100 --wm.eval-sequences 8
    --ppo.iterations 6 --ppo.num-envs 8 --ppo.num-steps 25 --ppo.minibatch-steps 10
    --eval.episodes 1 --eval.num-envs 1
)

# The CPU evidence run (Pong since 2026-11-28, Freeway before it: see the top; one torch thread, niced; re-run the same
# command to resume; checkpoints every 10 world-model steps or PPO iterations). The paper's architecture (stochastic-
# discrete: 6 encoder/decoder blocks, the first 3 doubling, 2 bottleneck layers, 128 bits, LSTM prior of 128) with its
# widths and frame counts shrunk: hidden 32 (paper 96), inference-net filters 32 (128), 2 target frames per sequence
# (6); Adam 1e-3 as the quick configuration. Budget against the paper's: real steps 101,376 (9 collections of 16 x 704;
# 0.99x of 102,400), world-model steps 5,600 = 400 per epoch x3 at epochs 0, 1, 4 (1.5% of 375,000), PPO 220 iterations
# of 16 x 50 simulated steps = 176,000 (1.1% of ~16M; learning rate 5e-4, 5x the paper's, for 50x fewer updates), 8
# epochs (15). The warm-ups are the paper's scaled to this first epoch (1,200 steps against its 45,000): scheduled
# sampling 270 / 1,070, hard bits and prior sampling over 1,070, latent use over 530. Every epoch: 32 real games. fp32:
# bf16 was not faster for this width on this CPU (predicting slower). Estimated ~6 h on one idle thread.
CPU_EVIDENCE=(
    --seed 1 --torch-threads 1 --precision fp32 --checkpoint-every 10
    --loop.epochs 8 --loop.real-steps 90000 --env.num-envs 16
    --wm.hidden-size 32 --wm.inference-filters 32 --wm.target-frames 2 --wm.batch-size 4
    --wm.optimizer adam --wm.learning-rate 1e-3 --wm.warmup-steps 200 --wm.train-steps 400 --wm.epoch-multiplier 3
    --wm.ss-exp-steps 270 --wm.ss-lin-steps 1070 --wm.discretize-warmup 1070 --wm.prior-warmup 1070
    --wm.latent-use-warmup 530
    --ppo.iterations 20 --ppo.learning-rate 5e-4
    --eval.episodes 32 --eval.num-envs 16
)
rom_id() { case "$1" in freeway) echo FreewayNoFrameskip-v4 ;; pong) echo PongNoFrameskip-v4 ;; esac; }

case "${1:-quick}" in
freeway-cpu | pong-cpu)  # the evidence run (resumable: the same command resumes it)
    game=${1%-cpu}
    nice -n 19 python simple_worldmodel_atari.py --env-id "$(rom_id "$game")" "${CPU_EVIDENCE[@]}" \
        --run-dir "runs/simple_cpu_${game}_s1"
    ;;
freeway-cpu-random | pong-cpu-random)
    # the random baseline: uniform actions through the same evaluation code, envs and game count as the run's
    game=${1%-cpu-random}
    nice -n 19 python simple_worldmodel_atari.py --eval-only "runs/simple_cpu_${game}_s1" \
        --eval.policy uniform-random --eval.episodes 32 --eval.num-envs 16 --seed 1 --torch-threads 1
    ;;
freeway-cpu-records | pong-cpu-records)
    # the small records of the run so far (no .pt, no collections): args, per-epoch learning curve (CSV and PNG),
    # the latest epoch's world-model strip under its epoch's name, evaluations, TensorBoard events, the log
    game=${1%-cpu-records}
    run=runs/simple_cpu_${game}_s1
    records=benchmarks/results/simple_cpu_${game}_s1
    mkdir -p "$records"
    for f in args.json results.json learning_curve.csv learning_curve.png "$run"/events.out.tfevents.*; do
        f=${f#"$run"/}
        if [ -f "$run/$f" ]; then cp "$run/$f" "$records/"; fi
    done
    if [ -f "$run/learning_curve.csv" ] && [ -f "$run/wm_strip.png" ]; then
        epoch=$(tail -n 1 "$run/learning_curve.csv" | cut -d, -f1)
        cp "$run/wm_strip.png" "$records/wm_strip_epoch$(printf %02d "$epoch").png"
    fi
    if [ -d "$run/evaluations" ]; then
        cp "$run"/evaluations/eval_*.json "$records/" 2>/dev/null || true
    fi
    if [ -f "runs/logs/simple_cpu_${game}_s1.log" ]; then
        cp "runs/logs/simple_cpu_${game}_s1.log" "$records/run.log"
    fi
    ls -la "$records"
    ;;
pong-cpu-probe)
    # the last world model's reward head on every held-out real step (benchmarks/simple_reward_probe.py: one step from
    # real frames, the prior's and the posterior's bits, and a fresh linear head fitted on its frozen inputs), one JSON
    # line each into the run's records (replaced when the probe finishes; the run's world model is of file format 1,
    # which the probe reads: format 2 moved two dropouts of training only)
    records=benchmarks/results/simple_cpu_pong_s1
    mkdir -p "$records"
    rm -f "$records/reward_probe.jsonl.tmp"  # the record is replaced only by a probe that finished
    nice -n 19 python benchmarks/simple_reward_probe.py runs/simple_cpu_pong_s1 --fresh-head 6000 \
      --out "$records/reward_probe.jsonl.tmp"
    mv "$records/reward_probe.jsonl.tmp" "$records/reward_probe.jsonl"
    ;;
pong-cpu-open-loop)
    # does the reward signal survive the model's own rollouts (what PPO trains on)? The same fresh head as
    # pong-cpu-probe, then 384 held-out real starts rolled 50 steps open loop under the real actions: the AUC of the
    # trained head and of the fresh head per bucket of steps (benchmarks/simple_reward_probe.py --open-loop), into
    # reward_open_loop.jsonl (its first, second and fourth lines: the one-step probes on those 384 windows only)
    records=benchmarks/results/simple_cpu_pong_s1
    nice -n 19 python benchmarks/simple_reward_probe.py runs/simple_cpu_pong_s1 --fresh-head 6000 --open-loop 50 \
      --max-windows 384 --out "$records/reward_open_loop.jsonl.tmp"
    mv "$records/reward_open_loop.jsonl.tmp" "$records/reward_open_loop.jsonl"
    ;;
pong-cpu-refit)
    # would a reward loss weighted toward the rewarded steps let the policy learn? (benchmarks/simple_reward_refit.py):
    # a fresh reward head on the last world model's frozen features, class weights (n_0 / n_c) ** 0.5, scored on the
    # held-out steps; 60 PPO iterations inside the model with it from the run's policy; both policies in the same 32
    # real games as the random baseline (seed 1); into reward_refit.jsonl (replaced when the probe finishes)
    records=benchmarks/results/simple_cpu_pong_s1
    rm -f "$records/reward_refit.jsonl.tmp"
    nice -n 19 python benchmarks/simple_reward_refit.py runs/simple_cpu_pong_s1 --power 0.5 --iterations 60 \
      --eval-episodes 32 --eval-seed 1 --out "$records/reward_refit.jsonl.tmp"
    mv "$records/reward_refit.jsonl.tmp" "$records/reward_refit.jsonl"
    ;;
pong-cpu-refit-control)
    # the control of pong-cpu-refit: the same 60 PPO iterations from the run's policy with the run's own trained
    # reward head (no refit), the same 32 real games; into reward_refit_control.jsonl (replaced when it finishes)
    records=benchmarks/results/simple_cpu_pong_s1
    rm -f "$records/reward_refit_control.jsonl.tmp"
    nice -n 19 python benchmarks/simple_reward_refit.py runs/simple_cpu_pong_s1 --head trained --power 0.5 \
      --iterations 60 --eval-episodes 32 --eval-seed 1 --out "$records/reward_refit_control.jsonl.tmp"
    mv "$records/reward_refit_control.jsonl.tmp" "$records/reward_refit_control.jsonl"
    ;;
pong-cpu-plot)
    # the docs' figure and table of the Pong run, from its committed records only (learning_curve.csv and the random
    # baseline's eval_NNN.json in benchmarks/results/simple_cpu_pong_s1/): docs/assets/simple_worldmodel_atari/
    # pong_cpu_evidence.png (left: open-loop frame error of the model and of copying the last frame over the first
    # 1 / 12 / 50 steps, per epoch; right: the real score per epoch, mean +- std over its games, the random baseline's
    # band and the paper's 12.8) and the table, one row per epoch, on stdout and in the records' table.md
    python - <<'PY'
import csv, json
from pathlib import Path
import matplotlib; matplotlib.use("Agg")
import matplotlib.pyplot as plt
records = Path("benchmarks/results/simple_cpu_pong_s1")
rows = list(csv.DictReader(open(records / "learning_curve.csv")))
random = [json.load(open(p)) for p in sorted(records.glob("eval_*.json"))]
random = [r for r in random if r.get("policy") == "uniform-random"][-1]
num = lambda row, key: float(row[key]) if row.get(key) not in (None, "") else float("nan")
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
epochs = [int(r["epoch"]) for r in rows]
for h, colour in (("1", "tab:green"), ("12", "tab:blue"), ("50", "tab:purple")):
    left.plot(epochs, [num(r, f"wm_frame_mse_{h}") for r in rows], "o-", color=colour, label=f"model, first {h}")
    left.plot(epochs, [num(r, f"wm_copy_frame_mse_{h}") for r in rows], "s--", color=colour, alpha=0.6,
              label=f"copy last frame, first {h}")
left.set_yscale("log"); left.set_xlabel("epoch"); left.set_ylabel("open-loop frame MSE (held-out real play)")
left.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.18)); left.grid(alpha=0.3)
means, stds = [num(r, "eval_mean") for r in rows], [num(r, "eval_std") for r in rows]
right.errorbar(epochs, means, yerr=stds, fmt="o-", capsize=3, label="policy trained in the model (32 games)")
lo, hi = random["mean"] - random["std"], random["mean"] + random["std"]
right.axhspan(lo, hi, color="grey", alpha=0.3, label=f"uniform random, mean +- std ({random['mean']:.2f})")
right.axhline(12.8, color="tab:red", ls=":", label="paper, SD long (5 runs, 100K steps): 12.8")
right.set_ylim(-21.5, 14.5); right.set_xlabel("epoch"); right.set_ylabel("real score (full games)")
right.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.18)); right.grid(alpha=0.3)
for ax in (left, right):
    ax.set_xticks(epochs or [0])
fig.suptitle("SimPLe on Pong, 2-core CPU, one seed (budget: see the docs' table)", fontsize=9)
fig.tight_layout()
out = Path("docs/assets/simple_worldmodel_atari/pong_cpu_evidence.png")
fig.savefig(out, dpi=70); print(out, out.stat().st_size)
table = ["| epoch | real agent steps at its end | world-model steps | frame MSE, model, 1 / 12 / 50 steps | copy the last frame | reward accuracy, model / always 0 (50 steps) | real score, 32 games |"]
table.append("|---|---|---|---|---|---|---|")
for r in rows:
    mse = " / ".join(f"{num(r, f'wm_frame_mse_{h}'):.6f}" for h in ("1", "12", "50"))
    copy = " / ".join(f"{num(r, f'wm_copy_frame_mse_{h}'):.6f}" for h in ("1", "12", "50"))
    acc = f"{num(r, 'wm_reward_accuracy_50'):.3f} / {num(r, 'wm_copy_reward_accuracy_50'):.3f}"
    score = f"{num(r, 'eval_mean'):.2f} ± {num(r, 'eval_std'):.2f}" if r.get("eval_mean") else "-"
    table.append(f"| {r['epoch']} | {r['real_steps'] or '-'} | {r['world_model_steps']} | {mse} | {copy} | {acc} | {score} |")
table.append(f"| random | | | | | | {random['mean']:.2f} ± {random['std']:.2f} ({random['episodes']} games) |")
head = "# The docs' table of the Pong run, written by `bash benchmarks/simple_worldmodel_atari.sh pong-cpu-plot` from\n"
head += "# learning_curve.csv and the uniform-random eval_NNN.json beside this file\n\n"
(records / "table.md").write_text(head + "\n".join(table) + "\n")
print("\n".join(table))
PY
    ;;
quick)
    python simple_worldmodel_atari.py --env-id "$ENV_ID" --seed "$SEED" "${QUICK[@]}" \
        --run-dir "runs/simple_quick_${ENV_ID//\//_}_s$SEED"
    ;;
paper)
    # defaults = tensor2tensor rlmb_base_stochastic_discrete: 15 epochs, 16 x 6,400 real steps, 15,000 world-model
    # steps per epoch (x3 at epochs 0, 1, 4, 9, 14), 1,000 PPO iterations of 16 x 50 per epoch (x2, x3 on some)
    python simple_worldmodel_atari.py --env-id "$ENV_ID" --seed "$SEED" --run-dir "runs/simple_paper_${ENV_ID//\//_}_s$SEED"
    ;;
baseline)
    python simple_worldmodel_atari.py --mode model-free --env-id "$ENV_ID" --seed "$SEED" \
        --run-dir "runs/simple_model_free_${ENV_ID//\//_}_s$SEED"
    ;;
throughput)
    # the quick configuration under the throughput harness: simulated env SPS (sim/SPS, PPO inside the model)
    # against the raw AtariVectorEnv's SPS at 8 envs, with world-model training steps/s and the real collection's
    # SPS beside it, and the peak memory of the run. Nothing else may run (the harness records the load average).
    python benchmarks/throughput.py atari --env-id "$ENV_ID" --label simple-quick --tag sim/SPS \
        --also-tag world_model/steps_per_s --also-tag charts/SPS --train-seconds 900 -- \
        python simple_worldmodel_atari.py --env-id "$ENV_ID" --seed "$SEED" "${QUICK[@]}"
    ;;
*)
    echo "usage: $0 [quick|paper|baseline|throughput|{freeway,pong}-cpu[-random|-records]|pong-cpu-{probe,open-loop,refit,refit-control,plot}]" >&2
    exit 2
    ;;
esac
