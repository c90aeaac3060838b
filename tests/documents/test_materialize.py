"""Materialization order, conflict resolution, deletion and views."""

from __future__ import annotations

import pytest

from sdk.documents import Action, OperationRecord, UsageError, materialize, topological_order
from sdk.documents.materialize import DocumentView


def op(
    op_id: str, *previous: str, action: Action = Action.UPDATE, **fields: object
) -> OperationRecord:
    """A record with a short fake id; ids only need to sort."""
    if not previous:
        action = Action.CREATE
    return OperationRecord(
        id=op_id,
        document_id="a",
        action=action,
        schema_id="s_v1",
        previous=tuple(sorted(previous)),
        fields=fields or None,  # type: ignore[arg-type]
    )


def ids(order: list[OperationRecord]) -> str:
    return "".join(o.id for o in order)


def test_p2panda_reference_graph_order() -> None:
    #             /--[i]<--[j]<--[k]<--\
    #  /--[b]<--[c]--\                  \
    # [a]<--[g]<-----[h]<--[d]<--[e]<---[f]
    graph = [
        op("a"),
        op("b", "a"),
        op("c", "b"),
        op("d", "c", "h"),
        op("e", "d"),
        op("f", "e", "k"),
        op("g", "a"),
        op("h", "g"),
        op("i", "c"),
        op("j", "i"),
        op("k", "j"),
    ]
    assert ids(topological_order(graph)) == "abcijkghdef"
    assert ids(topological_order(reversed(graph))) == "abcijkghdef"


def test_smaller_branch_first_higher_branch_wins() -> None:
    graph = [op("a", title="x"), op("c", "a", title="from c"), op("b", "a", title="from b")]
    assert ids(topological_order(graph)) == "abc"
    view = materialize(graph)
    assert view.fields == {"title": "from c"}
    assert view.view_id == ("b", "c")
    # A merge comes after both parents and overrides both.
    merged = materialize([*graph, op("m", "b", "c", title="merged")])
    assert merged.fields == {"title": "merged"} and merged.view_id == ("m",)


def test_concurrent_writes_to_different_fields_both_survive() -> None:
    graph = [op("a", x=1, y=1), op("b", "a", x=2), op("c", "a", y=3)]
    assert materialize(graph).fields == {"x": 2, "y": 3}


def test_delete_ends_document_and_views_before_it_remain() -> None:
    graph = [op("a", x=1), op("b", "a", x=2), op("c", "b", action=Action.DELETE)]
    view = materialize(graph)
    assert view.deleted and view.fields == {} and view.view_id == ("c",)
    before = materialize(graph, up_to=("b",))
    assert not before.deleted and before.fields == {"x": 2}
    # Concurrent update next to a delete: still deleted.
    assert materialize([*graph, op("z", "a", x=9)]).deleted


def test_up_to_uses_only_ancestors() -> None:
    graph = [op("a", x=0), op("b", "a", x=1), op("c", "a", y=2), op("d", "b", "c", x=3)]
    view = materialize(graph, up_to=("c",))
    assert view == DocumentView("a", "s_v1", ("c",), {"x": 0, "y": 2}, False, 2)
    assert materialize(graph, up_to=("b", "c")).fields == {"x": 1, "y": 2}
    with pytest.raises(UsageError):
        materialize(graph, up_to=("nope",))


@pytest.mark.parametrize(
    "graph",
    [
        [op("a"), op("b")],  # two roots
        [op("a"), op("b", "x")],  # missing previous
        [op("a"), op("b", "a", "c"), op("c", "b")],  # cycle
        [op("b", "c"), op("c", "b")],  # no root
    ],
)
def test_bad_graphs(graph: list[OperationRecord]) -> None:
    with pytest.raises(UsageError):
        topological_order(graph)


def test_long_chain_with_side_branches_orders_every_operation() -> None:
    # 20k operations: a chain where every 10th op forks a side branch merged by the next.
    graph = [op(f"{0:06d}")]
    for i in range(1, 20_000):
        prev = f"{i - 1:06d}"
        if i % 10 == 5:
            graph.append(op(f"{i:06d}x", prev, v=i))
            graph.append(op(f"{i:06d}", prev, v=-i))
        elif i % 10 == 6:
            graph.append(op(f"{i:06d}", prev, f"{i - 1:06d}x", v=i))
        else:
            graph.append(op(f"{i:06d}", prev, v=i))
    order = topological_order(graph)
    assert len(order) == len(graph)
    position = {o.id: n for n, o in enumerate(order)}
    assert all(position[p] < position[o.id] for o in graph for p in o.previous)
    # At each fork the smaller id ("000005" < "000005x") is walked first.
    assert position["000005"] < position["000005x"] < position["000006"]
