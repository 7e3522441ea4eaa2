"""Store URLs as people see them. A source URL may carry user-info (`user:password@host`,
for HTTP, FTP or SFTP stores): every message, log line, listing and status that names a store
shows it through `shown_url`, which cuts that part out; the servers reach the store with the
URL as given."""

from __future__ import annotations

import re

# What stands for the user-info of a URL shown to people.
HIDDEN_USERINFO = "***"
_AUTHORITY_END = re.compile(r"[/?#]")


def url_userinfo(url: str) -> str:
    """The user-info of `url`'s authority (what comes before its last `@`), or ""."""
    _, sep, rest = url.partition("://")
    if not sep:
        return ""
    authority = _AUTHORITY_END.split(rest, maxsplit=1)[0]
    info, at, _ = authority.rpartition("@")
    return info if at else ""


def shown_url(url: str) -> str:
    """`url` with its user-info, if any, replaced by HIDDEN_USERINFO."""
    info = url_userinfo(url)
    if not info:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{HIDDEN_USERINFO}{rest[len(info):]}"
