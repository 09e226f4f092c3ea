"""A publication batch through the configured channel layer (channels_redis on Redis, else the in-memory
layer): delivered in the order of its items, and a refused item stops none of the others."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from channels.exceptions import ChannelFull
from django.conf import settings
from django.utils.module_loading import import_string

from gateway.events import send_batch

ON_REDIS = bool(settings.REDIS_URL)
# Under the run's prefix, so that the run's cleanup finds whatever a failed test leaves.
PREFIX = f"{settings.REDIS_PREFIX}:asgi-batch-{uuid.uuid4().hex[:8]}"


def _process_layer(**config):
    """A layer as one gateway process holds it: the configured backend and options, on this module's
    Redis prefix (cleared after each test)."""
    default = settings.CHANNEL_LAYERS["default"]
    options = {**default["CONFIG"], **config}
    if ON_REDIS:
        options["prefix"] = PREFIX
    return import_string(default["BACKEND"])(**options)


async def _closed(*layers) -> None:
    if not ON_REDIS:
        return
    await layers[0].flush()  # every key of the prefix
    for layer in layers:
        await layer.close_pools()


async def _drain(layer, channel: str) -> list:
    got = []
    with contextlib.suppress(TimeoutError):
        while True:
            got.append((await asyncio.wait_for(layer.receive(channel), 0.3))["n"])
    return got


def test_a_batch_reaches_each_receiver_in_its_order_across_groups_and_direct_sends():
    async def scenario():
        sender = _process_layer()
        # Another gateway process, on Redis; in memory there is only this one.
        elsewhere = _process_layer() if ON_REDIS else sender
        try:
            origin = await sender.new_channel()  # the connection that sent the turn, also subscribed
            subscriber = await elsewhere.new_channel()
            for channel, layer in ((origin, sender), (subscriber, elsewhere)):
                await layer.group_add("gateway.sub.sessions", channel)
            items = []
            for n in range(1, 21, 2):
                items.append(("group", "gateway.sub.sessions", {"type": "gateway.event", "n": n}))
                items.append(("channel", origin, {"type": "gateway.event", "n": n + 1}))
            items.append(("group", "nobody.listens", {"type": "gateway.event", "n": "dropped"}))
            await send_batch(sender, items)
            return await _drain(sender, origin), await _drain(elsewhere, subscriber)
        finally:
            await _closed(sender, elsewhere)

    origin, subscriber = asyncio.run(scenario())
    assert origin == list(range(1, 21))
    assert subscriber == list(range(1, 21, 2))


def test_a_full_channel_refuses_its_item_alone_and_the_failure_is_raised_after_the_rest_went_out():
    async def scenario():
        # Room for the three messages the reader gets (channel_capacity patterns: channels_redis only).
        layer = _process_layer(capacity=3)
        try:
            full = "full.connection"
            for _ in range(3):
                await layer.send(full, {"type": "gateway.event", "n": "filler"})
            reader = "reader.general"
            await layer.group_add("g", reader)
            items = [
                ("group", "g", {"type": "gateway.event", "n": 1}),
                ("channel", full, {"type": "gateway.event", "n": "refused"}),
                ("channel", reader, {"type": "gateway.event", "n": 2}),
                ("group", "g", {"type": "gateway.event", "n": 3}),
            ]
            with pytest.raises(ChannelFull):
                await send_batch(layer, items)
            return await _drain(layer, reader), await _drain(layer, full)
        finally:
            await _closed(layer)

    reader, full = asyncio.run(scenario())
    assert reader == [1, 2, 3]
    assert full == ["filler"] * 3


def test_the_first_of_several_failures_is_the_one_raised():
    async def scenario():
        layer = _process_layer(capacity=1)
        try:
            await layer.send("full.one", {"type": "gateway.event", "n": 0})
            await layer.send("full.two", {"type": "gateway.event", "n": 0})
            items = [
                ("channel", "full.one", {"type": "gateway.event", "n": 1}),
                ("group", "invalid group name!", {"type": "gateway.event", "n": 2}),
                ("channel", "full.two", {"type": "gateway.event", "n": 3}),
            ]
            with pytest.raises(ChannelFull):
                await send_batch(layer, items)
        finally:
            await _closed(layer)

    asyncio.run(scenario())
