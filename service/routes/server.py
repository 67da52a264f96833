"""The server itself: ``GET /v1/info`` (version, and the same-host transport if it runs)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from tdreplay.codec.operations import SERVER_INFO

from ..deps import declare, error_responses

router = APIRouter(tags=["server"])


class ShmInfo(BaseModel):
    socket: str = Field(description="The Unix socket of the same-host transport.")
    host: str = Field(description="The host's identity (its kernel's boot id).")
    instance: str = Field(
        description="This server process's identity, which the socket's hello repeats: a "
        "client checks it reached this server, not another one publishing the same path."
    )


class ServerInfo(BaseModel):
    version: str
    shm: ShmInfo | None = Field(
        description="The same-host shared-memory transport; null when it does not run."
    )


@declare(router, SERVER_INFO, response_model=ServerInfo, responses=error_responses())
async def server_info(request: Request) -> dict[str, Any]:
    """The server's version, and where a client on this host reaches it over shared memory."""
    state = request.app.state
    shm = state.shm
    return {
        "version": state.version,
        "shm": None
        if shm is None
        else {"socket": str(shm.path), "host": shm.host, "instance": shm.instance},
    }
