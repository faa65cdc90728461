"""What every engine (ours and the HF baselines) shares: config, tokenizer, requests in, observers."""

from __future__ import annotations

import time

from engine.config import EngineConfig
from engine.observer import EngineObserver
from engine.output_processor import OutputProcessor
from engine.request import Request, RequestId
from engine.sampling_params import SamplingParams
from engine.weights import LoadedModel, load_model


def resolve_model(config: EngineConfig, loaded: LoadedModel | None) -> LoadedModel:
    """The weights to build on: those given, or the config's model loaded now."""
    return loaded if loaded is not None else load_model(config.model, config.torch_dtype, config.seed)


class EngineBase:
    """Loads the model if needed, finalizes the config and owns the request front end.

    Subclasses queue admitted requests in :meth:`_enqueue` and implement ``step``, ``abort``,
    ``has_unfinished`` and ``stats``; that is the interface the server and the bench drive.
    """

    def __init__(self, config: EngineConfig, loaded: LoadedModel) -> None:
        # NOTE: ``loaded`` is not kept: once subclasses copied the weights, they can be freed.
        self.config = config.finalize(loaded.config)
        self.model_config = loaded.config
        self.model_name = loaded.name
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = frozenset(loaded.config.eos_token_ids) | frozenset(self.tokenizer.eos_token_ids)
        self.outputs = OutputProcessor(self.tokenizer, loaded.config.vocab_size,
                                       self.config.max_model_len)  # type: ignore[arg-type]
        self.num_steps = 0

    def decode_weight_bytes(self) -> int | None:
        """Bytes of weights a decode step reads as this engine stores them; None where the engine cannot say."""
        return None

    @property
    def observers(self) -> list[EngineObserver]:
        return self.outputs.observers

    def add_observer(self, observer: EngineObserver) -> None:
        self.outputs.observers.append(observer)

    def remove_observer(self, observer: EngineObserver) -> None:
        self.outputs.observers.remove(observer)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> RequestId:
        """Queue a request; raises ValueError for an empty or over-long prompt or a reused id."""
        request = self.outputs.new_request(prompt, params, request_id,
                                           arrival_time if arrival_time is not None else time.time())
        self._enqueue(request)
        return request.request_id

    def _enqueue(self, request: Request) -> None:
        raise NotImplementedError
