"""Shared test set-up: CPU only, few threads, fixed seeds, and the subprocess pattern smoke tests use.

Every script's tests use these fixtures:

- ``run_dir``: a fresh path under pytest's tmp dir that does *not* exist yet (scripts create it;
  tests of the "never overwrite a result" rules need to create it themselves).
- ``run_script(script, *args, timeout=...)``: runs ``python <script> <args>`` from the repository
  root in a subprocess, CPU only, and returns ``(returncode, stdout, stderr)``.
- ``slow`` marker: tests over ~30 s on a 2-core CPU. They run in CI; ``-m "not slow"`` skips them.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

# Force the CPU and small thread counts before torch is imported anywhere, so results do not
# depend on the machine the tests run on.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SEED = 0

torch.set_num_threads(1)


def subprocess_env() -> dict[str, str]:
    """Environment for script subprocesses: CPU only, one thread, no display, unbuffered output."""
    env = dict(os.environ)
    env.update(
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        MPLBACKEND="Agg",
        PYTHONUNBUFFERED="1",
        PYTHONHASHSEED="0",
    )
    env.pop("WANDB_API_KEY", None)
    return env


def run_script_subprocess(script: str, *args: str, timeout: float = 300.0, env: dict | None = None):
    """Run ``python <script> *args`` from the repository root; return (returncode, stdout, stderr).

    ``script`` is a path relative to the repository root (e.g. ``"trex_ppo_atari.py"``). On a timeout
    the process is killed and the test fails with the tail of its output, so a hang never eats CI.
    """
    cmd = [sys.executable, str(REPO_ROOT / script), *map(str, args)]
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO_ROOT,
            env=env if env is not None else subprocess_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout:.0f}s\n--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{err[-3000:]}")
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(autouse=True)
def _deterministic_seeds():
    """Every test starts from the same RNG state."""
    random.seed(DEFAULT_SEED)
    np.random.seed(DEFAULT_SEED)
    torch.manual_seed(DEFAULT_SEED)
    yield


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run-directory path that does not exist yet, inside pytest's temporary directory."""
    return tmp_path / "run"


@pytest.fixture
def run_script():
    """The subprocess helper as a fixture: ``rc, out, err = run_script("x.py", "--flag", "1", timeout=120)``."""
    return run_script_subprocess


def interrupt_when_exists(cmd: list[str], path: Path, wait_s: float = 180.0, exit_s: float = 120.0):
    """Start ``cmd`` (CPU only, from the repository root), SIGTERM it once ``path`` exists (a checkpoint, say),
    and return (returncode, stdout, stderr): the pattern of every script's resume test."""
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + wait_s
    while not path.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=exit_s)
    return proc.returncode, out, err


def write_minari_dataset(demos: dict, dataset_id: str) -> None:
    """Store demos (the demos.npz layout) as a local Minari dataset: each episode's T+1 observations and T steps."""
    import gymnasium as gym
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    buffers = []
    for e in range(len(demos["returns"])):
        m = demos["episode_ids"] == e
        obs = np.concatenate([demos["observations"][m], demos["next_observations"][m][-1:]]).astype(np.float64)
        buffers.append(EpisodeBuffer(id=e, observations=obs, actions=demos["actions"][m], rewards=demos["rewards"][m],
                                     terminations=demos["terminals"][m], truncations=demos["timeouts"][m]))  # fmt: skip
    minari.create_dataset_from_buffers(dataset_id, buffers, env=gym.make(str(demos["env_id"])), algorithm_name="PD")
