"""PEFT LoRA adapters for the gateway's adapter tests, made by PEFT itself on a Llama of a given
config (random base weights, random non-zero B: PEFT initialises B to zeros), and their upload."""

from __future__ import annotations

from pathlib import Path

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_peft_adapter(
    folder: Path,
    base_config: dict,
    *,
    r: int = 4,
    alpha: float = 8.0,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    seed: int = 0,
    b_std: float = 0.05,
    base=None,
) -> Path:
    """adapter_config.json + adapter_model.safetensors in ``folder``, saved by PEFT. ``base``: a
    transformers model to adapt (left as it was), else a random Llama of ``base_config``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if base is None:
        base = LlamaForCausalLM(LlamaConfig(**base_config)).eval()
    model = get_peft_model(
        base, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0)
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, b_std)
    model.save_pretrained(folder)
    model.unload()
    return folder


def adapter_bytes(folder: Path) -> tuple[bytes, bytes]:
    return (folder / "adapter_config.json").read_bytes(), (folder / "adapter_model.safetensors").read_bytes()


def multipart(name: str | None, config: bytes | None, weights: bytes | None) -> dict:
    """httpx keyword arguments of an upload; a None part is left out."""
    files = {}
    if config is not None:
        files["adapter_config"] = ("adapter_config.json", config, "application/json")
    if weights is not None:
        files["adapter_model"] = ("adapter_model.safetensors", weights, "application/octet-stream")
    return {"data": {"name": name} if name is not None else {}, "files": files}
