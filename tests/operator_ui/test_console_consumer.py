"""The console's live socket when its page goes away while an event is on its way to it."""

from __future__ import annotations

import asyncio

from autobahn.exception import Disconnected

from gateway.broadcast import EVENT_MESSAGE_TYPE
from operator_ui.consumers import FORWARDED_EVENTS, ConsoleConsumer


def test_an_event_for_a_page_that_closed_before_its_disconnect_arrived_is_dropped_quietly():
    consumer = ConsoleConsumer()
    consumer.forwarded = frozenset(FORWARDED_EVENTS)
    sent = []

    async def closed_transport(message):
        sent.append(message)
        raise Disconnected("Attempt to send on a closed protocol")

    consumer.base_send = closed_transport
    event = sorted(FORWARDED_EVENTS - {"agent"})[0]

    # Daphne's answer to a send on a closing socket does not end the consumer with "Exception inside application".
    asyncio.run(consumer.dispatch({"type": EVENT_MESSAGE_TYPE, "event": event, "payload": {}}))

    assert len(sent) == 1
