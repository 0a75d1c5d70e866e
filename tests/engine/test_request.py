import pytest

from engine import InvalidRequestError, SamplingParams


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=-3), "max_tokens"),
        (dict(max_tokens=2.5), "max_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(n=0), "n"),
        (dict(n=129), "n"),
        (dict(n=2, max_tokens=0, prompt_logprobs=0), "n"),
        (dict(stop=[""]), "stop"),
        (dict(stop=[3]), "stop"),
        (dict(stop_token_ids=["x"]), "stop_token_ids"),
        (dict(seed="7"), "seed"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3), "frequency_penalty"),
        (dict(frequency_penalty="1"), "frequency_penalty"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(logit_bias={5: 101}), "logit_bias"),
        (dict(logit_bias={-1: 1}), "logit_bias"),
        (dict(logit_bias={"x": 1}), "logit_bias"),
        (dict(logit_bias=[5]), "logit_bias"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(max_tokens=4, min_tokens=5), "min_tokens"),
        (dict(logprobs=21), "logprobs"),
        (dict(logprobs=True), "logprobs"),
        (dict(prompt_logprobs=-1), "prompt_logprobs"),
    ],
)
def test_bad_sampling_params_raise_named_error(kwargs, param):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert err.value.param == param
    assert param.split("_")[0] in str(err.value)


def test_sampling_params_normalises_single_values():
    p = SamplingParams(stop="###", stop_token_ids=[5, 6], temperature=0)
    assert p.stop == ("###",)
    assert p.stop_token_ids == (5, 6)
    assert p.greedy


def test_logit_bias_normalises_to_sorted_pairs_and_survives_json():
    import json

    p = SamplingParams(logit_bias={"7": 1, 3: -100.0}, max_tokens=0, prompt_logprobs=0)
    assert p.logit_bias == ((3, -100.0), (7, 1.0))
    assert SamplingParams(**json.loads(json.dumps(p.__dict__))) == p  # as the lane message carries it
    assert not SamplingParams().processes_logits and SamplingParams(min_tokens=1).processes_logits
