"""The built-in PyTorch runtime that executes a Plan (DESIGN.md section 8).

The only part of autoplan, with the profiler, that imports torch. `parallelize()` composes
PyTorch's own pieces (DeviceMesh, DTensor TP/SP, FSDP2/DDP, pipelining, checkpointing) in one
documented order; `trainer.Trainer` runs steps; `cli.register` adds `autoplan train`.
"""
