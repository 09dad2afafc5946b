"""Names the runtime and the exported jobs share: a checkpoint's folder and the file rank 0
names the step of the last checkpoint in. No torch here: the export targets import it."""

from __future__ import annotations

STEP_DIR_FORMAT = "step-%08d"
"""A checkpoint's folder (checkpoint.Checkpointer.save): eight digits, more past step
99,999,999, as checkpoint_files.STEP_DIR reads it back. A printf format, so the SLURM script's
end line names the folder as Python does."""


def step_dir(step: int) -> str:
    """The folder name of the checkpoint of `step`."""
    return STEP_DIR_FORMAT % step


SAVED_STEP_ENV = "AUTOPLAN_SAVED_STEP_FILE"
"""The file rank 0 of `autoplan train` writes the step of the run's last checkpoint to, once
every rank has saved it and the run has ended cleanly (worker.py), set by the SLURM script
(export/slurm.py): torchrun exits 1 once it has passed a SIGTERM on, whatever its ranks did, so
srun's status cannot tell a clean stop at the time-limit warning from a crash; this file can."""
