#!/usr/bin/env bash
# What to run when a session is lent a GPU machine (the `device` tool): the numbers only a GPU can give. The device
# machine has python3 with torch but none of gymnasium, ale-py, mujoco, gymnasium-robotics or tyro, and no network:
# their wheels travel in the ignored folder .whl/ (made here by `bash benchmarks/gpu.sh wheels`: .whl/atari 4 MB, what
# the Atari scripts need, and .whl/mujoco 38 MB; name `.whl`, or `.whl/atari` alone, in the run's `carry`). Each step installs them if missing, writes its logs and the harness's records under $OUT,
# and ends inside the 10-minute limit of one device command (GA3C_S, SYN_S, HYPER_S shorten the timed phases so that
# several steps share one command). Steps, in order of value:
#   run(command="bash benchmarks/gpu.sh ga3c", carry=[".whl"])      # issue 11: GA3C >= 10,000 SPS on an H100/H200
#   run(command="bash benchmarks/gpu.sh pairwise", carry=[".whl/atari", ".gpu_carry"])  # issue 11: pairwise Pong at
#       the paper's label rate, chained across sessions: copy the returned pairwise.tgz.part-* into .gpu_carry/
#   run(command="bash benchmarks/gpu.sh simple", carry=[".whl"])    # issue 13: world-model steps/s, sim SPS, memory
#   run(command="bash benchmarks/gpu.sh hyper", carry=[".whl"])     # issue 14: rollouts >= 100x the real env
#   run(command="bash benchmarks/gpu.sh gpu-tests", carry=[".whl"])  # the tests that skip without a GPU (~1 min)
#   run(command="bash benchmarks/gpu.sh hyper-loop", carry=[".whl"])  # issue 14: graphed actor update, loop rate
#   run(command="bash benchmarks/gpu.sh reacher", carry=[".whl"])   # issue 14: an Ant controller that flips less
#   run(command="RUN=rnd_montezuma_rnd_s2 bash benchmarks/gpu.sh montezuma-chain", carry=[".whl/atari",
#       ".gpu_carry/rnd_montezuma_rnd_s2"])  # issue 44 item 2: a CPU Montezuma run continued here (see the step)
#   run(command="TREX_S=360 bash benchmarks/gpu.sh trex-chain", carry=[".whl/atari", ".gpu_carry/trex"])  # item 3
# Then copy the returned records into benchmarks/results/throughput.jsonl and the results/*.md pages.
# The CPU runs of issue 44 run inside the lanes of benchmarks/lanes.sh: SIGTERMing one for a chain step stops its
# lane (exit 130); once the GPU's checkpoint is copied back, start that lane again (it resumes the run from it).
# Run so far (2026-11-26, one H200, 15 minutes): `WORKERS=128 GA3C_S=100 SYN_S=110 ... ga3c` and `HYPER_S=140 ... hyper`
# in one command (8 min), the keep-pace synthetic row and 64 workers by hand after it; `pairwise` and `simple` not yet.
# 2026-11-27, one H100, 15 minutes: `bash benchmarks/gpu.sh hyper-loop; SYN_S=110 bash benchmarks/gpu.sh keep-pace` in one
# command (8.5 min), then the rl row at 128 workers by hand (records in benchmarks/results/).
# 2026-11-27 afternoon, one H100, 15 minutes: `bash benchmarks/gpu.sh gpu-tests; ACTOR_S=0 LOOP_S=230 bash
# benchmarks/gpu.sh hyper-loop; REACHER_S=140 bash benchmarks/gpu.sh reacher` (7 min), then the loop resumed for 240 s
# (the LOOP2_S of hyper-loop, written after: the first resume on a GPU failed on the RNG state and was fixed here).
# 2026-11-28 early morning, one H200, 15 minutes: GA3C at 128 workers with the true reward for 110 s (16 logged
# values: 9,171 SPS, 0.79 of the raw env), then `TREX_S=360 ... trex-chain` and `TREX_S=215 ... trex-chain` (T-REX's
# Breakout policy phase from iteration 381 to 1,394 of 12,208).
# At most 8 files come back from one call: keep the steps of one call under that.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
install() {  # (into /tmp/site once: the steps of one command share it)
  export PYTHONPATH=/tmp/site
  python3 -c "import gymnasium, ale_py, mujoco, gymnasium_robotics, tyro" 2>/dev/null && return
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*/*.whl
}
record() { cp benchmarks/results/throughput.jsonl "$OUT/throughput.jsonl"; nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1; }
# `all`: each step is one harness measurement (raw env for RAW_S seconds, then the script for its seconds, stopped
# by SIGTERM), under a `timeout` so that one step that hangs cannot eat the others' time. DRY=1 prints the commands
# and installs, runs and times nothing (the CPU test of this plumbing: tests/test_benchmarks.py).
RAW_S=${RAW_S:-8}
S=${S:-40}
step() {  # step SECONDS COMMAND...: run (or, with DRY=1, print) one measurement within SECONDS + 60 s
  local secs=$1; shift
  if [ -n "${DRY:-}" ]; then echo "[$secs s] $*"; return 0; fi
  timeout -s KILL $((secs + 60)) "$@" 2>&1 | tail -4 | tee -a "$OUT/all.log"
  cp benchmarks/results/throughput.jsonl "$OUT/throughput.jsonl"  # after each step: a command cut at its limit keeps them
}
harness() {  # harness FAMILY ENV_ID NUM_ENVS LABEL SECONDS [harness flags] -- COMMAND...
  local family=$1 env_id=$2 n=$3 label=$4 secs=$5; shift 5
  step "$((secs + RAW_S))" python3 benchmarks/throughput.py "$family" --env-id "$env_id" --num-envs "$n" \
    --seconds "$RAW_S" --train-seconds "$secs" --label "$label-gpu" "$@"
}
case "${1:-}" in
all)  # issue 44: the GPU training SPS of all seven scripts, the raw env's rate beside each, in one device command
  [ -n "${DRY:-}" ] || install
  ex=/tmp/gpu_all_experts; py=python3
  # T-REX: its quick configuration makes the reward model, then the policy phase on it is measured
  step 60 $py trex_ppo_atari.py --env-id BreakoutNoFrameskip-v4 --demonstrator.total-timesteps 8192 \
    --policy.total-timesteps 8192 --reward.num-pairs 300 --reward.epochs 1 --eval.episodes 1 \
    --env.max-episode-frames 4000 --run-dir /tmp/trex_quick
  harness atari BreakoutNoFrameskip-v4 8 trex-policy "$S" -- $py trex_ppo_atari.py \
    --env-id BreakoutNoFrameskip-v4 --reward-model /tmp/trex_quick/reward_model.pt
  # RND at the paper's 128 envs x 128 steps, the observation-normalisation warm-up skipped
  harness atari MontezumaRevengeNoFrameskip-v4 128 rnd-128envs "$S" -- $py rnd_ppo_atari.py \
    --env-id MontezumaRevengeNoFrameskip-v4 --ppo.num-envs 128 --rnd.num-iterations-obs-norm-init 0 --env.no-track-rooms
  # GA3C with the true reward (the speed limit) at 128 workers
  harness atari BreakoutNoFrameskip-v4 128 ga3c-rl-w128 "$S" -- $py preference_ga3c_atari.py \
    --env-id BreakoutNoFrameskip-v4 --labeler rl --ga3c.workers 128
  # FILTER: a short expert phase fills the demo cache, then the IRL phase's charts/SPS is measured
  harness mujoco Hopper-v5 1 filter-irl "$((S + 20))" -- $py filter_irl_mujoco.py --env-id Hopper-v5 \
    --expert.experts-dir "$ex" --expert.timesteps 2000 --expert.num-demos 4 --sac.learning-starts 1000
  # HyPE on the same cached demos
  harness mujoco Hopper-v5 1 hype-irl "$S" -- $py hype_irl_mujoco.py --env-id Hopper-v5 \
    --expert.experts-dir "$ex" --expert.num-demos 4 --sac.learning-starts 1000
  # HyPER: the model rollouts and the loop's real steps/s on AntMaze UMaze (random-action data)
  if [ -n "${DRY:-}" ]; then echo "[$((S + 30)) s] HYPER_S=$S bash benchmarks/mbirl_antmaze.sh throughput"
  else PYTHON=$py LABEL_SUFFIX=-gpu HYPER_S=$S timeout -s KILL $((S + 90)) bash benchmarks/mbirl_antmaze.sh throughput \
    2>&1 | tail -4 | tee -a "$OUT/all.log"; fi
  # SimPLe at the paper's sizes: world-model steps/s, then the simulated env's SPS (PPO inside the model)
  harness atari PongNoFrameskip-v4 16 simple-paper "$((2 * S + 20))" --tag sim/SPS \
    --also-tag world_model/steps_per_s --also-tag charts/SPS -- $py simple_worldmodel_atari.py \
    --env-id PongNoFrameskip-v4 --wm.train-steps 100 --wm.epoch-multiplier 1 --ppo.iterations 20
  [ -n "${DRY:-}" ] || record ;;
wheels)  # here, not on the device: the missing packages as Python 3.12 manylinux wheels
  get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$@"; }
  get .whl/atari gymnasium==1.4.0 ale-py==0.12.1 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.0 \
    farama-notifications==0.0.6
  get .whl/test pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4
  get .whl/mujoco mujoco==4.0.0 mujoco-core==4.0.0 gymnasium-robotics==1.4.2 pettingzoo==1.27.0 glfw==2.11.0 \
    pyopengl==3.1.10 ;;
ga3c)  # true reward (the speed limit), then the synthetic labeller at the paper's 0.1 label samples per step
  install
  for workers in ${WORKERS:-64 128}; do
    python3 benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs "$workers" \
      --label "ga3c-rl-gpu-w$workers" --train-seconds "${GA3C_S:-120}" -- python3 preference_ga3c_atari.py \
      --env-id BreakoutNoFrameskip-v4 --labeler rl --ga3c.workers "$workers" 2>&1 | tail -5 | tee -a "$OUT/ga3c.log"
  done
  python3 benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 128 \
    --label ga3c-synthetic-rate0.1-gpu --train-seconds "${SYN_S:-180}" --counter-tag reward/updates -- python3 \
    preference_ga3c_atari.py --env-id BreakoutNoFrameskip-v4 --labeler synthetic --reward.dropout 0.5 --ga3c.workers 128 \
    --labels.pretrain 50 --reward.pretrain-epochs 1 --reward.labels-per-step 0.1 \
    --labels.store-dir /tmp/store_bench --exp-name bench-gpu 2>&1 | tail -6 | tee -a "$OUT/ga3c.log"
  record ;;
trex-chain)  # issue 44 item 3: the CPU T-REX Breakout run's policy phase, continued on the GPU for TREX_S seconds.
  # Here, first: SIGTERM the CPU run (it checkpoints), then copy what the policy phase resumes from (args.json,
  # demos.npz, reward_model.pt, checkpoints/policy.pt; not the demonstrator's 360 MB) into .gpu_carry/trex and carry
  # it. The same command resumes there (the GPU is the default device); SIGTERM at TREX_S checkpoints it again. Back
  # come policy.pt in 15 MB pieces (cat them into runs/trex_paper_breakout_s1/checkpoints/policy.pt), the GPU's TB
  # events (copy them into the run dir) and the log; the CPU run then resumes from the GPU's checkpoint.
  install
  dir=.gpu_carry/trex
  PYTHONUNBUFFERED=1 timeout -k 120 -s TERM "${TREX_S:-400}" python3 trex_ppo_atari.py --env-id BreakoutNoFrameskip-v4 \
    --seed 1 --demonstrator.total-timesteps 491520 --reward.epochs 1 --torch-threads 1 --checkpoint-every 10 \
    --run-dir "$dir" > "$OUT/trex.log" 2>&1
  split -b 15M -d "$dir/checkpoints/policy.pt" "$OUT/policy.pt.part-"
  cp "$(ls -t "$dir"/events.out.tfevents.* | head -1)" "$OUT/"
  ;;
montezuma-chain)  # issue 44 item 2 (ranked above item 3's trex-chain): one Montezuma run, RUN=rnd_montezuma_{rnd|ppo}_s<seed>,
  # continued on the GPU for MONTEZUMA_S seconds. Here, first: SIGTERM the CPU run (it snapshots, exit 130), copy its
  # args.json and newest checkpoints/ckpt_*.pt into .gpu_carry/RUN/ (RND ~48 MB, PPO ~30 MB: one run per call fits the
  # 64 MiB carry) and carry .gpu_carry/RUN and .whl/atari. The montezuma command of benchmarks/rnd_ppo_atari.sh resumes
  # there with the same flags (the GPU is the default device); SIGTERM at MONTEZUMA_S snapshots it again. Back come
  # its log, its TB events of this start (copy them into runs/RUN/) and either the newest checkpoint in 15 MB pieces
  # (cat them into runs/RUN/checkpoints/ under the name before .part-; the CPU run resumes from it) or, when the run
  # finished there, results.json, policy.pt and curves.png. CARRY and MONTEZUMA_FLAGS (appended) exist for the CPU test
  # of this plumbing (tests/test_benchmarks.py).
  install
  run=${RUN:?RUN=rnd_montezuma_<rnd|ppo>_s<seed>}
  carry=${CARRY:-.gpu_carry}
  name=${run#rnd_montezuma_}
  command -v python >/dev/null || { mkdir -p /tmp/pybin && ln -sf "$(command -v python3)" /tmp/pybin/python; }
  # shellcheck disable=SC2086  # MONTEZUMA_FLAGS: words
  PATH=/tmp/pybin:$PATH PYTHONUNBUFFERED=1 RUN_ROOT=$carry timeout -k 120 -s TERM "${MONTEZUMA_S:-400}" \
    bash benchmarks/rnd_ppo_atari.sh montezuma "${name%_s*}" "${run##*_s}" ${MONTEZUMA_FLAGS:-}
  cp "$carry/$run.log" "$(ls -t "$carry/$run"/events.out.tfevents.* | head -1)" "$OUT/"
  if [ -f "$carry/$run/results.json" ]; then
    cp "$carry/$run/results.json" "$carry/$run/policy.pt" "$carry/$run/curves.png" "$OUT/"
  else
    ckpt=$(ls "$carry/$run"/checkpoints/ckpt_*.pt | tail -1)
    split -b 15M -d "$ckpt" "$OUT/$(basename "$ckpt").part-"
  fi
  ;;
pairwise)  # synthetic pairwise Pong with the reward model trained at the paper's 0.1 label samples per agent step
  # (--reward.keep-pace: the agents wait whenever it falls behind), the script's defaults otherwise (reward-model
  # dropout 0 since 2026-11-26; PAIRWISE_FLAGS="--reward.dropout 0.5" for the paper's); stopped by SIGTERM
  # after PAIRWISE_S seconds (everything saved). On an H200 it ran 2,650 steps/s at this rate, so Pong's ~10M steps take
  # several 15-minute loans: the run dir and its label store come back as $OUT/pairwise.tgz.part-* (15 MB pieces);
  # copy them into .gpu_carry/ (ignored) and the next session's call resumes the run from them. CPU runs at a
  # twentieth of this rate hacked its reward with dropout 0.5 and eps 0.1, and learned with 0 and 1e-5 (docs/
  # preference_ga3c_atari.md).
  install
  work=${PAIRWISE_DIR:-/tmp/pairwise}; mkdir -p "$work"
  if ls .gpu_carry/pairwise.tgz.part-* > /dev/null 2>&1; then cat .gpu_carry/pairwise.tgz.part-* | tar xzf - -C "$work"; fi
  timeout -s TERM "${PAIRWISE_S:-480}" ${PYTHON:-python3} preference_ga3c_atari.py --env-id PongNoFrameskip-v4 \
    --feedback pairwise --ga3c.workers 128 --reward.labels-per-step 0.1 --reward.keep-pace --run-dir "$work/run" \
    --labels.store-dir "$work/store" --exp-name pairwise-gpu ${PAIRWISE_FLAGS:-} > "$OUT/pairwise.log" 2>&1
  tar czf - -C "$work" run store | split -b 15M - "$OUT/pairwise.tgz.part-"
  cp "$work/run/learning_curve.png" "$OUT/" 2> /dev/null; tail -5 "$OUT/pairwise.log"; record ;;
keep-pace)  # the keep-pace row of `ga3c` again under the script's current defaults (reward-model dropout 0, channels-
  # last pixels, one sync per ensemble round; the row above ran at commit 76e24d6 with dropout 0.5)
  install
  python3 benchmarks/throughput.py atari --env-id BreakoutNoFrameskip-v4 --num-envs 128 \
    --label ga3c-synthetic-rate0.1-keep-pace-d0-gpu --train-seconds "${SYN_S:-120}" --counter-tag reward/updates -- \
    python3 preference_ga3c_atari.py --env-id BreakoutNoFrameskip-v4 --labeler synthetic --ga3c.workers 128 \
    --labels.pretrain 50 --reward.pretrain-epochs 1 --reward.labels-per-step 0.1 --reward.keep-pace \
    --labels.store-dir /tmp/store_kp --exp-name bench-kp 2>&1 | tail -6 | tee -a "$OUT/keep_pace.log"
  record ;;
gpu-tests)  # the tests that skip without a GPU (CUDA graphs computing what eager code computes), the GPU visible to
  # the test process only (TESTS_ON_GPU=1; the scripts' subprocesses stay on the CPU); pytest's wheels in .whl/test
  install
  TESTS_ON_GPU=1 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_mbirl_antmaze.py -k cuda -rA 2>&1 \
    | tail -15 | tee "$OUT/gpu_tests.log"
  record ;;
hyper-loop)  # issue 14: the actor update per-update / batched / CUDA-graphed (benchmarks/mbirl_actor_update.py), the
  # discriminator's real trajectories one env vs side by side (benchmarks/mbirl_real_trajectories.py), the ensemble's
  # training step eager vs CUDA-graphed (benchmarks/mbirl_ensemble_step.py, since 2026-11-27), then
  # the HyPER loop at the maze defaults (20 updates per real step, model retrained to patience every 2,000 steps,
  # 50,000 rollout starts, the discriminator every 100 steps on 4 real trajectories, 150k-step schedule) on AntMaze
  # UMaze with the shipped controller's expert data, pretraining capped at 100 epochs, stopped after LOOP_S seconds:
  # its TensorBoard events come back (hyper_loop_tb.tgz) for the real steps per second after exploration.
  install
  [ "${ACTOR_S:-8}" != 0 ] && SECONDS_PER_WAY=${ACTOR_S:-8} python3 benchmarks/mbirl_actor_update.py 2>&1 | tee "$OUT/actor_update.log"
  python3 benchmarks/mbirl_real_trajectories.py 2>&1 | tee "$OUT/real_trajectories.log"  # one env vs side by side
  python3 benchmarks/mbirl_ensemble_step.py 2>&1 | tee "$OUT/ensemble_step.log"  # model training eager vs graphed
  # LOOP2_S: then resume the stopped run for LOOP2_S seconds more (resume on a GPU; more retrainings timed).
  for s in "${LOOP_S:-270}" ${LOOP2_S:-}; do
    timeout -s TERM "$s" python3 mbirl_antmaze.py --env-id AntMaze_UMaze-v5 --seed 1 \
      --run-dir /tmp/hyper_loop --expert.experts-dir /tmp/experts --model.pretrain-max-epochs 100 \
      --eval.frequency 1000000 --eval.log-frequency 100 >> "$OUT/hyper_loop.log" 2>&1
  done
  tar czf "$OUT/hyper_loop_tb.tgz" -C /tmp/hyper_loop --exclude='*.pt' --exclude='*.npz' . ; tail -4 "$OUT/hyper_loop.log"
  python3 benchmarks/mbirl_tb_rates.py /tmp/hyper_loop 2>&1 | tail -1 | tee "$OUT/hyper_loop_rates.json"
  record ;;
reacher)  # issue 14: the goal-reaching Ant controller trained from scratch on the GPU (its SAC update replayed as a
  # CUDA graph since 2026-11-27; ~460 Ant steps/s on an H100, 2026-11-27), stopped after REACHER_S seconds. Every evaluation that beats
  # the best so far writes $OUT/ant_goal_reacher_gpu_s$SEED.pt (+ .json); the replay (hundreds of MB) stays behind, so
  # each call starts afresh. Back here: `CTRL=<that .pt> ENV=AntMaze_Large_Diverse_GR-v5 N=64 bash
  # benchmarks/mbirl_antmaze.sh expert-rate`, and ship it only if it beats the shipped controller's 53/64.
  install
  timeout -s TERM "${REACHER_S:-540}" python3 mbirl_antmaze.py --train-goal-reacher --seed "${SEED:-4}" \
    --run-dir /tmp/reacher --reacher.path "$OUT/ant_goal_reacher_gpu_s${SEED:-4}.pt" > "$OUT/reacher.log" 2>&1
  tar czf "$OUT/reacher_tb.tgz" -C /tmp/reacher --exclude='*.pt' . ; grep -a "eval\]" "$OUT/reacher.log" | tail -5
  record ;;
simple)  # the paper's configuration (stochastic discrete, bf16 auto): its rates over ~8 minutes, then stopped
  install
  python3 benchmarks/throughput.py atari --env-id PongNoFrameskip-v4 --label simple-paper-gpu --tag sim/SPS \
    --also-tag world_model/steps_per_s --also-tag charts/SPS --train-seconds 480 -- python3 simple_worldmodel_atari.py \
    --env-id PongNoFrameskip-v4 --wm.train-steps 600 --wm.epoch-multiplier 1 --ppo.iterations 50 2>&1 | tail -8 | tee "$OUT/simple.log"
  record ;;
hyper)  # AntMaze UMaze rollouts on the GPU: the CPU's measurement (benchmarks/mbirl_antmaze.sh throughput) as it is
  install
  PYTHON=python3 LABEL_SUFFIX=-gpu bash benchmarks/mbirl_antmaze.sh throughput 2>&1 | tail -6 | tee "$OUT/hyper.log"
  record ;;
*) echo "usage: $0 all|wheels|ga3c|keep-pace|pairwise|simple|hyper|gpu-tests|hyper-loop|reacher|trex-chain|montezuma-chain" >&2; exit 2 ;;
esac
