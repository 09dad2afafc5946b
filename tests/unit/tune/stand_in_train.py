"""A stand-in for `autoplan train` that speaks its metrics-file protocol (one JSON line per
step) and behaves by the plan: step time grows with the micro-batch size, full recompute
"runs out of memory", ZeRO-3 hangs. Lets the tune loop's process handling be tested in seconds;
the real runtime is exercised by the integration tests."""

import json
import sys
import time

import yaml

plan_path, metrics_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
plan = yaml.safe_load(open(plan_path))
if plan["recompute"]["policy"] == "full":
    sys.stderr.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    sys.exit(1)
if plan["zero_stage"] == 3:
    time.sleep(1000)
step_s = 0.03 * plan["batch"]["micro_batch_size"]
with open(metrics_path, "w") as fh:
    for step in range(1, steps + 1):
        time.sleep(step_s)
        fh.write(json.dumps({"step": step, "loss": 1.0, "step_time_s": step_s,
                             "peak_memory_bytes": 1e6 * step}) + "\n")
        fh.flush()
