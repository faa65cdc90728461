"""CUDA-graph decode: bucket choice everywhere; capture and replay only where a GPU is lent."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.cuda_graphs import batch_buckets

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="CUDA graphs need a CUDA device; none on this machine")


def test_buckets_cover_every_batch_size_up_to_the_cap() -> None:
    assert batch_buckets(1) == [1]
    assert batch_buckets(16) == [1, 2, 4, 8, 16]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]
    for cap in (1, 3, 16, 33):
        buckets = batch_buckets(cap)
        assert buckets[-1] == cap and buckets == sorted(set(buckets))


@needs_gpu
def test_graph_decode_matches_eager_decode_on_gpu() -> None:
    prompts = [[5, 6, 7], [100] * 20, [300, 2, 9, 9] * 5, [1] * 37, [9] * 3]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    graphs = LLM("dummy:tiny", device="cuda", execution="optimized", max_num_seqs=8)
    assert graphs.engine.runner.decode_graphs is not None
    eager = LLM("dummy:tiny", device="cuda", execution="eager", max_num_seqs=8)
    assert eager.engine.runner.decode_graphs is None
    assert [o.token_ids for o in graphs.generate(prompts, params)] == \
        [o.token_ids for o in eager.generate(prompts, params)]
