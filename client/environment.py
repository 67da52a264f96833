"""Where a client finds its server and token when the code does not say: the environment,
the same way the ``tdreplay`` command and the server read it (in a container or a pod the
token comes as a mounted secret file).

* ``TDREPLAY_URL``: the server's URL, or several comma-separated (a sharded table);
  default ``http://127.0.0.1:8000``.
* ``TDREPLAY_TOKEN``: the bearer token, or ``TDREPLAY_TOKEN_FILE``: a file holding it
  (not both).

Arguments given in code win over the environment.

    >>> configured(None, None, environ={"TDREPLAY_URL": "http://a:1, http://b:2"})
    (('http://a:1', 'http://b:2'), None)
    >>> configured("http://c:3", "t0ken", environ={"TDREPLAY_TOKEN": "other"})
    (('http://c:3',), 't0ken')
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..codec.token import check_token, read_token_file

URL_VAR = "TDREPLAY_URL"
TOKEN_VAR = "TDREPLAY_TOKEN"
TOKEN_FILE_VAR = "TDREPLAY_TOKEN_FILE"
#: where a client looks for its server when neither the code nor the environment says
DEFAULT_URL = "http://127.0.0.1:8000"


def configured(
    url: str | Sequence[str] | None,
    token: str | None,
    *,
    token_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[tuple[str, ...], str | None]:
    """The client's URLs and token: ``url`` / ``token`` (or ``token_file``) when given,
    else the environment's.

    Raises:
        ValueError: the token is given twice (``TDREPLAY_TOKEN`` and a token file), or is
            not one a server accepts (empty, too long, not visible ASCII); the message
            names where it came from, never the token.
    """
    env = os.environ if environ is None else environ
    if url is None or (not isinstance(url, str) and not url):
        url = [u.strip() for u in env.get(URL_VAR, "").split(",") if u.strip()] or DEFAULT_URL
    urls = (url,) if isinstance(url, str) else tuple(url)
    if token is not None:
        return urls, token
    path = token_file or env.get(TOKEN_FILE_VAR)
    given = env.get(TOKEN_VAR)
    if path:
        if given is not None:
            raise ValueError(
                f"the token is given twice: set {TOKEN_VAR} or a token file "
                f"({TOKEN_FILE_VAR}, --token-file), not both"
            )
        return urls, read_token_file(Path(path))
    if given is not None:
        check_token(given, TOKEN_VAR)
    return urls, given
