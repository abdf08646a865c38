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
        tail = f"--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{err[-3000:]}"
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout:.0f}s\n{tail}")
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
        steps = {"actions": demos["actions"][m], "rewards": demos["rewards"][m]}
        ends = {"terminations": demos["terminals"][m], "truncations": demos["timeouts"][m]}
        buffers.append(EpisodeBuffer(id=e, observations=obs, **steps, **ends))
    minari.create_dataset_from_buffers(dataset_id, buffers, env=gym.make(str(demos["env_id"])), algorithm_name="PD")


# ---- generated bad input (issue 15): the cases come from the code, so a new flag or key is covered without a test edit
ABSURD_INT, ABSURD_FLOAT = "1000000000000000", "1e30"


def numeric_flag_cases(args_cls, prefix: str = "") -> list[tuple[str, str]]:
    """(flag, value) for every int/float field of a tyro Args dataclass, nested dataclasses as ``--group.field``:
    0, -1, NaN and an absurd value (10**15 for ints, 1e30 for floats). Optional[int]/Optional[float] count; bools,
    strings and lists do not."""
    import dataclasses
    import typing

    cases = []
    hints = typing.get_type_hints(args_cls)
    for f in dataclasses.fields(args_cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            cases += numeric_flag_cases(kind, f"{prefix}{f.name}.")
            continue
        inner = [a for a in typing.get_args(kind) if a is not type(None)]
        kind = inner[0] if typing.get_origin(kind) is typing.Union and len(inner) == 1 else kind
        if kind in (int, float):
            flag = "--" + (prefix + f.name).replace("_", "-")
            cases += [(flag, v) for v in ("0", "-1", "nan", ABSURD_INT if kind is int else ABSURD_FLOAT)]
    return cases


def mutated_arrays(valid: dict) -> list[tuple[str, str, dict]]:
    """(key, how, arrays) for every key of a valid dict of arrays (an npz's content): the key dropped, its values as
    strings, a NaN in it, its first axis one shorter, and one more axis (a wrong width)."""
    cases = []
    for key, value in valid.items():
        value = np.asarray(value)
        with_nan = value.astype(np.float64).copy()
        with_nan.flat[0] = np.nan
        mutations = {
            "dropped": None,
            "strings": value.astype(str),
            "nan": with_nan,
            "truncated": value[:-1],
            "wrong width": np.stack([value, value], axis=-1),
        }
        for how, new in mutations.items():
            arrays = {k: v for k, v in valid.items() if k != key}
            if new is not None:
                arrays[key] = new
            cases.append((key, how, arrays))
    return cases


def corrupt_file(path: Path, how: str, seed: int = 0) -> None:
    """Damage a file in place: ``truncated`` keeps the first half of its bytes, ``random`` replaces them all by
    random bytes (at least 64)."""
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(np.random.default_rng(seed).integers(0, 256, max(64, len(data)), dtype=np.uint8).tobytes())


def one_line_exit_2(call) -> str:
    """Run ``call()`` (a script's main on bad input, in-process) and return its stderr line, asserting that it
    exited with code 2 and printed exactly one line without a traceback."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        call()
    text = err.getvalue().strip()
    assert exit_info.value.code == 2, text
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    return text


def apply_flag(args, flag: str, value: str) -> bool:
    """Set ``--group.field value`` on a parsed Args object in place, converting the value to the field's int/float
    type as the parser would; False when it does not convert (then the parser's own exit 2 is what to test). Much
    faster than parsing the whole command line again for each generated case."""
    import typing

    *groups, name = flag.removeprefix("--").replace("-", "_").split(".")
    target = args
    for group in groups:
        target = getattr(target, group)
    kind = typing.get_type_hints(type(target))[name]
    inner = [a for a in typing.get_args(kind) if a is not type(None)]
    kind = inner[0] if inner else kind
    try:
        setattr(target, name, kind(value) if kind is float else int(value))
    except ValueError:
        return False
    return True
