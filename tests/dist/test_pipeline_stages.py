"""PARITY: pipeline stages that hold no transformer block (issue #12, Deliver 1).

An embedding-only first stage and a stage of only the final norm, output layer and loss
(pipeline.layers_per_stage [0, ..., 0]) train as one process does: losses, gradients and
parameters within the fp32 tolerance, tied embeddings included (the copies on the first and
the last stage still sum their gradients when neither holds a block).
"""

from __future__ import annotations

import pytest

from tests.dist.test_parity import check_parity

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

ROWS = {
    # rank 0 holds only the embedding, rank 1 all four blocks, the norm, the tied head and
    # the loss
    "pp2-embedding-only-tied-llama-sgd": dict(model="tiny-llama-tied", pp=2,
                                              layers_per_stage=(0, 4), optim="sgd"),
    # embedding-only and loss-only stages around one of all the blocks, the head tied to the
    # embedding across ranks 0 and 2 (one reference run serves both rows: same model,
    # batch and optimizer)
    "pp3-embedding-loss-tied-llama-sgd": dict(model="tiny-llama-tied", pp=3,
                                              layers_per_stage=(0, 4, 0), optim="sgd"),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_empty_end_stages_match_single_process(pool, reference_cache, name):
    check_parity(pool, reference_cache, ROWS[name])
