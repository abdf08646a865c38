"""Signal latency of a training script: start SCRIPT in a fresh folder with the given flags, send SIGTERM DELAY seconds
after the start, print the seconds from the signal to the exit, the exit code, the 1-min load before and after, and
the last lines of stderr and stdout. Usage: python benchmarks/signal_latency.py SCRIPT DELAY [flags...]
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

script, delay = sys.argv[1], float(sys.argv[2])
cwd = tempfile.mkdtemp(prefix="signal_latency_")
env = dict(os.environ, OMP_NUM_THREADS="1")
load0 = os.getloadavg()[0]
p = subprocess.Popen(
    [sys.executable, script, "--run-dir", "run", *sys.argv[3:]],
    cwd=cwd,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=env,
    start_new_session=True,
)
time.sleep(delay)
t = time.perf_counter()
os.killpg(p.pid, signal.SIGTERM)
try:
    o, e = p.communicate(timeout=120)
except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL)
    o, e = p.communicate()
    e += "\nKILLED after 120 s"
last_err = (e.strip().splitlines() or [""])[-1][:110]
last_out = (o.strip().splitlines() or [""])[-1][:80]
print(
    f"{script}: SIGTERM at {delay:.0f} s -> exit after {time.perf_counter() - t:.1f} s, rc {p.returncode}, "
    f"1-min load {load0:.1f} -> {os.getloadavg()[0]:.1f}; stderr: {last_err}; stdout: {last_out}"
)
