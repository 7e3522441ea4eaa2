"""A store URL as people see it carries no user-info."""

from __future__ import annotations

import pytest

from strata.contract.urls import shown_url, url_userinfo


@pytest.mark.parametrize("url, shown", [
    ("s3://bucket/prefix", "s3://bucket/prefix"),
    ("file:///data/logs", "file:///data/logs"),
    ("https://alice:pa55word@example.org/data", "https://***@example.org/data"),
    ("ftp://bob@files.example.org", "ftp://***@files.example.org"),
    ("sftp://u:p%40ss@host:22/x?y=1#z", "sftp://***@host:22/x?y=1#z"),
    ("http://u:p@ss@host/a", "http://***@host/a"),         # an unescaped @ in the password
    ("http://host/a@b/c", "http://host/a@b/c"),             # an @ in the path is the path's
    ("http://host?who=a@b", "http://host?who=a@b"),
    ("not a url", "not a url"),
])
def test_the_user_info_of_a_url_is_never_shown(url: str, shown: str) -> None:
    assert shown_url(url) == shown
    info = url_userinfo(url)
    assert (info != "") == (shown != url) and (not info or info not in shown)
