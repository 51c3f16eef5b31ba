"""Images between peers, sent once (pure; protocol/README.md section 11.3, docs/vision.md).

A chat about an image is usually several turns about the same image: each turn's request carries
it again (the client resends the whole conversation). So that a peer is not sent the same
megabytes at every turn:

* the host keeps the images it was sent in an :class:`ImageCache` (an LRU bounded in bytes, per
  requesting peer), and fills an image that arrives without its bytes (``data`` absent: elided)
  from it: :meth:`ImageCache.fill` — or names the hashes it lacks (:class:`ImagesMissing`, which
  the host answers as a 409 ``images_missing`` before anything runs);
* the requester remembers which hashes it sent each peer (:class:`SentImages`, bounded) and
  leaves their bytes out (:meth:`SentImages.elide`); on ``images_missing`` it sends the request
  once more with every image's bytes.

The cache is per requesting peer, never shared between them: a shared one would let any member
learn, from the host's ``images_missing`` answer, whether another member's user sent an image
with a given hash. Within one request, an image that occurs twice carries its bytes once (its
first occurrence); the later ones are elided and filled from the same request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from hydra_node.inference.images import ImageBlob, ImageInput

__all__ = [
    "IMAGE_CACHE_BYTES",
    "SENT_IMAGES_PER_PEER",
    "SENT_IMAGES_PEERS",
    "ImageCache",
    "ImageCacheStatistics",
    "ImagesMissing",
    "SentImages",
]

#: Image bytes a host keeps for its requesters, all peers together (the oldest used go first).
IMAGE_CACHE_BYTES = 256 * 1024 * 1024
#: Hashes a requester remembers sending one peer (the most recently sent), and the peers it
#: remembers (the most recently sent to). Its guess may be stale (the host evicted the image,
#: or restarted): the host's ``images_missing`` corrects it at the cost of one round trip.
SENT_IMAGES_PER_PEER = 1024
SENT_IMAGES_PEERS = 256


class ImagesMissing(Exception):
    """Elided images the host does not hold (their SHA-256 hex, in request order, each once)."""

    def __init__(self, missing: tuple[str, ...]) -> None:
        super().__init__(f"{len(missing)} image(s) not held: {', '.join(missing)}")
        self.missing = missing


@dataclass(frozen=True)
class ImageCacheStatistics:
    entries: int
    bytes: int
    #: images stored (sent with their bytes), filled (elided, found), missing (elided, not found),
    #: evicted (dropped to make room)
    stored: int
    filled: int
    missing: int
    evicted: int


class ImageCache:
    """The host's images, keyed by (requesting peer, SHA-256): an LRU bounded in bytes. An image
    larger than the whole bound is not kept (the request that carried it is served all the same)."""

    def __init__(self, max_bytes: int = IMAGE_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("ImageCache: max_bytes must be 0 or more")
        self.max_bytes = max_bytes
        self._lru: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._bytes = 0
        self._stored = self._filled = self._missing = self._evicted = 0

    def __len__(self) -> int:
        return len(self._lru)

    def statistics(self) -> ImageCacheStatistics:
        return ImageCacheStatistics(
            len(self._lru), self._bytes, self._stored, self._filled, self._missing, self._evicted
        )

    def put(self, peer: str, blob: ImageBlob) -> None:
        """Keep ``blob``'s bytes for ``peer`` (an elided blob is ignored)."""
        if blob.elided:
            return
        key = (peer, blob.sha256)
        old = self._lru.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        if len(blob.data) > self.max_bytes:
            return
        self._lru[key] = blob.data
        self._bytes += len(blob.data)
        self._stored += 1
        while self._bytes > self.max_bytes:
            _, dropped = self._lru.popitem(last=False)
            self._bytes -= len(dropped)
            self._evicted += 1

    def get(self, peer: str, sha256: str) -> bytes | None:
        """``peer``'s image with that hash (now the most recently used), or None."""
        data = self._lru.get((peer, sha256))
        if data is not None:
            self._lru.move_to_end((peer, sha256))
        return data

    def fill(self, peer: str, images: Iterable[ImageBlob | ImageInput]) -> tuple[ImageBlob, ...]:
        """``images`` (as a request from ``peer`` carries them) with every one's bytes: the images
        that carry bytes are stored first, then each elided one is filled from this request's own
        images or the cache. :class:`ImagesMissing` names those found in neither (nothing is
        filled then; the ones with bytes stay stored)."""
        blobs = tuple(images)
        own: dict[str, bytes] = {}
        for im in blobs:
            if not isinstance(im, ImageBlob):  # never on the wire: from_wire builds blobs only
                raise TypeError("ImageCache.fill takes resolved images (ImageBlob)")
            if not im.elided:
                own.setdefault(im.sha256, im.data)
                self.put(peer, im)
        out: list[ImageBlob] = []
        missing: list[str] = []
        filled = 0
        for im in blobs:
            assert isinstance(im, ImageBlob)
            if not im.elided:
                out.append(im)
                continue
            data = own.get(im.sha256) or self.get(peer, im.sha256)
            if data is None:
                if im.sha256 not in missing:
                    missing.append(im.sha256)
                continue
            filled += 1
            out.append(im.with_data(data))
        if missing:
            self._missing += len(missing)
            raise ImagesMissing(tuple(missing))
        self._filled += filled
        return tuple(out)


class SentImages:
    """Which images the requester sent each peer recently (what it may send elided)."""

    def __init__(self, per_peer: int = SENT_IMAGES_PER_PEER, peers: int = SENT_IMAGES_PEERS) -> None:
        if per_peer < 0 or peers < 1:
            raise ValueError("SentImages: per_peer must be 0 or more and peers at least 1")
        self.per_peer = per_peer
        self.peers = peers
        self._sent: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()

    def holds(self, peer: str, sha256: str) -> bool:
        return sha256 in self._sent.get(peer, ())

    def elide(self, peer: str, images: Iterable[ImageBlob | ImageInput]) -> tuple[ImageBlob, ...]:
        """``images`` as they go to ``peer``: without the bytes of an image it was sent recently,
        and of a repeat within the request (its first occurrence with bytes carries them); an image
        already without bytes stays so."""
        out: list[ImageBlob] = []
        seen: set[str] = set()
        for im in images:
            if not isinstance(im, ImageBlob):
                raise TypeError("SentImages.elide takes resolved images (ImageBlob)")
            if im.elided:
                out.append(im)
                continue
            out.append(im.without_data() if im.sha256 in seen or self.holds(peer, im.sha256) else im)
            seen.add(im.sha256)
        return tuple(out)

    @staticmethod
    def once(images: Iterable[ImageBlob | ImageInput]) -> tuple[ImageBlob, ...]:
        """``images`` with every image's bytes, each distinct image's once (its first occurrence):
        what a requester sends after ``images_missing``."""
        return SentImages(per_peer=0).elide("", images)

    def sent(self, peer: str, images: Iterable[ImageBlob | ImageInput]) -> None:
        """``peer`` took a request with these images (it holds them now)."""
        if self.per_peer == 0:
            return
        held = self._sent.pop(peer, None)
        if held is None:
            held = OrderedDict()
            while len(self._sent) >= self.peers:
                self._sent.popitem(last=False)
        self._sent[peer] = held
        for im in images:
            if isinstance(im, ImageBlob):
                held.pop(im.sha256, None)
                held[im.sha256] = None
        while len(held) > self.per_peer:
            held.popitem(last=False)

    def forget(self, peer: str, hashes: Iterable[str] | None = None) -> None:
        """``peer`` no longer holds ``hashes`` (None: anything: it left, or answered ``images_missing``)."""
        if hashes is None:
            self._sent.pop(peer, None)
            return
        held = self._sent.get(peer)
        if held is not None:
            for h in hashes:
                held.pop(h, None)

    def known_peers(self) -> list[str]:
        return list(self._sent)
