"""FP8 checkpoints (block-wise `weight_scale_inv`, per-tensor and per-channel `weight_scale`) are
dequantized on load: the engine equals transformers run on the same dequantized weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from engine import LLM, SamplingParams
from engine.models import fp8
from tests.engine.hf_reference import hf_greedy
from tests.engine.models.families import BASE

BLOCK = [32, 32]
PROMPT = [(5 * i + 2) % 250 + 2 for i in range(20)]


def _quantize(w: torch.Tensor, scheme: str) -> dict[str, torch.Tensor]:
    """{weight, scale} of one [N, K] weight in float8_e4m3fn."""
    if scheme == "block":
        N, K = w.shape
        tiles = w.reshape(N // BLOCK[0], BLOCK[0], K // BLOCK[1], BLOCK[1])
        s = tiles.abs().amax(dim=(1, 3)) / 448.0  # [N / bn, K / bk]
        q = (tiles / s[:, None, :, None]).reshape(N, K).to(torch.float8_e4m3fn)
        return {"weight": q, "weight_scale_inv": s}
    s = w.abs().amax(dim=1, keepdim=True) / 448.0 if scheme == "channel" else w.abs().max() / 448.0
    return {"weight": (w / s).to(torch.float8_e4m3fn), "weight_scale": s}


@pytest.mark.parametrize("scheme", ["block", "tensor", "channel"])
def test_fp8_checkpoint_equals_transformers_on_its_dequantized_weights(tmp_path, scheme):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**BASE)).eval()
    sd = {}
    for name, t in model.state_dict().items():
        if name.endswith("_proj.weight"):
            prefix = name.removesuffix(".weight")
            sd.update({f"{prefix}.{k}": v.contiguous() for k, v in _quantize(t, scheme).items()})
        else:
            sd[name] = t.contiguous()
    quantized = tmp_path / "fp8"
    model.config.save_pretrained(quantized)
    raw = json.loads((quantized / "config.json").read_text())
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    if scheme == "block":
        qc["weight_block_size"] = BLOCK
    (quantized / "config.json").write_text(json.dumps({**raw, "quantization_config": qc}))
    save_file(sd, str(quantized / "model.safetensors"), metadata={"format": "pt"})
    # the reference: transformers on the dequantized weights
    with torch.no_grad():
        model.load_state_dict(fp8.dequantize(sd), strict=False)
    llm = LLM(model=str(quantized), dtype="float32", num_threads=2)
    out = llm.generate(
        PROMPT, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, prompt_logprobs=0)
    )[0]
    assert out.token_ids == hf_greedy(model, [PROMPT], [16])[0]
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0]
    want = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(PROMPT[1:])[:, None])[:, 0]
    got = torch.tensor([x.logprob for x in out.prompt_logprobs[1:]])
    assert (got - want).abs().max() < 1e-4
    # the dequantized weights are the fp8 values times their scales, not the unquantized ones
    w = fp8.dequantize(sd)["model.layers.0.mlp.down_proj.weight"]
    assert not torch.isnan(w).any() and w.abs().max() > 0
