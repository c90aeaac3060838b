"""The configuration boundary (issues 16.1, 19.5, 17.4): every value checked, one-line errors.

Each case in the issues' lists is here as the value that used to start a node wrongly or
end in a traceback: ``listen = "127.0.0.1:99999"``, ``port = "abc"``, a typo in a transport
option, a negative or infinite ``max_age_days``, ``max_request_bytes = 2147483648``, deep
nesting, a file that is not UTF-8, a channel with NUL or an MQTT wildcard, a SQLite path
under a missing folder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store_node.config import TokenGrant, load_config, parse_config
from store_node.errors import ConfigError


def _error(data: dict[str, Any], base: Path = Path(".")) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, base)
    message = str(info.value)
    assert "\n" not in message, "config errors are one line"
    return message


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # 16.1: an out-of-range port used to start on a random one
        ({"grpc": {"listen": "127.0.0.1:99999"}}, "grpc.listen port must be 1..65535"),
        ({"metrics": {"listen": "127.0.0.1:70000"}}, "metrics.listen port must be 1..65535"),
        ({"grpc": {"listen": "127.0.0.1:-1"}}, "grpc.listen must be HOST:PORT"),
        ({"grpc": {"listen": "127.0.0.1:٣"}}, "grpc.listen must be HOST:PORT"),
        ({"grpc": {"listen": "a b:5"}}, "grpc.listen host is not a host name"),
        ({"grpc": {"listen": 50051}}, "grpc.listen must be str, got 50051"),
        # 19.5: port = "abc" used to be a TypeError inside paho
        ({"transport": {"port": "abc"}}, "transport.port must be int | None, got 'abc'"),
        ({"transport": {"port": 0}}, "transport.port must be 1..65535"),
        ({"transport": {"qos": 3}}, "transport.qos must be Literal[0, 1, 2]"),
        ({"transport": {"keepalive": -5}}, "transport.keepalive must not be negative"),
        ({"transport": {"reconnect_max": float("nan")}}, "transport.reconnect_max must be float"),
        # 16.1: a typo in a transport option used to be a TypeError traceback
        ({"transport": {"hots": "127.0.0.1"}}, "transport (mqtt) has no option 'hots'; known:"),
        ({"transport": {"kind": "libp2p", "listen": "x"}}, "transport.listen must be"),
        ({"transport": {"kind": "mqtt", "tls": "yes"}}, "transport.tls must be bool"),
        (
            {"transport": {"tls_cert_file": "c.pem"}},
            "transport.tls_cert_file and tls_key_file go together",
        ),
        # 16.1: negative max_age_days used to mean "off"; 19.5: inf failed every interval
        ({"retention": {"max_age_days": -1}}, "retention.max_age_days must be a finite non-neg"),
        ({"retention": {"max_age_days": float("inf")}}, "retention.max_age_days must be a finite"),
        ({"retention": {"max_age_days": float("nan")}}, "retention.max_age_days must be a finite"),
        ({"retention": {"interval_s": 0}}, "retention.interval_s must be a finite positive"),
        ({"retention": {"max_bytes": -1}}, "retention.max_bytes must be in 0.."),
        # 19.5: 2147483648 used to be an OverflowError at start
        ({"grpc": {"max_request_bytes": 2147483648}}, "grpc.max_request_bytes must be in 64.."),
        ({"grpc": {"max_response_bytes": 2**40}}, "grpc.max_response_bytes must be in 1024.."),
        ({"ingest": {"batch_size": 10**30}}, "ingest.batch_size must be in 1..1000000"),
        ({"ingest": {"archive_ephemeral": 1}}, "ingest.archive_ephemeral must be bool"),
        # 19.3: a channel with NUL used to make a node that never starts
        ({"ingest": {"channels": ["a\x00b"]}}, "contains control character U+0000"),
        ({"ingest": {"channels": ["a/+"]}}, "contains the MQTT wildcard '+'"),
        ({"ingest": {"channels": ["x" * 257]}}, "over 256"),
        ({"ingest": {"channels": ["c", "c"]}}, "ingest.channels lists 'c' twice"),
        ({"ingest": {"channels": "c"}}, "ingest.channels must be a list"),
        ({"ingest": {"channels": [1]}}, "must be a string, not int"),
        # sections and types
        ({"grpc": 5}, "[grpc] must be a table, got 5"),
        ({"archive": {"path": ""}}, "archive.path must be a non-empty path"),
        ({"archive": {"schema": "x; drop"}}, "archive.schema must be an SQL identifier"),
        ({"log": {"level": "loud"}}, "log.level must be debug, info, warning or error"),
        ({"metrics": {"listen": "127.0.0.1:9"}, "grpc": {"listen": "127.0.0.1:9"}}, "same"),
        ({"grpc": {"tls_key_file": "k.pem"}}, "grpc.tls_cert_file and grpc.tls_key_file go"),
        ({"grpc": {"tls_cert_file": "c", "tls_key_file": "k"}}, "grpc TLS file c does not exist"),
        ({"grpc": {"access": [{"channels": ["c"]}]}}, "grpc.access[0] needs token_env or"),
        ({"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}, "nest deeper than 8"),
        # The sync sections and their listener keys go through the same Section.
        ({"collection": {"max_listeners": 0}}, "collection.max_listeners must be a positive"),
        ({"collection": {"pth": "x"}}, "unknown key(s) in [collection]: pth"),
        ({"replication": 5}, "[replication] must be a table, got 5"),
        ({"replication": {"interval_s": float("nan")}}, "replication.interval_s must be a finite"),
        ({"replication": {"mode": "x"}}, "replication.mode must be set-reconciliation or log"),
        ({"bamboo_p2p": {"initial_credit": True}}, "bamboo_p2p.initial_credit must be int"),
        ({"bamboo_p2p": {"documents": "a\x00"}}, "bamboo_p2p.documents must be a path"),
        ({"store_sync": {"window_s": 1e10}}, "store_sync.window_s must be a finite positive"),
        ({"store_sync": {"peers": ["x"]}}, "store_sync.peers must be HOST:PORT, got 'x'"),
        ({"store_sync": {"idle_timeout_s": -1}}, "store_sync.idle_timeout_s must be a finite"),
        ({"collection": {"tls_key": "k"}}, "collection.tls_cert and collection.tls_key go"),
    ],
)
def test_every_bad_value_is_a_one_line_error_naming_the_key(
    data: dict[str, Any], expected: str
) -> None:
    assert expected in _error(data)


def test_sqlite_path_under_a_missing_folder_is_an_error(tmp_path: Path) -> None:
    message = _error({"archive": {"path": "typo/archive.db"}}, tmp_path)
    assert message == f"archive.path: folder {tmp_path / 'typo'} does not exist"
    assert not (tmp_path / "typo").exists()
    (tmp_path / "data").mkdir()
    config = parse_config({"archive": {"path": "data/archive.db"}}, tmp_path)
    assert config.archive.path == tmp_path / "data" / "archive.db"


def test_port_zero_asks_for_any_free_port_and_ipv6_listen_is_accepted() -> None:
    config = parse_config({"grpc": {"listen": "[::1]:0"}, "metrics": {"listen": "[::1]:9464"}})
    assert config.grpc.listen == "[::1]:0"


def test_per_channel_tokens_from_env_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHORUS_TEST_READER", "reader-secret")
    (tmp_path / "admins").write_text("admin-1\n\nadmin-2\n")
    config = parse_config(
        {
            "grpc": {
                "token_file": "admins",
                "access": [{"token_env": "CHORUS_TEST_READER", "channels": ["a", "b"]}],
            }
        },
        tmp_path,
    )
    assert config.grpc.grants == (
        TokenGrant("admin-1"),
        TokenGrant("admin-2"),
        TokenGrant("reader-secret", frozenset({"a", "b"})),
    )
    assert "reader-secret" not in repr(config), "a secret must never reach a log line"
    monkeypatch.setenv("CHORUS_TEST_READER", "admin-1")
    assert "the same token is configured twice" in _error(
        {
            "grpc": {
                "token_file": "admins",
                "access": [{"token_env": "CHORUS_TEST_READER", "channels": ["a"]}],
            }
        },
        tmp_path,
    )


def test_mqtt_password_env_and_tls_files_become_adapter_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ssl

    monkeypatch.setenv("CHORUS_TEST_MQTT_PW", "pw")
    config = parse_config(
        {"transport": {"username": "u", "password_env": "CHORUS_TEST_MQTT_PW", "tls": True}},
        tmp_path,
    )
    assert config.transport.options["password"] == "pw"
    assert isinstance(config.transport.options["tls"], ssl.SSLContext)
    assert "not set" in _error({"transport": {"password_env": "CHORUS_SURELY_UNSET"}})
    assert "does not exist" in _error({"transport": {"tls_ca_file": "nope.pem"}}, tmp_path) or (
        "No such file" in _error({"transport": {"tls_ca_file": "nope.pem"}}, tmp_path)
    )


# -- the file itself ------------------------------------------------------------------------


def _load_error(tmp_path: Path, raw: bytes) -> str:
    path = tmp_path / "store.toml"
    path.write_bytes(raw)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    # 17.4: this used to be a UnicodeDecodeError traceback.
    assert "is not UTF-8 (byte 13)" in _load_error(tmp_path, b'[log]\nlevel="\xff\xfe"\n')


def test_deep_nesting_is_a_config_error(tmp_path: Path) -> None:
    # 19.5: this used to be a RecursionError.
    assert "nest too deeply" in _load_error(tmp_path, b"x = " + b"[" * 5000 + b"]" * 5000)
    assert "nest deeper than 8" in _load_error(tmp_path, b"x = " + b"[" * 20 + b"]" * 20)
    assert "nest deeper than 8" in _load_error(tmp_path, b"x = " + b"{a=" * 20 + b"1" + b"}" * 20)


def test_a_huge_file_is_rejected_before_parsing(tmp_path: Path) -> None:
    assert "is larger than 1048576 bytes" in _load_error(tmp_path, b"#" * (2 * 1024 * 1024))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=400))
def test_any_bytes_give_a_config_or_a_one_line_error(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "fuzz.toml"
    path.write_bytes(raw)
    try:
        load_config(path)
    except ConfigError as exc:
        assert "\n" not in str(exc)


_VALUES = st.recursive(
    st.none().map(lambda _: "x")
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
_KEYS = {
    "archive": ["backend", "path", "synchronous", "dsn", "schema"],
    "ingest": ["channels", "batch_size", "batch_interval_ms", "queue_size", "queue_bytes"],
    "transport": ["kind", "host", "port", "qos", "keepalive", "protocol", "tls", "username"],
    "grpc": ["listen", "max_request_bytes", "max_page_size", "access", "tls_cert_file"],
    "metrics": ["listen"],
    "retention": ["max_age_days", "max_bytes", "interval_s"],
    "log": ["level"],
}


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_mutated_sections_give_a_config_or_a_config_error(
    tmp_path: Path, data: st.DataObject
) -> None:
    section = data.draw(st.sampled_from(sorted(_KEYS)))
    key = data.draw(st.sampled_from(_KEYS[section]))
    value = data.draw(_VALUES)
    try:
        parse_config({section: {key: value}}, tmp_path)
    except ConfigError as exc:
        assert "\n" not in str(exc) and re.search(r"\S", str(exc))
