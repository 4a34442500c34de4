"""The waiting queue's `items` (the container the scheduler reads lengths from) follows every
change, under both policies."""

from __future__ import annotations

import pytest

from engine.core.block_keys import BlockKeys
from engine.core.request import Request
from engine.core.request_queue import WaitingQueue
from engine.core.request_state import SchedulerRequest


@pytest.mark.parametrize("priority", [False, True])
def test_items_holds_one_entry_per_waiting_request(priority):
    keys = BlockKeys(4, "builtin")
    reqs = [SchedulerRequest(Request(i, float(i), 8, 2, (i, i), hash_block_size=4, priority=-i), None, (), i, keys)
            for i in range(5)]
    q = WaitingQueue(priority)
    for r in reqs[:4]:
        q.add(r)
    q.add_preempted(reqs[4])
    assert len(q.items) == len(q) == 5
    q.remove(reqs[2])
    assert len(q.items) == len(q) == 4
    q.pop()
    assert len(q.items) == len(q) == 3
    # FCFS: the preempted one went first; priority: the lowest value (-4, request 4) first, then 3
    assert q.peek() is (reqs[0] if not priority else reqs[3])
