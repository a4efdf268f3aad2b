"""Two "machines" under torchrun: two agents on 127.0.0.1 joined by c10d rendezvous run a generated pipeline.

The line ``pipeforge run ... --print-torchrun --nnodes 2`` prints is run twice, as two
``torchrun --nnodes 2 --nproc-per-node 1`` agents (the rendezvous endpoint a free port
of 127.0.0.1): each agent starts one rank, the ranks find each other through the
rendezvous, generate the schedule's module, run two SGD steps and compare losses,
outputs, every gradient and the parameters with the unpipelined model in one process;
the rank that gets global rank 0 prints the verdict.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeforge.tools.launch import free_port
from tests.load import scaled

ROOT = Path(__file__).resolve().parents[2]
AGENT_TIMEOUT = scaled(90)  # seconds; under load the whole test takes about 25 s here


def printed_line(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pipeforge", "run", *args, "--print-torchrun", "--nnodes", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert "--rdzv-backend=c10d" in line and "--nnodes=2" in line and "--nproc-per-node=1" in line
    return shlex.split(line)


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("schedule", ["1f1b", "zbv"])
def test_two_torchrun_agents_run_a_pipeline_equal_to_one_process(schedule, tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun comes with torch"
    words = printed_line(schedule, "-D", "P=2", "-D", "M=4", "--backend", "gloo")
    endpoint = f"127.0.0.1:{free_port()}"
    words = [w.replace("$RDZV_HOST:29500", endpoint).replace("$JOB_ID", f"pipeforge-{os.getpid()}") for w in words]
    command = [torchrun, *words[1:], "--json"]
    command.insert(command.index("-m"), "--local-addr=127.0.0.1")  # the workers' master address, on this host
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    agents = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                               env=env) for _ in range(2)]
    outputs = []
    try:
        for agent in agents:
            out, err = agent.communicate(timeout=AGENT_TIMEOUT)
            outputs.append((agent.returncode, out, err))
    finally:
        for agent in agents:  # only the two agents started here
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    assert all(code == 0 for code, _, _ in outputs), [err[-2000:] for _, _, err in outputs]
    verdicts = [json.loads(out) for _, out, _ in outputs if out.strip()]
    assert len(verdicts) == 1, outputs  # printed by global rank 0 only
    assert verdicts[0]["match"] is True and verdicts[0]["nproc"] == 2
