"""The shared LEB128 codec (``sdk/sds/varint.py``) on the paths that use it hot.

Usage: ``python bench/varint.py [--rev REV]``; prints JSON lines (best of five, ns per call)
and appends them to ``bench/results/varint.jsonl``. With ``--rev``, the same figures for
``sdk/sds/message.py`` as it was at ``REV`` (e.g. the commit before the codec was shared)
are printed beside them, tagged ``impl=REV``.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Recorder
from sdk.sds import message
from sdk.sds.varint import encode_uvarint, read_uvarint
from sdk.sync.framing import FrameDecoder, encode_frame


def _ns(fn: Any, number: int = 50_000) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9


def _message_at(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:sdk/sds/message.py"], capture_output=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "message_at_rev.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("message_at_rev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["message_at_rev"] = module
    spec.loader.exec_module(module)
    return module


def _message_figures(rec: Recorder, mod: Any, impl: str) -> None:
    history = tuple(mod.HistoryEntry(f"id{i:060d}", b"hint" * 8, "bob") for i in range(2))

    def encode() -> bytes:
        return bytes(
            mod.encode_fields(
                "alice", "m" * 64, "room", 1_700_000_000_123, history, b"\0" * 1200, b"x" * 200
            )
        )

    data = encode()
    entry = mod.history_field(history[0])[2:]
    rec.record("encode_fields", _ns(encode), "ns", impl=impl)
    rec.record("fields_scan", _ns(lambda: mod._fields(data)), "ns", impl=impl)
    rec.record("entry_is_valid", _ns(lambda: mod._entry_is_valid(entry)), "ns", impl=impl)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="also measure sdk/sds/message.py at this git revision")
    args = parser.parse_args(argv)
    rec = Recorder("varint")
    for name, data in (("1_byte", b"\x05"), ("2_bytes", b"\x80\x01"), ("lamport", b"")):
        data = data or encode_uvarint(1_700_000_000_123)
        rec.record(f"read_uvarint_{name}", _ns(lambda d=data: read_uvarint(d, 0)), "ns")
    rec.record("encode_uvarint_300", _ns(lambda: encode_uvarint(300)), "ns")
    rec.record("encode_uvarint_lamport", _ns(lambda: encode_uvarint(1_700_000_000_123)), "ns")
    stream = b"".join(encode_frame(b"x" * (n % 300)) for n in range(1000))
    rec.record(
        "frame_decoder_1000_frames", _ns(lambda: FrameDecoder().feed(stream), 200) / 1000, "ns"
    )
    _message_figures(rec, message, "HEAD")
    if args.rev:
        _message_figures(rec, _message_at(args.rev), args.rev)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
