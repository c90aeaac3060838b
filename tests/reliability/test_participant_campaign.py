"""Short participant, broker-restart and partition campaigns in CI (the long ones are
``scripts/campaign --target ...``; figures in docs/runtime.md).

Target (issue 17.3): every message whose ``send()`` returned is delivered to every
other participant and archived by the store node (0 lost), no delivery is processed
twice (0 duplicated), and every byte is the sender's (0 corrupt). The checks can
fail: an application that replays its deliveries after a restart shows
duplicates, and :func:`tally` is shown losses, duplicates and corruption.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sdk.sds.message import encode_fields
from tests.conftest import skip_or_fail
from tests.reliability.campaign_participant import content_for, digest
from tests.reliability.participant_campaign import (
    ParticipantCampaignConfig,
    ParticipantCampaignReport,
    Sent,
    Target,
    run_participant_campaign,
    tally,
)
from transports.base import message_hash, topic_for_channel

pytestmark = pytest.mark.integration


def _require_mosquitto() -> None:
    if shutil.which("mosquitto") is None:
        skip_or_fail("the mosquitto binary is not installed (the campaign runs a private broker)")


@pytest.mark.parametrize(
    ("target", "down"), [("participants", 1.0), ("broker", 1.0), ("partition", 5.0)]
)
async def test_faults_under_load_lose_repeat_and_corrupt_nothing(
    tmp_path: Path, target: Target, down: float
) -> None:
    _require_mosquitto()
    report = await run_participant_campaign(
        ParticipantCampaignConfig(
            target=target, faults=3, rate=10, down=down, seed=17, workdir=tmp_path
        )
    )
    print(report.json())
    assert report.acknowledged > 200
    # Every fault came while the participants were sending.
    assert 0 < report.acknowledged_at_fault[0] < report.acknowledged_at_fault[-1]
    assert report.acknowledged_at_fault[-1] < report.acknowledged
    assert report.expected_deliveries == 2 * report.acknowledged
    assert report.delivered == report.expected_deliveries
    assert report.archived == report.acknowledged
    assert report.lost == 0 and report.duplicated == 0 and report.corrupt == 0
    assert report.errors == []


async def test_an_app_replaying_its_deliveries_after_a_restart_shows_duplicates(
    tmp_path: Path,
) -> None:
    _require_mosquitto()
    report = await run_participant_campaign(
        ParticipantCampaignConfig(
            target="participants", faults=1, rate=10, resume=False, seed=3, workdir=tmp_path
        )
    )
    print(report.json())
    assert report.duplicated > 0 and not report.clean


def test_tally_counts_losses_duplicates_and_corruption() -> None:
    channel = "room"
    contents = {f"m{k}": content_for("p0", k, 8) for k in range(4)}
    sent = {m: Sent("p0", digest(c)) for m, c in contents.items()}
    row = encode_fields("p0", "m0", channel, 1, (), None, contents["m0"])
    hint = message_hash(topic_for_channel(channel), row)
    archive = [
        ("m0", row, len(row), hint),
        ("m0", row, len(row), hint),  # two rows of one message
        ("m1", row, len(row), hint),  # the bytes of another message
    ]
    delivered = {
        "p0": [],
        "p1": [
            ["1", "m0", "p0", sent["m0"].digest],
            ["2", "m0", "p0", sent["m0"].digest],  # processed twice
            ["3", "m1", "p0", "0" * 64],  # not the sender's bytes
            ["4", "m2", "p0", sent["m2"].digest],
        ],
    }
    report = ParticipantCampaignReport("participants", 2, 0)
    tally(report, sent, delivered, archive, channel)
    assert report.acknowledged == 4
    assert report.expected_deliveries == 4 and report.delivered == 3
    assert report.lost_delivery == 1  # m3 never reached p1
    assert report.archived == 2 and report.lost_archive == 2  # m2, m3
    assert report.lost == 2
    assert report.duplicated == 2  # p1's second m0, the archive's second m0 row
    assert report.corrupt == 2  # p1's m1, the m1 row
    assert not report.clean
