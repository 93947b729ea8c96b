"""Descriptions: what they refuse (field checks beyond the types)."""
from __future__ import annotations

import pytest

import troy


@pytest.mark.parametrize("field, value", [
    ("walltime", float("nan")), ("runtime", float("inf")), ("walltime", float("-inf"))])
def test_non_finite_numbers_are_refused(field, value):
    """Broke: walltime NaN and runtime Infinity were accepted."""
    with pytest.raises(troy.BadParameter, match=f"task.{field}: expected a finite number"):
        troy.TaskDescription(executable="/bin/true", **{field: value})
    with pytest.raises(troy.BadParameter, match="unit.arguments: expected a list of strings"):
        troy.ComputeUnitDescription(executable="/bin/echo", arguments=[value])
    with pytest.raises(troy.BadParameter, match="unit.environment: expected a mapping"):
        troy.ComputeUnitDescription(executable="/bin/echo", environment={"X": value})
    with pytest.raises(troy.BadParameter, match="pilot.walltime: expected a finite number"):
        troy.PilotDescription(size=1, walltime=value)


def test_a_deeply_nested_value_makes_a_short_message():
    value: list = []
    for _ in range(5000):
        value = [value]
    with pytest.raises(troy.BadParameter) as info:
        troy.TaskDescription(executable="/bin/true", cores=value)
    assert "task.cores: expected an integer >= 1" in str(info.value)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize("fields, where", [
    ({"environment": {"A": {"x": 1}}}, "environment"),   # became the text "{'x': 1}"
    ({"environment": {"A": None}}, "environment"),       # became the text "None"
    ({"environment": {"A=B": "1"}}, "environment"),      # set A to "B=1"
    ({"environment": {"": "1"}}, "environment"),
    ({"executable": "/bin/tr\0ue"}, "executable"),       # FAILED at exec: embedded null byte
    ({"arguments": ["a\0b"]}, "arguments"),
    ({"environment": {"A": "1\0"}}, "environment"),
])
def test_values_that_reached_a_unit_as_repr_text_or_failed_at_exec_are_refused(fields, where):
    with pytest.raises(troy.BadParameter, match=rf"task\.{where}: "):
        troy.TaskDescription(**{"executable": "/bin/true", **fields})


def test_a_unit_made_from_a_checked_task_equals_one_checked_again() -> None:
    """The workload manager makes a task's unit without checking its fields again: the
    same unit as the checked constructor gives, with defaults of its own."""
    from troy import ComputeUnitDescription, TaskDescription
    from troy.workload.manager import unit_description
    from troy.workload.task import Task
    task = TaskDescription(executable="/bin/echo", arguments=["a", "b"], environment={"X": "1"},
                           cores=2, walltime=5.0, runtime=1.5, stdout="out.txt", cardinality=3)
    fields_ = {"name": "t1", **{f: getattr(task, f) for f in task.__dict__ if f != "cardinality"}}
    fast, checked = ComputeUnitDescription.checked(fields_), ComputeUnitDescription(**fields_)
    assert fast == checked and fast.to_dict() == checked.to_dict()
    made = unit_description([Task("t1", task)])   # the manager's: ComputeUnitDescription.of_task
    assert made == checked and made.to_dict() == checked.to_dict()
    assert made.to_dict(defaults=False) == checked.to_dict(defaults=False)
    assert list(made.to_dict()) == list(checked.to_dict())   # every field, in order
    assert task.cardinality == 3 and "cardinality" not in made.__dict__
    other = ComputeUnitDescription.checked({"name": "t2", "executable": "/bin/true"})
    assert other.bundle == [] and other.bundle is not fast.bundle
    assert other == ComputeUnitDescription(name="t2", executable="/bin/true")


def test_a_description_without_its_defaults_builds_the_same_description_again() -> None:
    """What goes over the wire to a node and into the store: only the fields that differ
    from their defaults (a bundle member is a one-field dict), and the same description
    comes back from it."""
    from troy import ComputeUnitDescription as CUD, TaskDescription as TD
    unit = CUD(name="b", cores=1, runtime=0.5, bundle=[
        CUD(executable="/bin/true"),
        CUD(executable="/bin/sh", arguments=["-c", "exit 0"], environment={"A": "1"},
            walltime=0, cores=2, stdout="out", inputs=["x > y"])])
    sparse = unit.to_dict(defaults=False)
    assert sparse == {"name": "b", "runtime": 0.5, "bundle": [
        {"executable": "/bin/true"},
        {"executable": "/bin/sh", "arguments": ["-c", "exit 0"], "environment": {"A": "1"},
         "walltime": 0, "cores": 2, "stdout": "out", "inputs": ["x > y"]}]}
    assert CUD.coerce(sparse) == unit and CUD.coerce(unit.to_dict()) == unit
    task = TD(executable="x", args=(1,), cardinality=3, runtime=0.0)
    assert task.to_dict(defaults=False) == {"executable": "x", "args": (1,),
                                             "cardinality": 3, "runtime": 0.0}
    assert TD.coerce(task.to_dict(defaults=False)) == task
    # the store's record of it: JSON of the same fields, read back the same
    import json

    from troy.store import _dumps_description
    text, persistable = _dumps_description(unit)
    assert persistable and json.loads(text)["bundle"][0] == {"executable": "/bin/true"}
    assert CUD.coerce(json.loads(text)) == unit
    called = CUD(function=print, args=(1, 2), name="f")
    text, persistable = _dumps_description(called)
    assert not persistable and json.loads(text) == {
        "name": "f", "function": None, "callable": "builtins.print", "args": [], "kwargs": {}}
    assert json.loads(_dumps_description(CUD(executable="x", args=(1,)))[0])["args"] == [1]


def test_the_fields_written_without_defaults_are_those_the_field_by_field_rule_gives() -> None:
    """``to_dict(defaults=False)`` is one function per class made from its fields
    (descriptions._sparse_of): it writes what the rule it replaced wrote, a field whose
    value is not its default's type or is unequal to it, on descriptions of every kind of
    value, a missing field and an attribute that is not a field included."""
    import itertools

    from troy import ComputeUnitDescription as CUD, PilotDescription, TaskDescription as TD
    from troy.descriptions import _sparse_defaults

    class Words(list):
        pass

    def by_rule(obj) -> dict:
        given = _sparse_defaults(type(obj))
        return {k: v for k, v in obj.__dict__.items() if k in given and (
            (dv := given[k]) is not v and (type(v) is not type(dv) or v != dv))}

    values = [None, 0, 1, 2, 1.0, True, False, "", "x", [], ["a"], Words(), {}, {"A": "1"},
              0.5, float("nan")]
    seen = 0
    for cls in (CUD, TD, PilotDescription):
        base = cls.__new__(cls)
        base.__dict__.update({n: v for n, v in _sparse_defaults(cls).items()})
        names = list(_sparse_defaults(cls))
        for name, value in itertools.product(names, values):
            obj = cls.__new__(cls)
            obj.__dict__.update(base.__dict__)
            obj.__dict__[name] = value
            assert obj.to_dict(deep=False, defaults=False) == by_rule(obj), (cls, name, value)
            seen += 1
        obj = cls.__new__(cls)   # a field missing, an attribute that is no field
        obj.__dict__.update({n: v for n, v in base.__dict__.items() if n != names[0]},
                            extra=1)
        assert obj.to_dict(deep=False, defaults=False) == by_rule(obj)
    assert seen > 500
    made = CUD(executable="/bin/sh", arguments=["-c", "true"], cores=2, environment={"A": "1"})
    assert made.to_dict(defaults=False) == {"executable": "/bin/sh",
                                            "arguments": ["-c", "true"], "cores": 2,
                                            "environment": {"A": "1"}}
