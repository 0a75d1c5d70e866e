"""EngineConfig.device: "auto" resolves to the hardware, "cpu" runs anywhere, bad names and absent
GPUs are refused with a clear error before anything loads."""

import pytest
import torch

from engine import LLM, EngineConfig, SamplingParams
from engine.device import device_to_select, resolve_device, resolve_dtype, select_device

TINY = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def test_dummy_model_runs_on_the_cpu():
    llm = LLM(model="dummy", device="cpu", dummy_config=TINY, kv_cache_gib=0.01)
    runner = llm.engine.runner
    assert runner.device == torch.device("cpu") and runner.graphs is None
    assert runner.kv_caches[0].device.type == "cpu" and runner.model.embed.device.type == "cpu"
    params = SamplingParams(max_tokens=5, temperature=0.8, seed=3, ignore_eos=True)
    first = llm.generate([[1, 2, 3]], params)[0].token_ids
    assert len(first) == 5 and llm.generate([[1, 2, 3]], params)[0].token_ids == first


def test_auto_is_cuda_exactly_when_torch_sees_a_gpu():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    if torch.cuda.is_available():
        assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "CPU", "mps"])
def test_bad_device_names_are_refused(name):
    with pytest.raises(ValueError, match="device must be"):
        EngineConfig(device=name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="no CUDA GPU"):
        LLM(model="dummy", device="cuda", dummy_config=TINY)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_the_triton_backend_refuses_a_cpu_without_the_interpreter(monkeypatch):
    from engine.attention import make_backend

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        make_backend("triton", 4, 2, 64, "cpu")


def test_auto_on_the_cpu_is_bfloat16_exactly_where_it_has_native_bf16_dot_products():
    import platform

    from engine.device import cpu_flags
    from engine.models.bf16_linear import bf16_library

    auto = resolve_dtype("auto", torch.device("cpu"))
    if platform.machine().lower() in ("x86_64", "amd64"):
        native = bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})
        assert auto == (torch.bfloat16 if native else torch.float32)
        if native:  # auto bf16 has the kernel (vdpbf16ps); a forced bf16 on AVX2 its AVX2 variant
            assert bf16_library() is not None
        assert (bf16_library() is not None) == bool(native or {"avx2", "fma"} <= cpu_flags())


def test_cuda_n_is_made_current_before_triton_launches():
    # Triton launches on the current CUDA device, not the tensors': cuda:N must be set first
    assert device_to_select(torch.device("cuda", 3)) == 3
    assert device_to_select(torch.device("cuda")) == 0
    assert device_to_select(torch.device("cpu")) is None
    select_device(torch.device("cpu"))  # nothing to set on the host


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_engine_on_the_last_gpu_runs_there():
    index = torch.cuda.device_count() - 1
    llm = LLM(model="dummy", device=f"cuda:{index}", dummy_config=TINY, kv_cache_gib=0.01)
    assert torch.cuda.current_device() == index
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids
    assert len(out) == 4
