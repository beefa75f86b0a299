"""Bearer-token check for every mutating call of the admin API.

Reads are open (the API listens on loopback unless a token is configured); writes need
``Authorization: Bearer <token>``, compared in constant time (``hmac.compare_digest``).
Without a configured token the API is read-only: a write gets 403 naming ``api.token``.
"""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

bearer_scheme = HTTPBearer(auto_error=False, description="The API token (api.token / token_file / token_env).")


async def require_token(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Security(bearer_scheme)
) -> None:
    """FastAPI dependency of every write route: the app's token (``app.state.token``) must be sent."""
    token: str | None = request.app.state.token
    expected = token.encode() if token else None
    if expected is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "the API is read-only: no token is configured (set api.token, api.token_file or api.token_env)",
        )
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing 'Authorization: Bearer <token>' header",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(credentials.credentials.encode(), expected):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "invalid bearer token")

