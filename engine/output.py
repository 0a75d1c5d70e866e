"""What a step's sampled tokens become: each token appended to its sequence, the stop checks (EOS,
stop tokens, a completed grammar, max_tokens, the context, stop strings), its text, the prompt
logprobs once, and one `RequestOutput` per sampled sequence; a finished sequence is released
(scheduler, grammar matcher, adapter pin, table). Requests that end without running (refused by an
SLO policy, a grammar that failed to compile) get their one output here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from engine.choices import Choices
from engine.detokenizer import Detokenizer, find_stop, holdback
from engine.request import FinishReason, RequestOutput, Sequence, SequenceStatus, TokenLogprob
from engine.request_table import RequestTable
from engine.scheduler import ScheduledSeq, Scheduler

if TYPE_CHECKING:
    from engine.lora.manager import LoRAManager
    from engine.structured.manager import StructuredOutputs

Sampled = tuple[ScheduledSeq, int, TokenLogprob | None]  # what ModelRunner.run returns per item


class OutputProcessor:
    def __init__(
        self,
        requests: RequestTable,
        choices: Choices,
        scheduler: Scheduler,
        *,
        detokenizer: Detokenizer | None,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        lora: LoRAManager | None,
        structured: Callable[[], StructuredOutputs | None],
    ):
        self.requests = requests
        self.choices = choices
        self.scheduler = scheduler
        self.detokenizer = detokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.lora = lora
        self.structured = structured  # the engine's StructuredOutputs once made, else None

    def process(self, sampled: Iterable[Sampled], now: float) -> list[RequestOutput]:
        """One output per sampled item (`now`: time.monotonic(), the first tokens' time)."""
        outputs: list[RequestOutput] = []
        last = None
        for item, token, logprob in sampled:
            if item is not last:
                outputs.append(self.append(item.seq, token, now, logprob))
            elif not item.seq.is_finished:  # speculative decoding: more kept tokens of the same item
                _merge(outputs[-1], self.append(item.seq, token, now, logprob))
            last = item
        return outputs

    def append(self, seq: Sequence, token: int, now: float, logprob: TokenLogprob | None) -> RequestOutput:
        params = seq.params
        new: list[int]
        logprobs: list[TokenLogprob] | None
        if params.max_tokens == 0:  # prompt scoring only: the prefill is done, nothing is generated
            new, logprobs = [], [] if params.logprobs is not None else None
            seq.finish_reason = FinishReason.LENGTH
        else:
            new, logprobs = [token], [logprob] if logprob is not None else None
            seq.token_ids.append(token)
            if self._grammar_complete(seq, token) or self._stop_token(seq, token):
                seq.finish_reason = FinishReason.STOP
            elif seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
                seq.finish_reason = FinishReason.LENGTH
        if seq.first_token_time is None:
            seq.first_token_time = now
            seq.record("first_token")
            self.choices.start(seq)
        text = self._text(seq)  # may finish it (a stop string)
        out = RequestOutput(
            request_id=seq.group or seq.request_id,
            index=seq.index,
            done=self.choices.finish(seq),
            new_token_ids=new,
            new_text=text,
            finished=seq.finish_reason is not None,
            finish_reason=seq.finish_reason.value if seq.finish_reason else None,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            logprobs=logprobs,
            num_cached_tokens=min(seq.num_cached_tokens, seq.num_prompt_tokens),
            num_draft_tokens=seq.num_draft_tokens,
            num_accepted_tokens=seq.num_accepted_tokens,
        )
        if params.prompt_logprobs is not None and not seq.prompt_logprobs_sent:
            out.prompt_logprobs, seq.prompt_logprobs_sent = seq.prompt_logprobs, True
        if out.finished:
            seq.record("finished", finish_reason=out.finish_reason)
            self.release(seq)
        if seq.events:
            out.events = seq.take_events()
        return out

    def _grammar_complete(self, seq: Sequence, token: int) -> bool:
        structured = self.structured()
        return (
            seq.params.structured is not None
            and structured is not None
            and structured.accept(seq.request_id, token)
        )

    def _stop_token(self, seq: Sequence, token: int) -> bool:
        params = seq.params
        return (not params.ignore_eos and token in self.eos_token_ids) or token in params.stop_token_ids

    def _text(self, seq: Sequence) -> str:
        """New text safe to hand out; detects stop strings (the stop string itself is not emitted)."""
        state = self.requests.text_states.get(seq.request_id)
        if state is None or self.detokenizer is None:
            return ""
        new = self.detokenizer.step(state, seq.output_token_ids)
        stops = seq.params.stop
        if new and stops:
            cut = find_stop(state.text, len(new), stops)
            if cut != -1:
                state.text = state.text[:cut]
                seq.finish_reason = FinishReason.STOP
        end = len(state.text)
        if seq.finish_reason is None and stops:
            end -= holdback(state.text, stops)
        end = max(end, state.emitted)
        chunk, state.emitted = state.text[state.emitted : end], end
        return chunk

    def refused(self, seq: Sequence, error: Exception) -> RequestOutput:
        """A waiting request the policy refused (it would miss its TTFT target): finished, no tokens."""
        seq.finish_reason = FinishReason.SLO_UNATTAINABLE
        seq.record("slo_refused")
        self.release_unstarted(self.choices.end(seq.request_id)[1])
        self.release(seq)
        return self._ended(seq, error)

    def failed(self, seq: Sequence, error: Exception) -> RequestOutput:
        """A request whose grammar failed to compile: finished, never scheduled."""
        seq.finish_reason = FinishReason.ABORT
        seq.status = SequenceStatus.FINISHED  # never in the scheduler
        self.release(seq)
        return self._ended(seq, error)

    def _ended(self, seq: Sequence, error: Exception) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=[],
            new_text="",
            finished=True,
            finish_reason=seq.finish_reason.value if seq.finish_reason else None,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            error=error,
            events=seq.take_events(),
            num_draft_tokens=seq.num_draft_tokens,
            num_accepted_tokens=seq.num_accepted_tokens,
        )

    def release(self, seq: Sequence) -> None:
        """`seq` is done: out of the scheduler (or the grammar queue), its adapter unpinned, forgotten."""
        structured = self.structured()
        if seq.params.structured is not None and structured is not None and structured.release(seq):
            seq.status = SequenceStatus.FINISHED  # it waited for its grammar: never in the scheduler
        else:
            self.scheduler.finish(seq)
        if self.requests.forget(seq) and seq.lora is not None and self.lora is not None:
            self.lora.release(seq.lora)  # unpin the adapter in host memory

    def release_unstarted(self, choices: list[Sequence]) -> None:
        """Choices 1..n-1 of a request that ends before they joined the scheduler: released, and the
        adapter pin each took (engine/choices.py) dropped; they were never in the table."""
        for choice in choices:
            self.release(choice)
            if choice.lora is not None and self.lora is not None:
                self.lora.release(choice.lora)


def _merge(out: RequestOutput, more: RequestOutput) -> None:
    """`more` (a later token of the same step and sequence) folded into `out`."""
    out.new_token_ids += more.new_token_ids
    out.new_text += more.new_text
    if out.logprobs is not None and more.logprobs is not None:
        out.logprobs += more.logprobs
    out.finished, out.finish_reason, out.done = more.finished, more.finish_reason, more.done
    out.num_output_tokens = more.num_output_tokens
    out.events += more.events
