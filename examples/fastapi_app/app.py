"""fairqueue in a FastAPI app: a signup and its welcome job commit in one request transaction
(SQLAlchemy ``AsyncSession``), a worker runs the job, and a status endpoint reads it with
``fairqueue.aget_job``. docs/fastapi.md walks through it; tests/docs/test_fastapi_example.py drives
it through ASGI against a real PostgreSQL.

From this folder (``DATABASE_URL`` is a ``postgresql+psycopg://`` or ``postgresql+asyncpg://`` URL):

    fairqueue migrate --database-url "$DATABASE_URL"
    uvicorn app:create_app --factory                        # the API
    fairqueue worker --import app --database-url "$DATABASE_URL"   # the worker, in its own process

or, for development, one process: ``FAIRQUEUE_RUN_WORKER=1 uvicorn app:create_app --factory``.
"""

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import fairqueue
from fairqueue.worker import Worker, WorkerConfig


class Base(DeclarativeBase):
    pass


class Signup(Base):
    __tablename__ = "example_signups"
    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[str]
    email: Mapped[str]
    welcomed: Mapped[bool] = mapped_column(default=False)


@fairqueue.task(name="signups.welcome", max_attempts=5, pass_context=True)
def send_welcome(ctx: fairqueue.JobContext, signup_id: int) -> dict[str, int]:
    # ... send the e-mail, then record it in the job's own transaction: it commits with the job's success
    ctx.session.execute(update(Signup).where(Signup.id == signup_id).values(welcomed=True))
    return {"welcomed": signup_id}


class SignupIn(BaseModel):
    tenant: str
    email: str


async def session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as s:
        yield s


DB = Annotated[AsyncSession, Depends(session)]
api = APIRouter()


@api.post("/signups", status_code=201)
async def create_signup(body: SignupIn, db: DB) -> dict[str, int]:
    async with db.begin():  # the signup and its job commit together, or neither
        signup = Signup(tenant=body.tenant, email=body.email)
        db.add(signup)
        await db.flush()
        job_id = await send_welcome.using(channel=body.tenant).aenqueue(db, signup.id)
    return {"signup_id": signup.id, "job_id": job_id}


@api.get("/jobs/{job_id}")
async def job_status(job_id: int, db: DB) -> dict[str, Any]:
    job = await fairqueue.aget_job(db, job_id)
    if job is None:
        raise HTTPException(404, "no such job")
    return {"status": job.status, "attempts": len(job.attempts), "result": job.result, "error": job.error}


@api.get("/signups/{signup_id}")
async def get_signup(signup_id: int, db: DB) -> dict[str, Any]:
    signup = await db.get(Signup, signup_id)
    if signup is None:
        raise HTTPException(404, "no such signup")
    return {"id": signup.id, "tenant": signup.tenant, "welcomed": signup.welcomed}


async def invalid_job(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=422)  # fairqueue refused the input: nothing written


def create_app(database_url: str | None = None, *, run_worker: bool | None = None) -> FastAPI:
    """The API. ``database_url`` defaults to $DATABASE_URL; ``run_worker`` (default: whether
    $FAIRQUEUE_RUN_WORKER is 1) runs a fairqueue worker in this process while the app is up."""
    url = database_url or os.environ["DATABASE_URL"]
    if run_worker is None:
        run_worker = os.environ.get("FAIRQUEUE_RUN_WORKER") == "1"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # pool_pre_ping: a pooled connection that a database restart cut is replaced, not handed to a request
        engine = create_async_engine(url, pool_pre_ping=True)
        app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
        async with engine.begin() as conn:  # a real app has a migration for its table
            await conn.run_sync(Base.metadata.create_all)
        worker = Worker(WorkerConfig(database_url=worker_url(url), concurrency=4)) if run_worker else None
        thread = threading.Thread(target=worker.run, name="fairqueue-worker") if worker else None
        if thread:
            thread.start()
        try:
            yield
        finally:
            if worker and thread:
                worker.stop()  # running jobs finish first
                await asyncio.to_thread(thread.join)
            await engine.dispose()

    app = FastAPI(title="signups", lifespan=lifespan)
    app.include_router(api)
    app.add_exception_handler(fairqueue.InvalidJobError, invalid_job)
    return app


def worker_url(url: str) -> str:
    """The app's SQLAlchemy URL as the worker takes it (psycopg 3, whatever the app's async driver)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
