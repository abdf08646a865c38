"""Time one docs page's quick command as a newcomer runs it, and append the record to quick_commands.jsonl.

    python benchmarks/time_quick.py trex_ppo_atari 'python trex_ppo_atari.py --env-id ...' [LIMIT_S]

The command runs in a fresh `git archive` of HEAD (no runs/, no cached experts: what a new clone has) under
`/usr/bin/time -v` and a `timeout` of LIMIT_S (600 by default, the docs' 10-minute promise). The record holds the
command, wall/user/sys seconds, peak memory, the load average before and after, the process's nice and its session
group's autogroup nice (with sched_autogroup on, a nice value only counts inside its own session): the wall time is
an upper bound of what 2 idle cores take whenever anything else ran.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "quick_commands.jsonl"


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: time_quick.py SCRIPT 'COMMAND' [LIMIT_S]", file=sys.stderr)
        return 2
    script, command = argv[0], " ".join(argv[1].replace("\\\n", " ").split())
    limit = int(argv[2]) if len(argv) == 3 else 600
    commit = subprocess.check_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], text=True).strip()
    work = Path(tempfile.mkdtemp(prefix=f"quick_{script}_"))
    subprocess.run(f"git -C {REPO} archive {commit} | tar -x -C {work}", shell=True, check=True)
    venv = REPO / ".venv"
    env = dict(os.environ, PATH=f"{venv}/bin:{os.environ['PATH']}", VIRTUAL_ENV=str(venv))
    before, start = loadavg(), datetime.now(timezone.utc)
    timing = work / "time.txt"
    with open(work / "log.txt", "w") as log:
        cmd = ["/usr/bin/time", "-v", "-o", str(timing), "timeout", "-s", "TERM", "-k", "60", str(limit)]
        done = subprocess.run([*cmd, "bash", "-c", command], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    after, text = loadavg(), timing.read_text()

    def field(name: str) -> str:
        return re.search(re.escape(name) + r": (.*)", text).group(1).strip()

    clock = [float(x) for x in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    record = {
        "script": script,
        "command": command,
        "date": start.isoformat(timespec="seconds"),
        "commit": commit,
        "exit_code": done.returncode,
        "timed_out": done.returncode in (124, 137),
        "limit_s": limit,
        "wall_s": round(sum(x * 60**i for i, x in enumerate(reversed(clock))), 1),
        "user_s": float(field("User time (seconds)")),
        "sys_s": float(field("System time (seconds)")),
        "cpu_percent": field("Percent of CPU this job got"),
        "max_rss_mb": round(int(field("Maximum resident set size (kbytes)")) / 1024, 1),
        "loadavg_before": before,
        "loadavg_after": after,
        "cores": os.cpu_count(),
        "nice": os.nice(0),
        "autogroup": Path("/proc/self/autogroup").read_text().split()[-1],
    }
    with OUT.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
