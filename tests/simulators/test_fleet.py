"""The scale fleet's DCGM exporters collect on their own interval, as
dcgm-exporter does: the same page in between, whatever the pods' loads do."""

from __future__ import annotations

import asyncio

from kinference_simulators.fleet import Fleet, FleetConfig
from kinference_common.tasks import cancel_and_wait


async def test_an_exporter_page_moves_only_at_its_collections() -> None:
    fleet = Fleet(FleetConfig(pods=8, gpus_per_node=8, change_interval=0.02, dcgm_collect_interval=0.3))
    pods_before, node_before = [p.page for p in fleet.pods], fleet.nodes[0].page
    task = asyncio.create_task(fleet.run())
    try:
        await asyncio.sleep(0.12)  # every pod's load moved several times, no collection yet
        assert [p.page for p in fleet.pods] != pods_before
        assert fleet.nodes[0].page == node_before
        await asyncio.sleep(0.4)  # a collection: the page follows the loads
        assert fleet.nodes[0].page != node_before
    finally:
        await cancel_and_wait(task)


async def test_with_no_collect_interval_the_page_follows_every_move() -> None:
    fleet = Fleet(FleetConfig(pods=8, gpus_per_node=8, change_interval=0.02, dcgm_collect_interval=0.0))
    node_before = fleet.nodes[0].page
    task = asyncio.create_task(fleet.run())
    try:
        await asyncio.sleep(0.12)
        assert fleet.nodes[0].page != node_before
    finally:
        await cancel_and_wait(task)
