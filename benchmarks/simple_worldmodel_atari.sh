#!/usr/bin/env bash
# Commands behind docs/simple_worldmodel_atari.md. Run from anywhere with the venv active:
#   bash benchmarks/simple_worldmodel_atari.sh quick     # CPU quick configuration: every phase, toy sizes
#   bash benchmarks/simple_worldmodel_atari.sh paper     # the paper's loop and budget (a GPU; days on CPU)
#   bash benchmarks/simple_worldmodel_atari.sh baseline  # model-free PPO on the same 102,400 real steps
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

case "${1:-quick}" in
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
    echo "usage: $0 [quick|paper|baseline|throughput]" >&2
    exit 2
    ;;
esac
