"""A gateway process runs without torch.

Nothing a gateway does needs it: it reads the model's config and tokenizer through transformers,
which imports torch whenever torch is installed (its configuration modules do), and that alone
cost a gateway process about 3 s of CPU at start and 250 MB of memory on a 2-core machine, once
per gateway process (``--gateway-workers N``). With ``torch`` marked absent in ``sys.modules``,
transformers takes its supported path for an installation without torch (configurations and
tokenizers only), and any import of torch in the process fails at once instead of loading it.
The engine workers are processes of their own and load torch as before.

One case needs torch: a GGUF file whose tokenizer has not been converted yet (transformers' GGUF
reader uses it). The first gateway to serve it converts the tokenizer into the model cache with
torch loaded (engine.assets.load_tokenizer); every later start reads that folder without it.
"""

from __future__ import annotations

import logging
import sys

ADVICE = "PyTorch was not found"  # transformers' notice on import without torch, not an error here


class _NoTorchAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return ADVICE not in record.getMessage()


def tokenizer_without_torch(model: str) -> bool:
    """Whether a gateway reads this model spec's tokenizer without torch: all but a GGUF file whose
    tokenizer is not converted yet (a spec that names nothing is refused later, by the check)."""
    from engine import assets

    try:
        source = assets.resolve_model(model)
    except FileNotFoundError:
        return True
    if source.kind != "gguf":
        return True
    return any(assets.has_tokenizer(d) for d in (assets.converted_dir(source), assets.tokenizer_dir(source)))


def torch_free() -> bool:
    """Mark torch absent in this process (before anything imports it); False where it is loaded."""
    if sys.modules.get("torch", None) is not None:
        return False
    sys.modules["torch"] = None  # type: ignore[assignment]  # find_spec answers None, import raises
    logging.getLogger("transformers").addFilter(_NoTorchAdvice())
    return True
