"""`sbatch --test-only` on a generated script against a throwaway slurm.conf: enough config for
sbatch to parse the script's #SBATCH lines; no controller runs, so a script it accepts ends on
"Unable to contact slurm controller" and one it refuses on the option it refused."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

needs_sbatch = pytest.mark.skipif(shutil.which("sbatch") is None,
                                  reason="sbatch (slurm-client) not installed")

ACCEPTED = "Unable to contact slurm controller"
"""What sbatch --test-only says of a script it parsed, with no controller to ask."""


def sbatch_test_only(tmp_path: Path, body: str) -> str:
    """sbatch --test-only's stderr for the script `body`."""
    conf = tmp_path / "slurm.conf"
    if not conf.exists():
        conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nSlurmctldPort=1\n"
                        "MessageTimeout=1\nGresTypes=gpu\nNodeName=n[1-64] CPUs=64 Gres=gpu:8\n"
                        "PartitionName=p Nodes=ALL Default=YES\n")
    path = tmp_path / "job.sbatch"
    path.write_text(body)
    return subprocess.run(["sbatch", "--test-only", str(path)],
                          env={**os.environ, "SLURM_CONF": str(conf)}, text=True,
                          capture_output=True, timeout=60).stderr
