"""Real PEFT adapters for the LoRA tests: made with PEFT on the real base model, B non-zero."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model


@dataclass(frozen=True)
class AdapterRecipe:
    name: str
    r: int
    alpha: float
    targets: tuple[str, ...]
    seed: int
    b_std: float = 0.02
    rslora: bool = False


def make_adapter(base, recipe: AdapterRecipe, root: Path) -> Path:
    """Save a PEFT LoRA adapter of `base` with random A and B (PEFT initialises B to zeros, which
    would test nothing). `base` is left as it was."""
    torch.manual_seed(recipe.seed)
    cfg = LoraConfig(
        r=recipe.r,
        lora_alpha=recipe.alpha,
        target_modules=list(recipe.targets),
        use_rslora=recipe.rslora,
        lora_dropout=0.0,
    )
    model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, recipe.b_std)
    path = root / recipe.name
    model.save_pretrained(path)
    model.unload()
    return path


class PeftReference:
    """PEFT serving the adapters on the base model: all loaded once into one PeftModel, one
    active at a time (`set_adapter`), the base model through `disable_adapter`. Greedy outputs
    are cached per (adapter, prompt, n). Make every adapter before building this: it turns
    `base` into the PeftModel's base (LoRA layers injected)."""

    def __init__(self, base, adapters: list[Path]):
        self.names = {str(p): f"a{i}" for i, p in enumerate(adapters)}
        self.model = PeftModel.from_pretrained(base, adapters[0], adapter_name="a0").eval()
        for path, name in list(self.names.items())[1:]:
            self.model.load_adapter(path, adapter_name=name)
        self._greedy: dict[tuple, list[int]] = {}

    def _use(self, adapter):
        if adapter is None:
            return self.model.disable_adapter()
        self.model.set_adapter(self.names[str(adapter)])
        return nullcontext()

    @torch.no_grad()
    def logits(self, adapter: Path | None, token_ids: list[int]) -> torch.Tensor:
        """fp32 logits [n, vocab] of `adapter` alone (None: the base model) over a prompt."""
        with self._use(adapter):
            return self.model(input_ids=torch.tensor([token_ids])).logits[0].float()

    @torch.no_grad()
    def greedy(self, adapter: Path | None, token_ids: list[int], n: int) -> list[int]:
        """transformers `generate` through PEFT, greedy, `n` tokens, EOS ignored."""
        key = (None if adapter is None else str(adapter), tuple(token_ids), n)
        if key not in self._greedy:
            with self._use(adapter):
                out = self.model.generate(
                    input_ids=torch.tensor([token_ids]),
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )
            self._greedy[key] = out[0, len(token_ids) :].tolist()
        return self._greedy[key]


def engine_prefill_logits(engine, requests: list[tuple[str, list[int], object]]) -> dict[str, torch.Tensor]:
    """Our logits [n, vocab] at every prompt position, for prompts prefilled together in one step
    (each (request id, token ids, lora)). Runs the engine's own scheduler, slots and forward."""
    from engine import SamplingParams

    for rid, ids, lora in requests:
        engine.add_request(rid, ids, SamplingParams(max_tokens=1, temperature=0), lora=lora)
    plan = engine.scheduler.schedule()
    assert len(plan.scheduled) == len(requests), "every prompt must fit one step"
    engine.lora.activate(engine.scheduler.running)
    items, hidden, _ = engine.runner.forward(plan)
    out, row = {}, 0
    for it in items:
        out[it.seq.request_id] = engine.runner.model.logits(hidden[row : row + it.num_tokens])
        row += it.num_tokens
    for rid, _, _ in requests:
        engine.abort(rid)
    return out


def static_decode_graphs(runner, lora: bool = True):
    """Decode graphs of up to 4 rows over the runner's model running their static buffers eagerly
    (capture=False: the CPU's way through the graph path); `lora`: with the LoRA static tables."""
    from engine.cuda_graphs import DecodeGraphs
    from engine.lora.graph import StaticLoRA

    tables = StaticLoRA(runner.lora.slots, runner.lora.kernel) if lora else None
    r = runner
    return DecodeGraphs(r.model, r.kv_caches, r.block_size, 4, 64, r.device, capture=False, lora=tables)
