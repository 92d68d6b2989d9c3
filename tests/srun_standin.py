"""A stand-in for ``srun`` on emulated hosts: what SLURM does for a one-task-per-node step.

``python srun_standin.py STATE_FILE [--wait S] COMMAND ARGS...`` runs COMMAND once in every
host of the emulated fabric described by STATE_FILE (``/run/tfgrpc-fabric/<name>.json``), as
task ``i`` on node ``i``, with the variables SLURM sets (``SLURM_JOB_NODELIST`` as a hostlist,
``SLURM_TASKS_PER_NODE``, ``SLURM_NODEID``, ``SLURM_PROCID``, ``SLURMD_NODENAME``...). Like
``srun --wait``, once the first task ends the others get ``--wait`` seconds, then SIGTERM; the
exit status is the highest of the tasks'. Plain module (no pytest import).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import hostlist

from pytest_tfgrpc.hosts.emulated import EmulatedFabric


def main(argv: list[str]) -> int:
    state, rest = argv[0], argv[1:]
    wait = 30.0
    if rest[:1] == ["--wait"]:
        wait, rest = float(rest[1]), rest[2:]
    with open(state) as handle:
        fabric = EmulatedFabric.from_json(json.load(handle))
    names = [host.name for host in fabric.hosts]
    base = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": hostlist.collect_hostlist(names),
        "SLURM_NNODES": str(len(names)),
        "SLURM_NTASKS": str(len(names)),
        "SLURM_TASKS_PER_NODE": f"1(x{len(names)})",
    }
    tasks = []
    for i, host in enumerate(fabric.hosts):
        env = {**os.environ, **base}
        env.update(SLURM_NODEID=str(i), SLURM_PROCID=str(i), SLURM_LOCALID="0",
                   SLURMD_NODENAME=host.name)  # fmt: skip
        tasks.append(subprocess.Popen(host.command(rest), env=env, start_new_session=True))
    first_end = None
    while any(task.poll() is None for task in tasks):
        if first_end is None and any(task.poll() is not None for task in tasks):
            first_end = time.monotonic()
        if first_end is not None and time.monotonic() - first_end > wait:
            for task in tasks:
                if task.poll() is None:
                    os.killpg(task.pid, signal.SIGTERM)
            for task in tasks:
                task.wait(timeout=30)
            break
        time.sleep(0.1)
    # srun reports the highest exit status (a signal counts as 128 + its number).
    return max(code if code >= 0 else 128 - code for code in (t.returncode for t in tasks))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
