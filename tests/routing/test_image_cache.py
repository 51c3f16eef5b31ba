"""The pure cores of sending images once per peer (hydra_node/routing/image_cache.py): the host's
cache (an LRU bounded in bytes, per requesting peer) fills elided images or names the missing
ones; the requester's memory of what it sent each peer decides which bytes it leaves out."""

from __future__ import annotations

import pytest

from hydra_node.inference.images import ImageBlob, image_sha256
from hydra_node.routing.image_cache import ImageCache, ImagesMissing, SentImages


def blob(data: bytes) -> ImageBlob:
    return ImageBlob(image_sha256(data), data, "image/png", 32, 32)


A, B, C = blob(b"a" * 100), blob(b"b" * 100), blob(b"c" * 100)


def test_an_elided_image_is_filled_from_what_the_same_peer_sent_before():
    cache = ImageCache()
    assert cache.fill("p", [A, B]) == (A, B)  # stored
    assert cache.fill("p", [B.without_data(), A.without_data()]) == (B, A)
    st = cache.statistics()
    assert (st.entries, st.bytes, st.stored, st.filled, st.missing) == (2, 200, 2, 2, 0)


def test_a_missing_image_is_named_and_nothing_is_filled():
    cache = ImageCache()
    cache.fill("p", [A])
    with pytest.raises(ImagesMissing) as info:
        cache.fill("p", [A.without_data(), C.without_data(), B, C.without_data()])
    assert info.value.missing == (C.sha256,)  # each missing hash once, in request order
    assert cache.get("p", B.sha256) == B.data  # what came with bytes is kept all the same
    assert cache.statistics().missing == 1


def test_another_peer_cannot_use_or_probe_an_image_it_did_not_send():
    cache = ImageCache()
    cache.fill("alice", [A])
    with pytest.raises(ImagesMissing) as info:
        cache.fill("mallory", [A.without_data()])
    assert info.value.missing == (A.sha256,)


def test_a_repeat_within_one_request_is_filled_from_that_request_even_with_no_cache():
    cache = ImageCache(0)  # keeps nothing
    assert cache.fill("p", [A, A.without_data()]) == (A, A)
    assert len(cache) == 0
    with pytest.raises(ImagesMissing):
        cache.fill("p", [A.without_data()])


def test_the_cache_is_bounded_in_bytes_and_evicts_the_least_recently_used():
    cache = ImageCache(250)
    cache.fill("p", [A, B])
    assert cache.get("p", A.sha256) == A.data  # A used: B is now the oldest
    cache.fill("p", [C])
    assert cache.get("p", B.sha256) is None and cache.get("p", A.sha256) and cache.get("p", C.sha256)
    st = cache.statistics()
    assert (st.entries, st.bytes, st.evicted) == (2, 200, 1)
    big = blob(b"x" * 300)  # larger than the whole bound: served, never kept
    assert cache.fill("p", [big]) == (big,)
    assert cache.get("p", big.sha256) is None and cache.statistics().bytes == 200


def test_storing_an_image_again_does_not_count_its_bytes_twice():
    cache = ImageCache()
    cache.fill("p", [A])
    cache.fill("p", [A])
    assert cache.statistics().bytes == 100 and len(cache) == 1


def test_the_requester_leaves_out_what_it_sent_that_peer_and_repeats_within_a_request():
    sent = SentImages()
    assert sent.elide("p", [A, B, A]) == (A, B, A.without_data())  # a repeat carries its bytes once
    sent.sent("p", [A, B])
    assert sent.elide("p", [A, C]) == (A.without_data(), C)
    assert sent.elide("q", [A]) == (A,)  # another peer was never sent it
    sent.forget("p", [A.sha256])  # the peer answered images_missing for A
    assert sent.elide("p", [A, B]) == (A, B.without_data())
    sent.forget("p")
    assert sent.elide("p", [B]) == (B,)


def test_once_puts_every_distinct_images_bytes_back_exactly_once():
    assert SentImages.once([A, A, B]) == (A, A.without_data(), B)
    # an image already without bytes stays so; a later occurrence with bytes keeps them (the host fills)
    assert SentImages.once([A.without_data(), A, B]) == (A.without_data(), A, B)


def test_the_requesters_memory_is_bounded_per_peer_and_in_peers():
    sent = SentImages(per_peer=2, peers=2)
    sent.sent("p", [A, B, C])  # only the last two are remembered
    assert [sent.holds("p", x.sha256) for x in (A, B, C)] == [False, True, True]
    sent.sent("q", [A])
    sent.sent("r", [A])  # p is the oldest peer: forgotten
    assert sent.known_peers() == ["q", "r"] and not sent.holds("p", B.sha256)
    off = SentImages(per_peer=0)  # remembers nothing: every image always goes with its bytes
    off.sent("p", [A])
    assert off.elide("p", [A]) == (A,)
