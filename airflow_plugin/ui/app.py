"""The savepoints page: a FastAPI app that the plugin mounts in Airflow's API server under /savepoints.

    GET  /                                           the page (anonymous: redirected to Airflow's login)
    GET  /static/{file}                              its script and style sheet
    GET  /api/me                                     the user and what the page may offer them
    GET  /api/jobs                                   the declared jobs
    GET  /api/fleet                                  every job at a glance: state, batch, heartbeat, last savepoint,
                                                     Kafka lag, failed snapshots, unhealthy first
    GET  /api/jobs/{job}/deployments                 deployments: version, state, heartbeat, batch, rows/s;
                                                     whether a savepoint can be taken and whether the job can
                                                     be deployed now, or why not
    POST /api/jobs/{job}/deployments                 trigger the deploy DAG for the job (version, restore)
    GET  /api/jobs/{job}/deploy-runs                 recent runs of the deploy DAG for the job
    GET  /api/jobs/{job}/snapshots                   a page of snapshots (offset, limit, focus, kind, status)
    GET  /api/jobs/{job}/runs                        recent runs of the savepoint DAG for the job
    POST /api/jobs/{job}/savepoints                  trigger the savepoint DAG for the job
    GET  /api/jobs/{job}/upgrades                    the job's newest upgrade: mode, phase, what it did last
    POST /api/jobs/{job}/upgrades                    trigger the upgrade DAG for the job (version, mode)
    PUT  /api/jobs/{job}/snapshots/{id}/pin          pin or unpin
    GET  /metrics                                    every job's figures for Prometheus (OpenMetrics text; the
                                                     same as `savepoints metrics`: core/metrics/)

Every route requires an authenticated Airflow user; see security.py for the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from airflow.api_fastapi.auth.managers.base_auth_manager import BaseUser
from airflow.api_fastapi.core_api.security import GetUserDep
from airflow.api_fastapi.logging.decorators import action_logging
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from ..core import metrics
from ..core.jobs.spec import RESTORE_MODES
from ..core.records.manifest import parse_labels
from ..core.snapshots.lifecycle import set_pinned
from . import runs, views
from .errors import ApiError, engine_errors
from .security import (
    DEPLOY_DAG_ID,
    authenticated,
    can_deploy,
    can_read_deploy_runs,
    can_read_runs,
    can_trigger,
    can_upgrade,
    from_the_page,
    optional_user,
    permissions,
)

STATIC = Path(__file__).parent / "static"
_ASSETS = {"savepoints.js": "text/javascript", "savepoints.css": "text/css", "icon.svg": "image/svg+xml"}
_NO_STORE = {"Cache-Control": "no-store"}


class SavepointRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stop: bool = False
    pin: bool = False
    label: str = Field("", max_length=256, description="optional key=value stored with the savepoint")


class UpgradeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str = Field(..., min_length=1, max_length=128, description="the new version, declared in the jobs file")
    mode: Literal["auto", "blue_green", "stop_restore", "replay", "migrate"] = "auto"


class DeployRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str = Field(..., min_length=1, max_length=128, description="a version declared in the jobs file")
    restore: str = Field(
        RESTORE_MODES[0],
        min_length=1,
        max_length=128,
        description=f"{', '.join(RESTORE_MODES)} or a snapshot id (the deploy DAG's `restore`)",
    )


class PinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pinned: bool


def create_app(settings: views.PageSettings | None = None) -> FastAPI:
    settings = settings or views.PageSettings()
    app = FastAPI(
        title="Savepoints",
        description="Snapshots and deployments of the streaming jobs declared in the jobs file",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.settings = settings

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=_NO_STORE)

    @app.get("/", include_in_schema=False, response_model=None)
    async def page(request: Request, user: Annotated[BaseUser | None, Depends(optional_user)]) -> Response:
        if user is None:
            from airflow.api_fastapi.app import get_auth_manager

            return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status_code=307)
        # only Airflow's own UI (same origin) may embed the page: no clickjacking from other sites
        headers = {**_NO_STORE, "Content-Security-Policy": "frame-ancestors 'self'"}
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=headers)

    @app.get("/static/{name}", include_in_schema=False, dependencies=[Depends(authenticated)])
    async def asset(name: str) -> FileResponse:
        if name not in _ASSETS:
            raise ApiError(404, f"no such file {name!r} on the savepoints page", "NotFound")
        return FileResponse(STATIC / name, media_type=_ASSETS[name], headers=_NO_STORE)

    @app.get("/api/me")
    def me(request: Request, user: GetUserDep) -> dict[str, Any]:
        return {"user": user.get_name(), "can": permissions(request, user)}

    @app.get("/metrics", include_in_schema=False, dependencies=[Depends(authenticated)])
    def prometheus_metrics() -> Response:
        with engine_errors("read the jobs for the metrics"):
            text = metrics.render(metrics.observe(settings.hook().context))
        return Response(text, media_type=metrics.CONTENT_TYPE, headers=_NO_STORE)

    @app.get("/api/jobs", dependencies=[Depends(authenticated)])
    def jobs() -> dict[str, Any]:
        with engine_errors("read the jobs file"):
            return views.job_list(settings.hook())

    @app.get("/api/fleet", dependencies=[Depends(authenticated)])
    def fleet() -> dict[str, Any]:
        with engine_errors("read the jobs"):
            hook = settings.hook()
            return views.fleet(hook.context, hook.jobs_file or "")

    @app.get("/api/jobs/{job}/deployments", dependencies=[Depends(authenticated)])
    def deployments(job: str) -> dict[str, Any]:
        with engine_errors(f"read the deployments of job {job}"):
            ctx = settings.hook().job_context(job)
            rows, older = views.deployments(ctx)
            return {
                "job": job,
                "deployments": rows,
                "older": older,
                "savepoint": views.savepoint_now(ctx),
                "deploy": views.deploy_now(ctx),
                "autoscale": views.autoscale_now(ctx),
            }

    @app.post(
        "/api/jobs/{job}/deployments",
        status_code=201,
        dependencies=[
            Depends(authenticated),
            Depends(from_the_page),
            Depends(can_deploy),
            Depends(action_logging("savepoints_page_deploy")),
        ],
    )
    def deploy(job: str, body: DeployRequest, request: Request, user: GetUserDep) -> dict[str, Any]:
        with engine_errors(f"trigger a deploy of job {job}"):
            ctx = settings.hook().job_context(job)  # an unknown job is a 404 naming the declared ones
            ctx.spec.version(body.version)  # unknown: a 404 naming the declared ones
            if body.restore not in RESTORE_MODES:
                ctx.store.get(job, body.restore)  # a snapshot id that is not there: a 404, before any run exists
            now = views.deploy_now(ctx)
            if not now["possible"]:  # the DAG's task would refuse it: say so now, with the engine's reason
                raise ApiError(409, now["reason"], "Refused")
            return runs.trigger_deploy_run(
                job,
                version=body.version,
                restore=body.restore,
                user_name=user.get_name(),
                from_ui=bool(request.headers.get("referer")),
            )

    @app.get("/api/jobs/{job}/deploy-runs", dependencies=[Depends(authenticated), Depends(can_read_deploy_runs)])
    def deploy_runs(job: str) -> dict[str, Any]:
        with engine_errors(f"list the deploy runs of job {job}"):
            return {"job": job, "runs": runs.recent_runs(job, dag_id=DEPLOY_DAG_ID)}

    @app.get("/api/jobs/{job}/snapshots", dependencies=[Depends(authenticated)])
    def snapshots(
        job: str,
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=views.MAX_PAGE_SIZE)] = views.PAGE_SIZE,
        focus: str | None = None,
        kind: str | None = None,
        status: str | None = None,
    ) -> dict[str, Any]:
        with engine_errors(f"list the snapshots of job {job}"):
            hook = settings.hook()
            return views.snapshots_page(
                hook.job_context(job), hook.jobs_file, offset=offset, limit=limit, focus=focus, kind=kind, status=status
            )

    @app.get("/api/jobs/{job}/runs", dependencies=[Depends(authenticated), Depends(can_read_runs)])
    def job_runs(job: str) -> dict[str, Any]:
        with engine_errors(f"list the savepoint runs of job {job}"):
            return {"job": job, "runs": runs.recent_runs(job)}

    @app.post(
        "/api/jobs/{job}/savepoints",
        status_code=201,
        dependencies=[
            Depends(authenticated),
            Depends(from_the_page),
            Depends(can_trigger),
            Depends(action_logging("savepoints_page_trigger")),
        ],
    )
    def trigger(job: str, body: SavepointRequest, request: Request, user: GetUserDep) -> dict[str, Any]:
        with engine_errors(f"trigger a savepoint of job {job}"):
            settings.hook().context.spec(job)  # an unknown job is a 404 naming the declared ones, not a DAG param error
            parse_labels(body.label)  # a bad label is a 400 naming it, before any run exists
            return runs.trigger_savepoint_run(
                job,
                stop=body.stop,
                pin=body.pin,
                label=body.label,
                user_name=user.get_name(),
                from_ui=bool(request.headers.get("referer")),
            )

    @app.get("/api/jobs/{job}/upgrades", dependencies=[Depends(authenticated)])
    def upgrades(job: str) -> dict[str, Any]:
        with engine_errors(f"read the upgrades of job {job}"):
            return {"job": job, "newest": views.newest_upgrade(settings.hook().job_context(job))}

    @app.post(
        "/api/jobs/{job}/upgrades",
        status_code=201,
        dependencies=[
            Depends(authenticated),
            Depends(from_the_page),
            Depends(can_upgrade),
            Depends(action_logging("savepoints_page_upgrade")),
        ],
    )
    def upgrade(job: str, body: UpgradeRequest, request: Request, user: GetUserDep) -> dict[str, Any]:
        with engine_errors(f"trigger an upgrade of job {job}"):
            settings.hook().context.spec(job).version(body.version)  # unknown: a 404 naming the declared ones
            return runs.trigger_upgrade_run(
                job,
                version=body.version,
                mode=body.mode,
                user_name=user.get_name(),
                from_ui=bool(request.headers.get("referer")),
            )

    @app.put(
        "/api/jobs/{job}/snapshots/{snapshot_id}/pin",
        dependencies=[
            Depends(authenticated),
            Depends(from_the_page),
            Depends(can_trigger),
            Depends(action_logging("savepoints_page_pin")),
        ],
    )
    def pin(job: str, snapshot_id: str, body: PinRequest) -> dict[str, Any]:
        with engine_errors(f"{'pin' if body.pinned else 'unpin'} snapshot {snapshot_id} of job {job}"):
            hook = settings.hook()
            ctx = hook.job_context(job)
            manifest = set_pinned(ctx.store, ctx.name, snapshot_id, body.pinned)
            return views.snapshot_row(manifest, ctx, hook.jobs_file, views.utc_now())

    return app
