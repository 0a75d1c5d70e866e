import pytest

from engine import InvalidRequestError, SamplingParams


@pytest.mark.parametrize("kwargs, param", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=-3), "max_tokens"),
    (dict(max_tokens=2.5), "max_tokens"),
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(n=2), "n"),
    (dict(stop=[""]), "stop"),
    (dict(stop=[3]), "stop"),
    (dict(stop_token_ids=["x"]), "stop_token_ids"),
    (dict(seed="7"), "seed"),
])
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
