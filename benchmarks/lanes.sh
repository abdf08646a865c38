#!/usr/bin/env bash
# Issue 44's long runs as two lanes (the CPU's two slots): each lane runs its queue of resumable commands one after
# another, so a slot goes to the next run as soon as the one before it finishes, with nobody watching. Every command
# is one of the benchmark targets that hold the exact run commands; each resumes from its checkpoints and exits 0 at
# once when its run has already finished, so the same lane command, re-run after a stop, skips what is done and goes
# on where it stopped. A command that exits non-zero stops its lane with a line (130: stopped by a signal, its
# checkpoint saved; 2: a gate refused, e.g. an expert below the paper's quality, which needs a person).
#
# Start each lane in its own session, then make that session yield to everything else (sched_autogroup is on, so
# nice alone only counts inside a session; the lane's children inherit its autogroup):
#   (setsid nohup bash benchmarks/lanes.sh a < /dev/null >> runs/logs/lane_a.log 2>&1 &)
#   (setsid nohup bash benchmarks/lanes.sh b < /dev/null >> runs/logs/lane_b.log 2>&1 &)
#   for p in $(pgrep -f "benchmarks/lanes.sh"); do echo 19 > /proc/$p/autogroup; done
# Stop: SIGTERM the running python (`pkill -TERM -f rnd_ppo_atari.py`, ...); it saves and exits 130, the lane stops.
#   bash benchmarks/lanes.sh a --list    # print lane a's queue, run nothing
# LANE_STEPS (one command per line) replaces a lane's queue: the tests use it.
set -euo pipefail
cd "$(dirname "$0")/.."
# the project's venv where the starting shell has none: unattended, a lane would otherwise stop at its first import
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi

# Both lanes start with the Hopper expert (item 4): the first makes its cache (from the committed actor, with no
# SAC training, or by training SAC), the second waits on its lock and then finds it. Then FILTER, MM and HyPE at 500k
# learner steps, seed 1 of each; then lane a takes item 3 (T-REX at 50M frames, most of a day of one slot, so several
# sessions) and lane b the second seeds, one after another, then third seeds (HyPE first: its two seeds' final
# evaluations differ most), so the slot T-REX leaves free keeps adding evidence.
# A machine is kept for the project's next session, but its work tree may be laid anew and a machine left unused for
# long is not kept, so on a machine that may outlive its checkout keep runs/ outside the work tree as a link:
#   mkdir -p /root/rl_runs/main && ln -s /root/rl_runs/main runs      # before the first lane starts
# Where runs/ is gone, the Hopper runs whose records are committed are skipped (paper_committed); a run that was under
# way starts again from nothing, and so does T-REX.
# (Item 2's Montezuma runs, RND and PPO seeds 1-2, finished in these lanes; their records are committed in
# benchmarks/results/rnd_montezuma_*.)
case "${1:-}" in
  a) steps="bash benchmarks/filter_irl_mujoco.sh paper-expert
bash benchmarks/filter_irl_mujoco.sh paper-irl mm 1
bash benchmarks/hype_irl_mujoco.sh paper-irl 1
bash benchmarks/trex_ppo_atari.sh paper" ;;
  b) steps="bash benchmarks/filter_irl_mujoco.sh paper-expert
bash benchmarks/filter_irl_mujoco.sh paper-irl filter 1
bash benchmarks/filter_irl_mujoco.sh paper-irl filter 2
bash benchmarks/filter_irl_mujoco.sh paper-irl mm 2
bash benchmarks/hype_irl_mujoco.sh paper-irl 2
bash benchmarks/hype_irl_mujoco.sh paper-irl 3
bash benchmarks/filter_irl_mujoco.sh paper-irl filter 3
bash benchmarks/filter_irl_mujoco.sh paper-irl mm 3" ;;
  *) echo "usage: bash benchmarks/lanes.sh {a|b} [--list]" >&2; exit 2 ;;
esac
lane=$1
steps=${LANE_STEPS:-$steps}
if [ "${2:-}" = --list ]; then echo "$steps"; exit 0; fi

while IFS= read -r step; do
  echo "== $(date -u +%FT%TZ) lane $lane: $step"
  rc=0
  bash -c "$step" < /dev/null || rc=$?  # not the queue on stdin: a step must not read the steps after it
  if [ "$rc" != 0 ]; then
    echo "== $(date -u +%FT%TZ) lane $lane stopped: '$step' exited $rc; re-run 'bash benchmarks/lanes.sh $lane'" \
      "to go on from it"
    exit "$rc"
  fi
done <<< "$steps"
echo "== $(date -u +%FT%TZ) lane $lane: every step done"
