"""The one-round-trip channel layer against real Redis: same wire format and rules as channels_redis."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest
from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer as UpstreamLayer
from django.conf import settings

from gateway.events import send_batch
from gateway.redis_layer import RedisChannelLayer

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL")


def _layers(upstreams: int = 1, **config):
    """Ours and upstream instances on one prefix: each instance is a process of its own (its own key)."""
    prefix = f"openclaw-test-layer-{uuid.uuid4().hex[:8]}:asgi"
    hosts = [{"address": settings.REDIS_URL, "socket_timeout": 15}]
    return RedisChannelLayer(hosts=hosts, prefix=prefix, **config), *(
        UpstreamLayer(hosts=hosts, prefix=prefix, **config) for _ in range(upstreams)
    )


async def _close(*layers):
    for layer in layers:
        await layer.flush()
        await layer.close_pools()


def test_a_send_is_received_by_the_upstream_layer_and_the_other_way_round():
    async def scenario():
        ours, upstream = _layers()
        try:
            theirs = await upstream.new_channel()
            await ours.send(theirs, {"type": "x.one", "n": 1})
            assert await asyncio.wait_for(upstream.receive(theirs), 5) == {"type": "x.one", "n": 1}
            mine = await ours.new_channel()
            await upstream.send(mine, {"type": "x.two"})
            await ours.send(mine, {"type": "x.three"})
            assert [await asyncio.wait_for(ours.receive(mine), 5) for _ in range(2)] == [
                {"type": "x.two"},
                {"type": "x.three"},
            ]
            await ours.send("general", {"type": "x.general"})
            assert await asyncio.wait_for(upstream.receive("general"), 5) == {"type": "x.general"}
        finally:
            await _close(ours, upstream)

    asyncio.run(scenario())


def test_a_full_channel_refuses_and_keeps_what_it_holds():
    async def scenario():
        ours, upstream = _layers(capacity=2)
        try:
            channel = await ours.new_channel()
            await ours.send(channel, {"type": "x", "n": 1})
            await ours.send(channel, {"type": "x", "n": 2})
            with pytest.raises(ChannelFull):
                await ours.send(channel, {"type": "x", "n": 3})
            assert [(await asyncio.wait_for(ours.receive(channel), 5))["n"] for _ in range(2)] == [1, 2]
        finally:
            await _close(ours, upstream)

    asyncio.run(scenario())


def test_expired_messages_are_dropped_before_counting():
    async def scenario():
        ours, upstream = _layers(capacity=1, expiry=60)
        try:
            channel = await ours.new_channel()
            key = ours.prefix + ours.non_local_name(channel)
            connection = ours.connection(ours.consistent_hash(channel))
            # A message older than the expiry, as a reader that went away leaves it.
            await connection.zadd(key, {ours.serialize({"type": "x.old", "__asgi_channel__": channel}): 1.0})
            await ours.send(channel, {"type": "x.new"})
            assert await asyncio.wait_for(ours.receive(channel), 5) == {"type": "x.new"}
        finally:
            await _close(ours, upstream)

    asyncio.run(scenario())


def test_group_send_reaches_every_member_once_and_skips_full_and_expired_members():
    async def scenario():
        ours, upstream, crowded = _layers(upstreams=2, capacity=1, group_expiry=3600)
        try:
            a, b = await ours.new_channel(), await ours.new_channel()
            elsewhere = await upstream.new_channel()
            full = await crowded.new_channel()
            for channel in (a, b, elsewhere, full):
                await ours.group_add("g", channel)
            await crowded.send(full, {"type": "x.filler"})
            # A membership older than group_expiry no longer receives.
            stale = await upstream.new_channel()
            await ours.connection(ours.consistent_hash("g")).zadd(ours._group_key("g"), {stale: time.time() - 7200})

            await ours.group_send("g", {"type": "x.all"})
            await ours.group_send("empty", {"type": "x.nobody"})

            assert await asyncio.wait_for(ours.receive(a), 5) == {"type": "x.all"}
            assert await asyncio.wait_for(ours.receive(b), 5) == {"type": "x.all"}
            assert await asyncio.wait_for(upstream.receive(elsewhere), 5) == {"type": "x.all"}
            assert await asyncio.wait_for(crowded.receive(full), 5) == {"type": "x.filler"}
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(crowded.receive(full), 0.3)
            members = await ours.connection(ours.consistent_hash("g")).zrange(ours._group_key("g"), 0, -1)
            assert stale.encode() not in members
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(upstream.receive(stale), 0.3)
        finally:
            await _close(ours, upstream, crowded)

    asyncio.run(scenario())


def test_a_burst_is_received_in_order_from_channels_of_one_process():
    async def scenario():
        ours, upstream = _layers()
        try:
            a, b = await ours.new_channel(), await ours.new_channel()
            for n in range(20):
                await upstream.send(a if n % 2 else b, {"type": "x", "n": n})
            got_a = [(await asyncio.wait_for(ours.receive(a), 5))["n"] for _ in range(10)]
            got_b = [(await asyncio.wait_for(ours.receive(b), 5))["n"] for _ in range(10)]
            # And a message sent while the receiver blocks on an empty channel.
            waiting = asyncio.create_task(ours.receive(a))
            await asyncio.sleep(0.2)
            await upstream.send(a, {"type": "x", "n": "late"})
            late = await asyncio.wait_for(waiting, 5)
            key = ours.prefix + ours.non_local_name(a)
            connection = ours.connection(ours.consistent_hash(a))
            await asyncio.sleep(0.1)  # the backup cleaner runs after each message
            leftover = await connection.zcard(ours._backup_channel_name(key))
            return got_a, got_b, late, leftover
        finally:
            await _close(ours, upstream)

    got_a, got_b, late, leftover = asyncio.run(scenario())
    assert got_a == list(range(1, 20, 2)) and got_b == list(range(0, 20, 2))
    assert late == {"type": "x", "n": "late"}
    assert leftover == 0


def test_a_message_left_in_flight_by_a_stopped_receiver_is_received_again_first():
    async def scenario():
        ours, upstream = _layers()
        try:
            channel = await ours.new_channel()
            key = ours.prefix + ours.non_local_name(channel)
            connection = ours.connection(ours.consistent_hash(channel))
            # A receiver stopped between popping a message and handing it over: it sits in the backup queue.
            stranded = ours.serialize({"type": "x.stranded", "__asgi_channel__": channel})
            await connection.zadd(ours._backup_channel_name(key), {stranded: time.time() - 1})
            await upstream.send(channel, {"type": "x.next"})
            return [await asyncio.wait_for(ours.receive(channel), 5) for _ in range(2)]
        finally:
            await _close(ours, upstream)

    assert asyncio.run(scenario()) == [{"type": "x.stranded"}, {"type": "x.next"}]


def test_a_batch_is_delivered_in_order_to_groups_and_channels_and_a_full_channel_refuses_alone():
    async def scenario():
        probe, upstream, crowded = _layers(upstreams=2)
        full = await crowded.new_channel()
        # The sender's capacity rule applies (as upstream): this channel holds one message.
        ours = RedisChannelLayer(hosts=probe.hosts, prefix=probe.prefix, channel_capacity={full: 1})
        try:
            sub_a, sub_b = await ours.new_channel(), await upstream.new_channel()
            direct = await ours.new_channel()
            for channel in (sub_a, sub_b):
                await ours.group_add("subs", channel)
            await crowded.send(full, {"type": "x", "n": "filler"})
            items = [
                ("group", "subs", {"type": "x", "n": 1}),
                ("channel", full, {"type": "x", "n": "refused"}),
                ("group", "nobody", {"type": "x", "n": "dropped"}),
                ("channel", direct, {"type": "x", "n": 2}),
                ("group", "subs", {"type": "x", "n": 3}),
            ]
            with pytest.raises(ChannelFull):
                await send_batch(ours, items)

            async def drain(layer, channel):
                got = []
                with contextlib.suppress(TimeoutError):
                    while True:
                        got.append((await asyncio.wait_for(layer.receive(channel), 0.3))["n"])
                return got

            # ours reads its channels through one queue: the order across them is the batch's.
            first_three = [(await asyncio.wait_for(ours.receive(c), 5))["n"] for c in (sub_a, direct, sub_a)]
            return first_three, await drain(upstream, sub_b), await drain(crowded, full)
        finally:
            await _close(ours, probe, upstream, crowded)

    ours_got, sub_b, full = asyncio.run(scenario())
    assert ours_got == [1, 2, 3]
    assert sub_b == [1, 3]
    assert full == ["filler"]


def test_without_the_batch_method_a_layer_gets_each_item_in_order_and_every_item_is_tried():
    class Recording:
        def __init__(self):
            self.sent = []

        async def group_send(self, group, message):
            if group == "broken":
                raise ChannelFull()
            self.sent.append((group, message["n"]))

        async def send(self, channel, message):
            self.sent.append((channel, message["n"]))

    layer = Recording()
    items = [("group", "g", {"n": 1}), ("group", "broken", {"n": 2}), ("channel", "c", {"n": 3})]
    with pytest.raises(ChannelFull):
        asyncio.run(send_batch(layer, items))
    assert layer.sent == [("g", 1), ("c", 3)]
