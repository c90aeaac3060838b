"""The store-node CLI and configuration loading."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from store_node import cli
from store_node.archive import open_archive
from store_node.config import load_config, parse_config
from store_node.errors import ConfigError
from tests.store_node.store_node_helpers import archive_row

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "store_node.toml"


def test_example_config_loads() -> None:
    config = load_config(EXAMPLE)
    assert config.grpc.listen.startswith("127.0.0.1:")
    assert config.metrics.listen.startswith("127.0.0.1:")
    assert config.ingest.channels


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"archive": {"pth": "x"}}, "unknown key(s) in [archive]: pth"),
        ({"nope": {}}, "unknown section(s): nope"),
        ({"ingest": {"batch_size": 0}}, "ingest.batch_size must be in 1..1000000, got 0"),
        ({"ingest": {"batch_size": "10"}}, "ingest.batch_size must be int"),
        ({"archive": {"backend": "postgresql"}}, "archive.dsn is required"),
        ({"grpc": {"listen": "50051"}}, "grpc.listen must be HOST:PORT"),
        ({"grpc": {"token_env": "CHORUS_SURELY_UNSET_VAR"}}, "not set"),
        ({"transport": {"kind": "factory"}}, "transport.factory must be"),
    ],
)
def test_config_errors_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(data)


def test_config_paths_and_transport_options(tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text("a\n\nb\n")
    (tmp_path / "data").mkdir()
    config = parse_config(
        {
            "archive": {"path": "data/s.db"},
            "transport": {"kind": "mqtt", "host": "127.0.0.1", "port": 1883},
            "grpc": {"token_file": "tokens", "max_page_size": 10},
            "retention": {"max_age_days": 7, "max_bytes": 1000},
        },
        tmp_path,
    )
    assert config.archive.path == tmp_path / "data" / "s.db"
    assert dict(config.transport.options) == {"host": "127.0.0.1", "port": 1883}
    assert config.grpc.tokens == ("a", "b")
    assert config.grpc.default_page_size == 10
    assert config.retention.max_age_days == 7.0 and config.retention.max_bytes == 1000


def _config_file(tmp_path: Path) -> Path:
    path = tmp_path / "store.toml"
    path.write_text('[archive]\npath = "a.db"\n[ingest]\nchannels = ["c"]\n')
    return path


def test_stats_and_export_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _config_file(tmp_path)
    with open_archive(load_config(path).archive) as archive:
        archive.write_batch([archive_row("c", i) for i in range(25)])
    assert cli.main(["stats", "--config", str(path), "--check"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["message_count"] == 25 and stats["integrity"] == "ok"
    assert stats["backend"] == "sqlite" and stats["channels"] == {"c": 25}
    out = tmp_path / "export"
    assert cli.main(["export", "--config", str(path), "--out", str(out), "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 25
    assert cli.main(["export", "--config", str(path), "--out", str(out), "--no-progress"]) == 2
    assert "not empty" in capsys.readouterr().err


def test_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[archive\n")
    assert cli.main(["stats", "--config", str(path)]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    assert cli.main(["stats", "--config", str(tmp_path / "missing.toml")]) == 2
    empty = _config_file(tmp_path)
    assert cli.main(["stats", "--config", str(empty)]) == 1
    assert "no archive at" in capsys.readouterr().err
    assert not (tmp_path / "a.db").exists(), "stats must not create an archive"


def test_serve_without_channels_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[archive]\npath = "a.db"\n')
    assert cli.main(["serve", "--config", str(path)]) == 2
    assert "channels is empty" in capsys.readouterr().err


def test_analytics_dispatch_is_lazy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import types

    calls: list[list[str]] = []
    fake = types.ModuleType("store_node.analytics.cli")
    fake.main = lambda argv: calls.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "store_node.analytics.cli", fake)
    assert cli.main(["analytics", "report", "--in", "x"]) == 0
    assert calls == [["report", "--in", "x"]]
    monkeypatch.setitem(sys.modules, "store_node.analytics.cli", None)  # import fails
    assert cli.main(["analytics", "report"]) == 2
    assert "analytics module is not installed" in capsys.readouterr().err
