#!/usr/bin/env bash
# A/B of the 2026-11-28 reading changes (issue 46): rnd, filter, hype at 4314729 (before) against HEAD (after),
# (run it with the venv active, from anywhere)
# alternating 20-s turns for S seconds each (benchmarks/alternate.py); the before scripts must be in /tmp/ab/before:
#   mkdir -p /tmp/ab/before && for f in rnd_ppo_atari filter_irl_mujoco hype_irl_mujoco; do git show 4314729:$f.py > /tmp/ab/before/$f.py; done
set -euo pipefail
cd "$(dirname "$0")/.."
ex=/tmp/ab/experts
if [ ! -f $ex/Hopper-v5/demos.npz ]; then
  OMP_NUM_THREADS=1 python filter_irl_mujoco.py --env-id Hopper-v5 --expert.experts-dir $ex --expert.timesteps 2000 \
    --expert.num-demos 16 --sac.learning-starts 1000 --expert.only --run-dir /tmp/ab/expert_run > /tmp/ab/expert.log 2>&1
fi
S=${S:-240}
for s in rnd filter hype; do
  case $s in
    rnd) flags="--env-id MontezumaRevengeNoFrameskip-v4 --ppo.num-envs 8 --no-progress-bar --rnd.num-iterations-obs-norm-init 1 --env.no-track-rooms --torch-threads 1"; f=rnd_ppo_atari;;
    filter) flags="--env-id Hopper-v5 --expert.experts-dir $ex --sac.learning-starts 1000 --irl.train-every 1000 --torch-threads 1"; f=filter_irl_mujoco;;
    hype) flags="--env-id Hopper-v5 --expert.experts-dir $ex --sac.learning-starts 1000 --torch-threads 1"; f=hype_irl_mujoco;;
  esac
  echo "== $s"
  python benchmarks/alternate.py --window 20 --seconds $S --cmd before "python /tmp/ab/before/$f.py $flags" --cmd after "python $f.py $flags"
done
