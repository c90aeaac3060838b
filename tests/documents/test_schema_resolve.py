"""Schema.resolve: the check of a peer's operation takes a shortcut for plain fields, with
the same verdicts as the full field check."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.documents import Action, Operation
from sdk.documents.errors import SchemaMismatch
from sdk.documents.schema import BLOB_V1, SCHEMA_FIELD_DEFINITION_V1, Schema

from .helpers import TODO_SCHEMA, todo_fields

H1 = "0020" + "aa" * 32
NAMES = [*TODO_SCHEMA.fields, "extra"]
VALUES = st.one_of(
    st.booleans(),
    st.integers(min_value=-(1 << 64), max_value=1 << 64),
    st.sampled_from([-(1 << 63), (1 << 63) - 1, 1 << 63, -(1 << 63) - 1]),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.none(),
)
#: Values of each field's own type, the i64 edges among the ints.
TYPED = {
    "title": st.text(max_size=5),
    "done": st.booleans(),
    "priority": st.one_of(
        st.integers(min_value=-5, max_value=5),
        st.sampled_from([-(1 << 63), (1 << 63) - 1, 1 << 63, -(1 << 63) - 1]),
    ),
    "weight": st.floats(allow_nan=False),
    "note": st.binary(max_size=5),
    "extra": st.text(max_size=5),
}
_ABSENT = object()
#: Some of the fields, mostly each of its own type, now and then of any type or unknown.
FIELDS = st.fixed_dictionaries(
    {
        name: st.sampled_from([0, 1, 1, 1, 1, 2] if name != "extra" else [0] * 9 + [1]).flatmap(
            lambda pick, name=name: [st.just(_ABSENT), TYPED[name], VALUES][pick]
        )
        for name in NAMES
    }
).map(lambda drawn: {k: v for k, v in drawn.items() if v is not _ABSENT})


@settings(max_examples=400, deadline=None)
@given(
    create=st.booleans(),
    fields=FIELDS.filter(bool),
)
def test_resolve_agrees_with_the_full_field_check(create: bool, fields: dict[str, object]) -> None:
    """Accepted or refused, with the same message, as resolve_fields says for a peer."""
    action = Action.CREATE if create else Action.UPDATE
    operation = Operation(action, TODO_SCHEMA.id, None if create else (H1,), fields)  # type: ignore[arg-type]
    try:
        typed = TODO_SCHEMA.resolve_fields(fields, complete=create, local=False)
    except SchemaMismatch as exc:
        with pytest.raises(SchemaMismatch) as refused:
            TODO_SCHEMA.resolve(operation)
        assert str(refused.value) == str(exc)
    else:
        assert typed == fields
        assert TODO_SCHEMA.resolve(operation) is operation


def test_a_plain_create_is_checked_without_typing_its_fields(monkeypatch) -> None:
    """The shortcut: plain values of the right types need no typed copy of the fields."""
    operation = Operation(Action.CREATE, TODO_SCHEMA.id, None, todo_fields())

    def full_check(*args: object, **kwargs: object) -> None:
        raise AssertionError("the full field check ran")

    monkeypatch.setattr(Schema, "resolve_fields", full_check)
    assert TODO_SCHEMA.resolve(operation) is operation
    with pytest.raises(AssertionError):
        TODO_SCHEMA.resolve(Operation(Action.CREATE, TODO_SCHEMA.id, None, {"title": "x"}))


def test_relations_and_ruled_system_fields_take_the_full_check() -> None:
    """Relation values are typed, system schemas have rules: no shortcut for them."""
    things = Schema.application("things", (H1,), "", {"r": f"relation({TODO_SCHEMA.id})"})
    assert things._plain is None
    assert BLOB_V1._plain is None and SCHEMA_FIELD_DEFINITION_V1._plain is None
    assert TODO_SCHEMA._plain is not None
    bad_name = Operation(
        Action.CREATE, SCHEMA_FIELD_DEFINITION_V1.id, None, {"name": "9x", "type": "str"}
    )
    with pytest.raises(SchemaMismatch, match="name"):
        SCHEMA_FIELD_DEFINITION_V1.resolve(bad_name)
