"""export's and import's number flags read numbers as train's do (cli_common's count and amount:
`--steps 10k`, `--checkpoint-every 1k`, import's `--num-gpus 1k` = 1024) and refuse a bad value
in the house line with an example the flag takes, not a GPU count's 8."""

from __future__ import annotations

import pytest

from autoplan.commands import build_parser, main

EXPORT = ["export", "plan.yaml", "--to", "slurm"]


def test_counts_take_the_suffixes_trains_flags_take() -> None:
    args = build_parser().parse_args([*EXPORT, "--steps", "10k", "--checkpoint-every", "0.5k",
                                      "--train-tokens", "1T"])
    assert (args.steps, args.checkpoint_every, args.train_tokens) == (10_000, 500, 1e12)
    imported = build_parser().parse_args(["import", "x.sh", "--from", "megatron", "--cluster",
                                          "c", "--num-gpus", "1k"])
    assert imported.num_gpus == 1024  # a GPU count: binary, as search's --num-gpus


@pytest.mark.parametrize(("argv", "needle"), [
    ([*EXPORT, "--steps", "ten"], "--steps: got 'ten'; write a whole number, e.g. 20 or 10k"),
    ([*EXPORT, "--checkpoint-every", "1.0005k"],
     "--checkpoint-every: got '1.0005k'; write a whole number, e.g. 500 or 1k"),
    ([*EXPORT, "--keep-checkpoints", "3k"],
     "--keep-checkpoints: got '3k'; write a whole number, e.g. 3"),
    ([*EXPORT, "--max-restarts", "1.5"], "--max-restarts: got '1.5'; write a whole number, e.g. 3"),
    ([*EXPORT, "--gpus-per-node", "eight"],
     "--gpus-per-node: got 'eight'; write a whole number, e.g. 8"),
    ([*EXPORT, "--elastic", "--min-nodes", "two"],
     "--min-nodes: got 'two'; write a whole number, e.g. 2"),
    ([*EXPORT, "--train-tokens", "lots"], "--train-tokens: got 'lots'; write a number of "
                                          "tokens, e.g. 1e12 or 1T"),
    (["import", "x.sh", "--from", "megatron", "--cluster", "c", "--num-gpus", "64x"],
     "--num-gpus: got '64x'; write a whole number, e.g. 64"),
])
def test_a_bad_number_is_the_house_line_with_the_flags_example(capsys, argv: list[str],
                                                               needle: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and not captured.out, err
    assert err.startswith(f"autoplan {argv[0]}: error: {needle}"), err


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--steps", "0", "--steps: got '0'; expected a whole number from 1 to"),
    ("--checkpoint-every", "-1", "--checkpoint-every: got '-1'; expected a whole number from 0 to"),
    ("--max-restarts", "10001",
     "--max-restarts: got '10001'; expected a whole number from 0 to 10,000"),
])
def test_the_ranges_stay(capsys, flag: str, value: str, needle: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*EXPORT, flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and needle in err, err


def test_a_suffixed_count_out_of_range_shows_the_text_and_its_value(capsys) -> None:
    """'-1k' read "got -1024" beside an ungrouped range: the text given comes first, its value
    beside it where that is not the same text, the range grouped."""
    with pytest.raises(SystemExit) as exit_:
        main([*EXPORT, "--steps=-1k"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert ("--steps: got '-1k' (= -1,000); expected a whole number from 1 to "
            "1,099,511,627,776") in err
