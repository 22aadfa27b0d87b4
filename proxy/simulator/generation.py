"""One request's generation: the scripted model (or the replayed ids) through the engine, cut
into engine outputs, with the request's knobs applied. Shared by every generation route. Sans-IO.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from proxy.simulator.engine import (
    EngineOutput,
    Generation,
    Grouping,
    Pacing,
    Sampling,
    generate,
    group,
    split_at,
)
from proxy.simulator.guided import Constraint, GuidedError
from proxy.simulator.options import Options
from proxy.simulator.records import SimulatorState


def stop_kept(options: Options, default: bool) -> bool:
    """Whether the token that ended generation stays in the ids: `X-Sim-Stop-Mode` decides when
    given, else `default` (the request's `include_stop_str_in_output`, or `return_in_ids`)."""
    return default if options.stop_mode is None else options.stop_mode == "kept"


def run_generation(
    state: SimulatorState,
    prompt_ids: Sequence[int],
    options: Options,
    sampling: Sampling,
    *,
    split: Iterable[int] = (),
    constraint: Constraint | None = None,
) -> tuple[Generation, list[EngineOutput]]:
    """Generate for `prompt_ids` and cut the result into engine outputs, split at `split`
    (token counts where faults fire). The scripted model is steered by `constraint` (guided
    decoding); replayed ids that break it raise `GuidedError`. Without a guided-decoding backend
    (`config.guided_decoding` off) nothing enforces `constraint`: the model is told so, and
    replayed ids go out as they are."""
    config = state.config
    source: Iterable[int]
    if options.replay is not None:
        source = options.replay
    else:
        source = state.model.generate(
            prompt_ids,
            min_tokens=options.sim_tokens,
            preamble=options.preamble,
            constraint=constraint,
            enforced=config.guided_decoding,
        )
    generation = generate(
        source,
        sampling,
        limit=config.max_seq_len - len(prompt_ids),
        return_in_ids=stop_kept(options, config.return_in_ids),
    )
    if constraint is not None and options.replay is not None and config.guided_decoding:
        _check_replay(state, generation, constraint)
    grouping = Grouping(
        stream_interval=options.stream_interval,
        uneven=options.uneven,
        draft_tokens=config.draft_tokens,
        seed=options.seed,
        sizes=options.chunks,
    )
    pacing = Pacing(config.first_token_seconds, config.token_seconds)
    return generation, split_at(group(generation, grouping, pacing), split)


def _check_replay(state: SimulatorState, generation: Generation, constraint: Constraint) -> None:
    text = state.model.guided_text(generation.raw_ids)
    cut = generation.finish_reason == "length"
    if not (constraint.accepts_prefix(text) if cut else constraint.accepts(text)):
        raise GuidedError(
            "the replayed ids break the request's response_format (a real engine would not "
            "have generated them)"
        )
