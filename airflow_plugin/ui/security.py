"""Who may use the savepoints page. A plugin's FastAPI app does not inherit Airflow's authentication, so
every route of app.py depends on one of these (Airflow's own dependencies, from its core API):

- reading anything: an authenticated Airflow user (JWT bearer, or the UI's `_token` cookie);
- triggering a savepoint and pinning: permission to trigger the savepoint DAG (POST on its runs), the
  permission Airflow's REST API asks for to trigger it; a viewer gets 403; an upgrade and a deploy: the same
  for the upgrade DAG and the deploy DAG;
- state changes authenticated by the cookie must also come from the page itself: a custom header, which
  a cross-site HTML form cannot send, and no `Sec-Fetch-Site` other than same-origin.
"""

from __future__ import annotations

from typing import Annotated, Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import (
    GetUserDep,
    bearer_scheme,
    get_user,
    requires_access_dag,
    requires_authenticated,
)
from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials

SAVEPOINT_DAG_ID = "savepoints_savepoint"
UPGRADE_DAG_ID = "savepoints_upgrade"
DEPLOY_DAG_ID = "savepoints_deploy"
# The page sends this header on every state change; a cross-site form post cannot set any header.
PAGE_HEADER = "X-Savepoints-Page"

authenticated = requires_authenticated()
can_read_runs = requires_access_dag(method="GET", access_entity=DagAccessEntity.RUN, param_dag_id=SAVEPOINT_DAG_ID)
can_trigger = requires_access_dag(method="POST", access_entity=DagAccessEntity.RUN, param_dag_id=SAVEPOINT_DAG_ID)
can_upgrade = requires_access_dag(method="POST", access_entity=DagAccessEntity.RUN, param_dag_id=UPGRADE_DAG_ID)
can_deploy = requires_access_dag(method="POST", access_entity=DagAccessEntity.RUN, param_dag_id=DEPLOY_DAG_ID)
can_read_deploy_runs = requires_access_dag(method="GET", access_entity=DagAccessEntity.RUN, param_dag_id=DEPLOY_DAG_ID)


def _bearer(request: Request) -> bool:
    return request.headers.get("authorization", "").lower().startswith("bearer ")


def from_the_page(request: Request) -> None:
    """Refuse a state change that a browser could have been tricked into sending with the user's cookie.
    A bearer token is never sent by a browser on its own, so API clients that use one need nothing more."""
    if _bearer(request):
        return
    site = request.headers.get("sec-fetch-site")
    if site not in (None, "same-origin"):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"cross-site request refused (Sec-Fetch-Site: {site}): use the savepoints page itself, "
            "or call the API with a bearer token",
        )
    if request.headers.get(PAGE_HEADER) != "1":
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"a state change authenticated by the session cookie needs the header {PAGE_HEADER}: 1 "
            "(the savepoints page sends it; a cross-site form cannot): or call the API with a bearer token",
        )


async def optional_user(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Any | None:
    """The user, or None when the request carries no valid credential (the page then redirects to login)."""
    try:
        return await get_user(request, None, bearer)
    except HTTPException:
        return None


def permissions(request: Request, user: GetUserDep) -> dict[str, bool]:
    """What the page may offer this user: the same checks as the routes, asked without failing."""

    def allowed(check: Any) -> bool:
        try:
            check(request, user)
        except HTTPException:
            return False
        return True

    return {
        "trigger": allowed(can_trigger),
        "pin": allowed(can_trigger),
        "read_runs": allowed(can_read_runs),
        "upgrade": allowed(can_upgrade),
        "deploy": allowed(can_deploy),
        "read_deploy_runs": allowed(can_read_deploy_runs),
    }
