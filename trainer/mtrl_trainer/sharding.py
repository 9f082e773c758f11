"""Every data-parallel rank generates: rank 0 shards the generate requests by episode.

Rank 0 alone reads the run's generate queue (one SQS consumer, as before) and routes each
request by a hash of its sample id: all turns of an episode land on the same rank, whose decoder
holds that episode's cached prefix. Its own share it samples locally; every other rank keeps one
TCP connection to rank 0 (newline-delimited protocol JSON) and samples its share with its own
copy of the policy. DDP keeps the copies equal, and each rank bumps its policy version under its
model lock right after the shared optimizer step, so a response carries the same version
whichever rank sampled it.

Rank 0's address is `MASTER_ADDR` (torchrun's rendezvous host, which every rank already reaches);
the port is picked by the OS and broadcast with the first collective. A lost connection fails
that rank's open requests with an error response (their episodes end as failed) instead of
leaving them waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import zlib
from dataclasses import dataclass

from mtrl_rollout.generation import Sample, error_response
from mtrl_rollout.protocol import GenerateRequest, GenerateResponse
from mtrl_trainer.distributed import World, broadcast

log = logging.getLogger(__name__)

LINE_LIMIT = 64 << 20  # a request carries a whole conversation


def shard_of(sample_id: str, world_size: int) -> int:
    """The rank that serves every turn of the episode `sample_id` (stable across processes)."""
    return zlib.crc32(sample_id.encode()) % world_size


@dataclass
class Endpoint:
    """Where rank 0 listens. On rank 0 `sock` is the bound, listening socket."""

    host: str
    port: int
    sock: socket.socket | None = None

    @classmethod
    def bootstrap(cls, world: World) -> Endpoint:
        """Collective: every rank calls it once, right after the process group starts."""
        sock = None
        address: tuple[str, int] | None = None
        if world.is_leader:
            sock = socket.create_server(("0.0.0.0", 0), backlog=world.size)
            address = (os.environ.get("MASTER_ADDR") or "127.0.0.1", sock.getsockname()[1])
        host, port = broadcast(address, world)
        return cls(host, port, sock)


class _Remote:
    """Rank 0's end of one follower's connection."""

    def __init__(self, rank: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.rank = rank
        self._reader, self._writer = reader, writer
        self._waiting: dict[str, tuple[GenerateRequest, asyncio.Future[GenerateResponse]]] = {}
        self._reading = asyncio.create_task(self._read())

    async def sample(self, request: GenerateRequest) -> GenerateResponse:
        if self._reading.done():
            return error_response(request, f"rank {self.rank} is gone")
        future: asyncio.Future[GenerateResponse] = asyncio.get_running_loop().create_future()
        self._waiting[request.request_id] = (request, future)
        self._writer.write(request.model_dump_json().encode() + b"\n")
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()
        return await future

    async def _read(self) -> None:
        try:
            while line := await self._reader.readline():
                response = GenerateResponse.model_validate_json(line)
                waiting = self._waiting.pop(response.request_id, None)
                if waiting is not None and not waiting[1].done():
                    waiting[1].set_result(response)
        except (ConnectionError, ValueError):
            log.exception("the connection to rank %d broke", self.rank)
        finally:
            for request, future in self._waiting.values():
                if not future.done():
                    future.set_result(error_response(request, f"rank {self.rank} is gone"))
            self._waiting.clear()

    async def aclose(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()
        await self._reading


class ShardRouter:
    """Rank 0: `sample` sends each request to the rank that serves its episode."""

    def __init__(self, world: World, local: Sample) -> None:
        self._world = world
        self._local = local
        self._remotes: dict[int, _Remote] = {}
        self._joined = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self, endpoint: Endpoint, timeout_s: float = 600.0) -> None:
        """Accept one connection from every other rank."""
        if self._world.size == 1:
            return
        self._server = await asyncio.start_server(self._accept, sock=endpoint.sock,
                                                  limit=LINE_LIMIT)
        await asyncio.wait_for(self._joined.wait(), timeout_s)
        log.info("generation sharded over %d ranks", self._world.size)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = await reader.readline()
        rank = int(hello.decode().strip())
        self._remotes[rank] = _Remote(rank, reader, writer)
        if len(self._remotes) == self._world.size - 1:
            self._joined.set()

    async def sample(self, request: GenerateRequest) -> GenerateResponse:
        rank = shard_of(request.sample_id, self._world.size)
        return await (self._local if rank == 0 else self._remotes[rank].sample)(request)

    async def aclose(self) -> None:
        for remote in self._remotes.values():
            await remote.aclose()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def serve_share(endpoint: Endpoint, rank: int, sample: Sample) -> None:
    """Another rank: sample the requests rank 0 routes here until it hangs up."""
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port, limit=LINE_LIMIT)
    writer.write(f"{rank}\n".encode())
    tasks: set[asyncio.Task[None]] = set()

    async def answer(request: GenerateRequest) -> None:
        response = await sample(request)
        writer.write(response.model_dump_json().encode() + b"\n")
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    try:
        while line := await reader.readline():
            task = asyncio.create_task(answer(GenerateRequest.model_validate_json(line)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        await asyncio.gather(*tasks, return_exceptions=True)
        writer.close()
