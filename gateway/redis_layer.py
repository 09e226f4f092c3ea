"""channels_redis's channel layer with fewer Redis round trips per message sent and received.

Upstream ``send`` takes four round trips (drop expired messages, count, add, set the expiry) and
``group_send`` two for an empty group and four otherwise. A turn publishes a dozen messages from
one lane, one after another, so their round trips add up on the turn's critical path (and the Redis
server's command count). Here the same steps run as one script per send (two per group send to
members: reading the members, then delivering), with the same keys, scores, expiries and capacity
rule, so the receiving side (upstream's) is unchanged. The scripts are atomic, which upstream's
separate steps were not: two senders can no longer both pass the capacity check of a full channel.

Receiving, upstream takes three round trips per message before it hands it over (put back what a
cancelled receive left in the backup queue, pop, back the popped message up). A process's
messages often arrive in bursts (a turn's events, a broadcast): here a message that is already
waiting is taken with those three steps in one script, and only an empty channel blocks in
``BZPOPMIN`` as upstream does.
"""

from __future__ import annotations

import logging
import time

from channels.exceptions import ChannelFull
from channels_redis import core

logger = logging.getLogger(__name__)

# KEYS[1]: the channel's sorted set. ARGV: message, score (now), drop scores up to, capacity, expiry.
_SEND = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[3])
if redis.call('ZCOUNT', KEYS[1], '-inf', '+inf') >= tonumber(ARGV[4]) then
    return 1
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 0
"""

# KEYS[1]: the group's sorted set. ARGV[1]: drop memberships added up to this time.
_GROUP_MEMBERS = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

# KEYS: channel sorted sets. ARGV: one message per key, one capacity per key, then score (now),
# expiry and the score up to which expired messages are dropped.
_GROUP_DELIVER = """
local n = #KEYS
local now, expiry, stale = ARGV[2 * n + 1], ARGV[2 * n + 2], ARGV[2 * n + 3]
local over_capacity = 0
for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, stale)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[n + i]) then
        redis.call('ZADD', KEYS[i], now, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""


# KEYS[1]: the channel's sorted set, KEYS[2]: its backup (in-flight) queue. Upstream's cleanup
# (messages a cancelled receive left in the backup go back to the channel, oldest first), then pop
# the oldest message and back it up until the receiver is done with it; false when there is none.
_CLEAN_AND_POP = """
local backed_up = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = #backed_up, 1, -2 do
    redis.call('ZADD', KEYS[1], backed_up[i], backed_up[i - 1])
end
redis.call('DEL', KEYS[2])
local popped = redis.call('ZPOPMIN', KEYS[1])
if popped[1] then
    redis.call('ZADD', KEYS[2], popped[2], popped[1])
    return popped[1]
end
return false
"""


class RedisChannelLayer(core.RedisChannelLayer):
    def _addressed(self, channel, message) -> tuple[str, dict]:
        """The channel's sorted-set key and the message as stored there (upstream's checks and rules)."""
        assert isinstance(message, dict), "message is not a dict"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        assert "__asgi_channel__" not in message
        if "!" in channel:
            return self.prefix + self.non_local_name(channel), {**message, "__asgi_channel__": channel}
        return self.prefix + channel, message

    async def send(self, channel, message):
        channel_key, message = self._addressed(channel, message)
        index = self.consistent_hash(channel) if "!" in channel else next(self._send_index_generator)
        now = time.time()
        full = await self.connection(index).eval(
            _SEND,
            1,
            channel_key,
            self.serialize(message),
            now,
            int(now) - int(self.expiry),
            self.get_capacity(channel),
            int(self.expiry),
        )
        if full:
            raise ChannelFull()

    async def group_send(self, group, message):
        assert self.require_valid_group_name(group), "Group name not valid"
        key = self._group_key(group)
        members = await self.connection(self.consistent_hash(group)).eval(
            _GROUP_MEMBERS, 1, key, int(time.time()) - self.group_expiry
        )
        if not members:
            return
        channel_names = [member.decode("utf8") for member in members]
        by_connection, messages, capacities = self._map_channel_keys_to_connection(channel_names, message)
        for index, channel_keys in by_connection.items():
            now = time.time()
            over_capacity = await self.connection(index).eval(
                _GROUP_DELIVER,
                len(channel_keys),
                *channel_keys,
                *(messages[channel_key] for channel_key in channel_keys),
                *(capacities[channel_key] for channel_key in channel_keys),
                now,
                int(self.expiry),
                int(now) - int(self.expiry),
            )
            if over_capacity:
                logger.info("%s of %s channels over capacity in group %s", over_capacity, len(channel_names), group)

    async def _brpop_with_clean(self, index, channel, timeout):
        """Upstream's receive step (cleanup, pop, back up), in one round trip when a message waits."""
        connection = self.connection(index)
        backup_queue = self._backup_channel_name(channel)
        member = await connection.eval(_CLEAN_AND_POP, 2, channel, backup_queue)
        if member is not None:
            return member
        # Nothing waiting: block as upstream does (a cancellation here loses nothing, and a message
        # popped is in the backup queue before this returns it).
        result = await connection.bzpopmin(channel, timeout=timeout)
        if result is None:
            return None
        _, member, timestamp = result
        await connection.zadd(backup_queue, {member: float(timestamp)})
        return member

    async def send_batch(self, items):
        """``(kind, target, message)`` items ("group" or "channel"), delivered in their order in two
        round trips: every group's members (read once per batch), then every delivery, pipelined.
        A full channel refuses its message alone; ``ChannelFull`` is raised after the others went out."""
        if self.ring_size != 1:
            # Several Redis servers: deliveries would spread over connections; keep upstream's way.
            for kind, target, message in items:
                await (self.group_send if kind == "group" else self.send)(target, message)
            return
        connection = self.connection(0)
        now = time.time()
        stale = int(now) - int(self.expiry)
        groups = list(dict.fromkeys(target for kind, target, _ in items if kind == "group"))
        members: dict[str, list[str]] = {}
        if groups:
            for group in groups:
                assert self.require_valid_group_name(group), "Group name not valid"
            reading = connection.pipeline(transaction=False)
            for group in groups:
                reading.eval(_GROUP_MEMBERS, 1, self._group_key(group), int(now) - self.group_expiry)
            for group, found in zip(groups, await reading.execute(), strict=True):
                members[group] = [member.decode("utf8") for member in found]
        delivering = connection.pipeline(transaction=False)
        sends = []
        for position, (kind, target, message) in enumerate(items):
            # A sorted set orders equal scores by content: each item gets a later score than the one
            # before (1 µs apart, still earlier than any send after this batch's round trip).
            score = now + position * 1e-6
            if kind == "group":
                if not members[target]:
                    continue
                by_connection, messages, capacities = self._map_channel_keys_to_connection(members[target], message)
                for channel_keys in by_connection.values():
                    delivering.eval(
                        _GROUP_DELIVER,
                        len(channel_keys),
                        *channel_keys,
                        *(messages[channel_key] for channel_key in channel_keys),
                        *(capacities[channel_key] for channel_key in channel_keys),
                        score,
                        int(self.expiry),
                        stale,
                    )
                    sends.append(("group", target))
                continue
            channel_key, message = self._addressed(target, message)
            delivering.eval(
                _SEND,
                1,
                channel_key,
                self.serialize(message),
                score,
                stale,
                self.get_capacity(target),
                int(self.expiry),
            )
            sends.append(("channel", target))
        if not sends:
            return
        refused = []
        for (kind, target), result in zip(sends, await delivering.execute(), strict=True):
            if result and kind == "group":
                logger.info("%s of %s channels over capacity in group %s", result, len(members[target]), target)
            elif result:
                refused.append(target)
        if refused:
            raise ChannelFull(f"channel full: {', '.join(refused)}")
