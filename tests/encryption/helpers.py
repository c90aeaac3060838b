"""A small encrypted group for the encryption tests: an issuer and members, their rings."""

from __future__ import annotations

from sdk.encryption import ChannelEncryption, Epoch, Identity, KeyRing, new_epoch, seal_key_package
from sdk.sds.message import Message, encode_message


class Group:
    """``names`` as members of ``channel``; the first issues epochs (and holds them all)."""

    def __init__(self, channel: str, names: list[str]) -> None:
        self.channel = channel
        self.ids = {name: Identity.generate() for name in names}
        self.issuer = names[0]
        self.rings = {
            name: KeyRing(channel, {self.ids[self.issuer].signing_public}) for name in names
        }
        self.epoch = self.rotate(names)

    def rotate(self, names: list[str]) -> Epoch:
        """Issue the next epoch to ``names`` by key package; return it."""
        number = self.rings[self.issuer].current.number + 1 if len(self.rings[self.issuer]) else 0
        epoch = new_epoch(number, {n: self.ids[n].signing_public for n in names})
        for name in names:
            package = seal_key_package(
                self.channel, epoch, self.ids[self.issuer], self.ids[name].box_public
            )
            self.rings[name].accept(package, self.ids[name])
        self.epoch = epoch
        return epoch

    def handle(self, name: str) -> ChannelEncryption:
        """``name``'s encryption handle."""
        return ChannelEncryption(self.rings[name], name, self.ids[name])


def sds(sender: str, mid: str, channel: str = "room", content: bytes = b"hello") -> bytes:
    """An encoded SDS content message."""
    return encode_message(Message(sender, mid, channel, 1_700_000_000_000, content=content))
