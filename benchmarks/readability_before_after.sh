#!/usr/bin/env bash
# Issue 17's before/after record: the four landed scripts as they were before the readability refactor (commit
# 3958e07, 2026-11-21) and as they are now, measured alternately in one window with nothing else running, with the
# foundation's harness (benchmarks/throughput.py). Old scripts take the flat flags of their time, new ones the nested.
# Usage (repository root, venv active): bash benchmarks/readability_before_after.sh [SECONDS]
# ONLY="filter hype" measures a subset (the second pass, after fused Adam and the multiply-sum Q output came back).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-90}
before=$(mktemp -d)
for f in trex_ppo_atari.py rnd_ppo_atari.py filter_irl_mujoco.py hype_irl_mujoco.py; do git show 3958e07:$f > "$before/$f"; done
# The IRL phases read a Hopper demos cache: 64 random-policy episodes (speed does not depend on the demos' quality).
experts=$(mktemp -d)
python - "$experts" <<'PY'
import sys, numpy as np, hype_irl_mujoco as h
from pathlib import Path
rng = np.random.default_rng(0)
demos = h.collect_demos("Hopper-v5", lambda obs: rng.uniform(-1, 1, 3), 64)
(Path(sys.argv[1]) / "Hopper-v5").mkdir(parents=True)
np.savez_compressed(Path(sys.argv[1]) / "Hopper-v5" / "demos.npz", **demos)
PY
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
atari() { python benchmarks/throughput.py atari ${NO_RECORD:+--no-record} --seconds "${RAW_SECONDS:-15}" --train-seconds "$secs" "$@"; }
mujoco() { python benchmarks/throughput.py mujoco ${NO_RECORD:+--no-record} --env-id Hopper-v5 --seconds "${RAW_SECONDS:-15}" --train-seconds "$secs" "$@"; }
for version in before after; do
  dir=$([ $version = before ] && echo "$before" || echo .)
  if [ $version = before ]; then
    want trex && atari --env-id BreakoutNoFrameskip-v4 --num-envs 8 --label "trex-policy-$version" -- python "$dir/trex_ppo_atari.py" \
        --env-id BreakoutNoFrameskip-v4 --reward-model runs/trex_quick/reward_model.pt
    want rnd && atari --env-id MontezumaRevengeNoFrameskip-v4 --num-envs 8 --label "rnd-$version" -- python "$dir/rnd_ppo_atari.py" \
        --env-id MontezumaRevengeNoFrameskip-v4 --num-envs 8 --no-progress-bar --num-iterations-obs-norm-init 1
    want filter && mujoco --label "filter-irl-$version${SUFFIX:-}" -- python "$dir/filter_irl_mujoco.py" --env-id Hopper-v5 \
        --experts-dir "$experts" --learning-starts 1000 --train-every 1000 --torch-threads 1
    want hype && mujoco --label "hype-irl-$version${SUFFIX:-}" -- python "$dir/hype_irl_mujoco.py" --env-id Hopper-v5 \
        --experts-dir "$experts" --learning-starts 1000 --log-frequency 100 --torch-threads 1
  else
    want trex && atari --env-id BreakoutNoFrameskip-v4 --num-envs 8 --label "trex-policy-$version" -- python trex_ppo_atari.py \
        --env-id BreakoutNoFrameskip-v4 --reward-model runs/trex_quick/reward_model.pt
    want rnd && atari --env-id MontezumaRevengeNoFrameskip-v4 --num-envs 8 --label "rnd-$version" -- python rnd_ppo_atari.py \
        --env-id MontezumaRevengeNoFrameskip-v4 --ppo.num-envs 8 --no-progress-bar --rnd.num-iterations-obs-norm-init 1 --env.no-track-rooms
    want filter && mujoco --label "filter-irl-$version${SUFFIX:-}" -- python filter_irl_mujoco.py --env-id Hopper-v5 \
        --expert.experts-dir "$experts" --sac.learning-starts 1000 --irl.train-every 1000 --torch-threads 1
    want hype && mujoco --label "hype-irl-$version${SUFFIX:-}" -- python hype_irl_mujoco.py --env-id Hopper-v5 \
        --expert.experts-dir "$experts" --sac.learning-starts 1000 --log-frequency 100 --torch-threads 1
  fi
done
rm -rf "$before" "$experts"
