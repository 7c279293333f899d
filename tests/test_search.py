"""Behavioural tests for ftnb.search (search spaces and variant generation)."""

from __future__ import annotations

import collections
import doctest
import json
import math
import random
from typing import Any

import pytest

import ftnb.search as search
from ftnb.search import (
    Domain,
    SampleSpec,
    choice,
    count_variants,
    encode_space,
    flatten_dict,
    generate_variants,
    grid_search,
    loguniform,
    randint,
    sample_from,
    uniform,
    unflatten_dict,
    validate_param_space,
    varying_keys,
)


@pytest.mark.parametrize(
    "module",
    [search, search.constructors, search.domains, search.flatten, search.messages, search.variants],
    ids=lambda module: module.__name__,
)
def test_docstring_examples_run(module) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


# --------------------------------------------------------------------------- grid_search


def test_grid_search_is_rays_dict_representation() -> None:
    assert grid_search([1, 2, 3]) == {"grid_search": [1, 2, 3]}
    assert grid_search((1, 2)) == {"grid_search": [1, 2]}
    assert grid_search(x for x in "ab") == {"grid_search": ["a", "b"]}
    assert type(grid_search((1,))["grid_search"]) is list


def test_grid_search_empty_names_argument() -> None:
    with pytest.raises(ValueError, match="'values'"):
        grid_search([])


@pytest.mark.parametrize("bad", ["abc", {1, 2}, {"a": 1}, 5])
def test_grid_search_rejects_non_lists(bad: Any) -> None:
    with pytest.raises(TypeError, match="'values'.*Fix"):
        grid_search(bad)


def test_hand_written_grid_dict_is_a_grid_axis() -> None:
    variants = generate_variants({"a": {"grid_search": [1, 2]}})
    assert variants == [{"a": 1}, {"a": 2}]


def test_grid_cartesian_product_order_first_key_slowest() -> None:
    space = {"a": grid_search([1, 2]), "fixed": "x", "b": grid_search(["p", "q", "r"])}
    variants = generate_variants(space)
    assert [(v["a"], v["b"]) for v in variants] == [
        (1, "p"), (1, "q"), (1, "r"), (2, "p"), (2, "q"), (2, "r"),
    ]
    assert all(v["fixed"] == "x" for v in variants)
    assert all(list(v) == ["a", "fixed", "b"] for v in variants)  # key order kept


def test_nested_grid_axes_depth_first_order() -> None:
    space = {
        "model": {"depth": grid_search([2, 4]), "width": grid_search([8, 16])},
        "lr": grid_search([0.1, 0.01]),
    }
    variants = generate_variants(space)
    assert len(variants) == 8
    assert [(v["model"]["depth"], v["model"]["width"], v["lr"]) for v in variants] == [
        (2, 8, 0.1), (2, 8, 0.01), (2, 16, 0.1), (2, 16, 0.01),
        (4, 8, 0.1), (4, 8, 0.01), (4, 16, 0.1), (4, 16, 0.01),
    ]


def test_num_samples_repeats_whole_grid() -> None:
    space = {"a": grid_search([1, 2, 3]), "x": uniform(0, 1)}
    variants = generate_variants(space, num_samples=3, seed=1)
    assert len(variants) == 9
    assert [v["a"] for v in variants] == [1, 2, 3] * 3
    # Random domains are drawn independently for every variant.
    assert len({v["x"] for v in variants}) == 9


def test_grid_values_may_be_domains_and_nested_dicts() -> None:
    space = {
        "opt": grid_search([
            {"name": "adam", "lr": loguniform(1e-4, 1e-2)},
            {"name": "sgd", "lr": 0.1, "momentum": uniform(0.5, 0.99)},
            randint(0, 3),
        ])
    }
    variants = generate_variants(space, num_samples=2, seed=0)
    assert len(variants) == 6
    adam, sgd, integer = variants[:3]
    assert adam["opt"]["name"] == "adam" and 1e-4 <= adam["opt"]["lr"] <= 1e-2
    assert sgd["opt"]["lr"] == 0.1 and 0.5 <= sgd["opt"]["momentum"] <= 0.99
    assert integer["opt"] in {0, 1, 2}
    # Grid dict values are rebuilt, not shared with the space or each other.
    assert variants[0]["opt"] is not variants[3]["opt"]
    assert space["opt"]["grid_search"][0]["lr"].__class__.__name__ == "LogUniform"


def test_nested_grid_inside_grid_value_is_expanded() -> None:
    space = {"opt": grid_search([{"name": "adam"}, {"name": "sgd", "m": grid_search([0.0, 0.9])}])}
    variants = generate_variants(space)
    assert [v["opt"] for v in variants] == [
        {"name": "adam"}, {"name": "sgd", "m": 0.0}, {"name": "sgd", "m": 0.9},
    ]
    assert count_variants(space) == 3


def test_grid_inside_list_is_expanded_and_list_type_kept() -> None:
    variants = generate_variants({"layers": [64, grid_search([32, 16])], "t": (1, uniform(0, 1))})
    assert [v["layers"] for v in variants] == [[64, 32], [64, 16]]
    assert all(type(v["layers"]) is list for v in variants)
    assert all(type(v["t"]) is tuple and 0 <= v["t"][1] <= 1 for v in variants)


# --------------------------------------------------------------------------- determinism


def _space() -> dict[str, Any]:
    return {
        "a": grid_search([1, 2]),
        "lr": loguniform(1e-5, 1e-1),
        "m": {"u": uniform(-1, 1), "k": randint(0, 1000), "c": choice(["x", "y", "z"])},
        "double": sample_from(lambda spec: spec.config.lr * 2),
    }


def test_same_seed_gives_identical_variants() -> None:
    assert generate_variants(_space(), num_samples=4, seed=123) == generate_variants(
        _space(), num_samples=4, seed=123
    )


def test_different_seeds_give_different_variants() -> None:
    a = generate_variants(_space(), num_samples=4, seed=1)
    b = generate_variants(_space(), num_samples=4, seed=2)
    assert [v["lr"] for v in a] != [v["lr"] for v in b]


def test_no_seed_is_not_deterministic() -> None:
    draws = {generate_variants({"x": uniform(0, 1)})[0]["x"] for _ in range(5)}
    assert len(draws) > 1


def test_seeded_generation_ignores_global_random_state() -> None:
    random.seed(0)
    a = generate_variants(_space(), seed=7)
    random.seed(99)
    b = generate_variants(_space(), seed=7)
    assert a == b


# --------------------------------------------------------------------------- distributions


def test_uniform_within_bounds() -> None:
    values = [v["x"] for v in generate_variants({"x": uniform(-2.5, 3.0)}, 500, seed=0)]
    assert all(-2.5 <= x <= 3.0 for x in values)
    assert min(values) < -2 and max(values) > 2.5  # actually spread over the range


def test_randint_high_is_exclusive() -> None:
    values = [v["n"] for v in generate_variants({"n": randint(3, 6)}, 500, seed=0)]
    assert set(values) == {3, 4, 5}
    assert all(isinstance(x, int) for x in values)


def test_randint_single_value() -> None:
    assert {v["n"] for v in generate_variants({"n": randint(7, 8)}, 20, seed=0)} == {7}


def test_loguniform_within_bounds_and_log_spread() -> None:
    values = [v["lr"] for v in generate_variants({"lr": loguniform(1e-6, 1e-1)}, 2000, seed=0)]
    assert all(1e-6 <= x <= 1e-1 for x in values)
    # Roughly a fifth of the draws per decade, unlike uniform which would
    # put ~90% in the top decade.
    top_decade = sum(x > 1e-2 for x in values) / len(values)
    assert 0.12 < top_decade < 0.28
    assert all(isinstance(x, float) for x in values)


def test_loguniform_other_base_same_range() -> None:
    dom = loguniform(1, 1024, base=2)
    rng = random.Random(0)
    assert all(1 <= dom.sample(rng) <= 1024 for _ in range(200))


def test_choice_covers_all_categories_and_keeps_identity() -> None:
    big = object()
    values = [v["c"] for v in generate_variants({"c": choice(["a", big, 3])}, 300, seed=0)]
    assert {id(x) for x in values} == {id("a"), id(big), id(3)}


def test_choice_resolves_domains_inside_chosen_category() -> None:
    space = {"opt": choice([{"name": "adam", "lr": loguniform(1e-4, 1e-2)}, {"name": "sgd"}])}
    variants = generate_variants(space, 50, seed=0)
    names = {v["opt"]["name"] for v in variants}
    assert names == {"adam", "sgd"}
    for v in variants:
        if v["opt"]["name"] == "adam":
            assert isinstance(v["opt"]["lr"], float) and 1e-4 <= v["opt"]["lr"] <= 1e-2


def test_domain_sample_directly() -> None:
    rng = random.Random(0)
    assert isinstance(uniform(0, 1), Domain)
    assert 0 <= uniform(0, 1).sample(rng) <= 1
    assert choice(["a"]).sample(rng) == "a"
    assert sample_from(lambda spec: 5).sample(rng) == 5
    assert sample_from(lambda: 6).sample(rng) == 6


# --------------------------------------------------------------------------- sample_from


def test_sample_from_sees_resolved_values_attribute_and_item_access() -> None:
    space = {
        "double": sample_from(lambda spec: spec.config.lr * 2),
        "lr": loguniform(1e-4, 1e-1),
        "model": {"width": randint(1, 100), "batch": grid_search([16, 32])},
        "area": sample_from(
            lambda spec: spec["config"]["model"]["width"] * spec.config.model.batch
        ),
    }
    for v in generate_variants(space, num_samples=3, seed=0):
        assert v["double"] == v["lr"] * 2
        assert v["area"] == v["model"]["width"] * v["model"]["batch"]
        assert list(v) == ["double", "lr", "model", "area"]


def test_sample_from_spec_object() -> None:
    seen: list[Any] = []

    def fn(spec: SampleSpec) -> int:
        seen.append(spec)
        return spec.rng.randrange(10)

    generate_variants({"x": sample_from(fn), "a": 1}, seed=0)
    assert isinstance(seen[0], SampleSpec)
    assert seen[0].config.a == 1
    assert dict(seen[0].config) == {"a": 1, "x": seen[0].config._data["x"]}


def test_sample_from_can_depend_on_another_sample_from() -> None:
    space = {
        "c": sample_from(lambda spec: spec.config.b + 1),
        "b": sample_from(lambda spec: spec.config.a * 10),
        "a": grid_search([1, 2]),
    }
    assert generate_variants(space) == [{"c": 11, "b": 10, "a": 1}, {"c": 21, "b": 20, "a": 2}]


def test_sample_from_cycle_is_reported() -> None:
    space = {
        "x": sample_from(lambda spec: spec.config.y),
        "y": sample_from(lambda spec: spec.config.x),
    }
    with pytest.raises(ValueError, match="cycle.*x reads y"):
        generate_variants(space)


def test_sample_from_missing_key_error_lists_available() -> None:
    with pytest.raises(AttributeError, match="'nope'.*available keys"):
        generate_variants({"a": 1, "b": sample_from(lambda spec: spec.config.nope)})


def test_sample_from_user_error_propagates() -> None:
    def boom(spec: Any) -> None:
        raise ZeroDivisionError("boom")

    with pytest.raises(ZeroDivisionError, match="boom"):
        generate_variants({"z": sample_from(boom)})


def test_sample_from_config_key_named_like_mapping_method() -> None:
    v = generate_variants({"items": 3, "y": sample_from(lambda spec: spec.config.items + 1)})
    assert v == [{"items": 3, "y": 4}]


def test_sample_from_returning_sub_config_is_a_plain_copy() -> None:
    v = generate_variants({"m": {"a": 1}, "copy": sample_from(lambda spec: spec.config.m)})[0]
    assert v["copy"] == {"a": 1} and type(v["copy"]) is dict
    assert v["copy"] is not v["m"]


def test_sample_from_inside_tuple_and_namedtuple() -> None:
    Pair = collections.namedtuple("Pair", "lo hi")
    space = {
        "lo": randint(0, 10),
        "pair": Pair(0, sample_from(lambda spec: spec.config.lo + 1)),
        "nested": ((sample_from(lambda spec: "deep"),), 2),
    }
    v = generate_variants(space, seed=3)[0]
    assert type(v["pair"]) is Pair and v["pair"].hi == v["lo"] + 1
    assert v["nested"] == (("deep",), 2) and type(v["nested"][0]) is tuple


def test_sample_from_rejects_non_callable() -> None:
    with pytest.raises(TypeError, match="'func'.*Fix"):
        sample_from(3)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- identity


def test_non_domain_leaves_keep_identity_and_dicts_are_rebuilt() -> None:
    dataset = object()
    rows = [1, 2, 3]  # a list without domains is a leaf: kept as-is
    model_fn = lambda: None  # noqa: E731 - plain callables are leaves, not sample_from
    space = {"data": dataset, "rows": rows, "fn": model_fn, "cfg": {"inner": dataset},
             "a": grid_search([1, 2])}
    variants = generate_variants(space, num_samples=2)
    for v in variants:
        assert v["data"] is dataset
        assert v["rows"] is rows
        assert v["fn"] is model_fn
        assert v["cfg"]["inner"] is dataset
        assert v["cfg"] is not space["cfg"]
    assert variants[0]["cfg"] is not variants[1]["cfg"]
    assert variants[0] is not variants[2]


def test_grid_values_keep_identity() -> None:
    big1, big2 = object(), object()
    variants = generate_variants({"d": grid_search([big1, big2])})
    assert variants[0]["d"] is big1 and variants[1]["d"] is big2


def test_list_with_domains_is_rebuilt_but_elements_kept() -> None:
    obj = object()
    space = {"xs": [obj, uniform(0, 1)]}
    v = generate_variants(space)[0]
    assert v["xs"] is not space["xs"] and v["xs"][0] is obj
    assert isinstance(v["xs"][1], float)


def test_search_free_list_of_dicts_is_one_shared_leaf() -> None:
    rows = [{"x": i} for i in range(10_000)]
    variants = generate_variants({"rows": rows, "a": grid_search([1, 2])})
    assert all(v["rows"] is rows for v in variants)


def test_choice_dict_category_is_copied_per_variant() -> None:
    cat = {"name": "adam", "betas": (0.9, 0.999)}
    variants = generate_variants({"opt": choice([cat])}, num_samples=2, seed=0)
    assert variants[0]["opt"] == cat
    assert variants[0]["opt"] is not cat and variants[0]["opt"] is not variants[1]["opt"]
    assert variants[0]["opt"]["betas"] is cat["betas"]


def test_custom_mapping_leaf_without_domains_keeps_identity() -> None:
    class DatasetDict(dict):  # like huggingface's
        pass

    ds = DatasetDict(train=[1], test=[2])
    v = generate_variants({"ds": ds})[0]
    assert v["ds"] is ds


def test_param_space_is_not_mutated() -> None:
    space = _space()
    before = repr(space)
    generate_variants(space, num_samples=3, seed=0)
    assert repr(space) == before


def test_empty_space() -> None:
    for space in (None, {}):
        variants = generate_variants(space, num_samples=3)
        assert variants == [{}, {}, {}]
        assert len({id(v) for v in variants}) == 3
        assert count_variants(space, 3) == 3


def test_non_dict_mapping_space_is_accepted() -> None:
    space = collections.OrderedDict(a=grid_search([1, 2]), b=2)
    assert generate_variants(space) == [{"a": 1, "b": 2}, {"a": 2, "b": 2}]
    assert all(type(v) is dict for v in generate_variants(collections.OrderedDict(b=2)))


# --------------------------------------------------------------------------- count_variants


@pytest.mark.parametrize(
    "space",
    [
        None,
        {},
        {"a": 1},
        {"a": grid_search([1, 2, 3])},
        {"a": grid_search([1, 2]), "b": {"c": grid_search([1, 2, 3]), "d": uniform(0, 1)}},
        {"opt": grid_search([{"x": grid_search([1, 2])}, 5, {"y": grid_search([1, 2, 3])}])},
        {"l": [grid_search([1, 2]), grid_search([3, 4])], "c": choice([1, 2])},
    ],
)
@pytest.mark.parametrize("num_samples", [1, 3])
def test_count_variants_matches_generation(space: Any, num_samples: int) -> None:
    assert count_variants(space, num_samples) == len(generate_variants(space, num_samples, seed=0))


def test_count_variants_large_grid_without_generating() -> None:
    space = {f"k{i}": grid_search(list(range(10))) for i in range(12)}
    assert count_variants(space, 2) == 2 * 10**12


# --------------------------------------------------------------------------- errors


def test_param_space_not_a_dict() -> None:
    with pytest.raises(TypeError) as info:
        validate_param_space([1, 2])  # type: ignore[arg-type]
    msg = str(info.value)
    assert msg.startswith("param_space must be a dict of config keys to values or search-space")
    assert "ftnb.loguniform(1e-4, 1e-1)" in msg
    assert "got list: [1, 2]. Fix: pass a dict." in msg
    for fn in (generate_variants, count_variants, varying_keys):
        with pytest.raises(TypeError, match="param_space must be a dict"):
            fn("lr=0.1")  # type: ignore[operator]


def test_validate_accepts_none_and_nested() -> None:
    validate_param_space(None)
    validate_param_space({"a": {"b": {"c": {"d": uniform(0, 1)}}}, "e": [1, {"f": 2}]})


def test_bare_grid_as_space_is_rejected() -> None:
    with pytest.raises(TypeError, match="bare grid_search"):
        validate_param_space(grid_search([1, 2]))


def test_non_string_key_names_path() -> None:
    with pytest.raises(TypeError, match=r"int key 3 under 'model/opt'"):
        validate_param_space({"model": {"opt": {3: "x"}}})
    with pytest.raises(TypeError, match=r"int key 1 under 'layers\[0\]'"):
        validate_param_space({"layers": [{1: "x"}]})
    with pytest.raises(TypeError, match="tuple key"):
        validate_param_space({("a", "b"): 1})  # type: ignore[dict-item]


def test_bad_hand_written_grid_specs() -> None:
    with pytest.raises(TypeError, match="'a/b'.*grid_search.*tuple"):
        validate_param_space({"a": {"b": {"grid_search": (1, 2)}}})
    with pytest.raises(ValueError, match="'a'.*empty grid_search"):
        validate_param_space({"a": {"grid_search": []}})


@pytest.mark.parametrize("bad", [0, -1])
def test_num_samples_below_one(bad: int) -> None:
    with pytest.raises(ValueError, match=f"num_samples.*{bad}"):
        generate_variants({}, num_samples=bad)
    with pytest.raises(ValueError, match="num_samples"):
        count_variants({}, num_samples=bad)


@pytest.mark.parametrize("bad", [1.5, "2", True])
def test_num_samples_wrong_type(bad: Any) -> None:
    with pytest.raises(TypeError, match="num_samples"):
        generate_variants({}, num_samples=bad)


def test_seed_wrong_type() -> None:
    with pytest.raises(TypeError, match="seed"):
        generate_variants({}, seed="abc")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("factory", "pattern"),
    [
        (lambda: uniform(1.0, 0.5), r"uniform\(\) needs lower < upper; got lower=1.0, upper=0.5.*Fix"),
        (lambda: uniform(1, 1), r"lower=1, upper=1"),
        (lambda: uniform(0, math.inf), r"'upper' must be finite; got inf"),
        (lambda: loguniform(0, 1), r"'lower' must be > 0; got lower=0.*Fix"),
        (lambda: loguniform(-1e-3, 1), r"lower=-0.001"),
        (lambda: loguniform(1e-1, 1e-3), r"lower=0.1, upper=0.001.*Fix"),
        (lambda: loguniform(1e-3, 1, base=1), r"'base'.*base=1.*Fix"),
        (
            lambda: randint(5, 5),
            r"randint\(\) needs lower < upper \(upper is exclusive\); got lower=5, upper=5.*Fix",
        ),
        (lambda: randint(5, 1), r"lower=5, upper=1"),
        (lambda: choice([]), r"'categories' is empty.*Fix"),
        (lambda: choice([1, grid_search([1, 2])]), r"category 1 contains a grid_search.*Fix"),
    ],
)
def test_bad_bounds_value_errors(factory: Any, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        factory()


@pytest.mark.parametrize(
    ("factory", "pattern"),
    [
        (lambda: uniform("0", 1), r"uniform\(\) argument 'lower' must be a real number; got str"),
        (lambda: loguniform(1e-3, None), r"'upper'.*NoneType"),
        (lambda: randint(0, 10.0), r"randint\(\) argument 'upper' must be an int; got float: 10.0"),
        (lambda: randint(True, 3), r"'lower'.*bool"),
        (lambda: choice("abc"), r"'categories' must be a list or tuple; got str"),
        (lambda: choice({1, 2}), r"set.*stable order"),
    ],
)
def test_bad_argument_types(factory: Any, pattern: str) -> None:
    with pytest.raises(TypeError, match=pattern):
        factory()


# --------------------------------------------------------------------------- encode_space


def test_encode_space_is_json_and_uses_callback_for_non_json_leaves() -> None:
    class Model:
        pass

    model = Model()
    encoded_leaves: list[Any] = []

    def encode_leaf(value: Any) -> Any:
        encoded_leaves.append(value)
        return {"__object__": type(value).__name__}

    space = {
        "model": model,
        "lr": loguniform(1e-4, 1e-1),
        "u": uniform(0.1, 1.0),
        "n": randint(1, 5),
        "opt": grid_search(["adam", {"name": "sgd", "m": uniform(0, 1)}, model]),
        "c": choice(["a", model, (1, 2)]),
        "f": sample_from(lambda spec: 1),
        "nested": {"t": (1, "x", None, True, 2.5), "l": [model]},
    }
    enc = encode_space(space, encode_leaf)
    assert json.loads(json.dumps(enc)) == enc
    assert enc["model"] == {"__object__": "Model"}
    assert enc["lr"] == {"__ftnb_domain__": "loguniform", "low": 1e-4, "high": 1e-1, "base": 10}
    assert enc["u"] == {"__ftnb_domain__": "uniform", "low": 0.1, "high": 1.0}
    assert enc["n"] == {"__ftnb_domain__": "randint", "low": 1, "high": 5}
    assert enc["opt"] == {
        "grid_search": [
            "adam",
            {"name": "sgd", "m": {"__ftnb_domain__": "uniform", "low": 0, "high": 1}},
            {"__object__": "Model"},
        ]
    }
    assert enc["c"] == {"__ftnb_domain__": "choice",
                        "categories": ["a", {"__object__": "Model"}, [1, 2]]}
    assert enc["f"]["__ftnb_domain__"] == "sample_from"
    assert "<lambda>" in enc["f"]["function"]
    assert enc["nested"] == {"t": [1, "x", None, True, 2.5], "l": [{"__object__": "Model"}]}
    assert all(x is model for x in encoded_leaves)  # JSON scalars never reach the callback


def test_encode_space_none_and_named_function() -> None:
    def scale_lr(spec: Any) -> float:
        return 1.0

    assert encode_space(None, repr) is None
    assert encode_space({"f": sample_from(scale_lr)}, repr)["f"]["function"].endswith("scale_lr")


def test_domain_to_json_without_callback_is_json() -> None:
    d = choice([object(), 1])
    json.dumps(d.to_json())
    assert "Categorical(" in repr(d)


# --------------------------------------------------------------------------- flatten


def test_flatten_dict() -> None:
    d = {"model": {"lr": 0.1, "opt": {"name": "adam"}}, "seed": 0, "empty": {}}
    assert flatten_dict(d) == {"model/lr": 0.1, "model/opt/name": "adam", "seed": 0, "empty": {}}
    assert flatten_dict(d, sep=".")["model.opt.name"] == "adam"


def test_flatten_unflatten_round_trip() -> None:
    obj = object()
    d = {"a": {"b": {"c": 1, "d": [1, 2]}, "e": obj}, "f": None, "g": {}}
    flat = flatten_dict(d)
    assert unflatten_dict(flat) == d
    assert unflatten_dict(flat)["a"]["e"] is obj
    assert unflatten_dict(flatten_dict(d, sep="."), sep=".") == d


def test_flatten_collision_is_an_error() -> None:
    with pytest.raises(ValueError, match="'a/b'"):
        flatten_dict({"a/b": 1, "a": {"b": 2}})


def test_unflatten_conflicts_are_errors() -> None:
    with pytest.raises(ValueError, match="'a/b'.*'a'"):
        unflatten_dict({"a": 1, "a/b": 2})
    with pytest.raises(ValueError, match="'a'"):
        unflatten_dict({"a/b": 2, "a": 1})


def test_unflatten_does_not_mutate_dict_values() -> None:
    inner = {"x": 1}
    out = unflatten_dict({"a": inner, "a/y": 2})
    assert out == {"a": {"x": 1, "y": 2}}
    assert inner == {"x": 1}


# --------------------------------------------------------------------------- varying_keys


def test_varying_keys() -> None:
    space = {
        "seed": 0,
        "lr": loguniform(1e-4, 1e-1),
        "model": {"depth": grid_search([2, 4]), "act": "relu", "drop": sample_from(lambda s: 0.1)},
        "opt": grid_search([{"name": "adam"}, {"name": "sgd", "momentum": uniform(0, 1)}]),
        "c": choice([{"k": 1}, {"k": 2, "j": 3}]),
        "layers": [64, randint(1, 10)],
        "data": object(),
    }
    assert varying_keys(space) == [
        "lr", "model/depth", "model/drop", "opt/name", "opt/momentum", "c/k", "c/j", "layers",
    ]
    assert varying_keys(space, sep=".")[1] == "model.depth"
    assert varying_keys(None) == [] and varying_keys({"a": 1}) == []


def test_varying_keys_are_flattened_config_columns() -> None:
    space = {"a": {"b": grid_search([1, 2])}, "x": uniform(0, 1), "k": 5}
    columns = set(flatten_dict(generate_variants(space)[0]))
    assert set(varying_keys(space)) <= columns
