"""The committed generated code must be what scripts/gen_proto.py produces now."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tests.conftest import REPO


def _load_generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_proto", REPO / "scripts" / "gen_proto.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_proto"] = module
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    gen = _load_generator()
    out = tmp_path / "_proto"
    gen.generate(out)
    committed = REPO / "sdk" / "_proto"
    fresh = {p.relative_to(out): p.read_text() for p in out.rglob("*") if p.is_file()}
    current = {
        p.relative_to(committed): p.read_text()
        for p in committed.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sorted(map(str, fresh)) == sorted(map(str, current)), (
        "sdk/_proto is stale: run `python scripts/gen_proto.py` and commit the result"
    )
    for path, text in fresh.items():
        assert current[path] == text, f"sdk/_proto/{path} is stale: run scripts/gen_proto.py"
