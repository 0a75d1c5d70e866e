"""The gateway's tokenizer for a random-weight "dummy" model: the byte tokenizer, loaded without
transformers or torch (a gateway process stays small and starts in seconds; tests and benchmarks
start many)."""

from __future__ import annotations

from tests.fresh_python import run_fresh

CHECK = """
import sys
from engine import check_model
from gateway.api.tokenization import load_prompt_tokenizer
assert check_model("dummy") is None
tokenizer = load_prompt_tokenizer("dummy", dummy_config={"vocab_size": 512})
ids = tokenizer.encode_prompt("hi")
assert tokenizer.vocab_size == 512 and ids and max(ids) < 512, ids
print(",".join(sorted(m for m in ("torch", "transformers") if m in sys.modules)) or "none")
"""


def _heavy_modules(code: str) -> str:
    return run_fresh(code).stdout.split()[-1]


def test_a_dummy_models_tokenizer_loads_neither_transformers_nor_torch():
    assert _heavy_modules(CHECK) == "none"


def test_the_check_sees_transformers_when_it_is_loaded():
    assert "transformers" in _heavy_modules("import transformers.models.auto.tokenization_auto\n" + CHECK)
