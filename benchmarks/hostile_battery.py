"""A hostile battery for issue 48's classes of bad input, over the seven scripts: numeric flags given hostile values
(a random sample of each script's INT/FLOAT flags from its --help), and path/artifact cases (unwritable and over-long
paths, a run dir that is a file, bad --exp-name, unknown flags, bad --eval-only files, retired env ids). Each case runs
in a fresh empty folder; a case is clean when it exits 2 with one stderr line, no traceback, and nothing created. A
case still running after 15 s was accepted (then SIGTERMed: it must exit 130 within 30 s): listed for review.

Usage (repository root, venv active): python benchmarks/hostile_battery.py {numeric|paths} OUT.jsonl [SEED] [FLAGS]
Prints the cases that are not clean and a count per script; every case is a line of OUT.jsonl.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ["trex_ppo_atari", "rnd_ppo_atari", "filter_irl_mujoco", "hype_irl_mujoco", "preference_ga3c_atari",
           "mbirl_antmaze", "simple_worldmodel_atari"]  # fmt: skip
HOSTILE = {"INT": ["-7", "123456789012345678901234567890", "3.5"], "FLOAT": ["nan", "-inf", "1e999"]}
RETIRED = {"trex_ppo_atari": ["Pong-v0", "ALE/Pong-v4"], "rnd_ppo_atari": ["ALE/MontezumaRevenge-v4"],
           "filter_irl_mujoco": ["Hopper-v3"], "hype_irl_mujoco": ["Walker2d-v2"],
           "preference_ga3c_atari": ["ALE/Breakout-v4"], "mbirl_antmaze": ["AntMaze_UMaze-v2"],
           "simple_worldmodel_atari": ["ALE/Freeway-v4"]}  # fmt: skip


def run(script: str, argv: list, wait: float = 15.0) -> dict:
    cwd = tempfile.mkdtemp(prefix="battery_")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(ROOT / f"{script}.py"), *argv]
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)  # fmt: skip
    try:
        out, err = p.communicate(timeout=wait)
        state = "exited"
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            out, err = p.communicate(timeout=30)
            state = "accepted"
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            state = "hang-on-term"
    lines = [line for line in err.splitlines() if line.strip()]
    created = sorted(str(x.relative_to(cwd)) for x in Path(cwd).rglob("*"))[:5]
    clean = state == "exited" and p.returncode == 2 and len(lines) == 1 and "Traceback" not in err + out
    return {"script": script, "argv": argv, "state": state, "rc": p.returncode, "clean": clean and not created,
            "stderr_lines": len(lines), "stderr_tail": lines[-1:], "created": created}  # fmt: skip


def numeric_cases(script: str, rng: random.Random, per: int) -> list:
    env = dict(os.environ, COLUMNS="200")
    text = subprocess.run([sys.executable, str(ROOT / f"{script}.py"), "--help"], capture_output=True, text=True,
                          cwd=ROOT, env=env).stdout  # fmt: skip
    flags = sorted(set(re.findall(r"(--[\w.\-]+) (INT|FLOAT)\b", text)))
    rng.shuffle(flags)
    return [[flag, value] for flag, kind in flags[:per] for value in HOSTILE[kind]]


def path_cases(script: str, base: Path) -> list:
    a_file = base / "a_file"
    a_file.write_text("x")
    bad = {"random_bytes": os.urandom(3000), "empty": b""}
    cases = [["--run-dir", "/proc/1/nope/run"], ["--run-dir", str(a_file)], ["--torch-threads", "100000"],
             ["--exp-name", "../../escape"], ["--exp-name", "a" * 300], ["--run-dir", str(base / ("b" * 300))],
             ["--no-such-flag", "1"], ["--seed", "-1"], ["--eval-only", str(base / "missing")]]  # fmt: skip
    for name, content in bad.items():
        folder = base / f"eval_only_{name}"
        folder.mkdir(exist_ok=True)
        (folder / "policy.pt").write_bytes(content)
        cases.append(["--eval-only", str(folder)])
    return cases + [["--env-id", env_id] for env_id in RETIRED[script]]


if __name__ == "__main__":
    kind, out_path = sys.argv[1], sys.argv[2]
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    per = int(sys.argv[4]) if len(sys.argv) > 4 else 6
    base, counts = Path(tempfile.mkdtemp(prefix="battery_inputs_")), Counter()
    with open(out_path, "a") as out:
        for script in SCRIPTS:
            for argv in numeric_cases(script, rng, per) if kind == "numeric" else path_cases(script, base):
                result = run(script, argv)
                out.write(json.dumps(result) + "\n")
                out.flush()
                counts[(script, result["clean"])] += 1
                if not result["clean"]:
                    print("NOT CLEAN:", script, argv[:2], result["state"], result["rc"], result["stderr_tail"])
    for script in SCRIPTS:
        print(f"{script}: {counts[(script, True)]} clean, {counts[(script, False)]} not clean")
