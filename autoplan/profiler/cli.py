"""`autoplan profile`: measure this machine and write profiles/NAME.yaml."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoplan import fsutil, resources
from autoplan.cli_common import add_format_argument, count, emit, stderr_console
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile, load_profile, profile_from_dict
from autoplan.hardware_efficiency import MAX_FP8_MATMUL
from autoplan.profile_files import check_out_and_name
from autoplan.yaml_io import read_yaml, save_yaml, to_dict

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser("profile", help="measure this machine into a hardware profile",
                       description="Measure GEMM efficiency, memory bandwidth, collectives and "
                       "host paths on this machine and write a profile the cost model reads.")
    p.add_argument("--out", help="output path (default NAME.yaml in the checkout's profiles/ "
                   "when run inside it, else in $AUTOPLAN_PROFILES or ~/.config/autoplan/profiles)")
    p.add_argument("--name", help="profile name, which `--cluster` finds it by: its file name "
                   "(default: --out's file name, else cpu-measured or <datasheet profile>-measured)")
    p.add_argument("--base", help="profile whose unmeasured fields are kept (default: cpu-gloo "
                   "on CPU, the matching datasheet profile on a GPU)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"),
                   help="dtype of the GEMM curve (default fp32 on CPU, bf16 on GPU)")
    p.add_argument("--ranks", type=count(None, None, example="4"),
                   help="largest collective group (default: 4 on CPU, the GPU count on CUDA)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (~1 minute)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    add_format_argument(p)
    p.set_defaults(func=profile_command)


def _gpu_base(device_name: str) -> str:
    name = device_name.lower()
    for key, prof in (("h200", "h200-sxm-141gb"), ("h100", "h100-sxm-80gb"),
                      ("h800", "h800-sxm-80gb"), ("a100", "a100-sxm4-80gb"),
                      ("v100", "v100-sxm2-32gb")):
        if key in name:
            return prof
    return "h100-sxm-80gb"


def _progress(console: Any):  # -> a context manager yielding an autoplan.progress.Tracker
    """A bar on a terminal, a line every few seconds on stderr otherwise (autoplan.progress)."""
    from autoplan.progress import tracker

    return tracker("profile", console)


@dataclass(frozen=True)
class _Request:
    """What `autoplan profile` was asked for, resolved: the device, the GEMM dtype, the base
    profile's fields, the new profile's name and path, and the collective group sizes."""

    device: Any  # torch.device
    precision: str
    base: dict[str, Any]
    name: str
    out: Path
    groups: list[int]
    quick: bool

    @property
    def use_cuda(self) -> bool:
        return bool(self.device.type == "cuda")


@dataclass
class _Measured:
    """Everything one `autoplan profile` run measured, before it becomes a profile."""

    matmul: list[Any]
    copy_bw: float
    elem_bw: float
    dispatch: Any
    host_bw: float
    adam: float
    sixteen_bit: Any
    tables: dict[str, Any]
    collectives: dict[int, dict[str, list[list[float]]]] = field(default_factory=dict)
    fp8: dict[str, list[Any]] | None = None
    """FP8 GEMMs at the curve's training sizes by pass (compute.time_fp8); None: not timed."""
    fp8_why: str | None = None
    """Why they were not (compute.fp8_unavailable)."""


def _request(args: argparse.Namespace) -> _Request:
    """The run `args` ask for, with each bad value refused in one line (exit 2)."""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", "cuda requested but torch sees no CUDA device",
                          "use --device cpu or install a CUDA build of torch")
    check_out_and_name(args.out, args.name)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    here = torch.cuda.get_device_name(0) if use_cuda else "cpu"
    default_base = _gpu_base(here) if use_cuda else "cpu-gloo"
    base_ref = args.base if args.base is not None else default_base
    # validates the name or path with the usual one-line error
    check_base_device(base_ref, load_profile(base_ref, "--base"), here)
    base_path = resources.find(resources.PROFILES, base_ref) if resources.is_name(base_ref) \
        else Path(base_ref)
    name = profile_name(args, "cpu-measured" if not use_cuda else f"{default_base}-measured")
    out = Path(args.out) if args.out is not None else (
        resources.default_write_dir(resources.PROFILES) / f"{name}.yaml")
    fsutil.check_file_target(out, force=args.force)  # before minutes of measuring
    # on CUDA one rank per GPU: refused here, not by a rank's set_device after the measuring
    most = torch.cuda.device_count() if use_cuda else 8
    max_ranks = args.ranks if args.ranks is not None else (most if use_cuda else 4)
    if not 1 <= max_ranks <= most:
        seen = f" (torch sees {most} GPU(s), one rank each)" if use_cuda else " on CPU"
        raise ConfigError("--ranks", f"got {max_ranks}", f"use --ranks 1 to {most}{seen}")
    base = read_yaml(base_path or base_ref, "--base")
    precision = gemm_precision(args.precision, use_cuda, base, base_ref)
    return _Request(
        device=torch.device("cuda", 0) if use_cuda else torch.device("cpu"),
        precision=precision, base=base, name=name, out=out,
        groups=[g for g in (2, 4, 8) if g <= max_ranks], quick=args.quick)


def profile_name(args: argparse.Namespace, default: str) -> str:
    """The name written into the profile: the one `--cluster` finds it by, its file name.
    --out X.yaml writes `name: X`; --name names the file written in the profile folder, and
    with an --out of another file name is refused (the name inside would find nothing)."""
    name = resources.safe_name(args.name, "--name") if args.name else None
    if args.out is None:
        return name or default
    stem = Path(args.out).stem
    if Path(args.out).suffix != ".yaml" or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", stem):
        log.warning("--out %s: --cluster cannot find this profile by name (a name is a plain "
                    "file name without '.', in a file ending .yaml): give --cluster its path, "
                    "or write it as e.g. %s", args.out,
                    Path(args.out).with_name(_plain(stem) + ".yaml"))
    if name is not None and name != stem:
        raise ConfigError("--name", f"{name!r} differs from --out's file name {stem!r}, the name "
                          f"`--cluster` finds the profile by",
                          f"leave --name out (the profile is named {stem}), or write --out "
                          f"{Path(args.out).with_name(name + Path(args.out).suffix)}")
    return stem


def _plain(stem: str) -> str:
    """`stem` with every character a name cannot hold made '-' (v1.2 -> v1-2)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", stem).lstrip("-") or "profile"


def check_base_device(base_ref: str, base: ClusterProfile, here: str) -> None:
    """Refuse a base profile of another device than the one measured (`here`: `cpu` or the
    GPU's name as torch gives it): its unmeasured fields (memory, peaks, SMs, GPUs per node,
    host) would sit beside this machine's measurements in one profile."""
    from autoplan.calibrate import device_model, device_token

    want, got = device_model(base), device_token(here)
    if want == got:
        return
    fix = ("use --base cpu-gloo or another CPU profile" if got == "cpu" else
           f"give --base a profile of a {got} GPU (copy the nearest datasheet profile, set its "
           "device name and figures, and pass its path)")
    raise ConfigError("--base", f"{base_ref} describes {want}, but this run measures {here}",
                      fix)


def gemm_precision(asked: str | None, use_cuda: bool, base: Any, base_ref: str) -> str:
    """The precision GEMMs are measured in: as asked, else fp32 on a CPU and on a GPU bf16, or
    fp16 where the base profile has no bf16 peak (a V100). On a GPU the curve is a share of the
    base profile's datasheet peak, so that peak must be there: refused before measuring."""
    peaks = base.get("device", {}).get("peak_flops_per_s", {}) if isinstance(base, dict) else {}
    if not use_cuda:
        return asked or "fp32"
    precision = asked or ("bf16" if "bf16" in peaks else "fp16")
    if precision not in peaks:
        raise ConfigError("--precision", f"{precision}: base profile {base_ref} has no "
                          f"{precision} peak", "choose one of " + ", ".join(sorted(peaks)))
    return precision


def _measure(req: _Request, console: Any) -> _Measured:
    """Run every microbenchmark, one progress step each (the runtime-layer grid reports its
    own sub-steps)."""
    import torch

    from autoplan.profiler import collectives, compute, dispatch, host, layers
    from autoplan.profiler import precision as sixteen_bit

    device, quick = req.device, req.quick
    if not req.use_cuda:
        torch.set_num_threads(1)
    with _progress(console) as progress:
        task = progress.add_task("measuring", total=6 + len(req.groups))

        def step(what: str) -> None:
            progress.update(task, description=what)

        step(f"GEMMs ({req.precision})")
        mm = compute.measure_matmul(device, req.precision, quick)
        if compute.fp8_unavailable(device, req.base) is None:
            step("GEMMs (fp8)")
        fp8, fp8_why = compute.time_fp8(device, req.base, quick)
        progress.advance(task)
        step("memory bandwidth")
        copy_bw, elem_bw = compute.measure_bandwidth(device, quick)
        progress.advance(task)
        step("operator dispatch (plain, DTensor, checkpointed, FSDP)")
        disp = dispatch.measure_dispatch(device, quick)
        progress.advance(task)
        step("host copies and CPU Adam")
        host_bw = host.measure_copy_bandwidth(device, quick)
        adam = host.measure_cpu_adam(quick, threads=None if req.use_cuda else 1)
        progress.advance(task)
        step("bf16 against fp32 (the runtime's GEMMs and attention)")
        figures = sixteen_bit.measure_precision(quick) if not req.use_cuda else None
        progress.advance(task)
        tables = layers.measured_tables(
            device, req.precision, quick,
            lambda i, n, what: step(f"runtime layers {i}/{n}: {what}"))
        progress.advance(task)
        measured = _Measured(mm, copy_bw, elem_bw, disp, host_bw, adam, figures, tables,
                             fp8=fp8, fp8_why=fp8_why)
        for g in req.groups:
            step(f"collectives over {g} ranks")
            measured.collectives[g] = collectives.measure_collectives(g, device.type, quick)
            progress.advance(task)
    return measured


def _profile(req: _Request, m: _Measured) -> dict[str, Any]:
    """The new profile's fields: the base's, with what was measured in their place."""
    from autoplan.profiler import build, collectives, dispatch, dtensor_collectives
    from autoplan.profiler import precision as sixteen_bit

    prof = build.assemble(req.base, req.name, req.device, req.precision, m.matmul, m.copy_bw,
                          m.elem_bw, m.dispatch.op_overhead_s, m.collectives, m.host_bw, m.adam,
                          req.quick, m.tables, m.fp8)
    dispatch.apply_dispatch(prof, m.dispatch, req.device)
    # a GPU profile keeps its datasheet 16-bit peaks; an fp16 curve scales neither fp32 nor bf16
    if m.sixteen_bit is not None and req.precision in ("fp32", "bf16"):
        sixteen_bit.apply_precision(prof, m.sixteen_bit, req.precision)
    if m.collectives:
        prof["collectives"] = collectives.collective_tables(m.collectives)
    dtensor_collectives.apply_tp_overhead(prof, m.collectives, req.device)
    if m.tables.get("layers"):  # last: it prices blocks with every other field final
        build.feed_layer_points(prof, m.tables, req.precision)
    return prof


def _summary(req: _Request, m: _Measured, prof: dict[str, Any], loaded: Any, written: Path
             ) -> dict[str, Any]:
    """What the run prints (or writes as JSON): the headline figures and the runtime's layers
    measured against the cost model's price of them under the new profile (`loaded`)."""
    from autoplan.profiler import compare

    colls = bool(m.collectives)
    return {
        "profile": str(written), "device": prof["device"]["name"],
        "matmul_peak_flops_per_s": max(t.size / t.seconds for t in m.matmul),
        "copy_bytes_per_s": m.copy_bw, "host_copy_bytes_per_s": m.host_bw,
        "cpu_adam_params_per_s": m.adam, "op_overhead_s": m.dispatch.op_overhead_s,
        "all_reduce_bytes_per_s": prof["intra_node"]["bytes_per_s"] if colls else None,
        "all_reduce_latency_s": prof["intra_node"]["latency_s"] if colls else None,
        "groups": req.groups, "pid": os.getpid(),
        "layers_vs_model": compare.layer_comparison(m.tables["layers"], m.tables["layer_models"],
                                                    loaded, req.precision),
        "saved_vs_model": compare.saved_comparison(m.tables["saved_activations"],
                                                   m.tables["layer_models"], req.precision),
        "matmul_from_layers": prof["measured"]["matmul_from_layers"],
        # a GPU profile's FP8 figure and where it came from (a CPU runs no FP8 plan: None)
        "fp8_matmul": prof["efficiency"].get("fp8_matmul", 1.0) if req.use_cuda else None,
        "fp8_measured": prof["measured"].get("fp8_matmul"), "fp8_why": m.fp8_why,
    }


def _render(summary: dict[str, Any], c: Any) -> None:
    from autoplan.profiler import report

    c.print(f"wrote [bold]{summary['profile']}[/] ({summary['device']})")
    c.print(f"  GEMM best {summary['matmul_peak_flops_per_s'] / 1e9:,.1f} GFLOP/s, memory "
            f"copy {summary['copy_bytes_per_s'] / 1e9:.1f} GB/s, host copy "
            f"{summary['host_copy_bytes_per_s'] / 1e9:.1f} GB/s, CPU Adam "
            f"{summary['cpu_adam_params_per_s'] / 1e6:.0f} M params/s, "
            f"{summary['op_overhead_s'] * 1e6:.1f} us per operator")
    if summary["fp8_matmul"] is not None:
        c.print(f"  FP8 GEMMs at {summary['fp8_matmul']:.3f} of the curve's share of the fp8 "
                f"peak {_fp8_source(summary['fp8_measured'], summary['fp8_why'])}")
    if summary["all_reduce_bytes_per_s"] is not None:
        c.print(f"  all-reduce over {min(summary['groups'])} ranks: "  # the fit's group
                f"{summary['all_reduce_bytes_per_s'] / 1e9:.2f} GB/s bus bandwidth, "
                f"{summary['all_reduce_latency_s'] * 1e6:.0f} us per step")
    fed = summary["matmul_from_layers"]
    err = fed["block_log_error"]
    c.print(f"  matmul curve: {len(fed['points'])} points from the runtime's MLP GEMMs "
            f"{'used' if fed['used'] else 'not used'}; block time mean |log(measured/"
            f"predicted)| {err['square_gemms']:.3f} square GEMMs only, "
            f"{err['with_points']:.3f} with them")
    c.print(report.layer_table(summary["layers_vs_model"]))
    c.print(report.saved_table(summary["saved_vs_model"]))


def _fp8_source(measured: dict[str, Any] | None, why: str | None) -> str:
    """Where the profile's fp8_matmul comes from, for the summary line."""
    if measured is None:
        return f"(the base profile's: not timed here, {why})"
    if measured["applied"]:
        return (f"(measured: forward {measured['forward_ratio']:.3f} with fast accumulation, "
                f"backward {measured['backward_ratio']:.3f})")
    return (f"(the base profile's: measured {measured['ratio']:.3f}, outside the (0, "
            f"{MAX_FP8_MATMUL:g}] a profile loads; the base's fp8 peak is below what this GPU "
            f"reached: a 16-bit figure filed as fp8?)")


def profile_command(args: argparse.Namespace) -> int:
    from autoplan.tune.runner import Stopped, stop_on_signals

    req = _request(args)
    try:
        # SIGTERM/SIGHUP unwind like Ctrl-C (as in train and tune): the collective benchmark's
        # ranks are killed and its temporary folder removed on the way out
        with stop_on_signals():
            measured = _measure(req, stderr_console())
    except Stopped as stop:
        sys.stderr.write(f"autoplan profile: stopped by {stop} while measuring; nothing "
                         "written\n")
        return 128 + stop.signum
    prof = _profile(req, measured)
    loaded = profile_from_dict(prof)  # the result must load like any other profile
    written = save_yaml(prof, req.out, overwrite=args.force)
    summary = _summary(req, measured, prof, loaded, written)
    emit(args, to_dict(summary), lambda c: _render(summary, c))
    return 0
