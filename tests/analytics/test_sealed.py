"""The report on a sealed archive (``docs/encryption.md``, ``docs/analytics.md``): without
keys, what the metadata allows and a line saying so; exported with the keys, the full report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sdk.encryption.keyfile import epoch_entry, load_key_rings, readers
from sdk.sds.message import HistoryEntry, Message, encode_message
from store_node.archive.base import ArchiveRow
from store_node.archive.sqlite import SqliteArchive
from store_node.export import export_archive
from store_node.ingest import row_from_envelope
from tests.analytics.conftest import T0
from tests.encryption.helpers import Group
from tests.store_node.store_node_helpers import envelope


def sealed_archive(tmp_path: Path) -> tuple[SqliteArchive, Path]:
    """Alice and bob each send 3 messages in "room"; one of alice's never reaches the
    archive (a lost message bob's history references). Returns the archive and a keys file."""
    group = Group("room", ["alice", "bob"])
    handles = {n: group.handle(n) for n in ("alice", "bob")}
    rows: list[ArchiveRow] = []
    previous: list[str] = []
    for k in range(6):
        sender = ("alice", "bob")[k % 2]
        mid = f"m{k}"
        sds = encode_message(
            Message(
                sender,
                mid,
                "room",
                T0 + k * 1000,
                tuple(HistoryEntry(h) for h in previous[-2:]),
                content=f"secret {k}".encode(),
            )
        )
        previous.append(mid)
        handles[sender]._clock = lambda k=k: T0 + k * 1000  # type: ignore[misc]
        if k == 2:
            continue  # lost: referenced by m3 and m4, never archived
        row = row_from_envelope(envelope("room", handles[sender].encrypt(sds)), T0 + k * 1000 + 50)
        assert isinstance(row, ArchiveRow), row
        rows.append(row)
    archive = SqliteArchive(tmp_path / "archive.db")
    archive.migrate()
    archive.write_batch(rows)
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"channels": {"room": {"epochs": [epoch_entry(group.epoch)]}}}))
    return archive, keys


def test_export_opens_sealed_rows_with_the_keys(tmp_path: Path) -> None:
    archive, keys = sealed_archive(tmp_path)
    with archive:
        plain = export_archive(archive, tmp_path / "sealed", progress=False)
        assert (plain.rows, plain.sealed, plain.opened) == (5, 5, 0)
        full = export_archive(
            archive, tmp_path / "open", progress=False, readers=readers(load_key_rings(keys))
        )
        assert (full.rows, full.sealed, full.opened) == (5, 0, 5)
        # Keys of another epoch open nothing: every row stays sealed.
        wrong = json.loads(keys.read_text())
        wrong["channels"]["room"]["epochs"][0]["key"] = "00" * 32
        keys.write_text(json.dumps(wrong))
        none = export_archive(
            archive, tmp_path / "wrong", progress=False, readers=readers(load_key_rings(keys))
        )
        assert (none.sealed, none.opened) == (5, 0)


@pytest.mark.integration
def test_report_on_a_sealed_archive_without_and_with_keys(tmp_path: Path, spark: Any) -> None:
    from store_node.analytics.report import run_report

    archive, keys = sealed_archive(tmp_path)
    with archive:
        export_archive(archive, tmp_path / "sealed", progress=False)
        export_archive(
            archive, tmp_path / "open", progress=False, readers=readers(load_key_rings(keys))
        )
    blind = run_report(spark, tmp_path / "sealed", tmp_path / "r1", make_plots=False)
    assert blind.totals["messages"] == 5
    assert blind.totals["messages_by_kind"]["sealed"] == 5
    assert blind.totals["senders"] == 0
    assert blind.tables["channels"].to_pylist()[0]["participants"] == 0
    assert blind.totals["loss"]["archived_messages"] == 0  # not judged, not "0% lost"
    assert blind.totals["delivery_delay"]["delay_p50_ms"] == 50  # envelope timestamps
    assert "5 sealed messages (encrypted channels, no keys given)" in blind.summary

    full = run_report(spark, tmp_path / "open", tmp_path / "r2", make_plots=False)
    assert full.totals["messages_by_kind"] == {"content": 5, "sync": 0, "ephemeral": 0}
    assert full.totals["senders"] == 2
    assert full.totals["loss"]["missing_messages"] == 1  # m2, referenced by m3 and m4
    assert "sealed messages" not in full.summary


def test_the_export_command_takes_a_keys_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from store_node import cli

    archive, keys = sealed_archive(tmp_path)
    archive.close()
    config = tmp_path / "store.toml"
    config.write_text('[archive]\npath = "archive.db"\n[ingest]\nchannels = ["room"]\n')
    base = ["export", "--config", str(config), "--no-progress"]
    assert cli.main([*base, "--out", str(tmp_path / "a")]) == 0
    assert json.loads(capsys.readouterr().out) | {"out": ""} == {
        "rows": 5,
        "files": 1,
        "out": "",
        "sealed": 5,
        "opened": 0,
    }
    assert cli.main([*base, "--out", str(tmp_path / "b"), "--keys", str(keys)]) == 0
    assert json.loads(capsys.readouterr().out)["opened"] == 5
    keys.write_text('{"channels": {"room": {"epochs": [{"number": 0}]}}}')
    assert cli.main([*base, "--out", str(tmp_path / "c"), "--keys", str(keys)]) == 2
    assert "--keys" in capsys.readouterr().err
