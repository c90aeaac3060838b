"""A short kill -9 campaign per backend in CI (the long one is ``scripts/campaign``).

Target (issue 17.3): 0 lost acknowledged messages, 0 duplicates, 0 corrupt rows.
The same campaign with acknowledgement on receipt must find losses: the check
can fail.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_SERVICES, require_service
from tests.reliability.store_campaign import CampaignConfig, run_campaign
from tests.store_node.store_node_helpers import postgres_dsn

pytestmark = pytest.mark.integration


def _require(backend: str) -> None:
    if shutil.which("mosquitto") is None:
        message = "the mosquitto binary is not installed (the campaign runs a private broker)"
        if REQUIRE_SERVICES:
            pytest.fail(message + " (CHORUS_REQUIRE_SERVICES=1)")
        pytest.skip(message)
    if backend == "postgresql":
        require_service("PostgreSQL", 5432)
        postgres_dsn()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_kill_9_under_load_loses_nothing_acknowledged(tmp_path: Path, backend: str) -> None:
    _require(backend)
    report = await run_campaign(
        CampaignConfig(backend=backend, kills=3, rate=500, seed=17, workdir=tmp_path)  # type: ignore[arg-type]
    )
    print(report.json())
    assert report.acknowledged == report.published > 3000
    # Kills landed while messages were arriving, not before or after the load.
    assert 0 < report.archived_at_kill[0] < report.published
    assert report.lost == 0 and report.duplicated == 0 and report.corrupt == 0
    assert report.integrity == []


async def test_the_campaign_finds_losses_when_the_node_acks_on_receipt(tmp_path: Path) -> None:
    _require("sqlite")
    report = await run_campaign(
        CampaignConfig(backend="sqlite", kills=1, rate=500, mode="none", seed=3, workdir=tmp_path)
    )
    print(report.json())
    assert report.lost > 0 and not report.clean
