"""The demo runs and converges, live over the embedded broker and simulated."""

from __future__ import annotations

import pytest

from examples import demo


@pytest.mark.integration
def test_live_demo_over_the_embedded_broker_converges(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("amqtt")
    assert demo.main(["--participants", "3", "--messages", "20", "--timeout", "60"]) == 0
    assert "CONVERGED" in capsys.readouterr().out


def test_simulated_demo_converges(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--simulated", "--messages", "30"]) == 0
    assert "CONVERGED" in capsys.readouterr().out
