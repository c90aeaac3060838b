"""Issue 20: a mixed JS/Python channel converges with library defaults, without a
complete store.

Three participants (two of the reference and one Chorus, then one and two),
300 messages, 25 % loss, reordering, one participant offline for the middle
third, then 30 simulated minutes to catch up; once with no store and once with
a store that misses 25 % of the messages. Before the liveness work 6-92
messages stayed missing per Chorus participant although some peer held every
one. Chorus participants run ``ChannelConfig()`` as shipped (on the ``waku``
profile, as a mixed channel must), the reference its own defaults driven as its
``ReliableChannel`` drives it (resend and sync every 30 s).
"""

from __future__ import annotations

import pytest

from sdk.sds import ChannelConfig

from .jsharness import JsHarness
from .mixnet import MixedNetwork, Node, js_options


def _run(harness: JsHarness, kinds: str, store_loss: float | None, seed: int) -> MixedNetwork:
    net = MixedNetwork(
        harness,
        loss=0.25,
        seed=seed,
        store=store_loss is not None,
        store_loss=store_loss or 0.0,
    )
    nodes: list[Node] = []
    for i, kind in enumerate(kinds):
        name = f"{kind}{i}"
        if kind == "p":
            nodes.append(net.chorus(name, ChannelConfig()))
        else:
            nodes.append(net.js(name, js_options(repair_config={}), sync_ms=30_000))
    away = nodes[-1]  # offline for the middle third
    cut = net.drop(lambda s, r, d: away.name in (s, r))
    net.undrop(cut)
    sent: set[str] = set()
    offline_since = None
    for i in range(300):
        if i == 100:
            net.drop_rules.append(cut)
            offline_since = net.now
        if i == 200:
            net.undrop(cut)
            if away.kind == "chorus":  # what the runtime does on reconnect
                away.channel.announce(net.now, away_since=offline_since)  # type: ignore[attr-defined]
                away._flush()  # type: ignore[attr-defined]
        sender = nodes[i % len(nodes)]
        if sender is away and 100 <= i < 200:
            sender = nodes[0]
        if i % 3 == 0:
            net.hold()  # the next three go out concurrently, in a different order to each
        sent.add(sender.send(f"message {i} from {sender.name}".encode()))
        if i % 3 == 2:
            net.release()
        net.advance(500, step_ms=500)
    if net.held is not None:
        net.release()
    for _ in range(15 * 60):
        if all(set(log) == sent for log in net.logs().values()):
            break
        net.advance(2_000, step_ms=2_000)
    net.sent = sent  # type: ignore[attr-defined]
    return net


# Two reference participants make the run slow (each call crosses to node): minutes, not seconds.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kinds", ["jjp", "jpp"])
@pytest.mark.parametrize("store_loss", [None, 0.25], ids=["no-store", "lossy-store"])
def test_mixed_channel_converges(harness: JsHarness, kinds: str, store_loss: float | None) -> None:
    net = _run(harness, kinds, store_loss, seed=len(kinds) + kinds.count("p"))
    sent: set[str] = net.sent  # type: ignore[attr-defined]
    missing = {name: len(sent - set(log)) for name, log in net.logs().items()}
    chorus = {name: n for name, n in missing.items() if name.startswith("p")}
    assert chorus == dict.fromkeys(chorus, 0), missing
    assert net.dropped > 0
